package dev.fusebox.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The channel finds a restarted fusebox again on its own. */
class ReconnectTest {
  static boolean admitted(FuseboxClient c) throws Exception {
    return !c.guard("k", () -> FuseboxClient.admission().orElseThrow().failedOpen());
  }

  @Test
  void aRestartedServerIsFoundAgain() throws Exception {
    TestServer first = TestServer.start();
    String addr = first.addr;
    try (FuseboxClient c = FuseboxClient.builder(addr).deadline(Duration.ofSeconds(2)).build()) {
      assertTrue(admitted(c));
      first.close();
      // Down for a while: several connection attempts fail and the backoff grows.
      long downUntil = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(1500);
      while (System.nanoTime() - downUntil < 0) {
        assertTrue(!admitted(c), "the server is down");
        Thread.sleep(20); // pacing the attempts, not waiting for anything
      }
      // The same address again (the port was the first server's).
      try (TestServer second = TestServer.start(Map.of(), addr)) {
        assertEquals(addr, second.addr);
        long start = System.nanoTime();
        assertTrue(ScenarioTest.poll(() -> {
          try {
            return admitted(c);
          } catch (Exception e) {
            throw new IllegalStateException(e);
          }
        }), "the client did not reconnect within 5 s");
        System.err.println("reconnected after " + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start) + " ms");
      }
    }
  }
}
