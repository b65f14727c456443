package dev.fusebox.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.fusebox.v1.FuseboxGrpc;
import dev.fusebox.v1.Concurrency;
import dev.fusebox.v1.DecideRequest;
import dev.fusebox.v1.Limiter;
import dev.fusebox.v1.Policy;
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
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.LongAdder;
import org.junit.jupiter.api.Test;

/** {@link Transport#STREAM} against a real fusebox server. */
class StreamTest extends LiveServers {
  /** Counts the calls the client starts, by method, and the Decide messages and frames it sends. */
  static final class Counting implements ClientInterceptor {
    final Map<String, LongAdder> calls = new ConcurrentHashMap<>();
    final LongAdder messages = new LongAdder();
    final LongAdder frames = new LongAdder();
    final AtomicInteger mostFrames = new AtomicInteger();

    long calls(MethodDescriptor<?, ?> m) {
      LongAdder n = calls.get(m.getFullMethodName());
      return n == null ? 0 : n.sum();
    }

    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      calls.computeIfAbsent(method.getFullMethodName(), k -> new LongAdder()).increment();
      return new ForwardingClientCall.SimpleForwardingClientCall<Q, R>(next.newCall(method, options)) {
        @Override
        public void sendMessage(Q message) {
          if (message instanceof DecideRequest) {
            int n = ((DecideRequest) message).getFramesCount();
            messages.increment();
            frames.add(n);
            mostFrames.accumulateAndGet(n, Math::max);
          }
          super.sendMessage(message);
        }
      };
    }
  }

  /** One permit at a time, and a queue. */
  static Policy queued() {
    return Policy.newBuilder()
        .setLimiter(
            Limiter.newBuilder().setConcurrency(Concurrency.newBuilder().setPermits(1)).setQueueLimit(4))
        .build();
  }

  FuseboxClient client(String addr, Counting counting, Duration deadline) {
    FuseboxClient.Builder b = FuseboxClient.builder(addr).deadline(deadline).transport(Transport.STREAM);
    if (counting != null) {
      b.interceptor(counting);
    }
    return client(b);
  }

  @Test
  void unaryIsTheDefault() throws Exception {
    try (FuseboxClient c = FuseboxClient.builder("127.0.0.1:1").build()) {
      assertEquals(Transport.UNARY, c.transport());
    }
  }

  @Test
  void callsAreFramesOfOneStream() throws Exception {
    TestServer s = server();
    s.setPolicy("k", GuardTest.breaker(5, 10));
    Counting counting = new Counting();
    FuseboxClient c = client(s.addr, counting, Duration.ofSeconds(2));
    assertEquals(Transport.STREAM, c.transport());
    assertEquals("ok", c.guard("k", GuardTest::ok));
    assertThrows(GuardTest.Boom.class, () -> c.guard("k", GuardTest::fail));
    GuardTest.flush(c);
    assertEquals(1, s.key("k").getStats().getSuccesses());
    assertEquals(1, s.key("k").getStats().getFailures());
    assertEquals(2, c.stats().completed());
    assertEquals(1, counting.calls(FuseboxGrpc.getDecideMethod()), "one stream");
    assertEquals(0, counting.calls(FuseboxGrpc.getAcquireMethod()));
    assertEquals(0, counting.calls(FuseboxGrpc.getCompleteMethod()));
    assertEquals(0, counting.calls(FuseboxGrpc.getCompleteBatchMethod()));
    assertEquals(4, counting.frames.sum(), "two Acquires and two Completes");
  }

  @Test
  void framesReadyTogetherShareAMessage() throws Exception {
    TestServer s = server();
    Counting counting = new Counting();
    FuseboxClient c = client(s.addr, counting, Duration.ofSeconds(20));
    int n = 3000;
    List<CompletableFuture<String>> all = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      all.add(c.guardAsync("k" + (i % 7), GuardOptions.defaults(), () -> CompletableFuture.completedFuture("ok")));
    }
    for (CompletableFuture<String> f : all) {
      assertEquals("ok", f.get(30, TimeUnit.SECONDS));
    }
    ScenarioTest.waitFor("every outcome", () -> c.stats().completed() == n);
    assertEquals(0, c.stats().failedOpen());
    assertEquals(2L * n, counting.frames.sum(), "an Acquire and a Complete per guard");
    assertTrue(counting.messages.sum() < counting.frames.sum(), counting.messages.sum() + " messages");
    assertTrue(counting.mostFrames.get() <= DecideStream.FRAMES_PER_MESSAGE, counting.mostFrames.get() + " frames");
    assertEquals(1, counting.calls(FuseboxGrpc.getDecideMethod()), "one stream");
  }

  @Test
  void anErrorAnswerIsTheUnaryCallsError() throws Exception {
    TestServer s = server();
    FuseboxClient stream = client(s.addr, null, Duration.ofSeconds(2));
    FuseboxClient unary = client(FuseboxClient.builder(s.addr).deadline(Duration.ofSeconds(2)));
    FuseboxRequestException a = assertThrows(FuseboxRequestException.class, () -> stream.guard("", GuardTest::ok));
    FuseboxRequestException b = assertThrows(FuseboxRequestException.class, () -> unary.guard("", GuardTest::ok));
    assertEquals(Status.Code.INVALID_ARGUMENT, a.status().getCode());
    assertEquals(b.status().getCode(), a.status().getCode());
    assertEquals(b.status().getDescription(), a.status().getDescription());
  }

  @Test
  void aWaitingAcquirePastItsDeadlineIsCancelled() throws Exception {
    TestServer s = server();
    s.setPolicy("k", queued());
    FuseboxClient c = client(s.addr, null, Duration.ofMillis(300));
    Ticket holder = c.acquire("k", GuardOptions.defaults().deadline(Duration.ofSeconds(2)).noRenew());
    assertTrue(holder.admission().ticket() != null);
    // The server's clock is manual: the wait ends only by the client's deadline.
    GuardOptions waiting = GuardOptions.defaults().maxWait(Duration.ofMillis(200)).onUnavailable(FailPolicy.CLOSED);
    UnavailableException e = assertThrows(UnavailableException.class, () -> c.acquire("k", waiting));
    assertEquals(Status.Code.DEADLINE_EXCEEDED, Status.fromThrowable(e.getCause()).getCode());
    ScenarioTest.waitFor("the waiter withdrawn", () -> s.key("k").getWaiters() == 0);
    holder.success();
    // Had the waiter stayed, it would hold the permit now.
    c.forget("k");
    // The deadline was an outage: the client backs off (fails open) for a while first.
    assertTrue(
        ScenarioTest.poll(
            () -> {
              Ticket next = c.acquire("k", GuardOptions.defaults().deadline(Duration.ofSeconds(2)).noRenew());
              next.success();
              return !next.admission().failedOpen();
            }),
        "the permit is free");
  }

  @Test
  void callsInFlightFailUnavailableWhenTheStreamEndsAndItIsOpenedAgain() throws Exception {
    TestServer first = server();
    String addr = first.addr;
    first.setPolicy("k", queued());
    Counting counting = new Counting();
    FuseboxClient c = client(addr, counting, Duration.ofSeconds(2));
    Ticket holder = c.acquire("k", GuardOptions.defaults().noRenew());
    assertFalse(holder.admission().failedOpen());
    CompletableFuture<Admission> waiter =
        CompletableFuture.supplyAsync(
            () -> c.acquire("k", GuardOptions.defaults().maxWait(Duration.ofSeconds(20))).admission());
    ScenarioTest.waitFor("a waiter", () -> first.key("k").getWaiters() == 1);
    first.close();
    Admission a = waiter.get(10, TimeUnit.SECONDS);
    assertTrue(a.failedOpen(), "failed open");
    assertEquals(Status.Code.UNAVAILABLE, Status.fromThrowable(a.cause()).getCode());
    try (TestServer second = TestServer.start(Map.of(), addr)) {
      assertEquals(addr, second.addr);
      assertTrue(
          ScenarioTest.poll(
              () -> {
                try {
                  return !c.acquire("k", GuardOptions.defaults().noRenew()).admission().failedOpen();
                } catch (FuseboxException e) {
                  return false;
                }
              }),
          "no answer from the restarted server");
      assertTrue(counting.calls(FuseboxGrpc.getDecideMethod()) >= 2, "the stream was opened again");
    }
  }
}
