package dev.fusebox.client.tool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.fusebox.client.ToolServer;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The client tool as the fleet test and the bench script run it: java -cp "$(cat target/tool.classpath)". */
class ClientToolTest {
  @TempDir Path tmp;

  /** The tool as a process, its standard output as a queue of lines. */
  static final class Tool implements AutoCloseable {
    final Process process;
    final Writer in;
    final BlockingQueue<String> lines = new LinkedBlockingQueue<>();

    Tool(String... args) throws IOException {
      List<String> cmd = new ArrayList<>(List.of(
          Path.of(System.getProperty("java.home"), "bin", "java").toString(),
          "-cp", Files.readString(Path.of("target", "tool.classpath")).trim(),
          ClientTool.class.getName()));
      cmd.addAll(List.of(args));
      process = new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.DISCARD).start();
      in = new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
      Thread reader = new Thread(() -> {
        try (BufferedReader r = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
          String l;
          while ((l = r.readLine()) != null) {
            lines.add(l);
          }
        } catch (IOException e) {
          // the tool is gone
        }
      });
      reader.setDaemon(true);
      reader.start();
    }

    void send(String line) throws IOException {
      in.write(line + "\n");
      in.flush();
    }

    JsonObject next() throws InterruptedException {
      String l = lines.poll(30, TimeUnit.SECONDS);
      assertNotNull(l, "no event from the tool");
      return JsonParser.parseString(l).getAsJsonObject();
    }

    int exit() throws Exception {
      in.close();
      assertTrue(process.waitFor(30, TimeUnit.SECONDS), "the tool did not exit");
      return process.exitValue();
    }

    @Override
    public void close() {
      process.destroyForcibly();
    }
  }

  static JsonObject json(String s) {
    return JsonParser.parseString(s).getAsJsonObject();
  }

  @Test
  void worker() throws Exception {
    String cfg = tmp.resolve("fusebox.toml").toString();
    Files.writeString(Path.of(cfg), "[[rule]]\nmatch = \"svc/*\"\nbreaker = { mode = \"consecutive\", failures = 2, break = \"10s\" }\n");
    try (ToolServer s = ToolServer.start("--config", cfg);
        Tool t = new Tool("worker", "--target", s.addr())) {
      assertEquals(json("{\"event\":\"ready\",\"lang\":\"java\"}"), t.next());
      for (String id : List.of("f1", "f2")) {
        t.send("{\"op\":\"guard\",\"id\":\"" + id + "\",\"key\":\"svc/a\",\"call\":\"fail\"}");
        assertEquals(json("{\"event\":\"running\",\"id\":\"" + id + "\"}"), t.next());
        assertEquals(json("{\"event\":\"done\",\"id\":\"" + id + "\",\"ran\":true,\"refusal\":null,\"reason\":null,"
            + "\"retry_after_ms\":null,\"local\":false,\"error\":true,\"unavailable\":false}"), t.next());
      }
      // The failures are reported in the background: the next Acquire must come after fusebox has them.
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
      while (s.key("svc/a").getPhase() != dev.fusebox.v1.Phase.PHASE_OPEN) {
        assertTrue(System.nanoTime() - end < 0, "the two failures did not open svc/a: " + s.key("svc/a"));
        Thread.sleep(5);
      }
      t.send("{\"op\":\"guard\",\"id\":\"b1\",\"key\":\"svc/a\",\"call\":\"succeed\"}");
      assertEquals(json("{\"event\":\"done\",\"id\":\"b1\",\"ran\":false,\"refusal\":\"blocked\",\"reason\":\"open\","
          + "\"retry_after_ms\":10000,\"local\":false,\"error\":false,\"unavailable\":false}"), t.next());
      t.send("{\"op\":\"guard\",\"id\":\"b2\",\"key\":\"svc/a\",\"call\":\"succeed\"}");
      JsonObject local = t.next();
      assertEquals("blocked", local.get("refusal").getAsString());
      assertTrue(local.get("local").getAsBoolean());
      t.send("{\"op\":\"forget\",\"key\":\"svc/a\"}");
      assertEquals(json("{\"event\":\"forgotten\",\"key\":\"svc/a\"}"), t.next());
      t.send("{\"op\":\"guard\",\"id\":\"b3\",\"key\":\"svc/a\",\"call\":\"succeed\"}");
      assertEquals(false, t.next().get("local").getAsBoolean(), "forgotten: the server is asked");

      t.send("{\"op\":\"guard\",\"id\":\"h\",\"key\":\"svc/b\",\"call\":\"hang\"}");
      assertEquals(json("{\"event\":\"running\",\"id\":\"h\"}"), t.next());
      t.send("{\"op\":\"release\",\"id\":\"h\"}");
      assertEquals(json("{\"event\":\"done\",\"id\":\"h\",\"ran\":true,\"refusal\":null,\"reason\":null,"
          + "\"retry_after_ms\":null,\"local\":false,\"error\":false,\"unavailable\":false}"), t.next());

      t.send("{\"op\":\"guard\",\"id\":\"bad\",\"key\":\"\",\"call\":\"succeed\"}");
      JsonObject bad = t.next();
      assertEquals("rejected", bad.get("refusal").getAsString());
      assertEquals("invalid_argument", bad.get("reason").getAsString());

      t.send("{\"op\":\"guard\",\"id\":\"left\",\"key\":\"svc/c\",\"call\":\"hang\"}");
      assertEquals(json("{\"event\":\"running\",\"id\":\"left\"}"), t.next());
      assertEquals(0, t.exit(), "the end of the input releases a hanging call");
      assertEquals("left", t.next().get("id").getAsString());
      // The worker closed its client before it exited, which reported the outcomes still queued.
      dev.fusebox.v1.KeyState left = s.key("svc/c");
      assertEquals(1, left.getStats().getSuccesses(), left.toString());
      assertEquals(0, left.getLiveTickets(), left.toString());
    }
  }

  @Test
  void workerStopsOnACommandItCannotRead() throws Exception {
    try (ToolServer s = ToolServer.start();
        Tool t = new Tool("worker", "--target", s.addr())) {
      assertEquals("ready", t.next().get("event").getAsString());
      t.send("{\"op\":\"guard\",\"id\":\"g\",\"key\":\"k\",\"call\":\"succeed\",\"extra\":1}");
      JsonObject e = t.next();
      assertEquals("error", e.get("event").getAsString());
      assertTrue(e.get("message").getAsString().contains("extra"), e.toString());
      assertEquals(1, t.exit());
    }
  }

  @Test
  void bench() throws Exception {
    try (ToolServer s = ToolServer.start();
        Tool t = new Tool("bench", "--target", s.addr(), "--key", "bench", "--iterations", "20")) {
      JsonObject line = t.next();
      assertEquals(0, t.exit());
      assertEquals("java", line.get("lang").getAsString());
      assertEquals(20, line.get("iterations").getAsInt());
      for (String unit : List.of("raw_us", "guard_us")) {
        JsonObject u = line.getAsJsonObject(unit);
        double median = u.get("median").getAsDouble();
        assertTrue(median > 0 && median <= u.get("p99").getAsDouble(), line.toString());
      }
      // 20 rounds and 2 of warm-up, a raw and a guard unit each: every outcome counted once.
      assertEquals(
          json("{\"expected\":44,\"reached\":44,\"lost\":0,\"dropped\":0,\"failed\":0}"),
          line.getAsJsonObject("outcomes"));
    }
  }

  @Test
  void usage() throws Exception {
    try (Tool t = new Tool("worker")) {
      assertEquals(2, t.exit());
    }
  }
}
