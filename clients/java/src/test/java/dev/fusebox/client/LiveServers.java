package dev.fusebox.client;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;

/**
 * A test class against real fusebox servers: the servers and clients a test makes here (or hands
 * to {@link #closed}) are closed after it, the last made first.
 */
abstract class LiveServers {
  private final List<AutoCloseable> closing = new ArrayList<>();

  @AfterEach
  void closeAll() throws Exception {
    for (int i = closing.size() - 1; i >= 0; i--) {
      closing.get(i).close();
    }
  }

  /** Closes {@code c} after the test; returns it. */
  <T extends AutoCloseable> T closed(T c) {
    closing.add(c);
    return c;
  }

  /** A server started with {@code args} ({@link TestServer#start(String...)}). */
  TestServer server(String... args) throws Exception {
    return closed(TestServer.start(args));
  }

  /** The client {@code b} builds. */
  FuseboxClient client(FuseboxClient.Builder b) {
    return closed(b.build());
  }
}
