// The caller id (rule Q1) and the attempt (rule R1) each Acquire carries.
// fusebox refuses a caller longer than 128 bytes with INVALID_ARGUMENT
// naming `caller` and takes one of 128: a refusal proves the client sent
// what it was given, the client's own and a guard's, on both transports.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import { DeniedError, FuseboxRequestError, duration } from '@fusebox/client';
import type { AcquireRequest, ClientOptions, GuardContext, Logger } from '@fusebox/client';

import { SharedServer } from './server';

const quiet: Logger = { warn() {} };
const shared = new SharedServer('node-caller', { deadlineMs: 2000, logger: quiet });

const LONG = 'c'.repeat(129);
const FITS = 'c'.repeat(128);

async function refusedForCaller(p: Promise<unknown>, what: string): Promise<void> {
  let err: unknown;
  try {
    await p;
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof FuseboxRequestError, `${what}: want a FuseboxRequestError, got ${String(err)}`);
  assert.equal(err.code, grpc.status.INVALID_ARGUMENT, what);
  assert.ok(err.details.startsWith('caller:'), `${what}: want details naming caller, got ${err.details}`);
}

for (const transport of ['unary', 'stream'] as const) {
  void test(`${transport}: the client's caller and a guard's are sent`, async () => {
    const key = shared.freshKey();
    const ran: string[] = [];
    const call = (what: string) => () => {
      ran.push(what);
      return Promise.resolve();
    };
    const opts = (caller: string): ClientOptions => ({ transport, caller });

    let c = shared.client(opts(LONG));
    await refusedForCaller(c.guard(key, call("the client's caller")), "the client's caller");
    await c.guard(key, call("a guard's caller replaces the client's"), { caller: 'checkout' });

    c = shared.client(opts(FITS));
    await c.guard(key, call('128 bytes'));
    await refusedForCaller(c.guard(key, call("a guard's caller"), { caller: LONG }), "a guard's caller");
    assert.deepEqual(ran, ["a guard's caller replaces the client's", '128 bytes']);
  });
}

void test('the attempt and the caller go on the wire; none without', async () => {
  const key = shared.freshKey();
  const c = shared.client({ caller: 'billing' });
  const sent: AcquireRequest[] = [];
  const stub = c.stub as unknown as { Acquire: (...args: unknown[]) => unknown };
  const acquire = stub.Acquire.bind(c.stub);
  stub.Acquire = (...args: unknown[]) => {
    sent.push(args[0] as AcquireRequest);
    return acquire(...args);
  };
  await c.guard(key, () => Promise.resolve());
  await c.guard(key, () => Promise.resolve(), { attempt: 3, caller: 'billing-retrier' });
  assert.equal(sent.length, 2);
  assert.equal(sent[0].attempt, undefined);
  assert.equal(sent[0].caller, 'billing');
  assert.equal(sent[1].attempt, 3);
  assert.equal(sent[1].caller, 'billing-retrier');
});

void test('a bad attempt or caller is refused naming it, before anything is sent', async () => {
  const c = shared.client();
  let acquires = 0;
  const stub = c.stub as unknown as { Acquire: (...args: unknown[]) => unknown };
  const acquire = stub.Acquire.bind(c.stub);
  stub.Acquire = (...args: unknown[]) => {
    acquires++;
    return acquire(...args);
  };
  for (const attempt of [-1, 1.5, 2 ** 32, Number.NaN]) {
    await assert.rejects(c.guard('k', () => Promise.resolve(), { attempt }), (err: Error) => {
      assert.ok(err instanceof RangeError && err.message.startsWith('fusebox: attempt must be'), err.message);
      return true;
    });
  }
  await assert.rejects(c.guard('k', () => Promise.resolve(), { caller: 7 as unknown as string }), /caller must be a string/);
  assert.throws(() => shared.client({ caller: 7 as unknown as string }), /caller must be a string/);
  assert.equal(acquires, 0);
});

// A key whose retry budget has seen no first attempt denies a retry (rule
// R2: DENIED retry_budget, no hint) and grants a first attempt.
for (const transport of ['unary', 'stream'] as const) {
  void test(`${transport}: the attempt is counted by the retry budget`, async () => {
    const key = shared.freshKey();
    await shared.server.setPolicy(key, { retryBudget: { ratio: 0.1, minPerSecond: 0, window: duration(10_000) } });
    const c = shared.client({ transport });
    let ran = 0;
    const call = (): Promise<void> => {
      ran++;
      return Promise.resolve();
    };
    await assert.rejects(c.guard(key, call, { attempt: 2 }), (err: Error) => {
      assert.ok(err instanceof DeniedError, String(err));
      assert.equal(err.reason, 'retry_budget');
      assert.equal(err.retryAfterMs, null);
      return true;
    });
    await c.guard(key, call, { attempt: 1 });
    assert.equal(ran, 1);
  });
}

// On a shadow policy (enforce = false, rule D1) a retry the budget would
// deny runs, its context says what it would have been, and its outcome is
// reported: fusebox counts a shadow grant and takes the shadow ticket's
// completion (stale, D2), leaving no ticket live.
for (const transport of ['unary', 'stream'] as const) {
  void test(`${transport}: a shadow policy runs the call and says what it would have been`, async () => {
    const key = shared.freshKey();
    await shared.server.setPolicy(key, {
      enforce: false,
      retryBudget: { ratio: 0.1, minPerSecond: 0, window: duration(10_000) },
    });
    const c = shared.client({ transport });
    const seen: GuardContext[] = [];
    const call = (ctx: GuardContext): Promise<string> => {
      seen.push(ctx);
      return Promise.resolve('ran');
    };
    assert.equal(await c.guard(key, call, { attempt: 2 }), 'ran');
    assert.equal(await c.guard(key, call, { attempt: 1 }), 'ran');
    assert.equal(seen.length, 2);
    const [shadow, real] = seen;
    assert.equal(shadow.admission, 'granted');
    assert.ok(shadow.ticket, 'a shadow grant has a ticket');
    assert.equal(shadow.shadowDecision, 'denied');
    assert.equal(shadow.shadowReason, 'retry_budget');
    assert.ok(real.ticket);
    assert.equal(real.shadowDecision, null);
    assert.equal(real.shadowReason, null);

    assert.equal(await c.flush(10_000), true);
    assert.equal(c.stats().completed, 2);
    assert.equal(c.stats().completeFailures, 0);
    const state = await shared.server.key(key);
    assert.ok(state.stats !== null);
    assert.deepEqual(
      [state.stats.shadow, state.stats.granted, state.stats.retryDenied, state.stats.stale, state.stats.successes, state.liveTickets],
      ['1', '1', '1', '1', '1', 0],
    );
  });
}
