import type { ServiceError } from '@grpc/grpc-js';

/** Why a request was blocked or denied, as the contract names it in lower case. */
export type Reason =
  | 'open'
  | 'probe_in_flight'
  | 'no_permits'
  | 'queue_full'
  | 'exceeds_limit'
  | 'evicted'
  | 'timeout'
  | 'retry_budget'
  | 'unspecified';

/** A `REASON_*` enum name as its lower-case contract name. */
export function reasonOf(r: string): Reason {
  return r.replace(/^REASON_/, '').toLowerCase() as Reason;
}

/**
 * Base of the answers fusebox gives instead of running the call
 * (BlockedError, RefusedError, DeniedError). They never come from the
 * call itself.
 */
export class FuseboxRefusal extends Error {
  readonly key: string;
  constructor(key: string, message: string) {
    super(message);
    this.name = new.target.name;
    this.key = key;
  }
}

/**
 * The key's breaker is OPEN (reason `open`) or its probe is in flight
 * (`probe_in_flight`); the call was not made. `retryAfterMs` is null when the
 * server gave no hint. `local` is true when the answer came from the local
 * short-circuit cache without asking fusebox.
 */
export class BlockedError extends FuseboxRefusal {
  readonly reason: Reason;
  readonly retryAfterMs: number | null;
  readonly local: boolean;
  constructor(key: string, reason: Reason, retryAfterMs: number | null, local = false) {
    super(key, `fusebox: "${key}" blocked (${reason})${retryAfterMs !== null ? `, retry after ${retryAfterMs} ms` : ''}${local ? ' [local]' : ''}`);
    this.reason = reason;
    this.retryAfterMs = retryAfterMs;
    this.local = local;
  }
}

/** The key is isolated by an operator; the call was not made. */
export class RefusedError extends FuseboxRefusal {
  constructor(key: string) {
    super(key, `fusebox: "${key}" refused (isolated)`);
  }
}

/**
 * The breaker admitted but the permit book did not (`no_permits`,
 * `queue_full`, `exceeds_limit`, `evicted`, `timeout`); the call was not
 * made. `retryAfterMs` is null when the server gave no hint.
 */
export class DeniedError extends FuseboxRefusal {
  readonly reason: Reason;
  readonly retryAfterMs: number | null;
  constructor(key: string, reason: Reason, retryAfterMs: number | null) {
    super(key, `fusebox: "${key}" denied (${reason})${retryAfterMs !== null ? `, retry after ${retryAfterMs} ms` : ''}`);
    this.reason = reason;
    this.retryAfterMs = retryAfterMs;
  }
}

/**
 * fusebox could not be asked in time (down, slow or unreachable) and the
 * guard fails closed: the call was not made. `cause` is the gRPC error.
 */
export class UnavailableError extends Error {
  readonly key: string;
  constructor(key: string, cause: unknown) {
    super(`fusebox: unavailable for "${key}": ${describe(cause)}`, { cause });
    this.name = 'UnavailableError';
    this.key = key;
  }
}

/**
 * fusebox rejected the request itself (a bad key or duration, a missing or
 * unknown token, a ticket it does not know: INVALID_ARGUMENT,
 * UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND, ...). It is not a decision about
 * the dependency; the call was not made. `code` is the gRPC status code.
 */
export class FuseboxRequestError extends Error {
  readonly key: string;
  readonly code: number;
  readonly details: string;
  constructor(key: string, cause: unknown) {
    super(`fusebox: request for "${key}" rejected: ${describe(cause)}`, { cause });
    this.name = 'FuseboxRequestError';
    this.key = key;
    this.code = isServiceError(cause) ? cause.code : 2;
    this.details = isServiceError(cause) ? cause.details : describe(cause);
  }
}

/** True for an error that carries a gRPC status code. */
export function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === 'number';
}

function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
