package dev.fusebox.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Duration;
import dev.fusebox.v1.Breaker;
import dev.fusebox.v1.Concurrency;
import dev.fusebox.v1.Consecutive;
import dev.fusebox.v1.IsolateRequest;
import dev.fusebox.v1.KeyState;
import dev.fusebox.v1.Limiter;
import dev.fusebox.v1.Phase;
import dev.fusebox.v1.Policy;
import io.grpc.Status;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/** The guard against a real fusebox server. */
class GuardTest extends LiveServers {
  static final class Boom extends Exception {
    private static final long serialVersionUID = 1L;

    Boom() {
      super("boom");
    }
  }

  /** A client with a deadline that a busy machine running a debug server keeps. */
  FuseboxClient client(TestServer s) {
    return client(FuseboxClient.builder(s.addr).deadline(java.time.Duration.ofSeconds(2)));
  }

  static Policy breaker(int failures, long breakSeconds) {
    return Policy.newBuilder()
        .setBreaker(
            Breaker.newBuilder()
                .setConsecutive(Consecutive.newBuilder().setFailures(failures))
                .setBreakDuration(Duration.newBuilder().setSeconds(breakSeconds)))
        .build();
  }

  static Policy concurrency(int permits) {
    return Policy.newBuilder()
        .setLimiter(Limiter.newBuilder().setConcurrency(Concurrency.newBuilder().setPermits(permits)))
        .build();
  }

  static String ok() {
    return "ok";
  }

  /**
   * Waits until fusebox answered every outcome the client queued: guards report in the
   * background, so a test reads the server's state, or makes a call that must see an outcome,
   * after this.
   */
  static void flush(FuseboxClient c) throws InterruptedException {
    assertTrue(c.flush(java.time.Duration.ofSeconds(30)), "the outcomes were not answered within 30 s");
  }

  static String fail() throws Boom {
    throw new Boom();
  }

  @Test
  void successAndFailureAreReported() throws Exception {
    TestServer s = server();
    s.setPolicy("k", breaker(5, 10));
    FuseboxClient c = client(s);
    assertEquals("ok", c.guard("k", GuardTest::ok));
    assertThrows(Boom.class, () -> c.guard("k", GuardTest::fail), "the call's own exception, unchanged");
    flush(c);
    KeyState st = s.key("k");
    assertEquals(1, st.getStats().getSuccesses());
    assertEquals(1, st.getStats().getFailures());
    assertEquals(2, c.stats().completed());
  }

  @Test
  void breakerTripsThenLocalShortCircuitThenProbe() throws Exception {
    TestServer s = server();
    s.setPolicy("k", breaker(2, 10));
    AtomicLong now = new AtomicLong();
    FuseboxClient c = client(FuseboxClient.builder(s.addr).deadline(java.time.Duration.ofSeconds(2)).ticker(now::get));
    assertThrows(Boom.class, () -> c.guard("k", GuardTest::fail));
    assertThrows(Boom.class, () -> c.guard("k", GuardTest::fail));
    flush(c); // the failures reach fusebox before the next Acquire

    BlockedException b = assertThrows(BlockedException.class, () -> c.guard("k", GuardTest::ok));
    assertFalse(b.local());
    assertEquals("open", b.reason());
    assertEquals(java.time.Duration.ofSeconds(10), b.retryAfter());
    b = assertThrows(BlockedException.class, () -> c.guard("k", GuardTest::ok));
    assertTrue(b.local());
    assertInstanceOf(FuseboxRefusal.class, b);
    assertEquals(1, s.key("k").getStats().getBlocked(), "the local answer did not reach the server");

    s.advance(java.time.Duration.ofSeconds(10));
    now.addAndGet(TimeUnit.SECONDS.toNanos(10));
    boolean probe = c.guard("k", () -> FuseboxClient.admission().orElseThrow().probe());
    assertTrue(probe, "the first call after the break is the probe");
    flush(c);
    assertEquals(Phase.PHASE_CLOSED, s.key("k").getPhase());
    Stats st = c.stats();
    assertEquals(1, st.blockedLocal());
    assertEquals(1, st.blocked());
    assertEquals(1, st.probes());
  }

  @Test
  void refusedWhenIsolated() throws Exception {
    TestServer s = server();
    s.admin.isolate(IsolateRequest.newBuilder().setKey("k").setReason("test").build());
    FuseboxClient c = client(s);
    AtomicBoolean ran = new AtomicBoolean();
    RefusedException e = assertThrows(RefusedException.class, () -> c.guard("k", () -> ran.getAndSet(true)));
    assertEquals("k", e.key());
    assertFalse(ran.get());
  }

  @Test
  void deniedWhenNoPermits() throws Exception {
    TestServer s = server();
    s.setPolicy("k", concurrency(1));
    FuseboxClient c = client(s);
    DeniedException inner =
        c.guard(
            "k",
            () -> {
              assertNull(FuseboxClient.admission().orElseThrow().cause());
              DeniedException d = assertThrows(DeniedException.class, () -> c.guard("k", GuardTest::ok));
              assertEquals("k", FuseboxClient.admission().orElseThrow().key(), "the outer admission is back");
              return d;
            });
    assertEquals("no_permits", inner.reason());
    assertNull(inner.retryAfter());
    assertTrue(FuseboxClient.admission().isEmpty(), "no admission outside a guard");
  }

  @Test
  void interruptedCallIsIgnored() throws Exception {
    TestServer s = server();
    s.setPolicy("k", breaker(1, 1));
    FuseboxClient c = client(s);
    AtomicReference<Throwable> got = new AtomicReference<>();
    Thread t = new Thread(() -> {
      try {
        c.guard("k", () -> {
          Thread.currentThread().interrupt();
          new CountDownLatch(1).await();
          return "not interrupted";
        });
      } catch (Throwable e) {
        got.set(e);
      }
    });
    t.start();
    t.join(10_000);
    assertInstanceOf(InterruptedException.class, got.get());
    flush(c);
    KeyState st = s.key("k");
    assertEquals(1, st.getStats().getIgnored());
    assertEquals(Phase.PHASE_CLOSED, st.getPhase());
  }

  @Test
  void classifierIsReplaceable() throws Exception {
    TestServer s = server();
    s.setPolicy("k", breaker(1, 1));
    FuseboxClient c = client(s);
    assertThrows(Boom.class, () -> c.guard("k", GuardOptions.defaults().classifier(e -> Outcome.IGNORED), GuardTest::fail));
    flush(c);
    KeyState st = s.key("k");
    assertEquals(1, st.getStats().getIgnored());
    assertEquals(Phase.PHASE_CLOSED, st.getPhase());
  }

  @Test
  void defaultClassifierIgnoresCancellationsOnly() {
    assertEquals(Outcome.FAILURE, Classifier.DEFAULT.classify(new Boom()));
    assertEquals(Outcome.FAILURE, Classifier.DEFAULT.classify(Status.DEADLINE_EXCEEDED.asRuntimeException()));
    assertEquals(Outcome.IGNORED, Classifier.DEFAULT.classify(Status.CANCELLED.asRuntimeException()));
    assertEquals(Outcome.IGNORED, Classifier.DEFAULT.classify(new InterruptedException()));
    assertEquals(Outcome.IGNORED, Classifier.DEFAULT.classify(new java.util.concurrent.CancellationException()));
  }

  @Test
  void anErrorIsAFailure() throws Exception {
    TestServer s = server();
    s.setPolicy("k", breaker(5, 1));
    FuseboxClient c = client(s);
    assertThrows(AssertionError.class, () -> c.guard("k", () -> {
      throw new AssertionError("x");
    }));
    flush(c);
    assertEquals(1, s.key("k").getStats().getFailures());
  }

  @Test
  void leaseIsRenewedInTheBackground() throws Exception {
    TestServer s = server();
    s.setPolicy("k", breaker(5, 1));
    FuseboxClient c = client(s);
    int timers = Renewer.Timers.INSTANCE.size();
    long renewals =
        c.guard(
            "k",
            GuardOptions.defaults().lease(java.time.Duration.ofMillis(100)),
            () -> {
              ScenarioTest.waitFor("two renewals", () -> c.stats().renewals() >= 2);
              return c.stats().renewals();
            });
    assertTrue(renewals >= 2);
    flush(c);
    assertEquals(1, c.stats().completed());
    KeyState st = s.key("k");
    assertEquals(1, st.getStats().getSuccesses());
    assertEquals(0, st.getLiveTickets());
    assertEquals(timers, Renewer.Timers.INSTANCE.size(), "the ended call left its renewal timer");
    long after = c.stats().renewals() + c.stats().renewErrors();
    // Renewal stopped with the call: nothing more is sent, whatever time passes.
    CountDownLatch never = new CountDownLatch(1);
    assertFalse(never.await(300, TimeUnit.MILLISECONDS));
    assertEquals(after, c.stats().renewals() + c.stats().renewErrors());
  }

  @Test
  void renewalStopsWhenTheTicketIsGone() throws Exception {
    TestServer s = server();
    FuseboxClient c = client(s);
    c.guard("k", GuardOptions.defaults().lease(java.time.Duration.ofMillis(400)), () -> {
      s.advance(java.time.Duration.ofSeconds(1)); // the lease ends on the server
      ScenarioTest.waitFor("a renewal answered NOT_FOUND", () -> c.stats().renewErrors() == 1);
      // Another error would be retried after a quarter lease (100 ms); NOT_FOUND is not.
      assertFalse(new CountDownLatch(1).await(500, TimeUnit.MILLISECONDS));
      assertEquals(1, c.stats().renewErrors());
      return null;
    });
    assertEquals(1, s.key("k").getStats().getExpired());
  }

  @Test
  void noRenewSendsNoRenewal() throws Exception {
    TestServer s = server();
    FuseboxClient c = client(s);
    c.guard("k", GuardOptions.defaults().lease(java.time.Duration.ofMillis(20)).noRenew(), () -> {
      assertFalse(new CountDownLatch(1).await(100, TimeUnit.MILLISECONDS));
      return null;
    });
    assertEquals(0, c.stats().renewals() + c.stats().renewErrors());
  }

  @Test
  void fuseboxDownFailsOpenOrClosed() throws Exception {
    TestServer s = server();
    FuseboxClient c = client(s);
    assertEquals("ok", c.guard("k", GuardTest::ok));
    s.stop();
    Admission a = c.guard("k", () -> FuseboxClient.admission().orElseThrow());
    assertTrue(a.failedOpen());
    assertNull(a.ticket());
    assertInstanceOf(io.grpc.StatusRuntimeException.class, a.cause());
    AtomicBoolean ran = new AtomicBoolean();
    UnavailableException e =
        assertThrows(
            UnavailableException.class,
            () -> c.guard("k", GuardOptions.defaults().onUnavailable(FailPolicy.CLOSED), () -> ran.getAndSet(true)));
    assertFalse(ran.get());
    assertEquals(Status.Code.UNAVAILABLE, Status.fromThrowable(e.getCause()).getCode());
    Stats st = c.stats();
    assertEquals(1, st.failedOpen());
    assertEquals(1, st.failedClosed());
    assertEquals(2, st.unavailable());
  }

  @Test
  void failClosedIsAClientOption() throws Exception {
    TestServer s = server();
    FuseboxClient c = client(FuseboxClient.builder(s.addr).failPolicy(FailPolicy.CLOSED));
    s.stop();
    assertThrows(UnavailableException.class, () -> c.guard("k", GuardTest::ok));
    assertEquals(1, c.stats().failedClosed());
  }

  @Test
  void unavailableIsLoggedOncePerInterval() throws Exception {
    TestServer s = server();
    RecordingLogger logger = new RecordingLogger();
    FuseboxClient c = client(FuseboxClient.builder(s.addr).logger(logger).logInterval(java.time.Duration.ofHours(1)));
    s.stop();
    for (int i = 0; i < 3; i++) {
      c.guard("k", GuardTest::ok);
    }
    assertEquals(1, logger.count("failing open"), logger.lines().toString());
    assertEquals(3, c.stats().failedOpen());
  }

  @Test
  void badKeyIsARequestError() throws Exception {
    TestServer s = server();
    FuseboxClient c = client(s);
    FuseboxRequestException e = assertThrows(FuseboxRequestException.class, () -> c.guard("", GuardTest::ok));
    assertEquals(Status.Code.INVALID_ARGUMENT, e.status().getCode());
    assertEquals(1, c.stats().requestErrors());
  }

  @Test
  void statusCheckRunsWithoutATicket() throws Exception {
    TestServer s = server();
    s.setPolicy("k", concurrency(1));
    FuseboxClient c = client(s);
    Admission a = c.guard("k", GuardOptions.defaults().permits(0), () -> FuseboxClient.admission().orElseThrow());
    assertNull(a.ticket());
    assertFalse(a.failedOpen());
    assertEquals(0, s.key("k").getStats().getSuccesses());
  }

  @Test
  void ticketClosedWithoutAnOutcomeIsIgnored() throws Exception {
    TestServer s = server();
    FuseboxClient c = client(s);
    try (Ticket t = c.acquire("k", GuardOptions.defaults())) {
      assertTrue(t.admission().ticket() != null);
    }
    try (Ticket t = c.acquire("k", GuardOptions.defaults())) {
      t.failure();
      t.success(); // the first outcome wins
    }
    flush(c);
    KeyState st = s.key("k");
    assertEquals(1, st.getStats().getIgnored());
    assertEquals(1, st.getStats().getFailures());
    assertEquals(0, st.getStats().getSuccesses());
    assertEquals(0, st.getLiveTickets());
  }

  @Test
  void asyncGuardReportsItsFuture() throws Exception {
    TestServer s = server();
    FuseboxClient c = client(s);
    assertEquals("ok", c.guardAsync("k", GuardOptions.defaults(), () -> CompletableFuture.completedFuture("ok")).get(10, TimeUnit.SECONDS));
    CompletableFuture<String> failing =
        c.guardAsync("k", GuardOptions.defaults(), () -> CompletableFuture.failedFuture(new Boom()));
    java.util.concurrent.ExecutionException e =
        assertThrows(java.util.concurrent.ExecutionException.class, () -> failing.get(10, TimeUnit.SECONDS));
    assertInstanceOf(Boom.class, e.getCause());
    ScenarioTest.waitFor("two outcomes", () -> s.key("k").getStats().getSuccesses() == 1 && s.key("k").getStats().getFailures() == 1);
  }

  @Test
  void asyncGuardCompletesOffTheNetworkThreads() throws Exception {
    TestServer s = server();
    FuseboxClient c = client(s);
    CompletableFuture<String> inner = new CompletableFuture<>();
    CountDownLatch started = new CountDownLatch(1);
    CompletableFuture<String> f = c.guardAsync("k", GuardOptions.defaults(), () -> {
      started.countDown();
      return inner;
    });
    assertTrue(started.await(10, TimeUnit.SECONDS));
    // A dependent stage that blocks on fusebox: on a network thread it would stall the answer.
    CompletableFuture<Admission> nested =
        f.thenApply(
            v -> {
              assertFalse(Thread.currentThread().getName().contains("ELG"), Thread.currentThread().getName());
              try {
                return c.guard("k2", () -> FuseboxClient.admission().orElseThrow());
              } catch (Exception e) {
                throw new java.util.concurrent.CompletionException(e);
              }
            });
    inner.complete("ok");
    Admission a = nested.get(30, TimeUnit.SECONDS);
    assertFalse(a.failedOpen(), "a guard in a dependent stage was answered");
    flush(c);
    assertEquals(1, s.key("k").getStats().getSuccesses());
  }

  /** Counts the Acquire calls a client makes in {@code acquires}. */
  private static io.grpc.ClientInterceptor countingAcquires(java.util.concurrent.atomic.AtomicInteger acquires) {
    return new io.grpc.ClientInterceptor() {
      @Override
      public <Q, R> io.grpc.ClientCall<Q, R> interceptCall(
          io.grpc.MethodDescriptor<Q, R> method, io.grpc.CallOptions options, io.grpc.Channel next) {
        if (method.getFullMethodName().endsWith("/Acquire")) {
          acquires.incrementAndGet();
        }
        return next.newCall(method, options);
      }
    };
  }

  /** The backoff reads the injected ticker: guards back off until it passes the window, then ask. */
  @Test
  void outageBackoffFollowsTheInjectedTicker() throws Exception {
    TestServer s = server();
    java.util.concurrent.atomic.AtomicInteger acquires = new java.util.concurrent.atomic.AtomicInteger();
    java.util.concurrent.atomic.AtomicLong now = new java.util.concurrent.atomic.AtomicLong(1_000_000_000L);
    FuseboxClient c =
        client(
            FuseboxClient.builder(s.addr)
                .deadline(java.time.Duration.ofSeconds(2))
                .interceptor(countingAcquires(acquires))
                .ticker(now::get));
    assertEquals("ok", c.guard("k", GuardTest::ok));
    s.stop();
    for (int i = 0; i < 3; i++) {
      assertTrue(c.guard("k", () -> FuseboxClient.admission().orElseThrow()).failedOpen());
    }
    assertEquals(2, acquires.get(), "backing off on the injected ticker");
    now.addAndGet(TimeUnit.MILLISECONDS.toNanos(99));
    c.guard("k", GuardTest::ok);
    assertEquals(2, acquires.get(), "1 ms before the window ends");
    now.addAndGet(TimeUnit.MILLISECONDS.toNanos(1));
    c.guard("k", GuardTest::ok);
    assertEquals(3, acquires.get(), "once the window ended");
  }

  @Test
  void outageBacksOffBeforeAskingAgain() throws Exception {
    TestServer s = server();
    java.util.concurrent.atomic.AtomicInteger acquires = new java.util.concurrent.atomic.AtomicInteger();
    io.grpc.ClientInterceptor count = countingAcquires(acquires);
    FuseboxClient c = client(FuseboxClient.builder(s.addr).deadline(java.time.Duration.ofSeconds(2)).interceptor(count));
    assertEquals("ok", c.guard("k", GuardTest::ok));
    s.stop();
    for (int i = 0; i < 3; i++) {
      assertTrue(c.guard("k", () -> FuseboxClient.admission().orElseThrow()).failedOpen());
    }
    assertThrows(
        UnavailableException.class,
        () -> c.guard("k", GuardOptions.defaults().onUnavailable(FailPolicy.CLOSED), GuardTest::ok));
    assertEquals(2, acquires.get(), "the guards after the outage are answered by the backoff");
    Stats st = c.stats();
    assertEquals(4, st.unavailable());
    assertEquals(3, st.failedOpen());
    assertEquals(1, st.failedClosed());
    assertEquals(TimeUnit.MILLISECONDS.toNanos(200), c.backoff.next(), "one outage, one step");
  }

  @Test
  void outageBackoffDoublesOncePerWindowAndResets() {
    FuseboxClient.OutageBackoff b = new FuseboxClient.OutageBackoff();
    long ms = TimeUnit.MILLISECONDS.toNanos(1);
    b.outage(0);
    b.outage(ms); // the same blip: no second step
    assertTrue(b.backingOff(99 * ms));
    assertFalse(b.backingOff(100 * ms));
    assertEquals(200 * ms, b.next());
    long now = 100 * ms;
    for (int i = 0; i < 10; i++) {
      b.outage(now);
      now += b.next();
    }
    assertEquals(5000 * ms, b.next());
    b.answered();
    assertFalse(b.backingOff(now));
    assertEquals(100 * ms, b.next());
  }

  @Test
  void cancelledAsyncGuardIsIgnored() throws Exception {
    TestServer s = server();
    s.setPolicy("k", breaker(1, 1));
    FuseboxClient c = client(s);
    CompletableFuture<String> inner = new CompletableFuture<>();
    CountDownLatch started = new CountDownLatch(1);
    CompletableFuture<String> f = c.guardAsync("k", GuardOptions.defaults(), () -> {
      started.countDown();
      return inner;
    });
    assertTrue(started.await(10, TimeUnit.SECONDS));
    assertTrue(f.cancel(true));
    ScenarioTest.waitFor("cancelling the guard cancels the call", inner::isCancelled);
    ScenarioTest.waitFor("the outcome", () -> s.key("k").getStats().getIgnored() == 1);
    KeyState st = s.key("k");
    assertEquals(0, st.getStats().getFailures());
    assertEquals(0, st.getLiveTickets());
    assertEquals(Phase.PHASE_CLOSED, st.getPhase());
  }

  @Test
  void asyncRefusalFailsTheFuture() throws Exception {
    TestServer s = server();
    s.admin.isolate(IsolateRequest.newBuilder().setKey("k").setReason("test").build());
    FuseboxClient c = client(s);
    CompletableFuture<String> f = c.guardAsync("k", GuardOptions.defaults(), () -> CompletableFuture.completedFuture("ran"));
    java.util.concurrent.ExecutionException e =
        assertThrows(java.util.concurrent.ExecutionException.class, () -> f.get(10, TimeUnit.SECONDS));
    assertInstanceOf(RefusedException.class, e.getCause());
  }

  @Test
  void cacheIsBounded() {
    OpenCache cache = new OpenCache(2);
    long s = TimeUnit.SECONDS.toNanos(1);
    cache.put("a", s, 0);
    cache.put("b", 3 * s, 0);
    cache.put("c", 2 * s, 0);
    assertEquals(2, cache.size());
    assertEquals(0, cache.blockedFor("a", 0), "the entry ending soonest went first");
    assertEquals(3 * s, cache.blockedFor("b", 0));
    assertEquals(0, cache.blockedFor("c", 2 * s));
    assertEquals(1, cache.size(), "an ended entry is dropped");
    cache.forget("b");
    assertEquals(0, cache.size());
  }

  @Test
  void cacheOfSizeZeroRemembersNothing() throws Exception {
    TestServer s = server();
    s.setPolicy("k", breaker(1, 10));
    FuseboxClient c = client(FuseboxClient.builder(s.addr).deadline(java.time.Duration.ofSeconds(2)).cacheSize(0));
    assertThrows(Boom.class, () -> c.guard("k", GuardTest::fail));
    flush(c);
    assertFalse(assertThrows(BlockedException.class, () -> c.guard("k", GuardTest::ok)).local());
    assertFalse(assertThrows(BlockedException.class, () -> c.guard("k", GuardTest::ok)).local());
    assertEquals(2, s.key("k").getStats().getBlocked());
  }

  @Test
  void forgetAsksTheServerAgain() throws Exception {
    TestServer s = server();
    s.setPolicy("k", breaker(1, 10));
    FuseboxClient c = client(s);
    assertThrows(Boom.class, () -> c.guard("k", GuardTest::fail));
    flush(c);
    assertFalse(assertThrows(BlockedException.class, () -> c.guard("k", GuardTest::ok)).local());
    assertTrue(assertThrows(BlockedException.class, () -> c.guard("k", GuardTest::ok)).local());
    c.forget("k");
    assertFalse(assertThrows(BlockedException.class, () -> c.guard("k", GuardTest::ok)).local());
  }

  @Test
  void sharedIsOneClientPerTarget() throws Exception {
    TestServer s = server();
    FuseboxClient a = closed(FuseboxClient.shared(s.addr));
    FuseboxClient b = FuseboxClient.builder(s.addr).token("ignored").shared();
    assertSame(a, b);
    assertSame(a.channel(), b.channel());
    a.close();
    FuseboxClient again = closed(FuseboxClient.shared(s.addr));
    assertFalse(again == a, "a closed client is no longer shared");
  }
}
