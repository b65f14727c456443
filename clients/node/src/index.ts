/**
 * The fusebox client: guard calls to a dependency with a keyed circuit
 * breaker and permit book.
 *
 * ```ts
 * const fusebox = FuseboxClient.shared('127.0.0.1:7700');
 * const receipt = await fusebox.guard('payments/charge', (ctx) => charge(order, ctx.signal));
 * ```
 */
export {
  DEFAULT_CACHE_SIZE,
  DEFAULT_DEADLINE_MS,
  DEFAULT_LOG_INTERVAL_MS,
  DEFAULT_OUTCOME_QUEUE,
  FuseboxClient,
  MAX_ATTEMPT,
  MAX_COST,
  defaultClassifier,
  tlsFromFiles,
} from './client';
export type {
  Admission,
  Classifier,
  ClientOptions,
  CostOf,
  GuardContext,
  GuardOptions,
  Outcome,
  ShadowDecision,
  TlsOptions,
  UnavailablePolicy,
} from './client';
export {
  BlockedError,
  DeniedError,
  FuseboxRefusal,
  FuseboxRequestError,
  RefusedError,
  UnavailableError,
} from './errors';
export type { Reason } from './errors';
export { OpenCache } from './cache';
export type { Logger, Stats } from './stats';
export { PROTO_FILE, duration, millis, proto } from './proto';
export type {
  AcquireRequest,
  AcquireResponse,
  AdminStub,
  ClockStub,
  FuseboxStub,
  KeyState,
  KeyStats,
  Policy,
} from './proto';
