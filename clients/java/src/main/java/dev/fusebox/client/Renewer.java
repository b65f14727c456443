package dev.fusebox.client;

import dev.fusebox.v1.RenewRequest;
import dev.fusebox.v1.RenewResponse;
import io.grpc.Status;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Renews a ticket's lease each time half of it has passed, until stopped or the ticket is gone
 * (NOT_FOUND). A failed renewal is tried again after a quarter lease. Once stopped (the call ended
 * and its outcome is queued next), the answer of a renewal still on its way only counts a renewal:
 * an error then is the ticket completed first, not trouble.
 *
 * <p>Its due time is an entry of the process's {@link Timers}, not a task of its own: most calls
 * end long before half their lease, and entering and leaving that set is all they cost.
 */
final class Renewer {
  private static final AtomicLong SEQ = new AtomicLong();

  private final FuseboxClient client;
  private final String key;
  private final String ticket;
  private final java.time.Duration askedLease;
  private final long deadlineNanos;
  /** Orders renewers due at the same nanosecond. */
  private final long seq = SEQ.incrementAndGet();

  private long leaseNanos;
  private boolean stopped; // guarded by this
  private RenewRequest request; // built on the first renewal
  /** When the next renewal is due (System.nanoTime); changed only while not in the timers. */
  private long due;

  Renewer(FuseboxClient client, String key, String ticket, long leaseNanos, GuardOptions opts, long deadlineNanos) {
    this.client = client;
    this.key = key;
    this.ticket = ticket;
    this.askedLease = opts.lease;
    this.leaseNanos = leaseNanos;
    this.deadlineNanos = deadlineNanos;
  }

  void start() {
    schedule(leaseNanos / 2);
  }

  private synchronized void schedule(long delayNanos) {
    if (!stopped) {
      due = System.nanoTime() + delayNanos;
      Timers.INSTANCE.add(this);
    }
  }

  /** Sends a renewal (the timers found it due). */
  private void renew() {
    CompletableFuture<RenewResponse> f;
    synchronized (this) {
      if (stopped) {
        return;
      }
      if (request == null) {
        RenewRequest.Builder b = RenewRequest.newBuilder().setTicket(ticket);
        if (askedLease != null) {
          b.setLease(FuseboxClient.duration(askedLease));
        }
        request = b.build();
      }
      f = client.callRenew(request, deadlineNanos, Rpc.DIRECT);
    }
    f.whenComplete(this::answered);
  }

  private void answered(RenewResponse resp, Throwable err) {
    long next;
    boolean over;
    synchronized (this) {
      over = stopped;
    }
    if (err != null && over) {
      return; // most likely completed before the renewal arrived
    }
    if (err != null) {
      client.counters.renewErrors.increment();
      Status status = Status.fromThrowable(err);
      client.logs.warn(
          "renew", "fusebox: could not renew a lease of \"" + key + "\": " + status.getCode());
      if (status.getCode() == Status.Code.NOT_FOUND) {
        return; // completed, expired or stale: nothing left to renew
      }
      next = leaseNanos / 4;
    } else {
      client.counters.renewals.increment();
      if (resp.hasLease()) {
        long l = FuseboxClient.nanos(resp.getLease());
        if (l > 0) {
          leaseNanos = l;
        }
      }
      next = leaseNanos / 2;
    }
    schedule(Math.max(next, TimeUnit.MILLISECONDS.toNanos(1)));
  }

  /** Stops renewing: no renewal is sent after this returns. */
  void stop() {
    synchronized (this) {
      stopped = true;
    }
    Timers.INSTANCE.remove(this);
  }

  /**
   * The renewals due in the process, by due time, and one task on the shared scheduler that wakes
   * at the earliest of them and starts those that are due. A renewer entered after that task's time
   * schedules nothing and a renewer removed leaves the task as it is (it finds nothing due and
   * sleeps until the next), so a call that ends before its renewal neither schedules nor cancels a
   * task (nor wakes the scheduler's thread).
   */
  static final class Timers {
    private static final Comparator<Renewer> BY_DUE =
        (a, b) -> a.due != b.due ? Long.compare(a.due - b.due, 0) : Long.compare(a.seq, b.seq);

    // After BY_DUE, which it uses.
    static final Timers INSTANCE = new Timers(Rpc.SCHEDULER);

    private final ScheduledExecutorService scheduler;
    private final TreeSet<Renewer> waiting = new TreeSet<>(BY_DUE); // guarded by this
    private ScheduledFuture<?> task; // guarded by this
    private long taskAt; // guarded by this

    Timers(ScheduledExecutorService scheduler) {
      this.scheduler = scheduler;
    }

    synchronized void add(Renewer r) {
      waiting.add(r);
      if (task == null || r.due - taskAt < 0) {
        if (task != null) {
          task.cancel(false);
        }
        wakeAt(r.due);
      }
    }

    synchronized void remove(Renewer r) {
      waiting.remove(r);
    }

    /** How many renewers are waiting (tests). */
    synchronized int size() {
      return waiting.size();
    }

    private void wakeAt(long at) {
      taskAt = at;
      task = scheduler.schedule(this::fire, Math.max(0, at - System.nanoTime()), TimeUnit.NANOSECONDS);
    }

    private void fire() {
      List<Renewer> due = new ArrayList<>();
      synchronized (this) {
        task = null;
        long now = System.nanoTime();
        while (!waiting.isEmpty() && waiting.first().due - now <= 0) {
          due.add(waiting.pollFirst());
        }
        if (!waiting.isEmpty()) {
          wakeAt(waiting.first().due);
        }
      }
      for (Renewer r : due) {
        try {
          r.renew();
        } catch (RuntimeException e) { // a bug; the other renewals go on
          FuseboxClient.LOG.error("fusebox: starting a renewal failed", e);
        }
      }
    }
  }
}
