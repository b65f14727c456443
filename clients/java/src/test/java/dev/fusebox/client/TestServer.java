package dev.fusebox.client;

import com.google.protobuf.Duration;
import dev.fusebox.v1.AdminGrpc;
import dev.fusebox.v1.ClockGrpc;
import dev.fusebox.v1.AdvanceRequest;
import dev.fusebox.v1.GetKeyRequest;
import dev.fusebox.v1.KeyState;
import dev.fusebox.v1.Policy;
import dev.fusebox.v1.PolicyRule;
import dev.fusebox.v1.SetPolicyRequest;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * A real fusebox server started with --manual-clock on port 0: the binary is $FUSEBOX_BIN, else
 * ../../target/debug/fusebox (from clients/java). Its Admin and Clock services are reached over a
 * plaintext channel of its own.
 */
final class TestServer implements AutoCloseable {
  final String addr;
  final List<String> args;
  private final Process process;
  private ManagedChannel channel;
  AdminGrpc.AdminBlockingStub admin;
  ClockGrpc.ClockBlockingStub clock;

  private TestServer(Process process, String addr, List<String> args) {
    this.process = process;
    this.addr = addr;
    this.args = args;
  }

  static String bin() {
    String env = System.getenv("FUSEBOX_BIN");
    if (env != null && !env.isEmpty()) {
      return env;
    }
    File f = new File("../../target/debug/fusebox").getAbsoluteFile();
    if (!f.canExecute()) {
      throw new IllegalStateException(
          "no fusebox binary: build it with `cargo build` at the repository root or set FUSEBOX_BIN");
    }
    return f.getPath();
  }

  static TestServer start(String... extra) throws Exception {
    return start(Map.of(), "127.0.0.1:0", extra);
  }

  static TestServer start(Map<String, String> env, String listen, String... extra) throws Exception {
    List<String> cmd = new ArrayList<>(List.of(bin(), "serve", "--listen", listen, "--http", "127.0.0.1:0", "--manual-clock"));
    cmd.addAll(List.of(extra));
    ProcessBuilder pb = new ProcessBuilder(cmd);
    pb.environment().putAll(env);
    File log = File.createTempFile("fusebox-", ".log");
    log.deleteOnExit();
    pb.redirectError(log);
    Process p = pb.start();
    BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
    CompletableFuture<String> first = CompletableFuture.supplyAsync(() -> {
      try {
        return out.readLine();
      } catch (IOException e) {
        return null;
      }
    });
    String line;
    try {
      line = first.get(60, TimeUnit.SECONDS);
    } catch (Exception e) {
      p.destroyForcibly().waitFor();
      throw new IllegalStateException("fusebox did not start: " + Files.readString(log.toPath()), e);
    }
    int at = line == null ? -1 : line.indexOf("listening on ");
    if (at < 0) {
      p.destroyForcibly().waitFor();
      throw new IllegalStateException("fusebox did not start: " + line + "\n" + Files.readString(log.toPath()));
    }
    Thread drain = new Thread(() -> {
      try {
        while (out.readLine() != null) {
          // keep the pipe empty
        }
      } catch (IOException e) {
        // the server is gone
      }
    }, "fusebox-stdout");
    drain.setDaemon(true);
    drain.start();
    String addr = line.substring(at + "listening on ".length()).trim().split("\\s+")[0];
    TestServer s = new TestServer(p, addr, cmd);
    s.channel = Grpc.newChannelBuilder(addr, InsecureChannelCredentials.create()).build();
    s.admin = AdminGrpc.newBlockingStub(s.channel);
    s.clock = ClockGrpc.newBlockingStub(s.channel);
    return s;
  }

  /** Writes a config file for --config. */
  static String config(Path dir, String toml) throws IOException {
    Path f = dir.resolve("fusebox.toml");
    Files.writeString(f, toml);
    return f.toString();
  }

  void setPolicy(String match, Policy p) {
    admin.setPolicy(SetPolicyRequest.newBuilder().setRule(PolicyRule.newBuilder().setMatch(match).setPolicy(p)).build());
  }

  KeyState key(String k) {
    return admin.getKey(GetKeyRequest.newBuilder().setKey(k).build());
  }

  void advance(java.time.Duration d) {
    clock.advance(AdvanceRequest.newBuilder().setBy(Duration.newBuilder().setSeconds(d.getSeconds()).setNanos(d.getNano())).build());
  }

  /**
   * Stops the server process (SIGSTOP) and waits until every thread of it is stopped: it keeps
   * its connections but answers nothing until {@link #resume()}.
   */
  void pause() throws Exception {
    signal("STOP");
    waitForState(true);
  }

  /** Lets a paused server go on (SIGCONT) and waits until it runs again. */
  void resume() throws Exception {
    signal("CONT");
    waitForState(false);
  }

  private void signal(String name) throws Exception {
    Process kill = new ProcessBuilder("kill", "-" + name, Long.toString(process.pid())).redirectErrorStream(true).start();
    String out = new String(kill.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    if (kill.waitFor() != 0) {
      throw new IllegalStateException("kill -" + name + " " + process.pid() + " failed: " + out);
    }
  }

  /** Polls /proc until every thread of the server is stopped (or none is), at most 10 s. */
  private void waitForState(boolean stopped) throws Exception {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (allStopped() != stopped) {
      if (System.nanoTime() - end > 0) {
        throw new IllegalStateException("fusebox " + process.pid() + (stopped ? " did not stop" : " did not go on"));
      }
      Thread.sleep(1);
    }
  }

  /** True when every thread of the server is stopped ('T' in /proc/PID/task/TID/stat). */
  private boolean allStopped() throws IOException {
    try (java.util.stream.Stream<Path> tasks = Files.list(Path.of("/proc", Long.toString(process.pid()), "task"))) {
      for (Path t : (Iterable<Path>) tasks::iterator) {
        String stat;
        try {
          stat = Files.readString(t.resolve("stat"));
        } catch (java.nio.file.NoSuchFileException e) {
          continue; // a thread that ended
        }
        char state = stat.charAt(stat.lastIndexOf(')') + 2);
        if (state != 'T' && state != 't') {
          return false;
        }
      }
      return true;
    }
  }

  /** Kills the server and waits for it to exit. */
  void stop() {
    process.destroyForcibly();
    boolean interrupted = false;
    while (true) {
      try {
        process.waitFor();
        break;
      } catch (InterruptedException e) {
        interrupted = true;
      }
    }
    if (interrupted) {
      Thread.currentThread().interrupt();
    }
  }

  @Override
  public void close() {
    channel.shutdownNow();
    stop();
  }
}
