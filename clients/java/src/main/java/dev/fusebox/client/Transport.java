package dev.fusebox.client;

/** How a client's calls reach fusebox; see {@link FuseboxClient.Builder#transport(Transport)}. */
public enum Transport {
  /** One unary call per Acquire, Complete and Renew (the default). */
  UNARY,
  /**
   * Every Acquire, Complete and Renew a frame of one {@code Decide} stream per client, the frames
   * ready together sent in one message: fewer messages for a busy process. The stream is opened on
   * the first call and again after it ends; the calls in flight when it ends fail UNAVAILABLE, as a
   * broken unary call would, so the fail policy applies.
   */
  STREAM,
}
