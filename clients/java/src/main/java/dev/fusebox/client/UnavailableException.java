package dev.fusebox.client;

/**
 * fusebox could not be asked in time (down, slow or unreachable) and the guard fails closed, so
 * the call was not made. The cause is the gRPC error.
 */
public final class UnavailableException extends FuseboxRefusal {
  private static final long serialVersionUID = 1L;

  UnavailableException(String key, Throwable cause) {
    super(key, "fusebox: unavailable for \"" + key + "\": " + cause.getMessage(), cause);
  }
}
