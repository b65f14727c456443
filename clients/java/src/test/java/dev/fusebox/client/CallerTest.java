package dev.fusebox.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.fusebox.v1.AcquireRequest;
import dev.fusebox.v1.KeyState;
import dev.fusebox.v1.Policy;
import dev.fusebox.v1.RetryBudget;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import org.junit.jupiter.api.Test;

/**
 * The caller id (rule Q1) and the attempt (rule R1) each Acquire carries. fusebox refuses a caller
 * longer than 128 bytes with INVALID_ARGUMENT naming {@code caller} and takes one of 128: a refusal
 * proves the client sent what it was given, the client's own and a guard's, on both transports.
 */
class CallerTest extends LiveServers {
  private static final String LONG = "c".repeat(129);
  private static final String FITS = "c".repeat(128);

  private FuseboxClient client(TestServer s, Transport t, String caller) {
    return client(FuseboxClient.builder(s.addr).deadline(Duration.ofSeconds(2)).transport(t).caller(caller));
  }

  private static void refusedForCaller(String what, FuseboxRequestException e) {
    Status status = e.status();
    assertEquals(Status.Code.INVALID_ARGUMENT, status.getCode(), what);
    assertTrue(
        status.getDescription() != null && status.getDescription().startsWith("caller:"),
        what + ": want a message naming caller, got " + status.getDescription());
  }

  @Test
  void theClientsCallerAndAGuardsAreSent() throws Exception {
    TestServer s = server();
    for (Transport t : Transport.values()) {
      List<String> ran = new ArrayList<>();
      FuseboxClient c = client(s, t, LONG);
      refusedForCaller(
          t + ", the client's caller",
          assertThrows(FuseboxRequestException.class, () -> c.guard("k", () -> ran.add("client's caller"))));
      c.guard("k", GuardOptions.defaults().caller("checkout"), () -> ran.add("a guard's caller replaces the client's"));

      FuseboxClient fits = client(s, t, FITS);
      fits.guard("k", () -> ran.add("128 bytes"));
      refusedForCaller(
          t + ", a guard's caller",
          assertThrows(
              FuseboxRequestException.class,
              () -> fits.guard("k", GuardOptions.defaults().caller(LONG), () -> ran.add("a guard's caller"))));
      assertEquals(List.of("a guard's caller replaces the client's", "128 bytes"), ran, t.toString());
    }
  }

  /** Keeps the Acquire requests the client sends. */
  private static final class Recording implements ClientInterceptor {
    final List<AcquireRequest> sent = new CopyOnWriteArrayList<>();

    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      return new ForwardingClientCall.SimpleForwardingClientCall<Q, R>(next.newCall(method, options)) {
        @Override
        public void sendMessage(Q message) {
          if (message instanceof AcquireRequest) {
            sent.add((AcquireRequest) message);
          }
          super.sendMessage(message);
        }
      };
    }
  }

  @Test
  void theAttemptAndTheCallerGoOnTheWire() throws Exception {
    TestServer s = server();
    Recording wire = new Recording();
    FuseboxClient c =
        client(FuseboxClient.builder(s.addr).deadline(Duration.ofSeconds(2)).caller("billing").interceptor(wire));
    c.guard("k", () -> "first");
    c.guard("k", GuardOptions.defaults().attempt(3).caller("billing-retrier"), () -> "retry");
    c.guard("k", GuardOptions.defaults().caller(""), () -> "anonymous");
    assertEquals(3, wire.sent.size());
    assertEquals("", wire.sent.get(2).getCaller(), "an empty caller sends none");
    AcquireRequest first = wire.sent.get(0);
    AcquireRequest retry = wire.sent.get(1);
    assertFalse(first.hasAttempt(), "no attempt unless one is given");
    assertEquals("billing", first.getCaller());
    assertEquals(3, retry.getAttempt());
    assertEquals("billing-retrier", retry.getCaller());
  }

  @Test
  void aNegativeAttemptIsRefusedNamingIt() {
    IllegalArgumentException e =
        assertThrows(IllegalArgumentException.class, () -> GuardOptions.defaults().attempt(-1));
    assertTrue(e.getMessage().startsWith("attempt must not be negative"), e.getMessage());
  }

  /**
   * A key whose retry budget has seen no first attempt denies a retry (rule R2: DENIED
   * retry_budget, no hint) and grants a first attempt: the attempt reaches the server's budget.
   */
  @Test
  void theAttemptIsCountedByTheRetryBudget() throws Exception {
    TestServer s = server();
    s.setPolicy(
        "budget/*",
        Policy.newBuilder()
            .setRetryBudget(
                RetryBudget.newBuilder()
                    .setRatio(0.1)
                    .setMinPerSecond(0)
                    .setWindow(com.google.protobuf.Duration.newBuilder().setSeconds(10)))
            .build());
    for (Transport t : Transport.values()) {
      FuseboxClient c = client(s, t, null);
      String key = "budget/" + t;
      List<String> ran = new ArrayList<>();
      DeniedException denied =
          assertThrows(
              DeniedException.class,
              () -> c.guard(key, GuardOptions.defaults().attempt(2), () -> ran.add("a retry")));
      assertEquals("retry_budget", denied.reason(), t.toString());
      assertNull(denied.retryAfter(), t + ": no hint");
      c.guard(key, GuardOptions.defaults().attempt(1), () -> ran.add("a first attempt"));
      assertEquals(List.of("a first attempt"), ran, t.toString());
    }
  }

  /**
   * On a shadow policy ({@code enforce = false}, rule D1) a retry the budget would deny runs, its
   * admission says what it would have been, and its outcome is reported: fusebox counts a shadow
   * grant and takes the shadow ticket's completion (stale, D2), leaving no ticket live.
   */
  @Test
  void aShadowPolicyRunsTheCallAndSaysWhatItWouldHaveBeen() throws Exception {
    TestServer s = server();
    s.setPolicy(
        "dry/*",
        Policy.newBuilder()
            .setEnforce(false)
            .setRetryBudget(
                RetryBudget.newBuilder()
                    .setRatio(0.1)
                    .setMinPerSecond(0)
                    .setWindow(com.google.protobuf.Duration.newBuilder().setSeconds(10)))
            .build());
    for (Transport t : Transport.values()) {
      FuseboxClient c = client(s, t, null);
      String key = "dry/" + t;
      Admission shadow =
          c.guard(key, GuardOptions.defaults().attempt(2), () -> FuseboxClient.admission().orElseThrow());
      assertTrue(shadow.ticket() != null && shadow.shadow(), t + ": want a shadow ticket, got " + shadow);
      assertEquals("denied", shadow.shadowDecision(), t.toString());
      assertEquals("retry_budget", shadow.shadowReason(), t.toString());
      Admission real =
          c.guard(key, GuardOptions.defaults().attempt(1), () -> FuseboxClient.admission().orElseThrow());
      assertTrue(real.ticket() != null && !real.shadow(), t + ": want a real ticket, got " + real);
      assertNull(real.shadowDecision(), t.toString());
      assertNull(real.shadowReason(), t.toString());

      // A ticket of acquire() carries the same admission.
      try (Ticket ticket = c.acquire(key, GuardOptions.defaults().attempt(2))) {
        assertEquals("denied", ticket.admission().shadowDecision(), t.toString());
        assertEquals("retry_budget", ticket.admission().shadowReason(), t.toString());
        ticket.success();
      }

      assertTrue(c.flush(Duration.ofSeconds(30)), t + ": flush");
      assertEquals(3, c.stats().completed(), t.toString());
      assertEquals(0, c.stats().completeFailures(), t.toString());
      KeyState state = s.key(key);
      assertEquals(2, state.getStats().getShadow(), t + ": " + state);
      assertEquals(1, state.getStats().getGranted(), t + ": " + state);
      assertEquals(2, state.getStats().getStale(), t + ": the shadow tickets' outcomes were taken, " + state);
      assertEquals(1, state.getStats().getSuccesses(), t + ": " + state);
      assertEquals(0, state.getLiveTickets(), t + ": " + state);
    }
  }
}
