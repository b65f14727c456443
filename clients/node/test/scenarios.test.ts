// The runner of the shared scenarios (clients/scenarios/*.json, described in
// clients/scenarios/README.md): every file is replayed against its own real
// fusebox server with a manual clock, one test per file. FUSEBOX_SCENARIOS
// names another folder.
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import { FuseboxClient, UnavailableError } from '@fusebox/client';
import type { GuardOptions, KeyState } from '@fusebox/client';

import { refusalFields } from './refusal';
import { REPO_ROOT, Server, waitFor, within } from './server';

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
type Obj = Record<string, Json>;

const STEP_WAIT_MS = 5000;
const boom = new Error('boom');

const SCENARIO_FIELDS = new Set(['name', 'description', 'config', 'steps']);
const ACTIONS = new Set([
  'guard',
  'await',
  'release',
  'cancel',
  'wait_renewed',
  'advance_ms',
  'isolate',
  'close',
  'forget_local',
  'stop_server',
  'expect_key',
]);
const STEP_EXTRAS: Record<string, string[]> = {
  guard: ['expect'],
  await: ['expect'],
  release: ['as', 'expect'],
  cancel: ['expect'],
};
const GUARD_FIELDS = new Set(['key', 'call', 'id', 'background', 'permits', 'max_wait_ms', 'lease_ms', 'on_unavailable', 'cost']);
const EXPECT_FIELDS = new Set(['ran', 'refusal', 'reason', 'retry_after_ms', 'local', 'error', 'cancelled', 'unavailable']);
const KEY_FIELDS = new Set(['key', 'phase', 'consecutive_failures', 'live_tickets', 'waiters', 'free', 'stats']);

function scenarioDir(): string {
  return process.env.FUSEBOX_SCENARIOS || path.join(REPO_ROOT, 'clients', 'scenarios');
}

function isObj(v: Json | undefined): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(v: Json | undefined, what: string): string {
  assert.equal(typeof v, 'string', `${what} must be a string`);
  return v as string;
}

function num(v: Json | undefined, what: string): number {
  assert.ok(typeof v === 'number' && Number.isInteger(v), `${what} must be an integer`);
  return v;
}

function checkFields(o: Obj, allowed: Set<string>, where: string): void {
  for (const k of Object.keys(o)) {
    assert.ok(allowed.has(k), `${where}: unknown field ${JSON.stringify(k)}`);
  }
}

interface GuardSpec {
  key: string;
  call: 'succeed' | 'fail' | 'hang' | 'cancel';
  id?: string;
  background: boolean;
  /** The cost the call's value reports (read by the guard's `cost` option). */
  cost?: number;
  options: GuardOptions;
}

function guardSpec(g: Json | undefined, where: string): GuardSpec {
  assert.ok(isObj(g), `${where}: guard must be an object`);
  checkFields(g, GUARD_FIELDS, `${where}: guard`);
  const call = str(g.call, `${where}: call`);
  assert.ok(['succeed', 'fail', 'hang', 'cancel'].includes(call), `${where}: unknown call ${call}`);
  const options: GuardOptions = {};
  if (g.permits !== undefined) {
    options.permits = num(g.permits, `${where}: permits`);
  }
  if (g.max_wait_ms !== undefined) {
    options.maxWaitMs = num(g.max_wait_ms, `${where}: max_wait_ms`);
  }
  if (g.lease_ms !== undefined) {
    options.leaseMs = num(g.lease_ms, `${where}: lease_ms`);
  }
  if (g.on_unavailable !== undefined) {
    const p = str(g.on_unavailable, `${where}: on_unavailable`);
    assert.ok(p === 'open' || p === 'closed', `${where}: on_unavailable ${p}`);
    options.onUnavailable = p;
  }
  if (g.background !== undefined) {
    assert.equal(typeof g.background, 'boolean', `${where}: background must be a bool`);
  }
  let cost: number | undefined;
  if (g.cost !== undefined) {
    cost = num(g.cost, `${where}: cost`);
    assert.equal(call, 'succeed', `${where}: cost needs call succeed`);
    options.cost = (value) => (typeof value === 'number' ? value : undefined);
  }
  return {
    key: str(g.key, `${where}: key`),
    call: call as GuardSpec['call'],
    id: g.id === undefined ? undefined : str(g.id, `${where}: id`),
    background: g.background === true,
    cost,
    options,
  };
}

interface Result {
  ran: boolean;
  unavailable: boolean;
  failed: boolean;
  err: unknown;
}

class Running {
  readonly controller = new AbortController();
  readonly started: Promise<void>;
  readonly done: Promise<Result>;
  result?: Result;
  private markStarted!: () => void;
  private releaseAs!: (as: string) => void;
  private readonly released: Promise<string>;

  constructor(
    client: FuseboxClient,
    spec: GuardSpec,
    readonly expect: Obj | undefined,
  ) {
    this.started = new Promise((resolve) => (this.markStarted = resolve));
    this.released = new Promise((resolve) => (this.releaseAs = resolve));
    const res: Result = { ran: false, unavailable: false, failed: false, err: undefined };
    const signal = this.controller.signal;
    this.done = client
      .guard(
        spec.key,
        async (ctx) => {
          res.ran = true;
          if (ctx.admission === 'failed_open') {
            res.unavailable = true;
          }
          this.markStarted();
          switch (spec.call) {
            case 'succeed':
              return spec.cost ?? 'ok';
            case 'fail':
              throw boom;
            case 'cancel':
              this.controller.abort();
              return aborted(ctx.signal);
            case 'hang':
              return Promise.race([
                this.released.then((as) => {
                  if (as === 'fail') {
                    throw boom;
                  }
                  return 'ok';
                }),
                aborted(ctx.signal),
              ]);
          }
        },
        { ...spec.options, signal },
      )
      .then(
        () => res,
        (err: unknown) => {
          res.failed = true;
          res.err = err;
          if (err instanceof UnavailableError) {
            res.unavailable = true;
          }
          return res;
        },
      )
      .then((r) => (this.result = r));
  }

  release(as: string): void {
    this.releaseAs(as);
  }

  wait(where: string): Promise<Result> {
    return within(`${where}: the guard did not end`, this.done, STEP_WAIT_MS);
  }
}

function aborted(signal: AbortSignal): Promise<never> {
  /* eslint-disable @typescript-eslint/prefer-promise-reject-errors -- the abort reason, whatever it is */
  return new Promise((_, reject) => {
    if (signal.aborted) {
      reject(signal.reason);
    } else {
      signal.addEventListener('abort', () => reject(signal.reason), { once: true });
    }
  });
  /* eslint-enable @typescript-eslint/prefer-promise-reject-errors */
}

function checkExpect(where: string, r: Result, exp: Obj | undefined): void {
  if (exp === undefined) {
    return;
  }
  checkFields(exp, EXPECT_FIELDS, `${where}: expect`);
  const e = r.err;
  const got: Record<string, Json> = {
    ran: r.ran,
    ...refusalFields(e),
    error: r.failed && e === boom,
    cancelled: r.failed && e instanceof Error && e.name === 'AbortError',
    unavailable: r.unavailable,
  };
  for (const [k, want] of Object.entries(exp)) {
    assert.deepEqual(got[k], want, `${where}: ${k} = ${JSON.stringify(got[k])}, want ${JSON.stringify(want)} (error: ${String(e)})`);
  }
}

const snake = (s: string): string => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

function keyMismatch(state: KeyState, exp: Obj): string {
  const got: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(state)) {
    got[snake(k)] = v;
  }
  for (const [k, want] of Object.entries(exp)) {
    if (k === 'stats') {
      assert.ok(isObj(want), 'expect_key.stats must be an object');
      const stats: Record<string, unknown> = {};
      for (const [sk, sv] of Object.entries(state.stats ?? {})) {
        stats[snake(sk)] = sv;
      }
      for (const [sk, sv] of Object.entries(want)) {
        assert.ok(sk in stats, `expect_key.stats: unknown field ${sk}`);
        if (String(stats[sk]) !== JSON.stringify(sv)) {
          return `stats.${sk} = ${String(stats[sk])}, want ${JSON.stringify(sv)}`;
        }
      }
      continue;
    }
    const w = k === 'phase' ? `PHASE_${str(want, 'phase').toUpperCase()}` : typeof want === 'string' ? want : JSON.stringify(want);
    if (String(got[k]) !== w) {
      return `${k} = ${String(got[k])}, want ${w}`;
    }
  }
  return '';
}

interface Scenario {
  name: string;
  config?: string;
  steps: Obj[];
}

function load(file: string): Scenario {
  const raw = JSON.parse(readFileSync(file, 'utf8')) as Json;
  assert.ok(isObj(raw), `${file}: not an object`);
  checkFields(raw, SCENARIO_FIELDS, file);
  assert.ok(Array.isArray(raw.steps), `${file}: steps must be a list`);
  const steps = raw.steps.map((s, i) => {
    assert.ok(isObj(s), `${file}: step ${i} must be an object`);
    const actions = Object.keys(s).filter((k) => ACTIONS.has(k));
    assert.equal(actions.length, 1, `${file}: step ${i} wants exactly one action, has ${actions.length}`);
    const allowed = new Set([actions[0], ...(STEP_EXTRAS[actions[0]] ?? [])]);
    checkFields(s, allowed, `${file}: step ${i}`);
    return s;
  });
  return {
    name: str(raw.name, `${file}: name`),
    config: raw.config === undefined ? undefined : str(raw.config, `${file}: config`),
    steps,
  };
}

async function runScenario(sc: Scenario, transport: 'unary' | 'stream'): Promise<void> {
  const server = await Server.start({ config: sc.config });
  const client = new FuseboxClient(server.addr, { deadlineMs: 2000, logger: { warn() {} }, transport });
  const guards = new Map<string, Running>();
  const get = (id: Json | undefined, where: string): Running => {
    const name = str(id, `${where}: id`);
    const g = guards.get(name);
    assert.ok(g !== undefined, `${where}: no guard ${name}`);
    return g;
  };
  const expectOf = (st: Obj, g: Running): Obj | undefined => (isObj(st.expect) ? st.expect : g.expect);
  try {
    for (const [i, st] of sc.steps.entries()) {
      const where = `step ${i}`;
      if (st.guard !== undefined) {
        const spec = guardSpec(st.guard, where);
        const expect = st.expect === undefined ? undefined : isObj(st.expect) ? st.expect : assert.fail(`${where}: expect`);
        if (spec.id === undefined) {
          assert.notEqual(spec.call, 'hang', `${where}: hang needs an id`);
          checkExpect(where, await new Running(client, spec, expect).wait(where), expect);
        } else {
          const g = new Running(client, spec, expect);
          guards.set(spec.id, g);
          if (!spec.background) {
            await within(`${where}: the call did not start`, Promise.race([g.started, g.done]), STEP_WAIT_MS);
          }
        }
      } else if (st.await !== undefined) {
        const g = get(st.await, where);
        checkExpect(where, await g.wait(where), expectOf(st, g));
      } else if (st.release !== undefined) {
        const g = get(st.release, where);
        const as = st.as === undefined ? 'succeed' : str(st.as, `${where}: as`);
        assert.ok(as === 'succeed' || as === 'fail', `${where}: as ${as}`);
        g.release(as);
        checkExpect(where, await g.wait(where), expectOf(st, g));
      } else if (st.cancel !== undefined) {
        const g = get(st.cancel, where);
        g.controller.abort();
        checkExpect(where, await g.wait(where), expectOf(st, g));
      } else if (st.wait_renewed !== undefined) {
        get(st.wait_renewed, where);
        const base = client.stats().renewals;
        await waitFor(`${where}: two renewals`, () => client.stats().renewals >= base + 2, STEP_WAIT_MS);
      } else if (st.advance_ms !== undefined) {
        await server.advance(num(st.advance_ms, `${where}: advance_ms`));
      } else if (st.isolate !== undefined) {
        await server.isolate(str(st.isolate, where), 'scenario');
      } else if (st.close !== undefined) {
        await server.closeKey(str(st.close, where), 'scenario');
      } else if (st.forget_local !== undefined) {
        client.forget(str(st.forget_local, where));
      } else if (st.stop_server !== undefined) {
        assert.equal(st.stop_server, true, `${where}: stop_server must be true`);
        await server.stop();
      } else if (st.expect_key !== undefined) {
        const exp = st.expect_key;
        assert.ok(isObj(exp), `${where}: expect_key must be an object`);
        checkFields(exp, KEY_FIELDS, `${where}: expect_key`);
        const key = str(exp.key, `${where}: expect_key.key`);
        let last = '';
        await waitFor(
          `${where}: key state`,
          async () => {
            last = keyMismatch(await server.key(key), exp);
            return last === '';
          },
          STEP_WAIT_MS,
        ).catch((err: unknown) => assert.fail(`${String(err)}: ${last}`));
      }
    }
  } finally {
    for (const g of guards.values()) {
      if (g.result === undefined) {
        g.controller.abort(); // let nothing hang past the test
      }
    }
    await within('the guards did not end', Promise.all([...guards.values()].map((g) => g.done)), STEP_WAIT_MS);
    await client.close();
    await server.close();
  }
}

const dir = scenarioDir();
const files = readdirSync(dir)
  .filter((f) => f.endsWith('.json'))
  .sort()
  .map((f) => path.join(dir, f));

void test('the scenario folder has scenarios', () => {
  assert.ok(files.length > 0, `no scenarios in ${dir}`);
});

for (const file of files) {
  const sc = load(file);
  void test(sc.name, () => runScenario(sc, 'unary'));
  void test(`${sc.name} (Decide stream)`, () => runScenario(sc, 'stream'));
}
