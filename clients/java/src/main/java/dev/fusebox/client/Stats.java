package dev.fusebox.client;

/**
 * What a client's guards did since it was made; a snapshot from {@link FuseboxClient#stats()}.
 *
 * @param granted calls run under a ticket (including probes)
 * @param probes of which half-open probes
 * @param blocked {@link BlockedException} answers from the server
 * @param blockedLocal {@link BlockedException} answers from the local short-circuit cache
 * @param refused {@link RefusedException} answers
 * @param denied {@link DeniedException} answers
 * @param unavailable Acquires that failed because fusebox was down or slow
 * @param failedOpen of which the call ran without a ticket
 * @param failedClosed of which the call was not run ({@link UnavailableException})
 * @param requestErrors Acquires fusebox rejected ({@link FuseboxRequestException})
 * @param renewals leases renewed
 * @param renewErrors renewals that failed
 * @param completed outcomes reported and answered by fusebox
 * @param completeErrors the same count as {@code completeFailures}, under its earlier name
 * @param outcomesDropped outcomes not reported because the outcome queue was full (their leases
 *     end on the server)
 * @param completeFailures outcomes whose report failed: in a send that failed (fusebox down, slow,
 *     or the client closed), or answered with an error (an unknown or already completed ticket);
 *     one per outcome
 */
public record Stats(
    long granted,
    long probes,
    long blocked,
    long blockedLocal,
    long refused,
    long denied,
    long unavailable,
    long failedOpen,
    long failedClosed,
    long requestErrors,
    long renewals,
    long renewErrors,
    long completed,
    long completeErrors,
    long outcomesDropped,
    long completeFailures) {

  /**
   * The snapshot of a client without the outcome queue's counters ({@code outcomesDropped} 0,
   * {@code completeFailures} the same as {@code completeErrors}), as the record was before them.
   */
  public Stats(
      long granted,
      long probes,
      long blocked,
      long blockedLocal,
      long refused,
      long denied,
      long unavailable,
      long failedOpen,
      long failedClosed,
      long requestErrors,
      long renewals,
      long renewErrors,
      long completed,
      long completeErrors) {
    this(
        granted,
        probes,
        blocked,
        blockedLocal,
        refused,
        denied,
        unavailable,
        failedOpen,
        failedClosed,
        requestErrors,
        renewals,
        renewErrors,
        completed,
        completeErrors,
        0,
        completeErrors);
  }
}
