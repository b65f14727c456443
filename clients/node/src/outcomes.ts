// The outcome queue: a guard queues its call's outcome and returns at once;
// one sender reports what is queued in the background, one send in flight
// at a time, the outcomes that end meanwhile going together in the next
// send (at most 1,000, the server's limit per message). A full queue drops
// the outcome (its ticket's lease then ends on the server). `flush` waits
// until every outcome queued before it has been answered.
import type { Outcome } from './client';
import type { LogLimiter, Stats } from './stats';

/** The longest delay a Node timer takes. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** The most outcomes in one send (the server's limit per message). */
export const OUTCOMES_PER_SEND = 1000;

/** One outcome waiting to be reported. */
export interface QueuedOutcome {
  readonly key: string;
  readonly ticket: string;
  readonly outcome: Outcome;
  /** The permits the call really used (the guard's `cost`); absent: the ticket's. */
  readonly cost?: number;
}

/**
 * How one item of a send was answered: null when fusebox took it, else the
 * error (the item's own, or the whole send's).
 */
export type ItemAnswer = Error | null;

/**
 * Reports a batch of outcomes to fusebox within deadlineMs: resolves with
 * one answer per item, in order; rejects when the whole send failed.
 */
export type SendOutcomes = (batch: readonly QueuedOutcome[], deadlineMs: number) => Promise<ItemAnswer[]>;

interface Waiter {
  upTo: number;
  resolve: (all: boolean) => void;
}

/**
 * A client's outcome queue and its sender: bounded at `capacity` waiting
 * outcomes, one send in flight at a time, each send at most 1,000 outcomes
 * with a deadline of `deadlineMs`.
 */
export class OutcomeSender {
  private queue: QueuedOutcome[] = [];
  private sending = false;
  private scheduled = false;
  private closed = false;
  /** Outcomes accepted into the queue, ever (each one's sequence number). */
  private accepted = 0;
  /** Outcomes whose send has ended (answered or failed), ever; in queue order. */
  private settled = 0;
  private waiters: Waiter[] = [];

  constructor(
    private readonly capacity: number,
    private readonly deadlineMs: number,
    private readonly send: SendOutcomes,
    private readonly counters: Stats,
    private readonly logs: LogLimiter,
  ) {}

  /**
   * Queues an outcome and returns: nothing here waits on the network. With
   * nothing in flight, a send starts in this turn of the event loop (after
   * the caller's own continuation), taking every outcome queued by then.
   */
  enqueue(item: QueuedOutcome): void {
    if (this.closed) {
      this.failed([item], new Error('the client is closed'));
      return;
    }
    if (this.queue.length >= this.capacity) {
      this.counters.outcomesDropped++;
      this.logs.warn(
        'dropped',
        'fusebox: the outcome queue is full, so an outcome was dropped (its ticket lives until its lease ends on the server); ' +
          'fusebox is slow or unreachable: check it, or raise the outcomeQueue option if this happens in bursts',
        { key: item.key, outcome: item.outcome, outcomeQueue: this.capacity, outcomesDropped: this.counters.outcomesDropped },
      );
      return;
    }
    this.queue.push(item);
    this.accepted++;
    if (!this.sending && !this.scheduled) {
      this.scheduled = true;
      setImmediate(this.next);
    }
  }

  /**
   * Resolves true once every outcome queued before this call has been
   * answered (reported, or counted as not reported), false when timeoutMs
   * passes first; the outcomes left keep going in the background.
   */
  flush(timeoutMs: number): Promise<boolean> {
    const upTo = this.accepted;
    if (this.settled >= upTo) {
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const waiter: Waiter = {
        upTo,
        resolve: (all) => {
          clearTimeout(timer);
          resolve(all);
        },
      };
      // Node's timers hold at most 2^31-1 ms; Infinity means no timer.
      const timer = Number.isFinite(timeoutMs)
        ? setTimeout(
            () => {
              this.waiters = this.waiters.filter((w) => w !== waiter);
              resolve(false);
            },
            Math.min(timeoutMs, MAX_TIMER_MS),
          )
        : undefined;
      this.waiters.push(waiter);
    });
  }

  /** From now on an outcome is counted as not reported instead of queued. */
  close(): void {
    this.closed = true;
  }

  private readonly next = (): void => {
    this.scheduled = false;
    if (this.sending || this.queue.length === 0) {
      return;
    }
    const batch = this.queue.length <= OUTCOMES_PER_SEND ? this.queue : this.queue.slice(0, OUTCOMES_PER_SEND);
    this.queue = batch === this.queue ? [] : this.queue.slice(OUTCOMES_PER_SEND);
    this.sending = true;
    let sent: Promise<ItemAnswer[]>;
    try {
      sent = this.send(batch, this.deadlineMs);
    } catch (err) {
      sent = Promise.reject(err instanceof Error ? err : new Error(String(err)));
    }
    sent
      .then(
        (answers) => this.answered(batch, answers),
        (err: unknown) => this.failed(batch, err),
      )
      .finally(() => {
        this.sending = false;
        this.settled += batch.length;
        if (this.waiters.length > 0) {
          const waiting = this.waiters;
          this.waiters = waiting.filter((w) => w.upTo > this.settled);
          for (const w of waiting) {
            if (w.upTo <= this.settled) {
              w.resolve(true);
            }
          }
        }
        this.next();
      });
  };

  private answered(batch: readonly QueuedOutcome[], answers: ItemAnswer[]): void {
    for (const [i, item] of batch.entries()) {
      const err = i < answers.length ? answers[i] : new Error('fusebox gave no answer for this outcome');
      if (err === null) {
        this.counters.completed++;
      } else {
        this.failed([item], err);
      }
    }
  }

  private failed(items: readonly QueuedOutcome[], err: unknown): void {
    this.counters.completeFailures += items.length;
    this.counters.completeErrs = this.counters.completeFailures;
    this.logs.warn(
      'complete',
      'fusebox: could not report an outcome; its ticket ends with its lease on the server, which counts it as expired. ' +
        'If this goes on, check that fusebox is up and reachable from this process',
      { key: items[0]?.key, outcome: items[0]?.outcome, outcomes: items.length, err: String(err) },
    );
  }
}
