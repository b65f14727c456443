package dev.fusebox.client;

import io.grpc.Status;

/**
 * fusebox rejected the request itself (a bad key or duration, a missing or unknown token, a cap
 * reached): not a decision about the dependency; the call was not made. The cause is the gRPC
 * error.
 */
public final class FuseboxRequestException extends FuseboxException {
  private static final long serialVersionUID = 1L;

  FuseboxRequestException(String key, Throwable cause) {
    super(key, "fusebox: request for \"" + key + "\" rejected: " + cause.getMessage(), cause);
  }

  /** The gRPC status fusebox answered with. */
  public Status status() {
    return Status.fromThrowable(getCause());
  }
}
