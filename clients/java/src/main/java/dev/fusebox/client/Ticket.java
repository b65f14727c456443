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

  /**
   * Reports SUCCESS and that the call really used {@code cost} permits; see {@link #complete(Outcome,
   * long)}.
   */
  public void success(long cost) {
    complete(Outcome.SUCCESS, cost);
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
    report(outcome, OutcomeQueue.NO_COST);
  }

  /**
   * Reports {@code outcome} as {@link #complete(Outcome)} does, and that the call really used
   * {@code cost} permits (rule U1, {@code CompleteRequest.cost}): on a token-bucket or window
   * limiter fusebox settles the difference from what the ticket took, up or down (0 gives the
   * permits back); other limiter kinds ignore it.
   *
   * @throws IllegalArgumentException {@code cost} is not from 0 to {@link #MAX_COST}; nothing is
   *     reported then, and the ticket can still be completed
   */
  public void complete(Outcome outcome, long cost) {
    java.util.Objects.requireNonNull(outcome, "outcome");
    if (cost < 0 || cost > MAX_COST) {
      throw new IllegalArgumentException(
          "cost must be a whole number of permits from 0 to " + MAX_COST + ", not " + cost);
    }
    report(outcome, cost);
  }

  /** The largest cost: a uint32 on the wire. */
  public static final long MAX_COST = 0xFFFF_FFFFL;

  private void report(Outcome outcome, long cost) {
    if (!done.compareAndSet(false, true)) {
      return;
    }
    if (renewer != null) {
      renewer.stop();
    }
    if (admission.ticket() != null) {
      client.report(admission.key(), admission.ticket(), outcome, cost);
    }
  }

  /**
   * Reports SUCCESS for a call that returned {@code value}, with the cost the guard's {@link
   * GuardOptions#costOf} reads from it, if any. A cost function that fails or answers a negative
   * number must not lose the value: it is logged and no cost is reported.
   */
  void succeeded(Object value) {
    if (opts.costOf == null || admission.ticket() == null) {
      success();
      return;
    }
    Integer cost;
    try {
      cost = opts.costOf.apply(value);
    } catch (RuntimeException e) {
      FuseboxClient.LOG.warn(
          "fusebox: the cost function of a guard on \"" + admission.key() + "\" failed; reporting no cost, so the"
              + " ticket's permits stand",
          e);
      cost = null;
    }
    if (cost != null && cost < 0) {
      FuseboxClient.LOG.warn(
          "fusebox: the cost function of a guard on \"" + admission.key() + "\" answered " + cost
              + ", not a whole number of permits; reporting no cost, so the ticket's permits stand");
      cost = null;
    }
    if (cost == null) {
      success();
    } else {
      success(cost);
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
