// How a guard's refusal reads in the client tool's `done` events
// (clients/README.md) and in the shared scenarios' expectations
// (clients/scenarios/README.md).
import { BlockedError, DeniedError, RefusedError, UnavailableError } from '@fusebox/client';

/** The fields that describe a refusal; all null (and not local) for none. */
export interface RefusalFields {
  refusal: string | null;
  reason: string | null;
  retry_after_ms: number | null;
  local: boolean;
}

/** The refusal fields of err, what a guard rejected with (or null). */
export function refusalFields(err: unknown): RefusalFields {
  if (err instanceof BlockedError) {
    return { refusal: 'blocked', reason: err.reason, retry_after_ms: err.retryAfterMs, local: err.local };
  }
  if (err instanceof DeniedError) {
    return { refusal: 'denied', reason: err.reason, retry_after_ms: err.retryAfterMs, local: false };
  }
  let refusal: string | null = null;
  if (err instanceof RefusedError) {
    refusal = 'refused';
  } else if (err instanceof UnavailableError) {
    refusal = 'unavailable';
  }
  return { refusal, reason: null, retry_after_ms: null, local: false };
}
