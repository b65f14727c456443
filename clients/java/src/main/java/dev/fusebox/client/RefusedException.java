package dev.fusebox.client;

/** The key is isolated by an operator; the call was not made. */
public final class RefusedException extends FuseboxRefusal {
  private static final long serialVersionUID = 1L;

  RefusedException(String key) {
    super(key, "fusebox: \"" + key + "\" refused (isolated)", null);
  }
}
