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
 * @param completed outcomes reported
 * @param completeErrors outcomes that could not be reported
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
    long completeErrors) {}
