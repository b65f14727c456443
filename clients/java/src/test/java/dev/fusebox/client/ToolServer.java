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

  @Override
  public void close() {
    server.close();
  }
}
