package dev.fusebox.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.fusebox.v1.KeyState;
import dev.fusebox.v1.Limiter;
import dev.fusebox.v1.Policy;
import dev.fusebox.v1.TokenBucket;
import java.time.Duration;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * A call asks with an estimate and reports what it really used (rule U1, {@code
 * CompleteRequest.cost}), through the guard's {@link GuardOptions#costOf} or a ticket's {@link
 * Ticket#complete(Outcome, long)}; fusebox settles the difference, which its key state shows.
 */
class CostTest extends LiveServers {
  /** A bucket of {@code capacity} tokens that refills one an hour: on the manual clock, never. */
  static Policy tokenBucket(int capacity) {
    return Policy.newBuilder()
        .setLimiter(
            Limiter.newBuilder()
                .setTokenBucket(
                    TokenBucket.newBuilder()
                        .setCapacity(capacity)
                        .setRefill(1)
                        .setPeriod(com.google.protobuf.Duration.newBuilder().setSeconds(3600))))
        .build();
  }

  /** The key's free permits once every outcome queued has been answered, with no ticket live. */
  static long free(TestServer s, FuseboxClient c) throws InterruptedException {
    assertTrue(c.flush(Duration.ofSeconds(30)), "the outcomes were not answered within 30 s");
    KeyState st = s.key("k");
    assertEquals(0, st.getLiveTickets(), st.toString());
    return st.getFree();
  }

  /** What a search returns: one permit per row. */
  static List<String> rows(int n) {
    return Collections.nCopies(n, "row");
  }

  @ParameterizedTest
  @EnumSource(Transport.class)
  void theCostReadFromTheValueIsSettled(Transport t) throws Exception {
    TestServer s = server();
    s.setPolicy("k", tokenBucket(10));
    FuseboxClient c =
        client(FuseboxClient.builder(s.addr).deadline(Duration.ofSeconds(2)).transport(t));
    GuardOptions perRow = GuardOptions.defaults().permits(1).costOf((List<String> r) -> r.size());

    assertEquals(rows(5), c.guard("k", perRow, () -> rows(5)));
    assertEquals(5, free(s, c), "1 taken at Acquire, 4 more at Complete");
    assertEquals(rows(0), c.guard("k", perRow, () -> rows(0)));
    assertEquals(5, free(s, c), "the permit taken came back");
    assertEquals(
        rows(3), c.guardAsync("k", perRow, () -> CompletableFuture.completedFuture(rows(3))).get(10, TimeUnit.SECONDS));
    assertEquals(2, free(s, c), "the async guard reports the cost too: 1 taken, 2 more");

    GuardOptions none = GuardOptions.defaults().costOf((List<String> r) -> null);
    c.guard("k", none, () -> rows(9));
    assertEquals(1, free(s, c), "null: no cost, the ticket's permit stands");
    // A value of another type than costOf takes: logged, and the ticket's permit stands.
    assertEquals("not rows", c.guard("k", perRow, () -> "not rows"));
    assertEquals(0, free(s, c));
    assertEquals(5, s.key("k").getStats().getSuccesses(), "every call reported success");
  }

  @ParameterizedTest
  @EnumSource(Transport.class)
  void aTicketReportsItsCost(Transport t) throws Exception {
    TestServer s = server();
    s.setPolicy("k", tokenBucket(10));
    FuseboxClient c =
        client(FuseboxClient.builder(s.addr).deadline(Duration.ofSeconds(2)).transport(t));
    try (Ticket tk = c.acquire("k", GuardOptions.defaults().permits(2))) {
      assertThrows(IllegalArgumentException.class, () -> tk.complete(Outcome.SUCCESS, -1));
      assertThrows(IllegalArgumentException.class, () -> tk.complete(Outcome.SUCCESS, Ticket.MAX_COST + 1));
      tk.complete(Outcome.FAILURE, 6); // a bad cost changed nothing: the ticket still completes
    }
    assertEquals(4, free(s, c), "2 taken at Acquire, 4 more at Complete");
    KeyState st = s.key("k");
    assertEquals(1, st.getStats().getFailures(), st.toString());
  }
}
