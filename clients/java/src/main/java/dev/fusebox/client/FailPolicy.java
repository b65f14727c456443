package dev.fusebox.client;

/** What a guard does when fusebox cannot be asked in time (down, slow or unreachable). */
public enum FailPolicy {
  /** Run the call without a ticket (the default); {@link Admission#failedOpen()} says so. */
  OPEN,
  /** Do not run the call: the guard throws an {@link UnavailableException}. */
  CLOSED
}
