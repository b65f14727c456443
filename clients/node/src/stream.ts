// A client's calls multiplexed over one Decide stream (transport 'stream'):
// each call is a frame with its own id, the frames queued in one turn of
// the event loop go out in one message, and each answer is handed to its
// caller by id. The stream is opened on first use and again after it ends;
// the calls in flight on a stream that ends fail UNAVAILABLE, as a broken
// unary call would. An Acquire given up whose answer still grants a ticket
// (the answer was made before the cancel) hands the ticket to `abandoned`,
// so that its outcome is reported rather than left to its lease.
import * as grpc from '@grpc/grpc-js';

import type { FuseboxStub } from './proto';
import type { DecideFrame } from './generated/fusebox/v1/DecideFrame';
import type { DecideRequest } from './generated/fusebox/v1/DecideRequest';
import type { DecideResponse__Output } from './generated/fusebox/v1/DecideResponse';
import type { DecideResult__Output } from './generated/fusebox/v1/DecideResult';

/** The most frames in one message (the server's limit). */
const FRAMES_PER_MESSAGE = 1000;

type Pending = Map<string, { resolve: (r: DecideResult__Output) => void; reject: (e: Error) => void }>;

/** Called with the key and ticket of an Acquire that was given up but granted. */
export type Abandoned = (key: string, ticket: string) => void;

/** An error shaped like the one a unary call fails with. */
export function statusError(code: grpc.status, details: string): grpc.ServiceError {
  return Object.assign(new Error(`${code} ${grpc.status[code]}: ${details}`), {
    code,
    details,
    metadata: new grpc.Metadata(),
  });
}

/** A client's calls as frames of one Decide stream (see the top of this file). */
export class DecideMux {
  private call: grpc.ClientDuplexStream<DecideRequest, DecideResponse__Output> | undefined;
  private pending: Pending = new Map();
  // The Acquires of the current stream given up before their answer (id to
  // key); each is answered once (CANCELLED, or the answer made before the
  // cancel), so this holds at most the Acquires in flight.
  private givenUp = new Map<string, string>();
  private queue: DecideFrame[] = [];
  private flushing = false;
  private nextId = 1;

  constructor(
    private readonly stub: FuseboxStub,
    private readonly abandoned: Abandoned = () => {},
  ) {}

  private open(): grpc.ClientDuplexStream<DecideRequest, DecideResponse__Output> {
    const call = this.stub.Decide();
    const pending: Pending = new Map();
    const givenUp = new Map<string, string>();
    call.on('data', (message: DecideResponse__Output) => {
      for (const result of message.results) {
        const waiter = pending.get(result.id);
        if (waiter !== undefined) {
          pending.delete(result.id);
          waiter.resolve(result);
          continue;
        }
        const key = givenUp.get(result.id);
        if (key !== undefined) {
          givenUp.delete(result.id);
          const ticket = result.acquire?.ticket;
          if (ticket) {
            this.abandoned(key, ticket);
          }
        }
      }
    });
    const ended = (why: string): void => {
      if (this.call === call) {
        this.call = undefined;
      }
      for (const waiter of pending.values()) {
        waiter.reject(statusError(grpc.status.UNAVAILABLE, `the Decide stream ended before fusebox answered (${why})`));
      }
      pending.clear();
      givenUp.clear();
    };
    call.on('error', (err: Error) => ended(err.message));
    call.on('end', () => ended('closed by fusebox'));
    this.call = call;
    this.pending = pending;
    this.givenUp = givenUp;
    return call;
  }

  /**
   * Sends a frame and waits for its answer, at most deadlineMs; an Acquire
   * past its deadline (or whose signal aborts) is cancelled on the stream.
   */
  request(frame: Omit<DecideFrame, 'id'>, deadlineMs: number, signal?: AbortSignal): Promise<DecideResult__Output> {
    if (this.call === undefined) {
      this.open();
    }
    const pending = this.pending;
    const givenUp = this.givenUp;
    const id = String(this.nextId++);
    return new Promise((resolve, reject) => {
      const giveUp = (err: Error): void => {
        if (pending.delete(id)) {
          if (frame.acquire !== undefined && frame.acquire !== null) {
            givenUp.set(id, frame.acquire.key ?? '');
            this.enqueue({ id, cancel: {} });
          }
          reject(err);
        }
      };
      const timer = setTimeout(
        () => giveUp(statusError(grpc.status.DEADLINE_EXCEEDED, 'fusebox did not answer in time')),
        deadlineMs,
      );
      timer.unref();
      const onAbort = (): void => giveUp(statusError(grpc.status.CANCELLED, 'the caller cancelled'));
      signal?.addEventListener('abort', onAbort, { once: true });
      const done = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      pending.set(id, {
        resolve: (r) => {
          done();
          resolve(r);
        },
        reject: (e) => {
          done();
          reject(e);
        },
      });
      this.enqueue({ id, ...frame });
    });
  }

  private enqueue(frame: DecideFrame): void {
    this.queue.push(frame);
    if (!this.flushing) {
      this.flushing = true;
      setImmediate(() => this.flush());
    }
  }

  private flush(): void {
    this.flushing = false;
    if (this.queue.length === 0) {
      return;
    }
    const call = this.call ?? this.open();
    while (this.queue.length > 0) {
      call.write({ frames: this.queue.splice(0, FRAMES_PER_MESSAGE) });
    }
  }

  /**
   * Sends frames (at most 1,000, none an Acquire) together in one message,
   * now, after any frames queued before them, and resolves with one answer
   * per frame, in order: the result, or the error that ended its wait (the
   * stream ended, or deadlineMs passed). Never rejects.
   */
  requestBatch(frames: readonly Omit<DecideFrame, 'id'>[], deadlineMs: number): Promise<(DecideResult__Output | Error)[]> {
    if (frames.length === 0) {
      return Promise.resolve([]);
    }
    this.flush();
    const call = this.call ?? this.open();
    const pending = this.pending;
    return new Promise((resolve) => {
      const answers: (DecideResult__Output | Error | undefined)[] = new Array<undefined>(frames.length);
      const ids: string[] = [];
      let left = frames.length;
      const settle = (i: number, answer: DecideResult__Output | Error): void => {
        if (answers[i] === undefined) {
          answers[i] = answer;
          left--;
          if (left === 0) {
            clearTimeout(timer);
            resolve(answers as (DecideResult__Output | Error)[]);
          }
        }
      };
      const timer = setTimeout(() => {
        for (const [i, id] of ids.entries()) {
          if (pending.delete(id)) {
            settle(i, statusError(grpc.status.DEADLINE_EXCEEDED, 'fusebox did not answer in time'));
          }
        }
      }, deadlineMs);
      timer.unref();
      const message: DecideFrame[] = frames.map((frame, i) => {
        const id = String(this.nextId++);
        ids.push(id);
        pending.set(id, { resolve: (r) => settle(i, r), reject: (e) => settle(i, e) });
        return { id, ...frame };
      });
      call.write({ frames: message });
    });
  }

  /** Ends the stream (its waiting Acquires are withdrawn by fusebox). */
  close(): void {
    this.call?.end();
    this.call = undefined;
  }
}
