// The client tool of clients/README.md (not part of the package):
//
//   node dist-test/test/client-tool.js worker --target HOST:PORT [--token T]
//   node dist-test/test/client-tool.js bench  --target HOST:PORT --key KEY --iterations N [--token T]
//
// `worker` reads JSON commands from standard input and writes JSON events to
// standard output, one per line, and closes its client (which flushes the
// outcome queue) at the end of its input; `bench` times the stub's Acquire
// alone against a guard of a no-op (whose outcome is reported in the
// background), counts the outcomes that reached fusebox and prints one JSON
// line.
import { createInterface } from 'node:readline';

import { FuseboxClient, UnavailableError } from '@fusebox/client';
import type { AcquireResponse, KeyState } from '@fusebox/client';

import { refusalFields } from './refusal';

const LANG = 'node';
const DEADLINE_MS = 2000;
/** How long the bench waits for its last outcomes to be answered. */
const FLUSH_MS = 10_000;

function usage(msg: string): never {
  process.stderr.write(
    `${msg}\nusage: client-tool worker --target HOST:PORT [--token T]\n` +
      `       client-tool bench --target HOST:PORT --key KEY --iterations N [--token T]\n`,
  );
  process.exit(2);
}

function parseArgs(argv: string[]): { cmd: string; flags: Map<string, string> } {
  const [cmd, ...rest] = argv;
  if (cmd !== 'worker' && cmd !== 'bench') {
    usage(`unknown command ${String(cmd)}`);
  }
  const flags = new Map<string, string>();
  for (let i = 0; i < rest.length; i += 2) {
    const name = rest[i];
    const value = rest[i + 1];
    if (!['--target', '--token', '--key', '--iterations'].includes(name) || value === undefined) {
      usage(`bad argument ${name}`);
    }
    flags.set(name.slice(2), value);
  }
  if (!flags.has('target')) {
    usage('--target is required');
  }
  return { cmd, flags };
}

function emit(event: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(event)}\n`);
}

class CallError extends Error {
  constructor() {
    super('the guarded call failed');
    this.name = 'CallError';
  }
}

interface Hang {
  release: () => void;
  released: Promise<void>;
}

async function worker(client: FuseboxClient): Promise<void> {
  const hangs = new Map<string, Hang>();
  const running: Promise<void>[] = [];
  const hangOf = (id: string): Hang => {
    let h = hangs.get(id);
    if (h === undefined) {
      let release!: () => void;
      const released = new Promise<void>((r) => (release = r));
      h = { release, released };
      hangs.set(id, h);
    }
    return h;
  };
  const fatal = (message: string): never => {
    emit({ event: 'error', message });
    process.exit(1);
  };

  const startGuard = (id: string, key: string, call: string): void => {
    const hang = call === 'hang' ? hangOf(id) : undefined;
    let ran = false;
    let unavailable = false;
    const done = client
      .guard(key, async (ctx) => {
        ran = true;
        unavailable = ctx.admission === 'failed_open';
        emit({ event: 'running', id });
        if (call === 'fail') {
          throw new CallError();
        }
        if (hang !== undefined) {
          await hang.released;
        }
        return 'ok';
      })
      .then(
        () => null,
        (err: unknown) => err,
      )
      .then((err) => {
        emit({
          event: 'done',
          id,
          ran,
          ...refusalFields(err),
          error: err instanceof CallError,
          unavailable: unavailable || err instanceof UnavailableError,
        });
      });
    running.push(done);
  };

  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (line.trim() === '') {
      continue;
    }
    let cmd: unknown;
    try {
      cmd = JSON.parse(line);
    } catch {
      fatal(`not JSON: ${line}`);
    }
    if (typeof cmd !== 'object' || cmd === null || Array.isArray(cmd)) {
      fatal(`not a command: ${line}`);
    }
    const c = cmd as Record<string, unknown>;
    const str = (name: string): string => {
      const v = c[name];
      return typeof v === 'string' && v !== '' ? v : fatal(`${name} must be a non-empty string: ${line}`);
    };
    const only = (...names: string[]): void => {
      for (const k of Object.keys(c)) {
        if (!names.includes(k)) {
          fatal(`unknown field ${k}: ${line}`);
        }
      }
    };
    switch (c.op) {
      case 'guard': {
        only('op', 'id', 'key', 'call');
        const call = str('call');
        if (!['succeed', 'fail', 'hang'].includes(call)) {
          fatal(`unknown call ${call}`);
        }
        startGuard(str('id'), str('key'), call);
        break;
      }
      case 'release':
        only('op', 'id');
        hangOf(str('id')).release();
        break;
      case 'forget': {
        only('op', 'key');
        const key = str('key');
        client.forget(key);
        emit({ event: 'forgotten', key });
        break;
      }
      default:
        fatal(`unknown op: ${line}`);
    }
  }
  for (const h of hangs.values()) {
    h.release(); // a hanging call still running at the end returns a value
  }
  await Promise.all(running);
}

function unary<T>(start: (cb: (err: Error | null, res?: T) => void) => void): Promise<T> {
  return new Promise((resolve, reject) => {
    start((err, res) => (err !== null || res === undefined ? reject(err ?? new Error('no answer')) : resolve(res)));
  });
}

// The stub's Acquire alone is timed; its Complete follows, awaited but not timed.
async function rawUnit(client: FuseboxClient, key: string): Promise<number> {
  const t0 = process.hrtime.bigint();
  const resp = await unary<AcquireResponse>((cb) => client.stub.Acquire({ key }, { deadline: Date.now() + DEADLINE_MS }, cb));
  const took = Number(process.hrtime.bigint() - t0) / 1000;
  if (resp.decision !== 'DECISION_GRANTED' || resp.ticket === '') {
    throw new Error(`raw Acquire was not granted: ${resp.decision} ${resp.reason}`);
  }
  await unary((cb) =>
    client.stub.Complete({ ticket: resp.ticket, outcome: 'OUTCOME_SUCCESS' }, { deadline: Date.now() + DEADLINE_MS }, cb),
  );
  return took;
}

async function successes(client: FuseboxClient, key: string): Promise<number> {
  const state = await unary<KeyState>((cb) => client.admin().GetKey({ key }, { deadline: Date.now() + DEADLINE_MS }, cb));
  return Number(state.stats?.successes ?? 0);
}

function summary(samples: number[]): { median: number; p99: number } {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number): number => s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
  const round = (v: number): number => Math.round(v * 10) / 10;
  return { median: round(at(0.5)), p99: round(at(0.99)) };
}

// Exits 1 when an outcome did not reach fusebox.
async function bench(client: FuseboxClient, key: string, iterations: number): Promise<boolean> {
  const noop = (): Promise<void> => Promise.resolve();
  const raw: number[] = [];
  const guarded: number[] = [];
  const timeRaw = (): Promise<number> => rawUnit(client, key);
  const timeGuard = async (): Promise<number> => {
    const t0 = process.hrtime.bigint();
    await client.guard(key, noop);
    return Number(process.hrtime.bigint() - t0) / 1000;
  };
  const warmup = Math.floor(iterations / 10);
  const before = await successes(client, key);
  for (let i = 0; i < warmup + iterations; i++) {
    let r: number;
    let g: number;
    if (i % 2 === 0) {
      r = await timeRaw();
      g = await timeGuard();
    } else {
      g = await timeGuard();
      r = await timeRaw();
    }
    if (i >= warmup) {
      raw.push(r);
      guarded.push(g);
    }
  }
  await client.flush(FLUSH_MS);
  const reached = (await successes(client, key)) - before;
  const st = client.stats();
  if (st.unavailable > 0 || st.granted !== warmup + iterations) {
    throw new Error(`the guards were not all granted: ${JSON.stringify(st)}`);
  }
  const expected = 2 * (warmup + iterations);
  const lost = expected - reached;
  emit({
    lang: LANG,
    iterations,
    raw_us: summary(raw),
    guard_us: summary(guarded),
    outcomes: { expected, reached, lost, dropped: st.outcomesDropped, failed: st.completeFailures },
  });
  if (lost !== 0) {
    process.stderr.write(
      `client-tool: ${lost} of ${expected} outcomes did not reach fusebox (dropped ${st.outcomesDropped}, failed ${st.completeFailures})\n`,
    );
  }
  return lost === 0;
}

async function main(): Promise<void> {
  const { cmd, flags } = parseArgs(process.argv.slice(2));
  const target = flags.get('target') ?? '';
  const client = new FuseboxClient(target, { token: flags.get('token'), deadlineMs: DEADLINE_MS });
  try {
    if (cmd === 'worker') {
      emit({ event: 'ready', lang: LANG });
      await worker(client);
    } else {
      const key = flags.get('key') ?? usage('--key is required');
      const n = Number(flags.get('iterations') ?? usage('--iterations is required'));
      if (!Number.isInteger(n) || n <= 0) {
        usage('--iterations must be a positive integer');
      }
      if (!(await bench(client, key, n))) {
        process.exitCode = 1;
      }
    }
  } finally {
    await client.close(); // flushes the outcome queue first
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`client-tool: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
