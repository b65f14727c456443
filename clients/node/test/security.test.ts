// The bearer token and TLS (a private CA made with openssl, mutual TLS)
// against a real fusebox.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import { FuseboxClient, FuseboxRequestError, tlsFromFiles } from '@fusebox/client';
import type { ClientOptions, GuardContext } from '@fusebox/client';

import { Server, tempDir } from './server';

const TOKEN = 's3cret-token-for-the-node-client-tests';

function client(addr: string, opts: ClientOptions = {}): FuseboxClient {
  return new FuseboxClient(addr, { deadlineMs: 2000, logger: { warn() {} }, ...opts });
}

async function admission(c: FuseboxClient): Promise<string> {
  let got = '';
  await c.guard('tls/k', (ctx: GuardContext) => {
    got = ctx.admission;
    return Promise.resolve();
  });
  return got;
}

void test('the token is sent as authorization: Bearer', async () => {
  const server = await Server.start({
    config: '[auth]\n[[auth.token]]\nname = "admin"\nrole = "admin"\nenv = "FUSEBOX_NODE_TEST_TOKEN"\n',
    env: { FUSEBOX_NODE_TEST_TOKEN: TOKEN },
    admin: false,
  });
  const without = client(server.addr);
  const withToken = client(server.addr, { token: TOKEN });
  const wrong = client(server.addr, { token: 'not-the-token' });
  try {
    const err = await without.guard('k', () => Promise.resolve()).catch((e: unknown) => e);
    assert.ok(err instanceof FuseboxRequestError, String(err));
    assert.equal(err.code, 16); // UNAUTHENTICATED
    assert.equal(without.stats().unavailable, 0, 'a refused credential is not an outage');
    assert.equal(await withToken.guard('k', () => Promise.resolve('ran')), 'ran');
    assert.equal(await withToken.flush(), true);
    assert.equal(withToken.stats().completed, 1);
    const wrongErr = await wrong.guard('k', () => Promise.resolve()).catch((e: unknown) => e);
    assert.ok(wrongErr instanceof FuseboxRequestError);
  } finally {
    await Promise.all([without.close(), withToken.close(), wrong.close()]);
    await server.close();
  }
});

function openssl(dir: string, ...args: string[]): void {
  execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A private CA, a server certificate for localhost and 127.0.0.1, and a client certificate. */
function makePki(dir: string): void {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  openssl(dir, 'req', '-x509', ...ec, '-days', '1', '-subj', '/CN=fusebox node test CA', '-keyout', 'ca.key', '-out', 'ca.pem');
  writeFileSync(path.join(dir, 'server.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n');
  writeFileSync(path.join(dir, 'client.ext'), 'extendedKeyUsage=clientAuth\n');
  for (const who of ['server', 'client']) {
    openssl(dir, 'req', ...ec, '-subj', `/CN=${who === 'server' ? 'localhost' : 'node-client'}`, '-keyout', `${who}.key`, '-out', `${who}.csr`);
    openssl(dir, 'x509', '-req', '-in', `${who}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
      '-days', '1', '-extfile', `${who}.ext`, '-out', `${who}.pem`);
  }
}

void test('TLS with a private CA and a client certificate; plaintext or no client certificate cannot reach it', async () => {
  const tmp = tempDir();
  makePki(tmp.dir);
  const f = (name: string): string => path.join(tmp.dir, name);
  const server = await Server.start({
    args: ['--tls-cert', f('server.pem'), '--tls-key', f('server.key'), '--tls-client-ca', f('ca.pem')],
    admin: false,
  });
  const mutual = client(server.addr, { tls: tlsFromFiles({ ca: f('ca.pem'), cert: f('client.pem'), key: f('client.key') }) });
  const byName = client(`localhost:${server.addr.split(':')[1]}`, {
    tls: tlsFromFiles({ ca: f('ca.pem'), cert: f('client.pem'), key: f('client.key'), serverName: 'localhost' }),
  });
  const noCert = client(server.addr, { tls: tlsFromFiles({ ca: f('ca.pem') }) });
  const plain = client(server.addr);
  try {
    assert.equal(await admission(mutual), 'granted');
    assert.equal(await mutual.flush(), true);
    assert.deepEqual([mutual.stats().granted, mutual.stats().completed], [1, 1]);
    assert.equal(await admission(byName), 'granted');
    assert.equal(await admission(noCert), 'failed_open', 'a client without a certificate is turned away');
    assert.equal(await admission(plain), 'failed_open', 'a plaintext client cannot reach a TLS server');
    assert.equal(plain.stats().failedOpen, 1);
  } finally {
    await Promise.all([mutual, byName, noCert, plain].map((c) => c.close()));
    await server.close();
    tmp.cleanup();
  }
});
