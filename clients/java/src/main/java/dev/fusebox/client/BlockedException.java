package dev.fusebox.client;

import java.time.Duration;

/**
 * The key's breaker is OPEN (reason {@code open}) or its probe is in flight ({@code
 * probe_in_flight}); the call was not made.
 */
public final class BlockedException extends FuseboxRefusal {
  private static final long serialVersionUID = 1L;

  private final String reason;
  private final Duration retryAfter;
  private final boolean local;

  BlockedException(String key, String reason, Duration retryAfter, boolean local) {
    super(key, message(key, "blocked", reason, retryAfter) + (local ? " (known locally)" : ""), null);
    this.reason = reason;
    this.retryAfter = retryAfter;
    this.local = local;
  }

  /** The contract's lower-case reason: {@code open} or {@code probe_in_flight}. */
  public String reason() {
    return reason;
  }

  /** When to try again; {@code null} when the server gave no hint. */
  public Duration retryAfter() {
    return retryAfter;
  }

  /** True when answered from the local short-circuit cache, without asking the server. */
  public boolean local() {
    return local;
  }

  static String message(String key, String what, String reason, Duration retryAfter) {
    String s = "fusebox: \"" + key + "\" " + what + " (" + reason + ")";
    if (retryAfter != null) {
      s += ", retry after " + retryAfter.toMillis() + " ms";
    }
    return s;
  }
}
