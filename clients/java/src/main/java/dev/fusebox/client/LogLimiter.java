package dev.fusebox.client;

import java.util.HashMap;
import java.util.Map;
import org.slf4j.Logger;

/**
 * Logs each kind of trouble (fusebox unavailable, a failed Complete or Renew) at most once per
 * interval, saying how many were left unlogged since the last line.
 */
final class LogLimiter {
  private final Logger logger;
  private final long intervalNanos;
  private final Map<String, Long> last = new HashMap<>();
  private final Map<String, Integer> skipped = new HashMap<>();

  LogLimiter(Logger logger, long intervalNanos) {
    this.logger = logger;
    this.intervalNanos = intervalNanos;
  }

  void warn(String kind, String message) {
    int unlogged;
    synchronized (this) {
      long now = System.nanoTime();
      Long l = last.get(kind);
      if (l != null && now - l < intervalNanos) {
        skipped.merge(kind, 1, Integer::sum);
        return;
      }
      last.put(kind, now);
      Integer s = skipped.put(kind, 0);
      unlogged = s == null ? 0 : s;
    }
    if (unlogged > 0) {
      message += " (" + unlogged + " more since the last report)";
    }
    logger.warn(message);
  }
}
