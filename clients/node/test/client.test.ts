// The guard against a real fusebox (manual clock, port 0): outcomes,
// refusals, the local short-circuit, renewal, fail open/closed, the
// classifier, wrap, shared clients and the bounded cache. Outcomes are
// reported in the background: a test that reads the server's state after a
// guard flushes the client first.
import assert from 'node:assert/strict';
import * as net from 'node:net';
import type { Socket } from 'node:net';
import { test } from 'node:test';

import {
  BlockedError,
  DeniedError,
  FuseboxClient,
  FuseboxRefusal,
  FuseboxRequestError,
  OpenCache,
  RefusedError,
  UnavailableError,
} from '@fusebox/client';
import type { ClientOptions, GuardContext, Logger } from '@fusebox/client';

import { Server, SharedServer, breaker, concurrency, tokenBucket, waitFor } from './server';

const boom = new Error('boom');
const quiet: Logger = { warn() {} };

// One server for the file's tests; their clients' deadline is one a debug build meets.
const shared = new SharedServer('node-test', { deadlineMs: 2000, logger: quiet });
const freshKey = (): string => shared.freshKey();
const client = (opts?: ClientOptions, addr?: string): FuseboxClient => shared.client(opts, addr);

async function rejection(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (err) {
    return err;
  }
  assert.fail('the guard did not reject');
}

void test('success and failure are reported; the call gets its value or its own error back', async () => {
  const key = freshKey();
  await shared.server.setPolicy(key, breaker(5, 10_000));
  const c = client();
  let ctx: GuardContext | undefined;
  assert.equal(
    await c.guard(key, (x) => {
      ctx = x;
      return Promise.resolve(42);
    }),
    42,
  );
  assert.equal(ctx?.admission, 'granted');
  assert.ok(ctx?.ticket);
  assert.equal(await rejection(c.guard(key, () => Promise.reject(boom))), boom);
  assert.equal(
    await rejection(
      c.guard(key, () => {
        throw boom;
      }),
    ),
    boom,
    'a synchronous throw is the call failing',
  );
  assert.equal(await c.flush(), true);
  const st = (await shared.server.key(key)).stats;
  assert.equal(st?.successes, '1');
  assert.equal(st?.failures, '2');
  assert.equal(c.stats().completed, 3);
});

void test('the breaker trips, then the key is short-circuited locally, then one probe closes it', async () => {
  const key = freshKey();
  await shared.server.setPolicy(key, breaker(2, 10_000));
  let now = 0;
  const c = client({ clock: () => now });
  for (let i = 0; i < 2; i++) {
    assert.equal(await rejection(c.guard(key, () => Promise.reject(boom))), boom);
  }
  await c.flush(); // the next Acquire must see both failures
  const first = await rejection(c.guard(key, () => Promise.resolve(1)));
  assert.ok(first instanceof BlockedError && first instanceof FuseboxRefusal);
  assert.equal(first.local, false);
  assert.equal(first.reason, 'open');
  assert.equal(first.retryAfterMs, 10_000);
  assert.equal(first.key, key);

  let ran = false;
  const second = await rejection(
    c.guard(key, () => {
      ran = true;
      return Promise.resolve();
    }),
  );
  assert.ok(second instanceof BlockedError && second.local && !ran);
  assert.equal(second.retryAfterMs, 10_000);
  assert.equal((await shared.server.key(key)).stats?.blocked, '1', 'the local answer did not reach the server');

  await shared.server.advance(10_000);
  now += 10_000;
  let admission = '';
  await c.guard(key, (ctx) => {
    admission = ctx.admission;
    return Promise.resolve();
  });
  assert.equal(admission, 'probe');
  await c.flush();
  assert.equal((await shared.server.key(key)).phase, 'PHASE_CLOSED');
  const st = c.stats();
  assert.deepEqual([st.blockedLocal, st.blocked, st.probes], [1, 1, 1]);
});

void test('forget drops a local short-circuit entry', async () => {
  const key = freshKey();
  await shared.server.setPolicy(key, breaker(1, 60_000));
  const c = client();
  await rejection(c.guard(key, () => Promise.reject(boom)));
  await c.flush();
  assert.ok(((await rejection(c.guard(key, () => Promise.resolve()))) as BlockedError).local === false);
  assert.ok(((await rejection(c.guard(key, () => Promise.resolve()))) as BlockedError).local === true);
  c.forget(key);
  assert.ok(((await rejection(c.guard(key, () => Promise.resolve()))) as BlockedError).local === false);
});

void test('an isolated key is refused without running the call', async () => {
  const key = freshKey();
  await shared.server.isolate(key, 'test');
  const c = client();
  let ran = false;
  const err = await rejection(
    c.guard(key, () => {
      ran = true;
      return Promise.resolve();
    }),
  );
  assert.ok(err instanceof RefusedError && err instanceof FuseboxRefusal);
  assert.equal(ran, false);
  assert.equal(c.stats().refused, 1);
});

void test('a call finding every permit held is denied (no_permits)', async () => {
  const key = freshKey();
  await shared.server.setPolicy(key, concurrency(1));
  const c = client();
  let inner: unknown;
  await c.guard(key, async () => {
    inner = await rejection(c.guard(key, () => Promise.resolve()));
  });
  assert.ok(inner instanceof DeniedError);
  assert.equal(inner.reason, 'no_permits');
  assert.equal(inner.retryAfterMs, null);
});

for (const transport of ['unary', 'stream'] as const) {
  void test(`the cost read from the call's value is settled (U1, ${transport})`, async () => {
    const key = freshKey();
    await shared.server.setPolicy(key, tokenBucket(10));
    const logged: string[] = [];
    const c = client({ transport, logger: { warn: (m) => logged.push(m) } });
    // search stands for a call whose value tells what it cost: one permit per row.
    const search = (rows: number | null): Promise<string[] | null> =>
      c.guard(key, () => Promise.resolve(rows === null ? null : Array<string>(rows).fill('row')), {
        permits: 1,
        cost: (value) => (value === null ? undefined : value.length),
      });
    const free = async (): Promise<number> => {
      await c.flush();
      const st = await shared.server.key(key);
      assert.equal(st.liveTickets, 0);
      return st.free;
    };
    assert.deepEqual(await search(5), Array<string>(5).fill('row'));
    assert.equal(await free(), 5); // 1 taken at Acquire, 4 more at Complete
    assert.deepEqual(await search(0), []);
    assert.equal(await free(), 5); // the permit taken came back
    assert.equal(await search(null), null);
    assert.equal(await free(), 4); // no cost reported: the ticket's permit stands
    // A rejected call reports no cost.
    await rejection(c.guard(key, () => Promise.reject(boom), { cost: () => 9 }));
    assert.equal(await free(), 3);
    // A broken cost function keeps the value; the ticket's permit stands.
    assert.equal(await c.guard(key, () => Promise.resolve(7), { cost: () => -1 }), 7);
    assert.equal(await free(), 2);
    assert.ok(logged.some((m) => m.includes('cost function answered -1')));
    const err = await rejection(c.guard(key, () => Promise.resolve(1), { cost: 3 as unknown as () => number }));
    assert.ok(err instanceof TypeError && err.message.includes('cost must be a function'));
    assert.equal(await free(), 2); // the bad option changed nothing
  });
}

void test("a call cancelled by its caller's signal is ignored, and the guard rejects with the abort reason", async () => {
  const key = freshKey();
  await shared.server.setPolicy(key, breaker(1, 10_000));
  const c = client();
  const ac = new AbortController();
  const err = await rejection(
    c.guard(
      key,
      (ctx) =>
        new Promise((_, reject) => {
          ctx.signal.addEventListener('abort', () => reject(new Error('stopped')), { once: true });
          ac.abort();
        }),
      { signal: ac.signal },
    ),
  );
  assert.equal(err, ac.signal.reason);
  await c.flush();
  const st = await shared.server.key(key);
  assert.equal(st.stats?.ignored, '1');
  assert.equal(st.phase, 'PHASE_CLOSED');

  const before = await rejection(c.guard(key, () => Promise.resolve(), { signal: AbortSignal.abort() }));
  assert.ok(before instanceof Error && before.name === 'AbortError', 'aborted before asking: not asked');
  assert.equal((await shared.server.key(key)).stats?.granted, '1');
});

void test('aborting a guard that waits in the queue withdraws the request; the call never runs', async () => {
  const key = freshKey();
  await shared.server.setPolicy(key, { limiter: { concurrency: { permits: 1 }, queueLimit: 1 } });
  const c = client();
  const ac = new AbortController();
  let ran = false;
  await c.guard(key, async () => {
    const waiting = rejection(
      c.guard(
        key,
        () => {
          ran = true;
          return Promise.resolve();
        },
        { maxWaitMs: 60_000, signal: ac.signal },
      ),
    );
    await waitFor('the request waits', async () => (await shared.server.key(key)).waiters === 1);
    ac.abort();
    assert.equal(await waiting, ac.signal.reason);
    // While the permit is still held, so that the waiter cannot be served first.
    await waitFor('the waiter withdrawn', async () => (await shared.server.key(key)).stats?.withdrawn === '1');
  });
  assert.equal(ran, false);
  assert.equal(c.stats().unavailable, 0, 'the caller aborting is not an outage');
});

void test('the default classifier ignores an AbortError; a replaced classifier decides', async () => {
  const key = freshKey();
  await shared.server.setPolicy(key, breaker(1, 10_000));
  const c = client();
  const abortErr = new DOMException('gone', 'AbortError');
  assert.equal(await rejection(c.guard(key, () => Promise.reject(abortErr))), abortErr);
  assert.equal(await rejection(c.guard(key, () => Promise.reject(boom), { classifier: () => 'ignored' })), boom);
  await c.flush();
  const st = await shared.server.key(key);
  assert.equal(st.stats?.ignored, '2');
  assert.equal(st.phase, 'PHASE_CLOSED');

  const throwing = client({
    classifier: () => {
      throw new Error('classifier bug');
    },
  });
  await rejection(throwing.guard(key, () => Promise.reject(boom)));
  await throwing.flush();
  assert.equal((await shared.server.key(key)).stats?.failures, '1', 'a failing classifier reports a failure');
});

void test('the lease is renewed in the background at half its length, and renewal stops with the call', async () => {
  const key = freshKey();
  const c = client();
  await c.guard(
    key,
    async () => {
      await waitFor('two renewals', () => c.stats().renewals >= 2);
    },
    { leaseMs: 100 },
  );
  assert.equal(await c.flush(), true);
  const st = c.stats();
  assert.ok(st.renewals >= 2);
  assert.equal(st.renewErrors, 0);
  assert.equal(st.completed, 1);
  const ks = await shared.server.key(key);
  assert.equal(ks.stats?.successes, '1');
  assert.equal(ks.liveTickets, 0);
  const settled = c.stats().renewals;
  await new Promise((r) => setTimeout(r, 150)); // three renewal periods: none may happen
  assert.equal(c.stats().renewals, settled);
});

void test('a renewal answered NOT_FOUND (the lease ended) stops renewing; the late outcome is counted as not reported', async () => {
  const key = freshKey();
  const c = client();
  await c.guard(
    key,
    async () => {
      await waitFor('a first renewal', () => c.stats().renewals >= 1);
      await shared.server.advance(1000); // past the 100 ms lease on the server's clock
      await waitFor('a renewal refused', () => c.stats().renewErrors >= 1);
      const settled = c.stats();
      await new Promise((r) => setTimeout(r, 150)); // three renewal periods: none may happen
      assert.deepEqual([c.stats().renewals, c.stats().renewErrors], [settled.renewals, settled.renewErrors]);
    },
    { leaseMs: 100 },
  );
  assert.equal(await c.flush(), true);
  const st = c.stats();
  assert.equal(st.renewErrors, 1);
  assert.deepEqual([st.completed, st.completeFailures, st.completeErrs], [0, 1, 1]);
  assert.equal((await shared.server.key(key)).stats?.expired, '1');
});

void test('with fusebox down a guard fails open (the call knows) or closed, and both are counted and logged once', async () => {
  const down = await Server.start({ admin: false });
  const lines: string[] = [];
  const c = client({ logger: { warn: (m) => lines.push(m) }, logIntervalMs: 3_600_000 }, down.addr);
  await c.guard('k', () => Promise.resolve());
  assert.equal(await c.flush(), true);
  await down.close();

  for (let i = 0; i < 3; i++) {
    let ctx: GuardContext | undefined;
    await c.guard('k', (x) => {
      ctx = x;
      return Promise.resolve();
    });
    assert.equal(ctx?.admission, 'failed_open');
    assert.equal(ctx?.ticket, null);
    assert.ok(ctx?.unavailableError instanceof Error);
  }
  let ran = false;
  const err = await rejection(
    c.guard(
      'k',
      () => {
        ran = true;
        return Promise.resolve();
      },
      { onUnavailable: 'closed' },
    ),
  );
  assert.ok(err instanceof UnavailableError && !ran);
  const st = c.stats();
  assert.deepEqual([st.unavailable, st.failedOpen, st.failedClosed], [4, 3, 1]);
  assert.deepEqual(lines, ['fusebox unavailable; failing open'], 'logged once per interval');

  let now = 0;
  const logged: Record<string, unknown>[] = [];
  const timed = client({ clock: () => now, logIntervalMs: 1000, logger: { warn: (_, f) => logged.push(f) } }, down.addr);
  for (let i = 0; i < 3; i++) {
    await timed.guard('k', () => Promise.resolve());
  }
  now = 1000;
  await timed.guard('k', () => Promise.resolve());
  assert.equal(logged.length, 2);
  assert.equal(logged[0].unloggedSinceLast, undefined);
  assert.equal(logged[1].unloggedSinceLast, 2, 'the next line tells how many were left unlogged');

  const closed = client({ onUnavailable: 'closed' }, down.addr);
  assert.ok((await rejection(closed.guard('k', () => Promise.resolve()))) instanceof UnavailableError);
});

void test('the 50 ms default deadline: a fusebox that does not answer costs one deadline, then the policy', async () => {
  // A listening socket that never speaks HTTP/2.
  const sockets: Socket[] = [];
  const silent = net.createServer((s) => sockets.push(s));
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  const addr = silent.address();
  assert.ok(addr !== null && typeof addr === 'object');
  const c = shared.closeAfter(new FuseboxClient(`127.0.0.1:${addr.port}`, { logger: quiet }));
  const t0 = performance.now();
  let admission = '';
  await c.guard('k', (ctx) => {
    admission = ctx.admission;
    return Promise.resolve();
  });
  const took = performance.now() - t0;
  assert.equal(admission, 'failed_open');
  assert.ok(took < 1000, `took ${took} ms`);
  await c.close();
  for (const s of sockets) {
    s.destroy();
  }
  await new Promise((r) => silent.close(r));
});

void test('fusebox rejecting the request itself is a FuseboxRequestError; the call is not made', async () => {
  const c = client();
  const err = await rejection(c.guard('', () => Promise.resolve()));
  assert.ok(err instanceof FuseboxRequestError);
  assert.equal(err.code, 3); // INVALID_ARGUMENT
  assert.equal(c.stats().unavailable, 0);
});

void test('a status check (permits 0) runs without a ticket and reports nothing', async () => {
  const key = freshKey();
  const c = client();
  let ticket: string | null = 'x';
  await c.guard(
    key,
    (ctx) => {
      ticket = ctx.ticket;
      return Promise.resolve();
    },
    { permits: 0 },
  );
  assert.equal(ticket, null);
  await c.flush();
  assert.equal(c.stats().completed, 0);
});

void test('wrap guards a function each time it is called, with a fixed key or one made from the arguments', async () => {
  const key = freshKey();
  const c = client();
  const add = c.wrap(key, (a: number, b: number) => Promise.resolve(a + b));
  assert.equal(await add(2, 3), 5);
  assert.equal(await add(4, 5), 9);
  const byUser = c.wrap(
    (user: string) => `${key}/${user}`,
    (user: string) => Promise.resolve(user.toUpperCase()),
  );
  assert.equal(await byUser('ann'), 'ANN');
  await c.flush();
  assert.equal((await shared.server.key(key)).stats?.successes, '2');
  assert.equal((await shared.server.key(`${key}/ann`)).stats?.successes, '1');
});

void test('shared is one client (and channel) per target until closed', async () => {
  const a = FuseboxClient.shared(shared.server.addr, { logger: quiet });
  const b = FuseboxClient.shared(shared.server.addr, { token: 'ignored' });
  assert.equal(a, b);
  const closing = a.close(); // forgotten at once, closed once flushed
  const c = FuseboxClient.shared(shared.server.addr, { logger: quiet });
  assert.notEqual(c, a);
  assert.equal(a.close(), closing, 'closing again is the same close');
  await closing;
  await c.close();
});

void test('the local cache is bounded: ended entries go first, then the one ending soonest', () => {
  const cache = new OpenCache(2);
  cache.put('a', 1000, 0);
  cache.put('b', 3000, 0);
  cache.put('c', 2000, 0);
  assert.equal(cache.size, 2);
  assert.equal(cache.blockedFor('a', 0), 0);
  assert.equal(cache.blockedFor('b', 0), 3000);
  assert.equal(cache.blockedFor('c', 2000), 0, 'an ended entry is dropped');
  assert.equal(cache.size, 1);
  const none = new OpenCache(0);
  none.put('a', 1000, 0);
  assert.equal(none.size, 0, 'size 0 turns the cache off');
});

void test('after an outage the guards back off before asking fusebox again, and apply the policy meanwhile', async () => {
  const down = await Server.start({ admin: false });
  const addr = down.addr;
  await down.close();
  const c = client({ deadlineMs: 50 }, addr);
  let acquires = 0;
  const stub = c.stub as unknown as { Acquire: (...args: unknown[]) => unknown };
  const acquire = stub.Acquire.bind(c.stub);
  stub.Acquire = (...args: unknown[]) => {
    acquires++;
    return acquire(...args);
  };
  for (let i = 0; i < 3; i++) {
    let admission: string | undefined;
    await c.guard('k', (ctx) => {
      admission = ctx.admission;
      return Promise.resolve();
    });
    assert.equal(admission, 'failed_open');
  }
  const err = await rejection(c.guard('k', () => Promise.resolve(), { onUnavailable: 'closed' }));
  assert.ok(err instanceof UnavailableError);
  assert.equal(acquires, 1, 'the later guards are answered by the backoff');
  const st = c.stats();
  assert.deepEqual([st.unavailable, st.failedOpen, st.failedClosed], [4, 3, 1]);
});
