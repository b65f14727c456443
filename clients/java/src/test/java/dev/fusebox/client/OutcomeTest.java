package dev.fusebox.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.fusebox.v1.CompleteBatchRequest;
import dev.fusebox.v1.DecideFrame;
import dev.fusebox.v1.DecideRequest;
import dev.fusebox.v1.FuseboxGrpc;
import dev.fusebox.v1.KeyState;
import dev.fusebox.v1.Policy;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.MethodDescriptor;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * Outcomes off the caller's path (clients/README.md): the outcome queue, its sender, flush and
 * close, against a real server that the tests stop (SIGSTOP) and let go on (SIGCONT) or kill.
 */
class OutcomeTest extends LiveServers {
  /**
   * A client whose deadline outlasts any stop of the server in these tests: a report in flight
   * while it is stopped is answered once it goes on, not failed.
   */
  static FuseboxClient.Builder builder(TestServer s, Transport t) {
    return FuseboxClient.builder(s.addr).deadline(Duration.ofSeconds(10)).transport(t);
  }

  static final Duration FLUSH = Duration.ofSeconds(30);

  @ParameterizedTest
  @EnumSource(Transport.class)
  void theGuardReturnsWithoutWaitingForItsOutcome(Transport t) throws Exception {
    TestServer s = server();
    FuseboxClient c = client(builder(s, t));
    String value =
        c.guard(
            "k",
            () -> {
              s.pause(); // granted; fusebox now answers nothing
              return "value";
            });
    // Back with the server still stopped: the outcome cannot have been answered.
    assertEquals("value", value);
    Stats st = c.stats();
    assertEquals(0, st.completed() + st.completeFailures(), "the guard waited for its outcome's answer");
    s.resume();
    assertTrue(c.flush(FLUSH), "flush");
    KeyState k = s.key("k");
    assertEquals(1, k.getStats().getSuccesses(), k.toString());
    assertEquals(0, k.getLiveTickets(), k.toString());
    assertEquals(1, c.stats().completed());
  }

  @ParameterizedTest
  @EnumSource(Transport.class)
  void aFullQueueDropsOutcomesAndCountsThem(Transport t) throws Exception {
    TestServer s = server();
    RecordingLogger log = new RecordingLogger();
    FuseboxClient c = client(builder(s, t).outcomeQueue(1).logger(log).logInterval(Duration.ofHours(1)));
    int calls = 4;
    CountDownLatch running = new CountDownLatch(calls);
    CountDownLatch release = new CountDownLatch(1);
    List<CompletableFuture<String>> results = new ArrayList<>();
    for (int i = 0; i < calls; i++) {
      CompletableFuture<String> result = new CompletableFuture<>();
      results.add(result);
      Thread th =
          new Thread(
              () -> {
                try {
                  result.complete(
                      c.guard(
                          "k",
                          () -> {
                            running.countDown();
                            release.await();
                            return "ok";
                          }));
                } catch (Throwable e) {
                  result.completeExceptionally(e);
                }
              },
              "guard-" + i);
      th.setDaemon(true);
      th.start();
    }
    assertTrue(running.await(30, TimeUnit.SECONDS), "the four calls did not all run");
    s.pause();
    release.countDown();
    for (CompletableFuture<String> r : results) {
      assertEquals("ok", r.get(30, TimeUnit.SECONDS), "a guard waited on the stopped server");
    }
    s.resume();
    assertTrue(c.flush(FLUSH), "flush");
    Stats st = c.stats();
    KeyState k = s.key("k");
    long reached = k.getStats().getSuccesses();
    String got = "reached " + reached + ", " + st + ", " + k;
    // One send in flight and one outcome waiting at most while the server was stopped.
    assertEquals(calls, reached + st.outcomesDropped(), got);
    assertTrue(st.outcomesDropped() >= 2, got);
    assertEquals(st.outcomesDropped(), k.getLiveTickets(), "a dropped outcome's ticket lives on: " + got);
    assertEquals(0, st.completeFailures(), got);
    assertEquals(1, log.count("outcome queue is full"), "logged once per interval: " + log.lines());
  }

  @ParameterizedTest
  @EnumSource(Transport.class)
  void flushWaitsUntilTheOutcomesAreAnswered(Transport t) throws Exception {
    TestServer s = server();
    FuseboxClient c = client(builder(s, t));
    assertEquals("ok", c.guard("k", GuardTest::ok));
    assertThrows(GuardTest.Boom.class, () -> c.guard("k", GuardTest::fail));
    assertTrue(c.flush(FLUSH), "flush");
    KeyState k = s.key("k"); // once: flush returned after the answers
    assertEquals(1, k.getStats().getSuccesses(), k.toString());
    assertEquals(1, k.getStats().getFailures(), k.toString());
    assertEquals(0, k.getLiveTickets(), k.toString());
    assertEquals(2, c.stats().completed());
    assertTrue(c.flush(Duration.ZERO), "nothing left to wait for");
  }

  @Test
  void flushGivesUpAtItsTimeout() throws Exception {
    TestServer s = server();
    FuseboxClient c = client(builder(s, Transport.UNARY));
    Ticket ticket = c.acquire("k", GuardOptions.defaults().noRenew());
    s.pause();
    ticket.success(); // in flight, unanswered while the server is stopped
    assertEquals(false, c.flush(Duration.ofMillis(100)), "flush waited past its timeout");
    s.resume();
    assertTrue(c.flush(FLUSH), "flush");
    assertEquals(1, s.key("k").getStats().getSuccesses());
  }

  @ParameterizedTest
  @EnumSource(Transport.class)
  void closeFlushesFirst(Transport t) throws Exception {
    TestServer s = server();
    FuseboxClient c = builder(s, t).build();
    int ok = 5;
    int failed = 2;
    for (int i = 0; i < ok; i++) {
      c.guard("k", GuardTest::ok);
    }
    for (int i = 0; i < failed; i++) {
      assertThrows(GuardTest.Boom.class, () -> c.guard("k", GuardTest::fail));
    }
    c.close();
    KeyState k = s.key("k"); // the test server's own channel
    assertEquals(ok, k.getStats().getSuccesses(), k.toString());
    assertEquals(failed, k.getStats().getFailures(), k.toString());
    assertEquals(0, k.getLiveTickets(), k.toString());
  }

  @ParameterizedTest
  @EnumSource(Transport.class)
  void aFailedReportIsCounted(Transport t) throws Exception {
    TestServer s = server();
    RecordingLogger log = new RecordingLogger();
    FuseboxClient c = client(builder(s, t).deadline(Duration.ofSeconds(5)).logger(log));
    String value =
        c.guard(
            "k",
            () -> {
              s.stop(); // killed while the call runs
              return "value";
            });
    assertEquals("value", value);
    assertTrue(c.flush(FLUSH), "flush returns once the failed report is counted");
    Stats st = c.stats();
    assertEquals(1, st.completeFailures(), st.toString());
    assertEquals(0, st.completed(), st.toString());
    assertEquals(0, st.outcomesDropped(), st.toString());
    assertEquals(st.completeFailures(), st.completeErrors());
    assertEquals(1, log.count("could not report outcome SUCCESS of \"k\""), log.lines().toString());
  }

  @ParameterizedTest
  @EnumSource(Transport.class)
  void anOutcomeAnsweredWithAnErrorIsCounted(Transport t) throws Exception {
    TestServer s = server();
    RecordingLogger log = new RecordingLogger();
    FuseboxClient c = client(builder(s, t).logger(log));
    Ticket ticket = c.acquire("k", GuardOptions.defaults().lease(Duration.ofSeconds(1)).noRenew());
    s.advance(Duration.ofSeconds(2)); // the lease ends on the server
    ticket.success();
    assertTrue(c.flush(FLUSH), "flush");
    assertEquals(1, c.stats().completeFailures());
    assertEquals(1, log.count("with an error (NOT_FOUND"), log.lines().toString());
    assertEquals(1, s.key("k").getStats().getExpired());
  }

  /** Counts the Completes of each report a client sends: per CompleteBatch, or per Decide message. */
  static final class Reports implements ClientInterceptor {
    private final List<Integer> sizes = new ArrayList<>();
    final AtomicInteger unaryCompletes = new AtomicInteger();

    synchronized List<Integer> sizes() {
      return new ArrayList<>(sizes);
    }

    synchronized void clear() {
      sizes.clear();
    }

    private synchronized void add(int n) {
      sizes.add(n);
    }

    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
      if (method.getFullMethodName().equals(FuseboxGrpc.getCompleteMethod().getFullMethodName())) {
        unaryCompletes.incrementAndGet();
      }
      return new ForwardingClientCall.SimpleForwardingClientCall<Q, R>(next.newCall(method, options)) {
        @Override
        public void sendMessage(Q message) {
          if (message instanceof CompleteBatchRequest) {
            add(((CompleteBatchRequest) message).getItemsCount());
          } else if (message instanceof DecideRequest) {
            int n = 0;
            for (DecideFrame f : ((DecideRequest) message).getFramesList()) {
              if (f.hasComplete()) {
                n++;
              }
            }
            if (n > 0) {
              add(n);
            }
          }
          super.sendMessage(message);
        }
      };
    }
  }

  /**
   * The sender's batching, as a property over random counts and outcomes: with the server
   * stopped, the first send goes out with what was queued by then and the rest wait; once it goes
   * on they follow in reports of 1,000 (the last one less), and every outcome reaches fusebox once.
   */
  @ParameterizedTest
  @EnumSource(Transport.class)
  void outcomesThatEndDuringASendGoTogetherInTheNext(Transport t) throws Exception {
    long seed = new Random().nextLong();
    Random rnd = new Random(seed);
    TestServer s = server();
    s.setPolicy("k", Policy.getDefaultInstance()); // no breaker: random failures trip nothing
    Reports reports = new Reports();
    FuseboxClient c = client(builder(s, t).interceptor(reports));
    long[] want = new long[Outcome.values().length];
    // A few outcomes, then enough to need more than one full report.
    for (int n : new int[] {2 + rnd.nextInt(40), 1002 + rnd.nextInt(1200)}) {
      String why = "seed " + seed + ", " + n + " outcomes";
      List<Ticket> tickets = new ArrayList<>();
      for (int i = 0; i < n; i++) {
        Ticket ticket = c.acquire("k", GuardOptions.defaults().noRenew());
        assertTrue(ticket.admission().ticket() != null, why);
        tickets.add(ticket);
      }
      s.pause();
      reports.clear();
      for (Ticket ticket : tickets) {
        Outcome o = Outcome.values()[rnd.nextInt(Outcome.values().length)];
        want[o.ordinal()]++;
        ticket.complete(o);
      }
      s.resume();
      assertTrue(c.flush(FLUSH), why);
      List<Integer> sizes = reports.sizes();
      assertTrue(!sizes.isEmpty(), why);
      // The first send took what was queued when it started (at least the first outcome); the
      // rest waited while it was in flight and followed in full reports, then the remainder.
      int first = sizes.get(0);
      assertTrue(first >= 1 && first <= OutcomeQueue.PER_SEND, why + ": " + sizes);
      List<Integer> expected = new ArrayList<>(List.of(first));
      for (int left = n - first; left > 0; left -= OutcomeQueue.PER_SEND) {
        expected.add(Math.min(left, OutcomeQueue.PER_SEND));
      }
      assertEquals(expected, sizes, why);
      KeyState k = s.key("k");
      assertEquals(want[Outcome.SUCCESS.ordinal()], k.getStats().getSuccesses(), why);
      assertEquals(want[Outcome.FAILURE.ordinal()], k.getStats().getFailures(), why);
      assertEquals(want[Outcome.IGNORED.ordinal()], k.getStats().getIgnored(), why);
      assertEquals(0, k.getLiveTickets(), why);
    }
    assertEquals(0, c.stats().completeFailures());
    assertEquals(0, reports.unaryCompletes.get(), "every report is a CompleteBatch or Decide frames");
  }

  @Test
  void theQueueBoundIsChecked() {
    IllegalArgumentException e =
        assertThrows(IllegalArgumentException.class, () -> FuseboxClient.builder("127.0.0.1:1").outcomeQueue(0));
    assertTrue(e.getMessage().contains("outcomeQueue"), e.getMessage());
  }
}
