// A real fusebox server for the tests: `fusebox serve --manual-clock` on
// port 0, its address read from the first line it prints.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { createInterface } from 'node:readline';
import { after, before } from 'node:test';

import { FuseboxClient, duration } from '@fusebox/client';
import type { AdminStub, ClientOptions, ClockStub, KeyState, Policy } from '@fusebox/client';

/** The repository's root (this file runs as clients/node/dist-test/test/server.js). */
export const REPO_ROOT = path.resolve(__dirname, '..', '..', '..', '..');

/** $FUSEBOX_BIN, else the repository's target/debug/fusebox. */
export function fuseboxBin(): string {
  const env = process.env.FUSEBOX_BIN;
  if (env) {
    return env;
  }
  const built = path.join(REPO_ROOT, 'target', 'debug', 'fusebox');
  if (!existsSync(built)) {
    throw new Error(`no fusebox binary: set FUSEBOX_BIN or build ${built} with \`cargo build\``);
  }
  return built;
}

/** A fresh temporary folder, removed by `cleanup`. */
export function tempDir(): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(path.join(tmpdir(), 'fusebox-node-'));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

export interface ServerOptions {
  /** TOML passed with --config. */
  config?: string;
  /** More arguments to `fusebox serve`. */
  args?: string[];
  /** More environment variables. */
  env?: Record<string, string>;
  /** Whether to make the plaintext admin client (not for a TLS server). */
  admin?: boolean;
}

export class Server {
  private exited: Promise<void>;
  private stderr = '';
  private client?: FuseboxClient;

  private constructor(
    private readonly proc: ChildProcess,
    readonly addr: string,
    private readonly cleanupDir: () => void,
  ) {
    this.exited = new Promise((resolve) => {
      if (proc.exitCode !== null || proc.signalCode !== null) {
        resolve();
      } else {
        proc.once('exit', () => resolve());
      }
    });
    proc.stderr?.on('data', (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString()).slice(-4000);
    });
  }

  static async start(opts: ServerOptions = {}): Promise<Server> {
    const tmp = tempDir();
    const args = ['serve', '--listen', '127.0.0.1:0', '--http', '127.0.0.1:0', '--manual-clock', ...(opts.args ?? [])];
    if (opts.config !== undefined) {
      const file = path.join(tmp.dir, 'fusebox.toml');
      writeFileSync(file, opts.config, { mode: 0o600 });
      args.push('--config', file);
    }
    const proc = spawn(fuseboxBin(), args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...opts.env },
    });
    const stdout = proc.stdout;
    if (stdout === null) {
      throw new Error('no stdout');
    }
    const lines = createInterface({ input: stdout });
    const first = await new Promise<string>((resolve, reject) => {
      lines.once('line', resolve);
      proc.once('error', reject);
      proc.once('exit', (code) => reject(new Error(`fusebox exited with ${String(code)} before listening`)));
    });
    const m = /listening on (\S+)/.exec(first);
    if (m === null) {
      proc.kill('SIGKILL');
      throw new Error(`fusebox did not start: ${first}`);
    }
    lines.on('line', () => {}); // keep reading
    const s = new Server(proc, m[1], tmp.cleanup);
    if (opts.admin !== false) {
      s.client = new FuseboxClient(s.addr, { deadlineMs: 5000 });
    }
    return s;
  }

  /** The generated Admin stub over a plaintext channel of its own. */
  get admin(): AdminStub {
    if (this.client === undefined) {
      throw new Error('no admin client');
    }
    return this.client.admin();
  }

  get clock(): ClockStub {
    if (this.client === undefined) {
      throw new Error('no admin client');
    }
    return this.client.clock();
  }

  /** What the server wrote to standard error lately. */
  get log(): string {
    return this.stderr;
  }

  /** Kills the server and waits for it to exit. */
  async stop(): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGKILL');
    }
    await this.exited;
  }

  /**
   * Stops the server process with SIGSTOP and waits until it is stopped (on
   * Linux, where /proc tells): it then answers nothing, but its sockets stay
   * open, so calls to it wait rather than fail. `resume` undoes it.
   */
  async pause(): Promise<void> {
    this.proc.kill('SIGSTOP');
    const stat = `/proc/${String(this.proc.pid)}/stat`;
    if (existsSync(stat)) {
      // The state is the field after the command's closing parenthesis.
      await waitFor('the server stopped', () => /\)\s+([A-Za-z])/.exec(readFileSync(stat, 'utf8'))?.[1] === 'T');
    }
  }

  /** Lets a server stopped by `pause` run again (SIGCONT). */
  resume(): void {
    this.proc.kill('SIGCONT');
  }

  /** Stops the server, closes the admin client and removes the temporary files. */
  async close(): Promise<void> {
    await this.client?.close();
    await this.stop();
    this.cleanupDir();
  }

  advance(ms: number): Promise<void> {
    return new Promise((resolve, reject) => {
      this.clock.Advance({ by: duration(ms) }, { deadline: Date.now() + 5000 }, (err) => (err ? reject(err) : resolve()));
    });
  }

  key(key: string): Promise<KeyState> {
    return new Promise((resolve, reject) => {
      this.admin.GetKey({ key }, { deadline: Date.now() + 5000 }, (err, res) =>
        err || res === undefined ? reject(err ?? new Error('no answer')) : resolve(res),
      );
    });
  }

  isolate(key: string, reason: string): Promise<void> {
    return new Promise((resolve, reject) => {
      this.admin.Isolate({ key, reason }, { deadline: Date.now() + 5000 }, (err) => (err ? reject(err) : resolve()));
    });
  }

  closeKey(key: string, reason: string): Promise<void> {
    return new Promise((resolve, reject) => {
      this.admin.Close({ key, reason }, { deadline: Date.now() + 5000 }, (err) => (err ? reject(err) : resolve()));
    });
  }

  setPolicy(match: string, policy: Policy): Promise<void> {
    return new Promise((resolve, reject) => {
      this.admin.SetPolicy({ rule: { match, policy } }, { deadline: Date.now() + 5000 }, (err) => (err ? reject(err) : resolve()));
    });
  }
}

/**
 * The server a test file's tests share, started before them, and the
 * clients they make: after the tests the clients are closed, then the server
 * (let go on first, in case a test failed while it was stopped).
 */
export class SharedServer {
  private started?: Server;
  private seq = 0;
  private readonly clients: FuseboxClient[] = [];

  /** keyPrefix starts the file's keys; defaults are its clients' options. */
  constructor(
    private readonly keyPrefix: string,
    private readonly defaults: ClientOptions,
  ) {
    before(async () => {
      this.started = await Server.start();
    });
    after(async () => {
      this.started?.resume();
      await Promise.all(this.clients.map((c) => c.close()));
      await this.started?.close();
    });
  }

  /** The server (from the file's first test on). */
  get server(): Server {
    if (this.started === undefined) {
      throw new Error('the shared server starts before the tests');
    }
    return this.started;
  }

  /** A key no other test of the file uses. */
  freshKey(): string {
    this.seq += 1;
    return `${this.keyPrefix}/${this.seq}`;
  }

  /** A client of the server (or of addr) with the file's defaults and opts. */
  client(opts: ClientOptions = {}, addr = this.server.addr): FuseboxClient {
    return this.closeAfter(new FuseboxClient(addr, { ...this.defaults, ...opts }));
  }

  /** Closes c after the file's tests; returns it. */
  closeAfter(c: FuseboxClient): FuseboxClient {
    this.clients.push(c);
    return c;
  }
}

/** Checks cond every 5 ms until it holds; fails after timeoutMs. */
export async function waitFor(what: string, cond: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (await cond()) {
      return;
    }
    if (performance.now() > deadline) {
      throw new Error(`${what}: not within ${timeoutMs} ms`);
    }
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Settles with p, or fails after timeoutMs. */
export async function within<T>(what: string, p: Promise<T>, timeoutMs = 5000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** A consecutive-failures breaker policy. */
export function breaker(failures: number, breakMs: number): Policy {
  return { breaker: { consecutive: { failures }, breakDuration: duration(breakMs) } };
}

/** A concurrency limiter policy. */
export function concurrency(permits: number): Policy {
  return { limiter: { concurrency: { permits } } };
}

/** A token bucket that refills one token an hour: on the manual clock, which no test moves past that, never. */
export function tokenBucket(capacity: number): Policy {
  return { limiter: { tokenBucket: { capacity, refill: 1, period: duration(3_600_000) } } };
}
