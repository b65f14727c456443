package dev.fusebox.client;

/**
 * Base of every exception thrown by this library, never by the guarded call itself: a {@link
 * FuseboxRefusal} (the call was not made because of fusebox's answer, or because fusebox could not
 * be asked and the guard fails closed) or a {@link FuseboxRequestException}.
 */
public abstract class FuseboxException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final String key;

  FuseboxException(String key, String message, Throwable cause) {
    super(message, cause);
    this.key = key;
  }

  /** The guarded key. */
  public String key() {
    return key;
  }
}
