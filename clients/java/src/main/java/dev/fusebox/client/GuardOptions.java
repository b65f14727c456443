package dev.fusebox.client;

import java.time.Duration;
import java.util.Objects;
import java.util.function.Function;

/**
 * Options of one guard; immutable, each method returns a changed copy. Unset options take the
 * client's (deadline, fail policy, classifier) or the server's (lease) defaults.
 *
 * <pre>{@code
 * GuardOptions opts = GuardOptions.defaults().lease(Duration.ofSeconds(10)).maxWait(Duration.ofMillis(200));
 * }</pre>
 */
public final class GuardOptions {
  private static final GuardOptions DEFAULTS =
      new GuardOptions(null, Duration.ZERO, null, null, null, null, false, null, null, null);

  final Integer permits;
  final Duration maxWait;
  final Duration lease;
  final Classifier classifier;
  final Duration deadline;
  final FailPolicy onUnavailable;
  final boolean noRenew;
  final Function<Object, Integer> costOf;
  final String caller;
  final Integer attempt;

  private GuardOptions(
      Integer permits,
      Duration maxWait,
      Duration lease,
      Classifier classifier,
      Duration deadline,
      FailPolicy onUnavailable,
      boolean noRenew,
      Function<Object, Integer> costOf,
      String caller,
      Integer attempt) {
    this.permits = permits;
    this.maxWait = maxWait;
    this.lease = lease;
    this.classifier = classifier;
    this.deadline = deadline;
    this.onUnavailable = onUnavailable;
    this.noRenew = noRenew;
    this.costOf = costOf;
    this.caller = caller;
    this.attempt = attempt;
  }

  /** No option set. */
  public static GuardOptions defaults() {
    return DEFAULTS;
  }

  /**
   * Asks for {@code n} permits (default 1). Zero is a status check: the call runs when a permit is
   * free, without a ticket and without reporting an outcome.
   */
  public GuardOptions permits(int n) {
    if (n < 0) {
      throw new IllegalArgumentException("permits must not be negative");
    }
    return new GuardOptions(n, maxWait, lease, classifier, deadline, onUnavailable, noRenew, costOf, caller, attempt);
  }

  /**
   * Lets the request wait in the key's queue up to {@code d} for permits (default: no wait). The
   * Acquire's deadline is then the guard's deadline plus {@code d}.
   */
  public GuardOptions maxWait(Duration d) {
    return new GuardOptions(permits, positive(d), lease, classifier, deadline, onUnavailable, noRenew, costOf, caller, attempt);
  }

  /** Asks for a ticket lease of {@code d} (default, or zero: the policy's). */
  public GuardOptions lease(Duration d) {
    Duration l = positive(d).isZero() ? null : d;
    return new GuardOptions(permits, maxWait, l, classifier, deadline, onUnavailable, noRenew, costOf, caller, attempt);
  }

  /** Replaces the classifier ({@link Classifier#DEFAULT}) for this guard. */
  public GuardOptions classifier(Classifier c) {
    return new GuardOptions(
        permits, maxWait, lease, Objects.requireNonNull(c), deadline, onUnavailable, noRenew, costOf, caller, attempt);
  }

  /**
   * Bounds this guard's Acquire (plus max-wait) and Renews (default: the client's, 50 ms unless
   * set). Its outcome is reported in the background with the client's deadline, at least 1 s.
   */
  public GuardOptions deadline(Duration d) {
    if (positive(d).isZero()) {
      throw new IllegalArgumentException("deadline must be positive");
    }
    return new GuardOptions(permits, maxWait, lease, classifier, d, onUnavailable, noRenew, costOf, caller, attempt);
  }

  /** What happens when fusebox cannot be asked in time (default: the client's, OPEN unless set). */
  public GuardOptions onUnavailable(FailPolicy p) {
    return new GuardOptions(
        permits, maxWait, lease, classifier, deadline, Objects.requireNonNull(p), noRenew, costOf, caller, attempt);
  }

  /** Turns off the background renewal of the ticket's lease. */
  public GuardOptions noRenew() {
    return new GuardOptions(permits, maxWait, lease, classifier, deadline, onUnavailable, true, costOf, caller, attempt);
  }

  /**
   * Reads the permits the call really used from the value it returned, and reports them with its
   * outcome (rule U1, {@code CompleteRequest.cost}): on a token-bucket or window limiter fusebox
   * settles the difference from what the ticket took, up or down (0 gives the permits back). Asked
   * only when the call returns (or its future completes) normally; {@code null} reports no cost, and
   * the ticket's permits stand, as they do when {@code f} throws (a value of another type than
   * {@code f} takes, say) or answers a negative number, which is logged. Other limiter kinds ignore
   * the cost.
   *
   * <pre>{@code
   * List<Hit> hits = client.guard("search/api",
   *     GuardOptions.defaults().permits(1).costOf((List<Hit> h) -> h.size()),
   *     () -> index.search(q));
   * }</pre>
   */
  @SuppressWarnings("unchecked") // the value is the call's; a mismatch is caught when applied
  public <T> GuardOptions costOf(Function<? super T, Integer> f) {
    Function<Object, Integer> any = (Function<Object, Integer>) Objects.requireNonNull(f, "costOf");
    return new GuardOptions(permits, maxWait, lease, classifier, deadline, onUnavailable, noRenew, any, caller, attempt);
  }

  /**
   * Who makes this call, sent as the Acquire's {@code caller} (rule Q1) in place of the client's
   * ({@link FuseboxClient.Builder#caller(String)}); null: the client's; empty: none (fusebox then
   * takes the connection's address), as in every fusebox client library.
   */
  public GuardOptions caller(String name) {
    return new GuardOptions(permits, maxWait, lease, classifier, deadline, onUnavailable, noRenew, costOf, name, attempt);
  }

  /**
   * Which attempt of the caller's own call this is, sent as the Acquire's {@code attempt} (rule
   * R1): 1 (or leaving it out) for a first attempt, 2 and up for a retry, which a retry budget on
   * the key counts. The client never runs a guarded call again by itself, so it marks no retry of
   * its own: a caller that retries says so here.
   *
   * <pre>{@code
   * for (int attempt = 1; ; attempt++) {
   *   try {
   *     return client.guard("payments/charge", GuardOptions.defaults().attempt(attempt), () -> charge(order));
   *   } catch (FuseboxRefusal | ChargeTimeout e) {
   *     if (attempt == 3) throw e;
   *   }
   * }
   * }</pre>
   *
   * @throws IllegalArgumentException {@code n} is negative
   */
  public GuardOptions attempt(int n) {
    if (n < 0) {
      throw new IllegalArgumentException("attempt must not be negative (1 a first attempt, 2 and up a retry), not " + n);
    }
    return new GuardOptions(permits, maxWait, lease, classifier, deadline, onUnavailable, noRenew, costOf, caller, n);
  }

  private static Duration positive(Duration d) {
    if (d == null || d.isNegative()) {
      throw new IllegalArgumentException("a duration must not be null or negative");
    }
    return d;
  }
}
