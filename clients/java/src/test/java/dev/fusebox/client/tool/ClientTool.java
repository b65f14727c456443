package dev.fusebox.client.tool;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import dev.fusebox.client.Admission;
import dev.fusebox.client.BlockedException;
import dev.fusebox.client.DeniedException;
import dev.fusebox.client.FuseboxClient;
import dev.fusebox.client.FuseboxRequestException;
import dev.fusebox.client.RefusedException;
import dev.fusebox.client.Stats;
import dev.fusebox.client.UnavailableException;
import dev.fusebox.v1.AdminGrpc;
import dev.fusebox.v1.FuseboxGrpc;
import dev.fusebox.v1.GetKeyRequest;
import dev.fusebox.v1.AcquireRequest;
import dev.fusebox.v1.AcquireResponse;
import dev.fusebox.v1.CompleteRequest;
import dev.fusebox.v1.Decision;
import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CountDownLatch;

/**
 * The client tool of the Java library (see clients/README.md): a worker for the fleet test, and
 * the overhead bench.
 *
 * <pre>
 * ClientTool worker --target HOST:PORT [--token T]
 * ClientTool bench  --target HOST:PORT --key KEY --iterations N [--token T]
 * </pre>
 *
 * <p>worker reads JSON-lines commands (guard, release, forget) on standard input and writes
 * JSON-lines events (ready, running, done, forgotten, error) on standard output; at the end of its
 * input it closes its client, which reports the outcomes still queued. bench times the raw stub's
 * Acquire (its Complete awaited, not timed) against a guarded no-op on the same channel, whose
 * outcome goes in the background, and writes one line of medians and p99s and of how many outcomes
 * reached fusebox (exit 1 when any did not). Logs go to standard error.
 */
public final class ClientTool {
  /** The deadline of calls to fusebox, as the scenario runners use it. */
  static final Duration DEADLINE = Duration.ofMillis(2000);

  static final String USAGE =
      "usage:\n"
          + "  ClientTool worker --target HOST:PORT [--token T]\n"
          + "  ClientTool bench  --target HOST:PORT --key KEY --iterations N [--token T]\n";

  private static final Gson GSON = new GsonBuilder().serializeNulls().disableHtmlEscaping().create();

  private ClientTool() {}

  public static void main(String[] args) {
    System.exit(run(args));
  }

  static int run(String[] args) {
    if (args.length == 0 || !(args[0].equals("worker") || args[0].equals("bench"))) {
      System.err.print(USAGE);
      return 2;
    }
    Set<String> known = args[0].equals("worker") ? Set.of("--target", "--token") : Set.of("--target", "--token", "--key", "--iterations");
    Map<String, String> flags = new HashMap<>();
    for (int i = 1; i < args.length; i++) {
      String a = args[i];
      String name = a;
      String value;
      int eq = a.indexOf('=');
      if (eq > 0) {
        name = a.substring(0, eq);
        value = a.substring(eq + 1);
      } else if (i + 1 < args.length) {
        value = args[++i];
      } else {
        System.err.print(USAGE);
        return 2;
      }
      if (!name.startsWith("--") && name.startsWith("-")) { // -flag as --flag
        name = "-" + name;
      }
      if (!known.contains(name)) {
        System.err.print(USAGE);
        return 2;
      }
      flags.put(name, value);
    }
    String target = flags.getOrDefault("--target", "");
    String token = flags.getOrDefault("--token", "");
    if (target.isEmpty()) {
      System.err.print(USAGE);
      return 2;
    }
    PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
    if (args[0].equals("worker")) {
      return worker(target, token, out);
    }
    String key = flags.getOrDefault("--key", "");
    int iterations;
    try {
      iterations = Integer.parseInt(flags.getOrDefault("--iterations", "0"));
    } catch (NumberFormatException e) {
      iterations = 0;
    }
    if (key.isEmpty()) {
      System.err.print(USAGE);
      return 2;
    }
    if (iterations < 1) {
      System.err.println("ClientTool bench: --iterations must be at least 1");
      return 1;
    }
    try {
      JsonObject line = bench(target, token, key, iterations);
      out.println(GSON.toJson(line));
      long lost = line.getAsJsonObject("outcomes").get("lost").getAsLong();
      if (lost > 0) {
        System.err.println(
            "ClientTool bench: " + lost + " outcomes did not reach fusebox (dropped and failed reports are counted in the line)");
        return 1;
      }
      return 0;
    } catch (Exception e) {
      System.err.println("ClientTool bench: " + e.getMessage());
      return 1;
    }
  }

  static FuseboxClient client(String target, String token) {
    return FuseboxClient.builder(target).token(token).deadline(DEADLINE).build();
  }

  /** Writes one JSON object a line, whole lines at once. */
  static final class Events {
    private final PrintStream out;

    Events(PrintStream out) {
      this.out = out;
    }

    synchronized void emit(JsonObject o) {
      out.println(GSON.toJson(o));
    }

    void emit(String... kv) {
      JsonObject o = new JsonObject();
      for (int i = 0; i < kv.length; i += 2) {
        o.addProperty(kv[i], kv[i + 1]);
      }
      emit(o);
    }
  }

  /** The call's own error in a "fail" call. */
  static final class CallFailed extends Exception {
    private static final long serialVersionUID = 1L;

    CallFailed() {
      super("the call failed");
    }
  }

  private static final Map<String, List<String>> FIELDS =
      Map.of(
          "guard", List.of("op", "id", "key", "call"),
          "release", List.of("op", "id"),
          "forget", List.of("op", "key"));

  /** One checked input line: its fields by name. */
  static Map<String, String> parse(String line) {
    JsonElement el;
    try {
      el = JsonParser.parseString(line);
    } catch (JsonParseException e) {
      throw new IllegalArgumentException("not a JSON object: " + e.getMessage());
    }
    if (!el.isJsonObject()) {
      throw new IllegalArgumentException("not a JSON object");
    }
    JsonObject o = el.getAsJsonObject();
    String op = string(o, "op");
    List<String> known = FIELDS.get(op);
    if (known == null) {
      throw new IllegalArgumentException("unknown op \"" + op + "\"");
    }
    for (String name : o.keySet()) {
      if (!known.contains(name)) {
        throw new IllegalArgumentException(op + ": unknown field \"" + name + "\"");
      }
    }
    Map<String, String> cmd = new HashMap<>();
    for (String name : known) {
      cmd.put(name, string(o, name));
    }
    if (op.equals("guard") && !Set.of("succeed", "fail", "hang").contains(cmd.get("call"))) {
      throw new IllegalArgumentException("unknown call \"" + cmd.get("call") + "\"");
    }
    return cmd;
  }

  private static String string(JsonObject o, String name) {
    JsonElement v = o.get(name);
    if (v == null) {
      throw new IllegalArgumentException(name + " is missing");
    }
    if (!v.isJsonPrimitive() || !v.getAsJsonPrimitive().isString()) {
      throw new IllegalArgumentException(name + " must be a string, not " + v);
    }
    return v.getAsString();
  }

  static int worker(String target, String token, PrintStream stdout) {
    Events out = new Events(stdout);
    FuseboxClient c;
    try {
      c = client(target, token);
    } catch (RuntimeException e) {
      out.emit("event", "error", "message", String.valueOf(e.getMessage()));
      return 1;
    }
    try (c) {
      out.emit("event", "ready", "lang", "java");
      // Every id a guard command started: its release latch.
      Map<String, CountDownLatch> releases = new LinkedHashMap<>();
      Map<String, Thread> threads = new LinkedHashMap<>();
      BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      String line;
      while (true) {
        try {
          line = in.readLine();
        } catch (IOException e) {
          out.emit("event", "error", "message", "reading standard input: " + e.getMessage());
          return 1;
        }
        if (line == null) {
          break;
        }
        if (line.isBlank()) {
          continue;
        }
        Map<String, String> cmd;
        try {
          cmd = parse(line);
        } catch (IllegalArgumentException e) {
          out.emit("event", "error", "message", e.getMessage() + ": " + line.trim());
          return 1;
        }
        switch (cmd.get("op")) {
          case "guard": {
            String id = cmd.get("id");
            if (releases.containsKey(id)) {
              out.emit("event", "error", "message", "guard id \"" + id + "\" used twice");
              return 1;
            }
            CountDownLatch release = new CountDownLatch(1);
            releases.put(id, release);
            Thread t = new Thread(() -> guard(c, out, id, cmd.get("key"), cmd.get("call"), release), "guard-" + id);
            t.setDaemon(true);
            threads.put(id, t);
            t.start();
            break;
          }
          case "release": {
            CountDownLatch release = releases.get(cmd.get("id"));
            if (release == null) {
              out.emit("event", "error", "message", "release: no guard \"" + cmd.get("id") + "\"");
              return 1;
            }
            release.countDown(); // a call that already ended ignores it
            break;
          }
          default: // forget
            c.forget(cmd.get("key"));
            out.emit("event", "forgotten", "key", cmd.get("key"));
        }
      }
      // The end of the input: calls still hanging return a value.
      releases.values().forEach(CountDownLatch::countDown);
      for (Thread t : threads.values()) {
        joinUninterruptibly(t);
      }
      return 0; // closing the client reports the outcomes still queued first
    }
  }

  private static void joinUninterruptibly(Thread t) {
    while (true) {
      try {
        t.join();
        return;
      } catch (InterruptedException e) {
        // keep waiting: the guard reports its call first
      }
    }
  }

  /** Runs one guarded call and writes its running and done events. */
  static void guard(FuseboxClient c, Events out, String id, String key, String call, CountDownLatch release) {
    boolean[] ran = {false};
    boolean[] failedOpen = {false};
    Throwable err = null;
    try {
      c.guard(key, () -> {
        ran[0] = true;
        failedOpen[0] = FuseboxClient.admission().map(Admission::failedOpen).orElse(false);
        out.emit("event", "running", "id", id);
        if (call.equals("fail")) {
          throw new CallFailed();
        }
        if (call.equals("hang")) {
          release.await(); // released, or the worker is ending: a value
        }
        return null;
      });
    } catch (Throwable e) {
      err = e;
    }
    out.emit(done(id, err, ran[0], failedOpen[0]));
  }

  /** The done event of a guard that ended, its fields in the README's order. */
  static JsonObject done(String id, Throwable err, boolean ran, boolean failedOpen) {
    JsonElement refusal = JsonNull.INSTANCE;
    JsonElement reason = JsonNull.INSTANCE;
    JsonElement retry = JsonNull.INSTANCE;
    boolean local = false;
    boolean error = false;
    boolean unavailable = failedOpen;
    if (err instanceof CallFailed) {
      error = true;
    } else if (err instanceof BlockedException) {
      BlockedException b = (BlockedException) err;
      refusal = new JsonPrimitive("blocked");
      reason = new JsonPrimitive(b.reason());
      retry = millis(b.retryAfter());
      local = b.local();
    } else if (err instanceof DeniedException) {
      DeniedException d = (DeniedException) err;
      refusal = new JsonPrimitive("denied");
      reason = new JsonPrimitive(d.reason());
      retry = millis(d.retryAfter());
    } else if (err instanceof RefusedException) {
      refusal = new JsonPrimitive("refused");
    } else if (err instanceof UnavailableException) {
      refusal = new JsonPrimitive("unavailable");
      unavailable = true;
    } else if (err instanceof FuseboxRequestException) {
      // Not a refusal: fusebox rejected the request itself (a bad key, a
      // missing token); the reason is the gRPC code's name.
      refusal = new JsonPrimitive("rejected");
      reason = new JsonPrimitive(((FuseboxRequestException) err).status().getCode().name().toLowerCase(Locale.ROOT));
    } else if (err != null) {
      refusal = new JsonPrimitive("rejected");
      reason = new JsonPrimitive(String.valueOf(err));
    }
    JsonObject d = new JsonObject();
    d.addProperty("event", "done");
    d.addProperty("id", id);
    d.addProperty("ran", ran);
    d.add("refusal", refusal);
    d.add("reason", reason);
    d.add("retry_after_ms", retry);
    d.addProperty("local", local);
    d.addProperty("error", error);
    d.addProperty("unavailable", unavailable);
    return d;
  }

  private static JsonElement millis(Duration d) {
    return d == null || d.isZero() ? JsonNull.INSTANCE : new JsonPrimitive(d.toMillis());
  }

  /** The sample at q (nearest rank) of sorted samples (ns), in µs rounded to 0.1. */
  static double quantile(long[] sorted, double q) {
    int rank = (int) Math.ceil(q * sorted.length);
    rank = Math.max(1, Math.min(rank, sorted.length));
    return Math.round(sorted[rank - 1] / 100.0) / 10.0;
  }

  static JsonObject summarize(long[] samples) {
    Arrays.sort(samples);
    JsonObject s = new JsonObject();
    s.addProperty("median", quantile(samples, 0.5));
    s.addProperty("p99", quantile(samples, 0.99));
    return s;
  }

  /** How long the bench waits, at the end, for the outcomes reported in the background. */
  static final Duration BENCH_FLUSH = Duration.ofSeconds(60);

  /** The key's successes as fusebox counts them (a key never used reads as fresh: 0). */
  static long successes(AdminGrpc.AdminBlockingStub admin, String key) {
    return admin.getKey(GetKeyRequest.newBuilder().setKey(key).build()).getStats().getSuccesses();
  }

  /**
   * Times a raw Acquire (its Complete awaited, not timed) against a guarded no-op (its outcome
   * reported in the background, nothing flushed between rounds), alternating which goes first;
   * then checks that every unit's outcome reached fusebox.
   */
  static JsonObject bench(String target, String token, String key, int iterations) throws Exception {
    try (FuseboxClient c = client(target, token)) {
      // The raw stub on the guard's own channel (which carries the token).
      FuseboxGrpc.FuseboxBlockingStub raw = FuseboxGrpc.newBlockingStub(c.channel());
      AdminGrpc.AdminBlockingStub admin = AdminGrpc.newBlockingStub(c.channel());
      AcquireRequest acquire = AcquireRequest.newBuilder().setKey(key).build();
      int warmup = iterations / 10;
      long[] rawNs = new long[iterations];
      long[] guardNs = new long[iterations];
      long before = successes(admin, key);
      for (int round = 0; round < warmup + iterations; round++) {
        long rawTook = 0;
        long guardTook = 0;
        for (int unit = 0; unit < 2; unit++) {
          if ((unit == 0) == (round % 2 == 0)) {
            long start = System.nanoTime();
            AcquireResponse resp = raw.acquire(acquire);
            rawTook = System.nanoTime() - start;
            if (resp.getDecision() != Decision.DECISION_GRANTED) {
              throw new IllegalStateException(key + " was not granted: " + resp);
            }
            raw.complete(
                CompleteRequest.newBuilder()
                    .setTicket(resp.getTicket())
                    .setOutcome(dev.fusebox.v1.Outcome.OUTCOME_SUCCESS)
                    .build());
          } else {
            long start = System.nanoTime();
            c.guard(key, () -> null);
            guardTook = System.nanoTime() - start;
          }
        }
        if (round >= warmup) {
          rawNs[round - warmup] = rawTook;
          guardNs[round - warmup] = guardTook;
        }
      }
      long unavailable = c.stats().unavailable();
      if (unavailable > 0) {
        throw new IllegalStateException(
            "fusebox was unavailable to the guard " + unavailable + " times: its timings would not be a guard's");
      }
      if (!c.flush(BENCH_FLUSH)) {
        System.err.println("ClientTool bench: the guards' outcomes were not all answered within " + BENCH_FLUSH);
      }
      long expected = 2L * (warmup + iterations);
      long reached = successes(admin, key) - before;
      Stats st = c.stats();
      JsonObject outcomes = new JsonObject();
      outcomes.addProperty("expected", expected);
      outcomes.addProperty("reached", reached);
      outcomes.addProperty("lost", Math.max(0, expected - reached));
      outcomes.addProperty("dropped", st.outcomesDropped());
      outcomes.addProperty("failed", st.completeFailures());
      JsonObject line = new JsonObject();
      line.addProperty("lang", "java");
      line.addProperty("iterations", iterations);
      line.add("raw_us", summarize(rawNs));
      line.add("guard_us", summarize(guardNs));
      line.add("outcomes", outcomes);
      return line;
    }
  }
}
