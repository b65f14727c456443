package dev.fusebox.client;

import dev.fusebox.v1.RenewRequest;
import dev.fusebox.v1.RenewResponse;
import io.grpc.Status;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/**
 * Renews a ticket's lease each time half of it has passed, on the shared scheduler, until stopped
 * or the ticket is gone (NOT_FOUND). A failed renewal is tried again after a quarter lease.
 */
final class Renewer {
  private final FuseboxClient client;
  private final String key;
  private final RenewRequest request;
  private final long deadlineNanos;
  private long leaseNanos;
  private boolean stopped;
  private ScheduledFuture<?> timer;
  private CompletableFuture<RenewResponse> inFlight;

  Renewer(FuseboxClient client, String key, String ticket, long leaseNanos, GuardOptions opts, long deadlineNanos) {
    this.client = client;
    this.key = key;
    RenewRequest.Builder b = RenewRequest.newBuilder().setTicket(ticket);
    if (opts.lease != null) {
      b.setLease(FuseboxClient.duration(opts.lease));
    }
    this.request = b.build();
    this.leaseNanos = leaseNanos;
    this.deadlineNanos = deadlineNanos;
  }

  synchronized void start() {
    schedule(leaseNanos / 2);
  }

  private synchronized void schedule(long delayNanos) {
    if (!stopped) {
      timer = Rpc.SCHEDULER.schedule(this::renew, delayNanos, TimeUnit.NANOSECONDS);
    }
  }

  private void renew() {
    CompletableFuture<RenewResponse> f;
    synchronized (this) {
      if (stopped) {
        return;
      }
      f = client.callRenew(request, deadlineNanos, Rpc.DIRECT);
      inFlight = f;
    }
    f.whenComplete(this::answered);
  }

  private void answered(RenewResponse resp, Throwable err) {
    long next;
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

  /** Stops renewing; the future ends once no renewal is on its way. */
  CompletableFuture<Void> stop() {
    CompletableFuture<RenewResponse> f;
    synchronized (this) {
      stopped = true;
      if (timer != null) {
        timer.cancel(false);
      }
      f = inFlight;
    }
    if (f == null) {
      return CompletableFuture.completedFuture(null);
    }
    return f.handle((r, e) -> null);
  }
}
