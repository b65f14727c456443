/** What a client's guards did since it was made (see `FuseboxClient.stats()`). */
export interface Stats {
  /** Calls run under a ticket (including probes). */
  granted: number;
  /** Of which half-open probes. */
  probes: number;
  /** BlockedError answers from the server. */
  blocked: number;
  /** BlockedError answers from the local short-circuit cache. */
  blockedLocal: number;
  /** RefusedError answers. */
  refused: number;
  /** DeniedError answers. */
  denied: number;
  /** Acquires that failed because fusebox was down or slow. */
  unavailable: number;
  /** Of which the call ran without a ticket. */
  failedOpen: number;
  /** Of which the call was not run (UnavailableError). */
  failedClosed: number;
  /** Leases renewed. */
  renewals: number;
  /** Renewals that failed. */
  renewErrors: number;
  /** Outcomes reported (answered by fusebox). */
  completed: number;
  /**
   * Outcomes that could not be reported: their send failed, or fusebox
   * answered the item with an error (an unknown or already completed
   * ticket). Their tickets end with their leases on the server.
   */
  completeFailures: number;
  /** Outcomes dropped because the outcome queue was full (the `outcomeQueue` option). */
  outcomesDropped: number;
  /** @deprecated The same count as `completeFailures`, under its old name. */
  completeErrs: number;
}

export function emptyStats(): Stats {
  return {
    granted: 0,
    probes: 0,
    blocked: 0,
    blockedLocal: 0,
    refused: 0,
    denied: 0,
    unavailable: 0,
    failedOpen: 0,
    failedClosed: 0,
    renewals: 0,
    renewErrors: 0,
    completed: 0,
    completeFailures: 0,
    outcomesDropped: 0,
    completeErrs: 0,
  };
}

/** Where a client reports trouble; `console` fits. */
export interface Logger {
  warn(message: string, fields: Record<string, unknown>): void;
}

/** Logs to standard error with console.warn. */
export const consoleLogger: Logger = {
  warn(message, fields) {
    console.warn(message, fields);
  },
};

/**
 * Logs each kind of trouble at most once per interval, with the count of
 * lines left unlogged since the last one (`unloggedSinceLast`).
 */
export class LogLimiter {
  private readonly last = new Map<string, number>();
  private readonly skipped = new Map<string, number>();

  constructor(
    private readonly logger: Logger,
    private readonly intervalMs: number,
    private readonly now: () => number,
  ) {}

  warn(kind: string, message: string, fields: Record<string, unknown>): void {
    const now = this.now();
    const last = this.last.get(kind);
    if (last !== undefined && now - last < this.intervalMs) {
      this.skipped.set(kind, (this.skipped.get(kind) ?? 0) + 1);
      return;
    }
    const skipped = this.skipped.get(kind) ?? 0;
    this.last.set(kind, now);
    this.skipped.set(kind, 0);
    this.logger.warn(message, skipped > 0 ? { ...fields, unloggedSinceLast: skipped } : fields);
  }
}
