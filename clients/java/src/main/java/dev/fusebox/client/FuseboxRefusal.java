package dev.fusebox.client;

/**
 * The guarded call was not made: fusebox answered no ({@link BlockedException}, {@link
 * RefusedException}, {@link DeniedException}) or could not be asked and the guard fails closed
 * ({@link UnavailableException}).
 */
public abstract class FuseboxRefusal extends FuseboxException {
  private static final long serialVersionUID = 1L;

  FuseboxRefusal(String key, String message, Throwable cause) {
    super(key, message, cause);
  }
}
