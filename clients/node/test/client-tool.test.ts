// The client tool (client-tool.ts) driven as the fleet test and the bench
// script drive it, against a real fusebox.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import * as path from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, test } from 'node:test';

import { Server, waitFor, within } from './server';

const TOOL = path.join(__dirname, 'client-tool.js');

let server: Server;

before(async () => {
  server = await Server.start({
    config: '[[rule]]\nmatch = "svc/*"\nbreaker = { mode = "consecutive", failures = 2, break = "10s" }\n',
  });
});

const tools: Tool[] = [];

after(async () => {
  for (const t of tools) {
    if (t.proc.exitCode === null && t.proc.signalCode === null) {
      t.proc.kill(); // a test that failed midway leaves no process behind
    }
  }
  await server.close();
});

type Event = Record<string, unknown>;

class Tool {
  readonly proc: ChildProcessWithoutNullStreams;
  private readonly events: Event[] = [];
  private waiting: (() => void) | undefined;
  readonly exited: Promise<number | null>;

  constructor(args: string[]) {
    this.proc = spawn(process.execPath, [TOOL, ...args], { stdio: 'pipe' });
    tools.push(this);
    this.exited = new Promise((resolve) => this.proc.once('exit', (code) => resolve(code)));
    createInterface({ input: this.proc.stdout }).on('line', (line) => {
      this.events.push(JSON.parse(line) as Event);
      this.waiting?.();
    });
  }

  send(cmd: Event | string): void {
    this.proc.stdin.write(`${typeof cmd === 'string' ? cmd : JSON.stringify(cmd)}\n`);
  }

  /** The next event (at most 5 s). */
  async next(): Promise<Event> {
    if (this.events.length === 0) {
      await within(
        'an event from the tool',
        new Promise<void>((resolve) => (this.waiting = resolve)),
      );
      this.waiting = undefined;
    }
    const e = this.events.shift();
    assert.ok(e !== undefined);
    return e;
  }
}

const done = (id: string, fields: Event): Event => ({
  event: 'done',
  id,
  ran: false,
  refusal: null,
  reason: null,
  retry_after_ms: null,
  local: false,
  error: false,
  unavailable: false,
  ...fields,
});

void test('worker: guards, refusals, the local short-circuit, forget, hang and release', async () => {
  const w = new Tool(['worker', '--target', server.addr]);
  assert.deepEqual(await w.next(), { event: 'ready', lang: 'node' });
  for (const id of ['f1', 'f2']) {
    w.send({ op: 'guard', id, key: 'svc/a', call: 'fail' });
    assert.deepEqual(await w.next(), { event: 'running', id });
    assert.deepEqual(await w.next(), done(id, { ran: true, error: true }));
  }
  // The outcomes are reported in the background: wait until fusebox has
  // both before the next Acquire, as the fleet test does.
  await waitFor('the two failures reach fusebox', async () => (await server.key('svc/a')).phase === 'PHASE_OPEN');
  w.send({ op: 'guard', id: 'b1', key: 'svc/a', call: 'succeed' });
  assert.deepEqual(await w.next(), done('b1', { refusal: 'blocked', reason: 'open', retry_after_ms: 10000 }));
  w.send({ op: 'guard', id: 'b2', key: 'svc/a', call: 'succeed' });
  const local = await w.next();
  assert.equal(local.local, true);
  assert.equal(local.refusal, 'blocked');
  w.send({ op: 'forget', key: 'svc/a' });
  assert.deepEqual(await w.next(), { event: 'forgotten', key: 'svc/a' });
  w.send({ op: 'guard', id: 'b3', key: 'svc/a', call: 'succeed' });
  assert.equal((await w.next()).local, false);

  w.send({ op: 'guard', id: 'h1', key: 'svc/b', call: 'hang' });
  assert.deepEqual(await w.next(), { event: 'running', id: 'h1' });
  w.send({ op: 'release', id: 'h1' });
  assert.deepEqual(await w.next(), done('h1', { ran: true }));

  w.send({ op: 'guard', id: 'h2', key: 'svc/b', call: 'hang' });
  assert.deepEqual(await w.next(), { event: 'running', id: 'h2' });
  w.proc.stdin.end(); // a call still hanging at the end is released
  assert.deepEqual(await w.next(), done('h2', { ran: true }));
  assert.equal(await within('the worker exits', w.exited), 0);
  // Read once: the worker closed its client, which flushed the outcomes.
  assert.equal((await server.key('svc/b')).stats?.successes, '2');
});

void test('worker: a command it cannot read is an error event and exit 1', async () => {
  const w = new Tool(['worker', '--target', server.addr]);
  assert.equal((await w.next()).event, 'ready');
  w.send({ op: 'dance' });
  assert.equal((await w.next()).event, 'error');
  assert.equal(await within('the worker exits', w.exited), 1);
});

void test('bench: one JSON line with the medians and p99s of raw and guarded units', async () => {
  const b = new Tool(['bench', '--target', server.addr, '--key', 'bench/k', '--iterations', '20']);
  const line = await b.next();
  assert.equal(await within('the bench exits', b.exited, 30_000), 0);
  assert.deepEqual(Object.keys(line), ['lang', 'iterations', 'raw_us', 'guard_us', 'outcomes']);
  assert.equal(line.lang, 'node');
  assert.equal(line.iterations, 20);
  for (const k of ['raw_us', 'guard_us']) {
    const s = line[k] as { median: number; p99: number };
    assert.ok(s.median > 0 && s.p99 >= s.median, `${k} ${JSON.stringify(s)}`);
  }
  assert.deepEqual(line.outcomes, { expected: 44, reached: 44, lost: 0, dropped: 0, failed: 0 });
  const st = await server.key('bench/k');
  assert.equal(st.stats?.successes, '44', '22 rounds (2 warm-up) of one raw and one guarded unit');
  assert.equal(st.liveTickets, 0);
});
