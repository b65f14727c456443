package dev.fusebox.client;

import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;

/**
 * Remembers keys the server reported OPEN until a deadline (in {@link System#nanoTime()} units),
 * so that guards answer Blocked locally until then. It is bounded: when full, ended entries go
 * first, then the one that ends soonest. Once an entry ends the next request goes to the server,
 * which admits one probe for the whole fleet.
 */
final class OpenCache {
  private final int limit;
  private final Map<String, Long> until = new HashMap<>();

  OpenCache(int limit) {
    this.limit = limit;
  }

  /** How many nanoseconds {@code key} is still known OPEN at {@code now}; 0: not known. */
  synchronized long blockedFor(String key, long now) {
    Long u = until.get(key);
    if (u == null) {
      return 0;
    }
    if (u - now <= 0) {
      until.remove(key);
      return 0;
    }
    return u - now;
  }

  synchronized void put(String key, long end, long now) {
    if (limit <= 0) {
      return;
    }
    if (!until.containsKey(key) && until.size() >= limit) {
      String victim = null;
      long soonest = 0;
      for (Iterator<Map.Entry<String, Long>> it = until.entrySet().iterator(); it.hasNext(); ) {
        Map.Entry<String, Long> e = it.next();
        if (e.getValue() - now <= 0) {
          it.remove();
          continue;
        }
        if (victim == null || e.getValue() - soonest < 0) {
          victim = e.getKey();
          soonest = e.getValue();
        }
      }
      if (until.size() >= limit && victim != null) {
        until.remove(victim);
      }
    }
    until.put(key, end);
  }

  synchronized void forget(String key) {
    until.remove(key);
  }

  synchronized int size() {
    return until.size();
  }
}
