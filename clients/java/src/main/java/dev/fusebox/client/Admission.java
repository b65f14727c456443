package dev.fusebox.client;

/**
 * How a guarded call was let in; read it inside the call with {@link FuseboxClient#admission()}.
 *
 * @param key the key
 * @param ticket the ticket, or {@code null} when the call runs without one (a status check, or
 *     fusebox unavailable and the guard failing open)
 * @param probe true for the single half-open probe
 * @param failedOpen true when fusebox could not be asked and the call runs anyway
 * @param cause why fusebox could not be asked (with {@code failedOpen}), else {@code null}
 */
public record Admission(String key, String ticket, boolean probe, boolean failedOpen, Throwable cause) {}
