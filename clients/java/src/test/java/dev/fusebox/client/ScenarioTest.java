package dev.fusebox.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.MapEntry;
import dev.fusebox.v1.CloseRequest;
import dev.fusebox.v1.GetKeyRequest;
import dev.fusebox.v1.IsolateRequest;
import dev.fusebox.v1.KeyState;
import dev.fusebox.v1.KeyStats;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.io.TempDir;

/**
 * The runner of the shared scenarios (../scenarios/*.json, described in ../scenarios/README.md):
 * every file is replayed against its own real fusebox server with a manual clock, once per transport
 * (unary calls, then the Decide stream), as one test named after the scenario and the transport.
 * FUSEBOX_SCENARIOS names another folder.
 */
class ScenarioTest {
  static final long STEP_WAIT_MS = 5000;

  @TempDir Path tmp;

  /** The call's own error in the scenarios. */
  static final class Boom extends Exception {
    private static final long serialVersionUID = 1L;

    Boom() {
      super("boom");
    }
  }

  static Path scenarioDir() {
    String d = System.getenv("FUSEBOX_SCENARIOS");
    return Path.of(d != null && !d.isEmpty() ? d : "../scenarios");
  }

  @TestFactory
  Stream<DynamicTest> scenarios() throws IOException {
    List<Path> files;
    try (Stream<Path> s = Files.list(scenarioDir())) {
      files = s.filter(p -> p.toString().endsWith(".json")).sorted().collect(Collectors.toList());
    }
    assertFalse(files.isEmpty(), "no scenarios in " + scenarioDir().toAbsolutePath());
    List<DynamicTest> tests = new ArrayList<>();
    for (Path f : files) {
      JsonObject sc = JsonParser.parseString(Files.readString(f)).getAsJsonObject();
      only(sc, Set.of("name", "description", "config", "steps"), f.toString());
      String name = sc.get("name").getAsString();
      for (Transport t : Transport.values()) {
        String label = name + " [" + t.name().toLowerCase(java.util.Locale.ROOT) + "]";
        tests.add(DynamicTest.dynamicTest(label, f.toUri(), () -> run(sc, t)));
      }
    }
    return tests.stream();
  }

  static void only(JsonObject o, Set<String> allowed, String where) {
    for (String k : o.keySet()) {
      if (!allowed.contains(k)) {
        fail(where + ": unknown field \"" + k + "\"");
      }
    }
  }

  /** A guard running in the background. */
  static final class Running {
    final JsonObject expect;
    final CountDownLatch started = new CountDownLatch(1);
    final BlockingQueue<String> release = new LinkedBlockingQueue<>();
    final CompletableFuture<Result> done = new CompletableFuture<>();
    Thread thread;

    Running(JsonObject expect) {
      this.expect = expect;
    }

    Result await() throws Exception {
      return done.get(STEP_WAIT_MS, TimeUnit.MILLISECONDS);
    }
  }

  /** What a guard gave. */
  static final class Result {
    volatile boolean ran;
    volatile boolean unavailable;
    Throwable error;
  }

  private void run(JsonObject sc, Transport transport) throws Exception {
    List<String> args = new ArrayList<>();
    if (sc.has("config")) {
      args.add("--config");
      args.add(TestServer.config(tmp, sc.get("config").getAsString()));
    }
    Map<String, Running> guards = new HashMap<>();
    try (TestServer s = TestServer.start(args.toArray(new String[0]));
        FuseboxClient c = FuseboxClient.builder(s.addr).deadline(Duration.ofMillis(2000)).transport(transport).build()) {
      assertEquals(transport, c.transport());
      int i = 0;
      for (JsonElement el : sc.getAsJsonArray("steps")) {
        String where = "step " + i++;
        JsonObject st = el.getAsJsonObject();
        step(s, c, guards, st, where);
      }
      for (Map.Entry<String, Running> e : guards.entrySet()) { // let nothing hang past the test
        Running g = e.getValue();
        if (!g.done.isDone()) {
          g.thread.interrupt();
          g.await();
        }
      }
    }
  }

  private static final Set<String> ACTIONS =
      Set.of("guard", "await", "release", "cancel", "wait_renewed", "advance_ms", "isolate", "close",
          "forget_local", "stop_server", "expect_key");

  private void step(TestServer s, FuseboxClient c, Map<String, Running> guards, JsonObject st, String where)
      throws Exception {
    List<String> actions = st.keySet().stream().filter(ACTIONS::contains).collect(Collectors.toList());
    if (actions.size() != 1) {
      fail(where + ": want exactly one action, got " + actions);
    }
    String action = actions.get(0);
    Set<String> allowed = new java.util.HashSet<>(Set.of(action));
    if (Set.of("guard", "await", "release", "cancel").contains(action)) {
      allowed.add("expect");
    }
    if (action.equals("release")) {
      allowed.add("as");
    }
    only(st, allowed, where);
    JsonObject expect = st.has("expect") ? st.getAsJsonObject("expect") : null;
    JsonElement v = st.get(action);
    switch (action) {
      case "guard": {
        JsonObject g = v.getAsJsonObject();
        only(g, Set.of("key", "call", "id", "background", "permits", "max_wait_ms", "lease_ms", "on_unavailable", "cost"), where);
        String id = g.has("id") ? g.get("id").getAsString() : null;
        String call = g.get("call").getAsString();
        if (id == null && call.equals("hang")) {
          fail(where + ": hang needs an id");
        }
        Running r = startGuard(c, g, expect);
        if (id == null) {
          checkExpect(where, r.await(), expect);
        } else {
          guards.put(id, r);
          boolean background = g.has("background") && g.get("background").getAsBoolean();
          if (!background) {
            long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(STEP_WAIT_MS);
            while (!r.started.await(5, TimeUnit.MILLISECONDS) && !r.done.isDone()) {
              if (System.nanoTime() - end > 0) {
                fail(where + ": the call did not start");
              }
            }
          }
        }
        break;
      }
      case "await": {
        Running r = get(guards, v.getAsString(), where);
        checkExpect(where, r.await(), expect != null ? expect : r.expect);
        break;
      }
      case "release": {
        Running r = get(guards, v.getAsString(), where);
        r.release.add(st.has("as") ? st.get("as").getAsString() : "succeed");
        checkExpect(where, r.await(), expect != null ? expect : r.expect);
        break;
      }
      case "cancel": {
        Running r = get(guards, v.getAsString(), where);
        r.thread.interrupt();
        checkExpect(where, r.await(), expect != null ? expect : r.expect);
        break;
      }
      case "wait_renewed": {
        get(guards, v.getAsString(), where);
        long base = c.stats().renewals();
        waitFor(where + ": two renewals", () -> c.stats().renewals() >= base + 2);
        break;
      }
      case "advance_ms":
        s.advance(Duration.ofMillis(v.getAsLong()));
        break;
      case "isolate":
        s.admin.isolate(IsolateRequest.newBuilder().setKey(v.getAsString()).setReason("scenario").build());
        break;
      case "close":
        s.admin.close(CloseRequest.newBuilder().setKey(v.getAsString()).setReason("scenario").build());
        break;
      case "forget_local":
        c.forget(v.getAsString());
        break;
      case "stop_server":
        assertTrue(v.getAsBoolean(), where + ": stop_server must be true");
        s.stop();
        break;
      case "expect_key": {
        JsonObject want = v.getAsJsonObject();
        only(want, Set.of("key", "phase", "consecutive_failures", "live_tickets", "waiters", "free", "stats"), where);
        String[] last = {""};
        boolean ok = poll(() -> {
          last[0] = keyMismatch(s, want, where);
          return last[0].isEmpty();
        });
        if (!ok) {
          fail(where + ": key state: " + last[0]);
        }
        break;
      }
      default:
        fail(where + ": unknown action " + action);
    }
  }

  private static Running get(Map<String, Running> guards, String id, String where) {
    Running r = guards.get(id);
    assertNotNull(r, where + ": no guard \"" + id + "\"");
    return r;
  }

  private static Running startGuard(FuseboxClient c, JsonObject spec, JsonObject expect) {
    Running r = new Running(expect);
    String key = spec.get("key").getAsString();
    String call = spec.get("call").getAsString();
    if (!Set.of("succeed", "fail", "hang", "cancel").contains(call)) {
      fail("unknown call " + call);
    }
    GuardOptions opts = GuardOptions.defaults();
    if (spec.has("permits")) {
      opts = opts.permits(spec.get("permits").getAsInt());
    }
    if (spec.has("max_wait_ms")) {
      opts = opts.maxWait(Duration.ofMillis(spec.get("max_wait_ms").getAsLong()));
    }
    if (spec.has("lease_ms")) {
      opts = opts.lease(Duration.ofMillis(spec.get("lease_ms").getAsLong()));
    }
    if (spec.has("on_unavailable")) {
      String p = spec.get("on_unavailable").getAsString();
      switch (p) {
        case "open":
          opts = opts.onUnavailable(FailPolicy.OPEN);
          break;
        case "closed":
          opts = opts.onUnavailable(FailPolicy.CLOSED);
          break;
        default:
          fail("unknown on_unavailable " + p);
      }
    }
    Integer cost = null;
    if (spec.has("cost")) {
      // The call's value is the cost; the guard's costOf reads it.
      if (!"succeed".equals(call)) {
        fail("cost needs call succeed, not " + call);
      }
      cost = spec.get("cost").getAsInt();
      opts = opts.costOf((Integer n) -> n);
    }
    Object value = cost != null ? cost : "ok";
    GuardOptions o = opts;
    Result res = new Result();
    r.thread = new Thread(() -> {
      try {
        c.guard(key, o, () -> {
          res.ran = true;
          if (FuseboxClient.admission().map(Admission::failedOpen).orElse(false)) {
            res.unavailable = true;
          }
          r.started.countDown();
          switch (call) {
            case "succeed":
              return value;
            case "fail":
              throw new Boom();
            case "cancel":
              Thread.currentThread().interrupt(); // the caller cancels the running call
              new CountDownLatch(1).await();
              return "not cancelled";
            default: // hang
              if ("fail".equals(r.release.take())) {
                throw new Boom();
              }
              return "ok";
          }
        });
      } catch (Throwable e) {
        res.error = e;
        if (e instanceof UnavailableException) {
          res.unavailable = true;
        }
      }
      r.done.complete(res);
    }, "guard-" + key);
    r.thread.setDaemon(true);
    r.thread.start();
    return r;
  }

  private static void checkExpect(String where, Result r, JsonObject expect) {
    if (expect == null) {
      return;
    }
    Throwable e = r.error;
    Map<String, JsonElement> got = new LinkedHashMap<>();
    JsonElement refusal = JsonNull.INSTANCE;
    JsonElement reason = JsonNull.INSTANCE;
    JsonElement retry = JsonNull.INSTANCE;
    boolean local = false;
    if (e instanceof BlockedException) {
      BlockedException b = (BlockedException) e;
      refusal = new JsonPrimitive("blocked");
      reason = new JsonPrimitive(b.reason());
      local = b.local();
      if (b.retryAfter() != null) {
        retry = new JsonPrimitive(b.retryAfter().toMillis());
      }
    } else if (e instanceof DeniedException) {
      DeniedException d = (DeniedException) e;
      refusal = new JsonPrimitive("denied");
      reason = new JsonPrimitive(d.reason());
      if (d.retryAfter() != null) {
        retry = new JsonPrimitive(d.retryAfter().toMillis());
      }
    } else if (e instanceof RefusedException) {
      refusal = new JsonPrimitive("refused");
    } else if (e instanceof UnavailableException) {
      refusal = new JsonPrimitive("unavailable");
    }
    got.put("ran", new JsonPrimitive(r.ran));
    got.put("refusal", refusal);
    got.put("reason", reason);
    got.put("retry_after_ms", retry);
    got.put("local", new JsonPrimitive(local));
    got.put("error", new JsonPrimitive(e instanceof Boom));
    got.put("cancelled", new JsonPrimitive(e instanceof InterruptedException || e instanceof CancellationException));
    got.put("unavailable", new JsonPrimitive(r.unavailable));
    for (String k : expect.keySet()) {
      if (!got.containsKey(k)) {
        fail(where + ": unknown expect field \"" + k + "\"");
      }
      JsonElement want = expect.get(k);
      JsonElement have = got.get(k);
      String w = want.isJsonNull() ? "null" : want.getAsString();
      String h = have.isJsonNull() ? "null" : have.getAsString();
      assertEquals(w, h, where + ": " + k + " (error " + e + ")");
    }
  }

  private static String keyMismatch(TestServer s, JsonObject want, String where) {
    if (!want.has("key")) {
      fail(where + ": expect_key needs a key");
    }
    KeyState st;
    try {
      st = s.admin.getKey(GetKeyRequest.newBuilder().setKey(want.get("key").getAsString()).build());
    } catch (RuntimeException e) {
      return e.toString();
    }
    for (String k : want.keySet()) {
      JsonElement w = want.get(k);
      String have;
      switch (k) {
        case "key":
          have = st.getKey();
          break;
        case "phase":
          have = st.getPhase().name().substring("PHASE_".length());
          break;
        case "consecutive_failures":
          have = Long.toString(st.getConsecutiveFailures());
          break;
        case "live_tickets":
          have = Long.toString(st.getLiveTickets());
          break;
        case "waiters":
          have = Long.toString(st.getWaiters());
          break;
        case "free":
          have = Long.toString(st.getFree());
          break;
        case "stats": {
          String m = statsMismatch(st.getStats(), w.getAsJsonObject(), where);
          if (!m.isEmpty()) {
            return m;
          }
          continue;
        }
        default:
          fail(where + ": unknown expect_key field \"" + k + "\"");
          return "";
      }
      if (!have.equals(w.getAsString())) {
        return k + " = " + have + ", want " + w;
      }
    }
    return "";
  }

  private static String statsMismatch(KeyStats stats, JsonObject want, String where) {
    for (String k : want.keySet()) {
      FieldDescriptor f = KeyStats.getDescriptor().findFieldByName(k);
      if (f == null) {
        fail(where + ": unknown KeyStats field \"" + k + "\"");
      }
      if (f.isMapField()) {
        Map<String, String> have = new HashMap<>();
        for (Object o : (List<?>) stats.getField(f)) {
          MapEntry<?, ?> e = (MapEntry<?, ?>) o;
          have.put(e.getKey().toString(), e.getValue().toString());
        }
        Map<String, String> w = new HashMap<>();
        for (Map.Entry<String, JsonElement> e : want.getAsJsonObject(k).entrySet()) {
          w.put(e.getKey(), e.getValue().getAsString());
        }
        if (!have.equals(w)) {
          return "stats." + k + " = " + have + ", want " + w;
        }
        continue;
      }
      String have = stats.getField(f).toString();
      if (!have.equals(want.get(k).getAsString())) {
        return "stats." + k + " = " + have + ", want " + want.get(k);
      }
    }
    return "";
  }

  /** Checks cond until it holds or STEP_WAIT_MS has passed. */
  static boolean poll(Supplier<Boolean> cond) throws InterruptedException {
    long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(STEP_WAIT_MS);
    while (!cond.get()) {
      if (System.nanoTime() - end > 0) {
        return false;
      }
      Thread.sleep(5);
    }
    return true;
  }

  static void waitFor(String what, Supplier<Boolean> cond) throws InterruptedException {
    if (!poll(cond)) {
      fail(what + ": not within " + STEP_WAIT_MS + " ms");
    }
  }
}
