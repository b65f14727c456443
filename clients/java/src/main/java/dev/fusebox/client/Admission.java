package dev.fusebox.client;

/**
 * How a guarded call was let in; read it inside the call with {@link FuseboxClient#admission()}.
 *
 * <p>When the key's policy is a shadow ({@code enforce = false}, a dry run) that granted a call it
 * would have blocked or denied, {@code shadowDecision} says which ({@code blocked} or {@code
 * denied}) and {@code shadowReason} why, in the contract's lower case ({@code open}, {@code
 * no_permits}, {@code retry_budget}, ...). The call runs and its outcome is reported all the same.
 *
 * @param key the key
 * @param ticket the ticket, or {@code null} when the call runs without one (a status check, or
 *     fusebox unavailable and the guard failing open)
 * @param probe true for the single half-open probe
 * @param failedOpen true when fusebox could not be asked and the call runs anyway
 * @param cause why fusebox could not be asked (with {@code failedOpen}), else {@code null}
 * @param shadowDecision {@code blocked} or {@code denied} for a shadow grant, else {@code null}
 * @param shadowReason the reason of {@code shadowDecision}, else {@code null}
 */
public record Admission(
    String key,
    String ticket,
    boolean probe,
    boolean failedOpen,
    Throwable cause,
    String shadowDecision,
    String shadowReason) {

  /** An admission that is not a shadow grant. */
  public Admission(String key, String ticket, boolean probe, boolean failedOpen, Throwable cause) {
    this(key, ticket, probe, failedOpen, cause, null, null);
  }

  /** True when a shadow policy granted the call though it would have blocked or denied it. */
  public boolean shadow() {
    return shadowDecision != null;
  }
}
