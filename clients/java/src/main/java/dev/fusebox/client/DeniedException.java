package dev.fusebox.client;

import java.time.Duration;

/**
 * The breaker admitted but the permit book did not ({@code no_permits}, {@code queue_full}, {@code
 * exceeds_limit}, {@code evicted}, {@code timeout}); the call was not made.
 */
public final class DeniedException extends FuseboxRefusal {
  private static final long serialVersionUID = 1L;

  private final String reason;
  private final Duration retryAfter;

  DeniedException(String key, String reason, Duration retryAfter) {
    super(key, BlockedException.message(key, "denied", reason, retryAfter), null);
    this.reason = reason;
    this.retryAfter = retryAfter;
  }

  /** The contract's lower-case reason, such as {@code no_permits}. */
  public String reason() {
    return reason;
  }

  /** When to try again; {@code null} when the server gave no hint. */
  public Duration retryAfter() {
    return retryAfter;
  }
}
