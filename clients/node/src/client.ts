import { readFileSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';

import { OpenCache } from './cache';
import {
  BlockedError,
  DeniedError,
  FuseboxRequestError,
  RefusedError,
  UnavailableError,
  isServiceError,
  reasonOf,
} from './errors';
import type { AcquireRequest, AcquireResponse, AdminStub, ClockStub, FuseboxStub } from './proto';
import { duration, millis, proto } from './proto';
import type { Logger, Stats } from './stats';
import { LogLimiter, consoleLogger, emptyStats } from './stats';
import type { Reason } from './errors';
import { DecideMux, statusError } from './stream';
import { OutcomeSender } from './outcomes';
import type { ItemAnswer, QueuedOutcome } from './outcomes';
import type { CompleteBatchResponse__Output } from './generated/fusebox/v1/CompleteBatchResponse';
import type { DecideResult__Output } from './generated/fusebox/v1/DecideResult';
import type { ItemError__Output } from './generated/fusebox/v1/ItemError';
import type { RenewResponse__Output } from './generated/fusebox/v1/RenewResponse';

/** How long a guard waits for fusebox itself (Acquire, Complete, Renew), in ms. */
export const DEFAULT_DEADLINE_MS = 50;
/** The bound of the local short-circuit cache (keys known OPEN). */
export const DEFAULT_CACHE_SIZE = 1024;
/** The least time between two log lines about the same kind of trouble, in ms. */
export const DEFAULT_LOG_INTERVAL_MS = 10_000;
/** The bound of the outcome queue: outcomes waiting to be reported. */
export const DEFAULT_OUTCOME_QUEUE = 10_000;
/** The least deadline of a send of outcomes, and of the flush that `close` does, in ms. */
const MIN_BACKGROUND_DEADLINE_MS = 1000;

/** How a guarded call went, as reported to fusebox. */
export type Outcome = 'success' | 'failure' | 'ignored';

/** Maps the error a guarded call rejected with to the outcome reported for it. */
export type Classifier = (err: unknown) => Outcome;

/** What a guard does when fusebox cannot be asked in time. */
export type UnavailablePolicy = 'open' | 'closed';

/** How the guarded call was let in. */
export type Admission = 'granted' | 'probe' | 'failed_open';

/**
 * What a shadow policy (`enforce = false`, a dry run) would have answered
 * a call it granted anyway.
 */
export type ShadowDecision = 'blocked' | 'denied';

/** What a guarded call is given. */
export interface GuardContext {
  readonly key: string;
  /** `granted`, `probe` (the half-open probe), or `failed_open` (fusebox could not be asked). */
  readonly admission: Admission;
  /** The ticket; null for a status check (permits 0) or when failing open. */
  readonly ticket: string | null;
  /** Aborted when the caller aborts (the guard's `signal` option). */
  readonly signal: AbortSignal;
  /** With `failed_open`: why fusebox could not be asked. */
  readonly unavailableError?: unknown;
  /**
   * `blocked` or `denied` when the key's policy is a shadow (`enforce =
   * false`, a dry run) that granted this call though it would have blocked
   * or denied it; null otherwise. The call runs and its outcome is reported
   * all the same.
   */
  readonly shadowDecision: ShadowDecision | null;
  /** Why the shadow policy would have blocked or denied the call (`retry_budget`, ...); null otherwise. */
  readonly shadowReason: Reason | null;
}

/**
 * Maps a guarded call's value to the permits it really used
 * (`CompleteRequest.cost`, rule U1); undefined reports no cost.
 */
export type CostOf<T> = (result: T) => number | undefined;

/** The largest cost: a uint32 on the wire. */
export const MAX_COST = 2 ** 32 - 1;

/** The largest attempt: a uint32 on the wire. */
export const MAX_ATTEMPT = 2 ** 32 - 1;

/** Options of one guard; `T` is the guarded call's value. */
export interface GuardOptions<T = unknown> {
  /** Permits asked for (default 1). 0 is a status check: no ticket, nothing reported. */
  permits?: number;
  /** How long the request may wait in the key's queue, in ms (default 0). */
  maxWaitMs?: number;
  /** The lease asked for, in ms (default: the policy's). */
  leaseMs?: number;
  /** Replaces the client's classifier (default `defaultClassifier`). */
  classifier?: Classifier;
  /** Deadline of each call to fusebox, in ms (Acquire gets `maxWaitMs` more). */
  deadlineMs?: number;
  /** What to do when fusebox cannot be asked in time. */
  onUnavailable?: UnavailablePolicy;
  /** Renew the lease in the background (default true). */
  renew?: boolean;
  /**
   * Reads the permits the call really used from its value, reported with
   * its outcome (rule U1): on a token-bucket or window limiter fusebox
   * settles the difference from what the ticket took, up or down (0 gives
   * the permits back). undefined (or a call that rejects) reports no cost,
   * and the ticket's permits stand. A cost function that throws or answers
   * something other than a whole number from 0 to 2^32 - 1 is logged and
   * reports no cost. Other limiter kinds ignore the cost.
   */
  cost?: CostOf<T>;
  /** The caller's cancellation: the call is then reported IGNORED and the guard rejects with the abort reason. */
  signal?: AbortSignal;
  /**
   * Who makes this call, sent as the Acquire's `caller` (rule Q1) in place
   * of the client's `caller` option.
   */
  caller?: string;
  /**
   * Which attempt of the caller's own call this is, sent as the Acquire's
   * `attempt` (rule R1): 1 (or leaving it out) for a first attempt, 2 and up
   * for a retry, which a retry budget on the key counts. The client never
   * runs a guarded call again by itself, so it marks no retry of its own: a
   * caller that retries says so here. A whole number from 0 to 2^32 - 1,
   * else the guard throws a RangeError naming `attempt`.
   */
  attempt?: number;
}

// A grant's shadow fields: what a shadow policy would have answered (D1),
// or nulls for a real grant.
function shadowOf(resp: AcquireResponse): { shadowDecision: ShadowDecision | null; shadowReason: Reason | null } {
  const d = resp.shadowDecision;
  if (d === 'DECISION_UNSPECIFIED') {
    return { shadowDecision: null, shadowReason: null };
  }
  return {
    shadowDecision: d.replace(/^DECISION_/, '').toLowerCase() as ShadowDecision,
    shadowReason: reasonOf(resp.shadowReason),
  };
}

/** TLS options: PEM text or bytes. */
export interface TlsOptions {
  /** The roots to trust (default: the system's). */
  ca?: string | Buffer;
  /** A client certificate for mutual TLS (with `key`). */
  cert?: string | Buffer;
  /** The client certificate's private key. */
  key?: string | Buffer;
  /** Overrides the name checked in the server's certificate. */
  serverName?: string;
}

/** Reads TLS options from PEM files; an empty or absent path is skipped. */
export function tlsFromFiles(files: { ca?: string; cert?: string; key?: string; serverName?: string }): TlsOptions {
  const read = (p?: string): Buffer | undefined => (p ? readFileSync(p) : undefined);
  return { ca: read(files.ca), cert: read(files.cert), key: read(files.key), serverName: files.serverName };
}

/** Options of a client. */
export interface ClientOptions {
  /** Sent as `authorization: Bearer TOKEN` on every call. */
  token?: string;
  /** Connect with TLS; without it the connection is plaintext. */
  tls?: TlsOptions;
  /**
   * Default deadline of each call to fusebox, in ms (default 50). Sends of
   * outcomes, which nobody waits on, get at least 1 s.
   */
  deadlineMs?: number;
  /** Default policy when fusebox cannot be asked in time (default `open`). */
  onUnavailable?: UnavailablePolicy;
  /** Default classifier of every guard (default `defaultClassifier`). */
  classifier?: Classifier;
  /** Bound of the local short-circuit cache (default 1024; 0 turns it off). */
  cacheSize?: number;
  /** Least time between two log lines about one kind of trouble, in ms (default 10 000). */
  logIntervalMs?: number;
  /** Where trouble is logged (default: console.warn). */
  logger?: Logger;
  /** The monotonic clock of the local cache and the log limiter, in ms (default `performance.now`). */
  clock?: () => number;
  /** More grpc-js channel options. */
  channelOptions?: grpc.ChannelOptions;
  /**
   * How calls reach fusebox: 'unary' (default), one call each; or 'stream',
   * every Acquire, Complete and Renew a frame of one Decide stream per
   * client, the frames of one event-loop turn sent in one message.
   */
  transport?: 'unary' | 'stream';
  /**
   * Bound of the outcome queue (default 10 000): the outcomes of guarded
   * calls waiting to be reported in the background. With the queue full an
   * outcome is dropped (counted in `stats().outcomesDropped`, logged), and
   * its ticket ends with its lease on the server.
   */
  outcomeQueue?: number;
  /**
   * Who this client calls for (a service's name, at most 128 bytes of
   * printable UTF-8), sent as every Acquire's `caller` (rule Q1) unless a
   * guard says otherwise. Without it fusebox takes the connection's
   * address; with a token, the token's name. fusebox refuses a longer one
   * with INVALID_ARGUMENT naming `caller` (a FuseboxRequestError).
   */
  caller?: string;
}

const CANCELLED = grpc.status.CANCELLED;

/**
 * Counts every error as a failure except cancellations (an `AbortError`, a
 * gRPC status CANCELLED), which are ignored. A deadline that passed counts:
 * a slow dependency is failing.
 */
export function defaultClassifier(err: unknown): Outcome {
  if (err instanceof Error && err.name === 'AbortError') {
    return 'ignored';
  }
  if (isServiceError(err) && err.code === CANCELLED) {
    return 'ignored';
  }
  return 'failure';
}

// Status codes that mean fusebox is down or slow: the policy applies.
const OUTAGE = new Set<number>([
  grpc.status.UNAVAILABLE,
  grpc.status.DEADLINE_EXCEEDED,
  grpc.status.CANCELLED,
  grpc.status.ABORTED,
  grpc.status.INTERNAL,
  grpc.status.UNKNOWN,
  grpc.status.RESOURCE_EXHAUSTED, // fusebox at one of its caps cannot serve
]);

function isUnavailable(err: unknown): boolean {
  return !isServiceError(err) || OUTAGE.has(err.code);
}

/** The first outage backoff and its bound, in ms. */
const INITIAL_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 5000;

/**
 * After an outage the client's guards do not ask fusebox for a while: 100 ms,
 * doubling to 5 s, reset by the next answer. A window is started only when
 * none is running, so a burst of failures in one blip counts as one step.
 */
class OutageBackoff {
  private until: number | null = null;
  private next = INITIAL_BACKOFF_MS;

  backingOff(now: number): boolean {
    return this.until !== null && now < this.until;
  }

  outage(now: number): void {
    if (this.until === null || this.until <= now) {
      this.until = now + this.next;
      this.next = Math.min(this.next * 2, MAX_BACKOFF_MS);
    }
  }

  answered(): void {
    this.until = null;
    this.next = INITIAL_BACKOFF_MS;
  }
}

/** The outage a guard answers with, without asking, while backing off. */
class BackingOffError extends Error {
  readonly code = grpc.status.UNAVAILABLE;
  constructor() {
    super('fusebox was unavailable; backing off before asking again');
    this.name = 'BackingOffError';
  }
}

const OUTCOME = { success: 'OUTCOME_SUCCESS', failure: 'OUTCOME_FAILURE', ignored: 'OUTCOME_IGNORED' } as const;

const NEVER_ABORTED = new AbortController().signal;

interface Resolved<T = unknown> {
  permits: number | undefined;
  maxWaitMs: number;
  leaseMs: number;
  classifier: Classifier;
  deadlineMs: number;
  onUnavailable: UnavailablePolicy;
  renew: boolean;
  cost: CostOf<T> | undefined;
  caller: string | undefined;
  attempt: number | undefined;
}

/** A caller option as the wire takes it, or a TypeError naming the field. */
function checkCaller(caller: unknown): string | undefined {
  if (caller !== undefined && typeof caller !== 'string') {
    throw new TypeError(`fusebox: caller must be a string (a service's name), not a ${typeof caller}`);
  }
  return caller;
}

const shared = new Map<string, FuseboxClient>();

/**
 * A client of one fusebox server over one gRPC channel. Make one per process
 * (or use `FuseboxClient.shared`) and wrap each call to a dependency in
 * `guard`.
 */
export class FuseboxClient {
  /** The generated Fusebox stub, on the client's channel. */
  readonly stub: FuseboxStub;
  private readonly opts: Required<Pick<ClientOptions, 'deadlineMs' | 'onUnavailable' | 'classifier'>> &
    Pick<ClientOptions, 'caller'>;
  private readonly cache: OpenCache;
  private readonly logs: LogLimiter;
  private readonly now: () => number;
  private readonly counters: Stats = emptyStats();
  private readonly backoff = new OutageBackoff();
  private readonly credentials: grpc.ChannelCredentials;
  private readonly interceptors: grpc.Interceptor[];
  private adminStub?: AdminStub;
  private clockStub?: ClockStub;
  private readonly mux: DecideMux | undefined;
  private readonly outcomes: OutcomeSender;
  private readonly backgroundDeadlineMs: number;
  private closing: Promise<void> | undefined;

  constructor(
    readonly target: string,
    options: ClientOptions = {},
  ) {
    const outcomeQueue = options.outcomeQueue ?? DEFAULT_OUTCOME_QUEUE;
    if (!Number.isSafeInteger(outcomeQueue) || outcomeQueue < 1) {
      throw new RangeError(
        `fusebox: the outcomeQueue option must be a whole number of at least 1 (got ${String(outcomeQueue)}); leave it out for the default of ${DEFAULT_OUTCOME_QUEUE}`,
      );
    }
    this.opts = {
      deadlineMs: options.deadlineMs ?? DEFAULT_DEADLINE_MS,
      onUnavailable: options.onUnavailable ?? 'open',
      classifier: options.classifier ?? defaultClassifier,
      caller: checkCaller(options.caller),
    };
    this.now = options.clock ?? (() => performance.now());
    this.cache = new OpenCache(options.cacheSize ?? DEFAULT_CACHE_SIZE);
    this.logs = new LogLimiter(options.logger ?? consoleLogger, options.logIntervalMs ?? DEFAULT_LOG_INTERVAL_MS, this.now);

    const channelOptions: grpc.ChannelOptions = {
      'grpc.initial_reconnect_backoff_ms': 100,
      'grpc.max_reconnect_backoff_ms': 5000,
      ...options.channelOptions,
    };
    const tls = options.tls;
    if (tls !== undefined) {
      const buf = (v?: string | Buffer): Buffer | null => (v === undefined ? null : Buffer.from(v));
      this.credentials = grpc.credentials.createSsl(buf(tls.ca), buf(tls.key), buf(tls.cert));
      if (tls.serverName) {
        channelOptions['grpc.ssl_target_name_override'] = tls.serverName;
        channelOptions['grpc.default_authority'] = tls.serverName;
      }
    } else {
      this.credentials = grpc.credentials.createInsecure();
    }
    this.interceptors = [];
    const token = options.token;
    if (token) {
      this.interceptors.push(
        (callOptions, next) =>
          new grpc.InterceptingCall(next(callOptions), {
            start(metadata, listener, start) {
              metadata.set('authorization', `Bearer ${token}`);
              start(metadata, listener);
            },
          }),
      );
    }
    const { Fusebox } = proto().fusebox.v1;
    this.stub = new Fusebox(target, this.credentials, { ...channelOptions, interceptors: this.interceptors });
    // Start connecting now, so that the first guard's deadline is not spent
    // on the handshake.
    this.stub.getChannel().getConnectivityState(true);
    this.mux =
      options.transport === 'stream'
        ? new DecideMux(this.stub, (key, ticket) => this.outcomes.enqueue({ key, ticket, outcome: 'ignored' }))
        : undefined;
    this.backgroundDeadlineMs = Math.max(this.opts.deadlineMs, MIN_BACKGROUND_DEADLINE_MS);
    this.outcomes = new OutcomeSender(
      outcomeQueue,
      this.backgroundDeadlineMs,
      (batch, deadlineMs) => this.sendOutcomes(batch, deadlineMs),
      this.counters,
      this.logs,
    );
  }

  /**
   * The process's client for target, made with options on first use; later
   * calls for the same target get the same client (and channel) and ignore
   * their options.
   */
  static shared(target: string, options: ClientOptions = {}): FuseboxClient {
    let c = shared.get(target);
    if (c === undefined) {
      c = new FuseboxClient(target, options);
      shared.set(target, c);
    }
    return c;
  }

  /**
   * Waits until every outcome queued before this call has been reported
   * (or counted as not reported), at most timeoutMs (default: the client's
   * deadline, at least 1 s; Infinity waits as long as it takes). Resolves
   * true when they all were, false when the time ran out first (the rest
   * are still sent in the background). Call it where the next call must
   * see the last outcome, say before an Acquire under a concurrency limit
   * of one.
   */
  flush(timeoutMs: number = this.backgroundDeadlineMs): Promise<boolean> {
    if (typeof timeoutMs !== 'number' || !(timeoutMs >= 0)) {
      return Promise.reject(
        new RangeError(`fusebox: flush's timeoutMs must be a number of milliseconds, 0 or more (got ${String(timeoutMs)})`),
      );
    }
    return this.outcomes.flush(timeoutMs);
  }

  /**
   * Flushes the outcome queue (within the client's deadline, at least 1 s),
   * then closes the stream and the channel. The client is forgotten as the
   * shared one of its target at once; an outcome that ends after the call
   * is counted as not reported. Calling it again returns the same promise.
   */
  close(): Promise<void> {
    if (this.closing === undefined) {
      if (shared.get(this.target) === this) {
        shared.delete(this.target);
      }
      this.closing = this.outcomes.flush(this.backgroundDeadlineMs).then(() => {
        this.outcomes.close();
        this.mux?.close();
        this.stub.close();
      });
    }
    return this.closing;
  }

  /** The operator API (generated Admin stub) on the client's channel. */
  admin(): AdminStub {
    this.adminStub ??= this.onChannel(proto().fusebox.v1.Admin);
    return this.adminStub;
  }

  /** The manual-clock testing hook (generated Clock stub) on the client's channel. */
  clock(): ClockStub {
    this.clockStub ??= this.onChannel(proto().fusebox.v1.Clock);
    return this.clockStub;
  }

  /** A stub of another fusebox service, on the client's channel and with its interceptors. */
  private onChannel<S>(Service: new (target: string, credentials: grpc.ChannelCredentials, options: grpc.ClientOptions) => S): S {
    return new Service(this.target, this.credentials, {
      channelOverride: this.stub.getChannel(),
      interceptors: this.interceptors,
    });
  }

  /** A snapshot of the client's counters. */
  stats(): Stats {
    return { ...this.counters };
  }

  /** Drops the local short-circuit entry for key: the next guard asks fusebox again. */
  forget(key: string): void {
    this.cache.forget(key);
  }

  /**
   * Asks fusebox before running `call` for `key`, runs it when admitted and
   * reports how it went: success when it resolves, the classifier's outcome
   * when it rejects (failure by default), ignored when it rejects after the
   * caller's signal was aborted (the guard then rejects with the abort
   * reason). Resolves with the call's value; rejects with the call's own
   * error unchanged, or with a refusal (BlockedError, RefusedError,
   * DeniedError) without running it, an UnavailableError when fusebox cannot
   * be asked and the policy is fail closed, or a FuseboxRequestError when
   * fusebox rejects the request itself. The outcome goes into the client's
   * outcome queue and is reported in the background: the guard settles as
   * soon as the call does (see `flush`).
   */
  async guard<T>(key: string, call: (ctx: GuardContext) => Promise<T> | T, options: GuardOptions<T> = {}): Promise<T> {
    if (options.cost !== undefined && typeof options.cost !== 'function') {
      throw new TypeError(`cost must be a function of the call's value, not ${String(options.cost)}`);
    }
    const attempt = options.attempt;
    if (attempt !== undefined && (!Number.isSafeInteger(attempt) || attempt < 0 || attempt > MAX_ATTEMPT)) {
      throw new RangeError(
        `fusebox: attempt must be a whole number from 0 to ${MAX_ATTEMPT} (1 a first attempt, 2 and up a retry), not ${String(attempt)}`,
      );
    }
    const cfg: Resolved<T> = {
      permits: options.permits,
      maxWaitMs: options.maxWaitMs ?? 0,
      leaseMs: options.leaseMs ?? 0,
      classifier: options.classifier ?? this.opts.classifier,
      deadlineMs: options.deadlineMs ?? this.opts.deadlineMs,
      onUnavailable: options.onUnavailable ?? this.opts.onUnavailable,
      renew: options.renew ?? true,
      cost: options.cost,
      caller: checkCaller(options.caller) ?? this.opts.caller,
      attempt,
    };
    const signal = options.signal;
    const left = this.cache.blockedFor(key, this.now());
    if (left > 0) {
      this.counters.blockedLocal++;
      throw new BlockedError(key, 'open', Math.ceil(left), true);
    }
    signal?.throwIfAborted();

    const req: AcquireRequest = { key };
    if (cfg.permits !== undefined) {
      req.permits = cfg.permits;
    }
    if (cfg.maxWaitMs > 0) {
      req.maxWait = duration(cfg.maxWaitMs);
    }
    if (cfg.leaseMs > 0) {
      req.lease = duration(cfg.leaseMs);
    }
    if (cfg.caller) {
      req.caller = cfg.caller;
    }
    if (cfg.attempt !== undefined) {
      req.attempt = cfg.attempt;
    }
    let resp: AcquireResponse;
    try {
      if (this.backoff.backingOff(performance.now())) {
        throw new BackingOffError();
      }
      resp = await this.acquire(req, cfg.deadlineMs + cfg.maxWaitMs, signal);
      this.backoff.answered();
    } catch (err) {
      if (signal?.aborted) {
        throw signal.reason;
      }
      if (!isUnavailable(err)) {
        this.backoff.answered();
        throw new FuseboxRequestError(key, err);
      }
      if (!(err instanceof BackingOffError)) {
        this.backoff.outage(performance.now());
      }
      this.counters.unavailable++;
      if (cfg.onUnavailable === 'closed') {
        this.counters.failedClosed++;
        this.logs.warn('unavailable', 'fusebox unavailable; failing closed', { key, err: String(err) });
        throw new UnavailableError(key, err);
      }
      this.counters.failedOpen++;
      this.logs.warn('unavailable', 'fusebox unavailable; failing open', { key, err: String(err) });
      const ctx = { key, admission: 'failed_open', ticket: null, signal: signal ?? NEVER_ABORTED, unavailableError: err, shadowDecision: null, shadowReason: null } as const;
      return runBare(ctx, call, signal);
    }

    switch (resp.decision) {
      case 'DECISION_GRANTED':
      case 'DECISION_PROBE': {
        const probe = resp.decision === 'DECISION_PROBE';
        this.counters.granted++;
        if (probe) {
          this.counters.probes++;
        }
        this.cache.forget(key);
        const ctx: GuardContext = {
          key,
          admission: probe ? 'probe' : 'granted',
          ticket: resp.ticket || null,
          signal: signal ?? NEVER_ABORTED,
          ...shadowOf(resp),
        };
        return this.run(ctx, millis(resp.lease) ?? 0, cfg, call, signal);
      }
      case 'DECISION_BLOCKED': {
        this.counters.blocked++;
        const retry = millis(resp.retryAfter);
        if (resp.reason === 'REASON_OPEN' && retry !== null && retry > 0) {
          const now = this.now();
          this.cache.put(key, now + retry, now);
        }
        throw new BlockedError(key, reasonOf(resp.reason), retry);
      }
      case 'DECISION_REFUSED':
        this.counters.refused++;
        throw new RefusedError(key);
      case 'DECISION_DENIED':
        this.counters.denied++;
        throw new DeniedError(key, reasonOf(resp.reason), millis(resp.retryAfter));
      default:
        throw new FuseboxRequestError(key, new Error(`unknown decision ${String(resp.decision)}`));
    }
  }

  /**
   * The higher-order form: a function that guards `fn` under `key` (a string,
   * or a function of the arguments) each time it is called.
   */
  wrap<A extends unknown[], T>(
    key: string | ((...args: A) => string),
    fn: (...args: A) => Promise<T> | T,
    options: GuardOptions<T> = {},
  ): (...args: A) => Promise<T> {
    return (...args: A) => this.guard(typeof key === 'string' ? key : key(...args), () => fn(...args), options);
  }

  // Runs the call under a ticket, renews its lease and queues the outcome.
  private async run<T>(
    ctx: GuardContext,
    leaseMs: number,
    cfg: Resolved<T>,
    call: (ctx: GuardContext) => Promise<T> | T,
    signal: AbortSignal | undefined,
  ): Promise<T> {
    const ticket = ctx.ticket;
    if (ticket === null) {
      return runBare(ctx, call, signal); // a status check: nothing to renew or report
    }
    const renewer =
      cfg.renew && leaseMs > 0
        ? new Renewer(leaseMs, (lease, stopped) => this.renewOnce(ticket, lease, cfg, stopped))
        : null;
    let value: T;
    try {
      value = await call(ctx);
    } catch (err) {
      const outcome = signal?.aborted ? 'ignored' : this.classify(cfg.classifier, err);
      renewer?.stop();
      this.outcomes.enqueue({ key: ctx.key, ticket, outcome });
      throw signal?.aborted ? signal.reason : err;
    }
    // Renewal stops before the outcome is queued; the guard returns without
    // waiting for fusebox to take it.
    renewer?.stop();
    const cost = cfg.cost === undefined ? undefined : this.costOf(ctx.key, cfg.cost, value);
    this.outcomes.enqueue(cost === undefined ? { key: ctx.key, ticket, outcome: 'success' } : { key: ctx.key, ticket, outcome: 'success', cost });
    return value;
  }

  // The cost option's answer for a call's value; a broken one must not lose
  // the value: it is logged, and the ticket's permits stand.
  private costOf<T>(key: string, costOf: CostOf<T>, value: T): number | undefined {
    try {
      const cost = costOf(value);
      if (cost === undefined || (Number.isInteger(cost) && cost >= 0 && cost <= MAX_COST)) {
        return cost;
      }
      this.logs.warn('cost', `fusebox: the cost function answered ${String(cost)}, not a whole number of permits from 0 to ${MAX_COST}; reporting no cost, so the ticket's permits stand`, { key });
    } catch (err) {
      this.logs.warn('cost', "fusebox: the cost function failed; reporting no cost, so the ticket's permits stand", { key, err: String(err) });
    }
    return undefined;
  }

  private classify(classifier: Classifier, err: unknown): Outcome {
    try {
      const o = classifier(err);
      if (o === 'success' || o === 'failure' || o === 'ignored') {
        return o;
      }
    } catch (cerr) {
      this.logs.warn('classifier', 'fusebox: the classifier failed; reporting failure', { err: String(cerr) });
    }
    return 'failure';
  }

  // A stream answer as the unary call's result (or error).
  private static answer<T>(result: DecideResult__Output, kind: 'acquire' | 'renew'): T {
    if (result.error) {
      throw statusError(result.error.code, result.error.message);
    }
    const reply = result[kind];
    if (reply === undefined || reply === null) {
      throw statusError(grpc.status.INTERNAL, `fusebox answered a ${kind} frame with ${result.result ?? 'nothing'}`);
    }
    return reply as T;
  }

  private async acquire(req: AcquireRequest, deadlineMs: number, signal?: AbortSignal): Promise<AcquireResponse> {
    if (this.mux !== undefined) {
      return FuseboxClient.answer(await this.mux.request({ acquire: req }, deadlineMs, signal), 'acquire');
    }
    return new Promise((resolve, reject) => {
      let onAbort: (() => void) | undefined;
      let call: grpc.ClientUnaryCall;
      try {
        call = this.stub.Acquire(req, { deadline: Date.now() + deadlineMs }, (err, res) => {
          if (onAbort !== undefined) {
            signal?.removeEventListener('abort', onAbort);
          }
          if (err !== null || res === undefined) {
            reject(err ?? new Error('no response'));
          } else {
            resolve(res);
          }
        });
      } catch (err) {
        reject(err instanceof Error ? err : new Error(String(err))); // a closed channel throws
        return;
      }
      if (signal !== undefined) {
        onAbort = () => call.cancel();
        signal.addEventListener('abort', onAbort, { once: true });
      }
    });
  }

  // One send of the outcome queue: a CompleteBatch, or complete frames of
  // the Decide stream in one message. An item's error is its answer.
  private async sendOutcomes(batch: readonly QueuedOutcome[], deadlineMs: number): Promise<ItemAnswer[]> {
    const items = batch.map((o) =>
      o.cost === undefined ? { ticket: o.ticket, outcome: OUTCOME[o.outcome] } : { ticket: o.ticket, outcome: OUTCOME[o.outcome], cost: o.cost },
    );
    const itemError = (e: ItemError__Output): Error => statusError(e.code, e.message);
    if (this.mux !== undefined) {
      const answers = await this.mux.requestBatch(
        items.map((complete) => ({ complete })),
        deadlineMs,
      );
      return answers.map((a) => {
        if (a instanceof Error) {
          return a;
        }
        if (a.error) {
          return itemError(a.error);
        }
        return a.complete ? null : statusError(grpc.status.INTERNAL, `fusebox answered a complete frame with ${a.result ?? 'nothing'}`);
      });
    }
    const resp = await new Promise<CompleteBatchResponse__Output>((resolve, reject) => {
      this.stub.CompleteBatch({ items }, { deadline: Date.now() + deadlineMs }, (err, res) =>
        err !== null || res === undefined ? reject(err ?? new Error('no response')) : resolve(res),
      );
    });
    return resp.results.map((r) => (r.error ? itemError(r.error) : null));
  }

  // One renewal; the delay before the next (null: stop). A renewal whose
  // call has ended meanwhile is let go quietly: the outcome supersedes it.
  private async renewOnce<T>(ticket: string, leaseMs: number, cfg: Resolved<T>, stopped: () => boolean): Promise<number | null> {
    try {
      const message = cfg.leaseMs > 0 ? { ticket, lease: duration(cfg.leaseMs) } : { ticket };
      const mux = this.mux;
      const resp =
        mux !== undefined
          ? {
              lease: millis(
                FuseboxClient.answer<RenewResponse__Output>(await mux.request({ renew: message }, cfg.deadlineMs), 'renew').lease,
              ),
            }
          : await new Promise<{ lease: ReturnType<typeof millis> }>((resolve, reject) => {
              this.stub.Renew(message, { deadline: Date.now() + cfg.deadlineMs }, (err, res) =>
                err !== null || res === undefined ? reject(err ?? new Error('no response')) : resolve({ lease: millis(res.lease) }),
              );
            });
      this.counters.renewals++;
      return Math.max((resp.lease ?? leaseMs) / 2, 1);
    } catch (err) {
      if (stopped()) {
        return null;
      }
      this.counters.renewErrors++;
      this.logs.warn('renew', 'fusebox: could not renew a lease', { err: String(err) });
      if (isServiceError(err) && err.code === grpc.status.NOT_FOUND) {
        return null; // completed, expired or stale: nothing left to renew
      }
      return Math.max(leaseMs / 4, 1); // try again before the lease ends
    }
  }
}

// Runs a call that has no ticket (failing open, or a status check): nothing
// is reported, but a caller who aborted gets the abort reason as ever.
async function runBare<T>(
  ctx: GuardContext,
  call: (ctx: GuardContext) => Promise<T> | T,
  signal: AbortSignal | undefined,
): Promise<T> {
  try {
    return await call(ctx);
  } catch (err) {
    throw signal?.aborted ? signal.reason : err;
  }
}

// Renews a ticket each time half its lease has passed, until stopped or the
// ticket is gone. Its timers do not keep the process alive.
class Renewer {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    private leaseMs: number,
    private readonly renew: (leaseMs: number, stopped: () => boolean) => Promise<number | null>,
  ) {
    this.schedule(leaseMs / 2);
  }

  private schedule(ms: number): void {
    this.timer = setTimeout(() => this.fire(), ms);
    this.timer.unref();
  }

  private fire(): void {
    this.timer = undefined;
    void this.renew(this.leaseMs, () => this.stopped).then((next) => {
      if (next !== null && !this.stopped) {
        this.leaseMs = next * 2;
        this.schedule(next);
      }
    });
  }

  // Stops renewing without waiting: a renewal in flight is let go (its
  // answer, or NOT_FOUND once the outcome is in, changes nothing).
  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
  }
}
