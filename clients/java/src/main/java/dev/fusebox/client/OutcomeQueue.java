package dev.fusebox.client;

import dev.fusebox.v1.CompleteRequest;
import io.grpc.Status;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.LockSupport;
import java.util.function.BiFunction;

/**
 * The client's outcome queue and its sender: a guard queues its call's outcome and returns, and the
 * sender reports what is queued in the background (clients/README.md, "Outcomes off the caller's
 * path").
 *
 * <p>One send is in flight at a time. With nothing in flight, the thread that queues an outcome
 * only wakes the process's {@link Starter}, which starts the send (an asynchronous call) at once:
 * starting a gRPC call costs the caller several times what a wake-up does. The outcomes queued
 * while a send is in flight go together in the next one, up to {@value #PER_SEND}, started from the
 * thread that handled the answer. The bound counts the outcomes waiting, not the ones in flight:
 * with the queue full an outcome is dropped, counted and logged, and its lease ends on the server.
 * A failed send, and each item answered with an error, is counted and logged; its tickets' leases
 * end on the server too.
 */
final class OutcomeQueue {
  /** Outcomes waiting at most, by default. */
  static final int DEFAULT_CAPACITY = 10_000;

  /** Outcomes in one send at most (the server's limit per message). */
  static final int PER_SEND = 1000;

  /** An item's cost when the call reported none. */
  static final long NO_COST = -1;

  /** One outcome to report. */
  static final class Item {
    final String key;
    final String ticket;
    final Outcome outcome;
    /** The permits the call really used, or {@link #NO_COST}: the ticket's. */
    final long cost;

    Item(String key, String ticket, Outcome outcome, long cost) {
      this.key = key;
      this.ticket = ticket;
      this.outcome = outcome;
      this.cost = cost;
    }

    CompleteRequest request() {
      CompleteRequest.Builder b = CompleteRequest.newBuilder().setTicket(ticket).setOutcome(outcome.proto);
      if (cost != NO_COST) {
        b.setCost((int) cost); // a uint32: the low 32 bits
      }
      return b.build();
    }
  }

  /** An outcome not reported: fusebox answered it with an error, or no answer came for it. */
  static final class Failed {
    final Status status;
    /** True when fusebox answered the item with {@code status}; false when the send failed. */
    final boolean answered;

    Failed(Status status, boolean answered) {
      this.status = status;
      this.answered = answered;
    }
  }

  /** A {@link #flush} waiting until {@code answered} reaches {@code upTo}. */
  private static final class Flush {
    final long upTo;
    final CompletableFuture<Void> done = new CompletableFuture<>();

    Flush(long upTo) {
      this.upTo = upTo;
    }
  }

  private final int capacity;
  private final long deadlineNanos;
  private final BiFunction<List<CompleteRequest>, Long, CompletableFuture<List<Failed>>> send;
  private final FuseboxClient.Counters counters;
  private final LogLimiter logs;

  // Guarded by this.
  private final ArrayDeque<Item> waiting = new ArrayDeque<>();
  private final ArrayDeque<Flush> flushes = new ArrayDeque<>();
  private boolean sending;
  private long queued; // outcomes ever queued
  private long answered; // of which answered (or failed); they are answered in order

  /**
   * @param send starts one send of the requests with the deadline (ns); its future holds, per
   *     request, null when it was answered, else why not, or fails when the send failed as a whole
   */
  OutcomeQueue(
      int capacity,
      long deadlineNanos,
      BiFunction<List<CompleteRequest>, Long, CompletableFuture<List<Failed>>> send,
      FuseboxClient.Counters counters,
      LogLimiter logs) {
    this.capacity = capacity;
    this.deadlineNanos = deadlineNanos;
    this.send = send;
    this.counters = counters;
    this.logs = logs;
  }

  /** Queues an outcome, or drops it when the queue is full; never waits on the network. */
  void add(Item item) {
    boolean dropped = false;
    boolean start = false;
    synchronized (this) {
      if (waiting.size() >= capacity) {
        dropped = true;
      } else {
        waiting.add(item);
        queued++;
        if (!sending) {
          sending = true; // the outcomes queued until the starter runs go with this one
          start = true;
        }
      }
    }
    if (dropped) {
      counters.outcomesDropped.increment();
      logs.warn(
          "dropped",
          "fusebox: the outcome queue is full ("
              + capacity
              + " outcomes waiting to be reported): dropped outcome "
              + item.outcome
              + " of \""
              + item.key
              + "\"; its ticket's lease will end on the server, which counts it as expired."
              + " fusebox is slow or unreachable; if it is up, raise the client's outcomeQueue");
      return;
    }
    if (start) {
      Starter.INSTANCE.start(this);
    }
  }

  /** Starts the send the starter was woken for. */
  private void sendNext() {
    List<Item> batch;
    synchronized (this) {
      batch = take();
    }
    sendFrom(batch);
  }

  /**
   * One daemon thread for the process that starts the send of a queue that had none in flight: the
   * thread that queued the outcome only wakes it. It never waits on the network (the sends are
   * asynchronous calls), so the queues of every client share it.
   */
  static final class Starter implements Runnable {
    static final Starter INSTANCE = new Starter();

    private final ConcurrentLinkedQueue<OutcomeQueue> ready = new ConcurrentLinkedQueue<>();
    private final Thread thread;

    private Starter() {
      thread = new Thread(this, "fusebox-outcomes");
      thread.setDaemon(true);
      thread.start();
    }

    void start(OutcomeQueue q) {
      ready.add(q);
      LockSupport.unpark(thread);
    }

    @Override
    public void run() {
      while (true) {
        OutcomeQueue q = ready.poll();
        if (q == null) {
          LockSupport.park(this);
          continue;
        }
        try {
          q.sendNext();
        } catch (Throwable e) { // a bug; the thread must live on for the other queues
          FuseboxClient.LOG.error("fusebox: starting a report of outcomes failed", e);
        }
      }
    }
  }

  /** Takes the next send's outcomes and marks a send in flight, or marks none. */
  private List<Item> take() {
    if (waiting.isEmpty()) {
      sending = false;
      return null;
    }
    sending = true;
    int n = Math.min(waiting.size(), PER_SEND);
    List<Item> batch = new ArrayList<>(n);
    for (int i = 0; i < n; i++) {
      batch.add(waiting.poll());
    }
    return batch;
  }

  /**
   * Sends {@code batch}, and the next ones while sends end at once (a closed channel), in a loop
   * rather than by recursion; a send still on its way carries on from its answer's callback.
   */
  private void sendFrom(List<Item> batch) {
    while (batch != null) {
      List<CompleteRequest> reqs = new ArrayList<>(batch.size());
      for (Item it : batch) {
        reqs.add(it.request());
      }
      CompletableFuture<List<Failed>> f;
      try {
        f = send.apply(reqs, deadlineNanos);
      } catch (RuntimeException e) {
        f = CompletableFuture.failedFuture(e);
      }
      if (!f.isDone()) {
        List<Item> sent = batch;
        f.whenComplete((results, err) -> sendFrom(answered(sent, results, err)));
        return;
      }
      List<Failed> results = null;
      Throwable err = null;
      try {
        results = f.get();
      } catch (ExecutionException e) {
        err = e.getCause();
      } catch (InterruptedException e) { // not possible: the future is done
        Thread.currentThread().interrupt();
        err = e;
      }
      batch = answered(batch, results, err);
    }
  }

  /** Counts a send's answer, releases the flushes it satisfies, and takes the next send. */
  private List<Item> answered(List<Item> batch, List<Failed> results, Throwable err) {
    int ok = 0;
    // Not reported, apart: no answer came (the send failed), and answered with an error.
    int[] failed = new int[2];
    Item[] firstItem = new Item[2];
    Status[] firstStatus = new Status[2];
    for (int i = 0; i < batch.size(); i++) {
      Failed f;
      if (err != null) {
        f = new Failed(Status.fromThrowable(err), false);
      } else if (results == null || i >= results.size()) {
        f = new Failed(Status.INTERNAL.withDescription("fusebox answered fewer items than were sent"), false);
      } else {
        f = results.get(i);
      }
      if (f == null) {
        ok++;
        continue;
      }
      int kind = f.answered ? 1 : 0;
      if (failed[kind]++ == 0) {
        firstItem[kind] = batch.get(i);
        firstStatus[kind] = f.status;
      }
    }
    counters.completed.add(ok);
    counters.completeFailures.add(failed[0] + failed[1]);
    if (failed[0] > 0) {
      logs.warn("complete", failureMessage(failed[0], firstItem[0], firstStatus[0], false));
    }
    if (failed[1] > 0) {
      logs.warn("complete-answered", failureMessage(failed[1], firstItem[1], firstStatus[1], true));
    }
    List<CompletableFuture<Void>> released = new ArrayList<>();
    List<Item> next;
    synchronized (this) {
      answered += batch.size();
      while (!flushes.isEmpty() && flushes.peek().upTo <= answered) {
        released.add(flushes.poll().done);
      }
      next = take();
    }
    for (CompletableFuture<Void> r : released) {
      r.complete(null);
    }
    return next;
  }

  private static String failureMessage(int failed, Item first, Status status, boolean answered) {
    String what =
        failed == 1
            ? "outcome " + first.outcome + " of \"" + first.key + "\""
            : failed + " outcomes (the first " + first.outcome + " of \"" + first.key + "\")";
    String why = status.getCode() + (status.getDescription() != null ? ": " + status.getDescription() : "");
    if (!answered) {
      return "fusebox: could not report "
          + what
          + " ("
          + why
          + (failed == 1
              ? "); its ticket's lease will end on the server, which counts it as expired."
              : "); their tickets' leases will end on the server, which counts them as expired.")
          + " Check that fusebox is up and reachable within the client's deadline";
    }
    return "fusebox answered the report of "
        + what
        + " with an error ("
        + why
        + "): the ticket was unknown or already completed (its lease had ended, or it was"
        + " completed elsewhere), so fusebox did not count it";
  }

  /**
   * Waits until every outcome queued before the call has been answered, at most {@code
   * timeoutNanos}; false when the time ran out first.
   */
  boolean flush(long timeoutNanos) throws InterruptedException {
    Flush f;
    synchronized (this) {
      if (answered >= queued) {
        return true;
      }
      f = new Flush(queued);
      flushes.add(f);
    }
    try {
      f.done.get(timeoutNanos, TimeUnit.NANOSECONDS);
      return true;
    } catch (TimeoutException e) {
      return false;
    } catch (ExecutionException e) { // never failed
      return true;
    } finally {
      if (!f.done.isDone()) {
        synchronized (this) {
          for (Iterator<Flush> it = flushes.iterator(); it.hasNext(); ) {
            if (it.next() == f) {
              it.remove();
              break;
            }
          }
        }
      }
    }
  }
}
