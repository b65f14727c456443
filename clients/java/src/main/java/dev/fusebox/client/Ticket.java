package dev.fusebox.client;

import java.util.concurrent.atomic.AtomicBoolean;

/**
 * An admission from {@link FuseboxClient#acquire(String, GuardOptions)}: run the call, then report
 * how it went, once. Its lease is renewed in the background until then; the outcome is queued and
 * reported in the background, as a guard's is.
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
  private final Renewer renewer;
  private final AtomicBoolean done = new AtomicBoolean();

  Ticket(FuseboxClient client, Admission admission, GuardOptions opts, long deadlineNanos, long leaseNanos) {
    this.client = client;
    this.admission = admission;
    this.opts = opts;
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
   * Reports {@code outcome}: stops the renewal and queues the outcome for the client's sender,
   * without waiting for fusebox ({@link FuseboxClient#flush} waits for it). The first outcome of a
   * ticket wins; later ones do nothing.
   */
  public void complete(Outcome outcome) {
    java.util.Objects.requireNonNull(outcome, "outcome");
    if (!done.compareAndSet(false, true)) {
      return;
    }
    if (renewer != null) {
      renewer.stop();
    }
    if (admission.ticket() != null) {
      client.report(admission.key(), admission.ticket(), outcome);
    }
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
}
