package dev.fusebox.client;

/** The test server for the client tool's tests, in another package. */
public final class ToolServer implements AutoCloseable {
  private final TestServer server;

  private ToolServer(TestServer server) {
    this.server = server;
  }

  public static ToolServer start(String... args) throws Exception {
    return new ToolServer(TestServer.start(args));
  }

  public String addr() {
    return server.addr;
  }

  /** The key's state, read over the test server's own channel. */
  public dev.fusebox.v1.KeyState key(String key) {
    return server.key(key);
  }

  @Override
  public void close() {
    server.close();
  }
}
