// Outcomes off the caller's path (clients/README.md): a guard returns as
// soon as its call does, the outcome is reported in the background from a
// bounded queue, `flush` waits for it, `close` flushes, and what cannot be
// reported is counted. Against a real fusebox (port 0), stopped with SIGSTOP
// where a test needs a server that answers nothing.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { FuseboxClient } from '@fusebox/client';
import type { ClientOptions, Logger } from '@fusebox/client';

import { Server, SharedServer, waitFor, within } from './server';

const quiet: Logger = { warn() {} };
const TRANSPORTS = ['unary', 'stream'] as const;

// One server for the file's tests; their clients' deadline outlasts a stop of the server.
const shared = new SharedServer('node-outcomes', { deadlineMs: 10_000, logger: quiet });
const freshKey = (): string => shared.freshKey();
const client = (opts?: ClientOptions, addr?: string): FuseboxClient => shared.client(opts, addr);

/** A promise and the function that resolves it. */
function latch(): { open: () => void; opened: Promise<void> } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

/**
 * Starts `calls` guards of key on c whose calls wait for `release.open()`,
 * and returns once every call runs (`what` names that wait).
 */
async function heldCalls(
  c: FuseboxClient,
  key: string,
  calls: number,
  what: string,
  timeoutMs?: number,
): Promise<{ guards: Promise<void>[]; release: ReturnType<typeof latch> }> {
  const release = latch();
  let started = 0;
  const guards = Array.from({ length: calls }, () =>
    c.guard(key, async () => {
      started++;
      await release.opened;
    }),
  );
  await waitFor(what, () => started === calls, timeoutMs);
  return { guards, release };
}

for (const transport of TRANSPORTS) {
  void test(`${transport}: the guard returns the call's value while fusebox is stopped, before the outcome is answered`, async () => {
    const key = freshKey();
    const c = client({ transport });
    const granted = latch();
    const release = latch();
    const guarded = c.guard(key, async (ctx) => {
      assert.equal(ctx.admission, 'granted');
      granted.open();
      await release.opened;
      return 'value';
    });
    await within('the call is granted', granted.opened);
    await shared.server.pause();
    try {
      release.open();
      assert.equal(await within('the guard returns with fusebox stopped', guarded), 'value');
      const st = c.stats();
      assert.deepEqual([st.completed, st.completeFailures], [0, 0], 'the guard did not wait for its outcome to be answered');
    } finally {
      shared.server.resume();
    }
    assert.equal(await c.flush(), true);
    const ks = await shared.server.key(key);
    assert.equal(ks.stats?.successes, '1');
    assert.equal(ks.liveTickets, 0);
    assert.equal(c.stats().completed, 1);
  });

  void test(`${transport}: flush waits until the outcomes queued before it are answered`, async () => {
    const key = freshKey();
    const c = client({ transport });
    assert.equal(await c.guard(key, () => 7), 7);
    await c.guard(key, () => Promise.reject(new Error('boom'))).catch(() => undefined);
    assert.equal(await c.flush(), true);
    assert.equal(c.stats().completed, 2, 'both answered when flush returns');
    const ks = await shared.server.key(key); // once, no polling
    assert.deepEqual([ks.stats?.successes, ks.stats?.failures, ks.liveTickets], ['1', '1', 0]);
    assert.equal(await c.flush(), true, 'nothing queued: at once');
  });

  void test(`${transport}: more outcomes than one send takes go in several sends of at most 1,000`, async () => {
    const key = freshKey();
    const c = client({ transport });
    const calls = 1200;
    const { guards, release } = await heldCalls(c, key, calls, 'all calls run', 30_000);
    release.open(); // every outcome is queued in this turn: one send cannot take them all
    await Promise.all(guards);
    assert.equal(await c.flush(30_000), true);
    const st = c.stats();
    assert.deepEqual([st.completed, st.completeFailures, st.outcomesDropped], [calls, 0, 0]);
    const ks = await shared.server.key(key);
    assert.deepEqual([ks.stats?.successes, ks.liveTickets], [String(calls), 0]);
  });

  void test(`${transport}: close flushes the outcome queue, then closes`, async () => {
    const key = freshKey();
    const c = new FuseboxClient(shared.server.addr, { deadlineMs: 10_000, logger: quiet, transport });
    const n = 5;
    await Promise.all(Array.from({ length: n }, (_, i) => c.guard(key, () => i)));
    await c.close();
    const ks = await shared.server.key(key); // the admin client's own channel
    assert.deepEqual([ks.stats?.successes, ks.liveTickets], [String(n), 0]);
    const late = await c.guard(key, () => 'ran', { onUnavailable: 'open' }).catch((e: unknown) => e);
    assert.equal(late, 'ran', 'a closed client fails open as for any outage');
  });

  void test(`${transport}: a send that fails is counted, and flush still returns`, async () => {
    const doomed = await Server.start({ admin: false });
    const lines: string[] = [];
    const c = client({ transport, deadlineMs: 2000, logger: { warn: (m) => lines.push(m) } }, doomed.addr);
    const running = latch();
    const release = latch();
    const guarded = c.guard('k', async () => {
      running.open();
      await release.opened;
      return 'value';
    });
    await within('the call runs', running.opened);
    await doomed.close(); // killed, and waited for
    release.open();
    assert.equal(await within('the guard returns', guarded), 'value');
    assert.equal(await within('flush returns', c.flush(10_000), 10_000), true);
    const st = c.stats();
    assert.deepEqual([st.completed, st.completeFailures, st.outcomesDropped], [0, 1, 0]);
    assert.ok(
      lines.some((l) => l.startsWith('fusebox: could not report an outcome')),
      `logged: ${JSON.stringify(lines)}`,
    );
  });

  void test(`${transport}: the queue is bounded: with fusebox stopped, what does not fit is dropped and its ticket lives on`, async () => {
    // The case of the spec (4 calls, a queue of 1), then random ones; all
    // calls end at once while a send cannot be answered.
    const cases: [number, number][] = [[4, 1]];
    for (let i = 0; i < 3; i++) {
      cases.push([1 + Math.floor(Math.random() * 8), 1 + Math.floor(Math.random() * 4)]);
    }
    for (const [calls, queue] of cases) {
      const where = `${calls} calls, outcomeQueue ${queue}`;
      const key = freshKey();
      const c = client({ transport, outcomeQueue: queue });
      const { guards, release } = await heldCalls(c, key, calls, `${where}: all calls run`);
      await shared.server.pause();
      try {
        release.open();
        await within(`${where}: the guards return`, Promise.all(guards));
      } finally {
        shared.server.resume();
      }
      assert.equal(await c.flush(), true, where);
      const st = c.stats();
      const ks = await shared.server.key(key);
      const reached = Number(ks.stats?.successes);
      assert.equal(reached + st.outcomesDropped, calls, `${where}: every outcome reached fusebox or was dropped`);
      assert.ok(st.outcomesDropped >= calls - queue - 1, `${where}: at most one send in flight and a full queue (dropped ${st.outcomesDropped})`);
      assert.equal(ks.liveTickets, st.outcomesDropped, `${where}: a dropped outcome's ticket lives until its lease ends`);
      assert.equal(st.completeFailures, 0, where);
    }
  });
}

void test('stream: an Acquire given up but granted after all reports its ticket as ignored', async () => {
  const key = freshKey();
  const c = client({ transport: 'stream', deadlineMs: 200 });
  await c.guard(key, () => 1); // the stream is open and the key known
  assert.equal(await c.flush(), true);
  await shared.server.pause();
  let admission = '';
  try {
    // The Acquire reaches fusebox only after its deadline: the guard fails
    // open, and the grant fusebox still answers is handed back.
    await c.guard(key, (ctx) => {
      admission = ctx.admission;
    });
  } finally {
    shared.server.resume();
  }
  assert.equal(admission, 'failed_open');
  let last = '';
  await waitFor('the abandoned ticket reported', async () => {
    const ks = await shared.server.key(key);
    last = JSON.stringify({ ignored: ks.stats?.ignored, live: ks.liveTickets, granted: ks.stats?.granted });
    return ks.stats?.ignored === '1' && ks.liveTickets === 0;
  }).catch((err: unknown) => assert.fail(`${String(err)}: ${last}`));
});

void test("the outcomeQueue option and flush's timeout are checked", async () => {
  for (const bad of [0, -1, 1.5, Number.NaN]) {
    assert.throws(() => new FuseboxClient(shared.server.addr, { outcomeQueue: bad }), /outcomeQueue/);
  }
  const c = client();
  for (const bad of [-1, Number.NaN]) {
    await assert.rejects(c.flush(bad), /timeoutMs/);
  }
  assert.equal(await c.flush(Infinity), true, 'nothing queued');
});
