package dev.fusebox.client;

import dev.fusebox.v1.CompleteRequest;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * An admission from {@link FuseboxClient#acquire(String, GuardOptions)}: run the call, then report
 * how it went, once. Its lease is renewed in the background until then.
 *
 * <pre>{@code
 * try (Ticket t = client.acquire("payments/charge", GuardOptions.defaults())) {
 *   charge(order);
 *   t.success();
 * } // without an outcome, close() reports IGNORED
 * }</pre>
 *
 * <p>A ticket of a call running without one ({@link Admission#failedOpen()}, or a status check)
 * reports nothing.
 */
public final class Ticket implements AutoCloseable {
  private final FuseboxClient client;
  private final Admission admission;
  private final GuardOptions opts;
  private final long deadlineNanos;
  private final Renewer renewer;
  private final AtomicBoolean done = new AtomicBoolean();

  Ticket(FuseboxClient client, Admission admission, GuardOptions opts, long deadlineNanos, long leaseNanos) {
    this.client = client;
    this.admission = admission;
    this.opts = opts;
    this.deadlineNanos = deadlineNanos;
    if (admission.ticket() != null && !opts.noRenew && leaseNanos > 0) {
      renewer = new Renewer(client, admission.key(), admission.ticket(), leaseNanos, opts, deadlineNanos);
      renewer.start();
    } else {
      renewer = null;
    }
  }

  /** How the call was let in. */
  public Admission admission() {
    return admission;
  }

  /** Reports SUCCESS. */
  public void success() {
    complete(Outcome.SUCCESS);
  }

  /** Reports FAILURE. */
  public void failure() {
    complete(Outcome.FAILURE);
  }

  /**
   * Reports what the guard's classifier makes of {@code error}; IGNORED when the thread is
   * interrupted or {@code error} is an {@link InterruptedException} (the caller cancelled).
   */
  public void failure(Throwable error) {
    complete(outcomeOf(error));
  }

  /** Reports IGNORED unless an outcome was reported; stops the renewal. */
  @Override
  public void close() {
    complete(Outcome.IGNORED);
  }

  /**
   * Reports {@code outcome}, waiting (at most the deadline) for fusebox to take it; the first
   * outcome of a ticket wins, later ones do nothing. An interrupt does not stop the report.
   */
  public void complete(Outcome outcome) {
    CompletableFuture<Void> f = completeAsync(outcome);
    Rpc.awaitUninterruptibly(f);
  }

  Outcome outcomeOf(Throwable error) {
    if (error instanceof InterruptedException || Thread.currentThread().isInterrupted()) {
      return Outcome.IGNORED; // the caller cancelled
    }
    Classifier c = opts.classifier != null ? opts.classifier : Classifier.DEFAULT;
    try {
      Outcome o = c.classify(error);
      return o != null ? o : Outcome.FAILURE;
    } catch (RuntimeException e) {
      FuseboxClient.LOG.warn("fusebox: the classifier failed; reporting FAILURE", e);
      return Outcome.FAILURE;
    }
  }

  /** Stops the renewal and reports {@code outcome}; the future ends when fusebox answered. */
  CompletableFuture<Void> completeAsync(Outcome outcome) {
    return completeAsync(outcome, Rpc.DIRECT);
  }

  /**
   * As {@link #completeAsync(Outcome)}, with the report's future completed on {@code executor}
   * (null: gRPC's default executor, never its network threads).
   */
  CompletableFuture<Void> completeAsync(Outcome outcome, java.util.concurrent.Executor executor) {
    if (!done.compareAndSet(false, true)) {
      return CompletableFuture.completedFuture(null);
    }
    CompletableFuture<Void> stopped =
        renewer != null ? renewer.stop() : CompletableFuture.completedFuture(null);
    if (admission.ticket() == null) {
      return stopped;
    }
    CompleteRequest req =
        CompleteRequest.newBuilder().setTicket(admission.ticket()).setOutcome(outcome.proto).build();
    return stopped
        .thenCompose(
            v ->
client.callComplete(req, deadlineNanos, executor))
        .handle(
            (r, e) -> {
              if (e == null) {
                client.counters.completed.increment();
              } else {
                client.counters.completeErrors.increment();
                client.logs.warn(
                    "complete",
                    "fusebox: could not report outcome "
                        + outcome
                        + " of \""
                        + admission.key()
                        + "\": "
                        + io.grpc.Status.fromThrowable(e).getCode());
              }
              return null;
            });
  }
}
