// Drives fusebox's dashboard in headless Chromium for tests/suite/dashboard.rs.
//
//   node check.mjs URL SCREENSHOT_PATH EXPECTED_JSON
//
// EXPECTED_JSON: {"keys": N, "open": [KEY...], "isolated": [KEY...],
// "busy": [KEY...], "prefix": P}, what the engine holds. Loads the page and
// checks, in order:
// - the totals: N keys, as many open and isolated as listed;
// - the keys that are not closed are listed first (the "Not closed" table,
//   before the others), and are exactly the open and isolated ones;
// - the busy keys show request sparklines that moved;
// - the prefix filter pages on the server: with prefix P, page 1 then page
//   2 (Next) then page 1 again (Previous), each at most 100 rows from a
//   /api/keys answer of at most 100 keys, in key order, all starting with
//   P, and the rows shown get sparklines;
// then prints "ready". Then waits for a line "tripped KEY" on standard
// input (the Rust test trips KEY), and checks, without reloading, that the
// page shows KEY as OPEN; presses Close, answers the reason dialog, waits
// for the close in the timeline and the open count back where it was,
// saves a screenshot at SCREENSHOT_PATH and prints "done".
// Exits 0 on success; on any failure, prints why on standard error, saves
// SCREENSHOT_PATH with "-failure" before ".png", and exits 1.

import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const [url, screenshot, expectedJson] = process.argv.slice(2);
if (!url || !screenshot || !expectedJson) {
  console.error('usage: node check.mjs URL SCREENSHOT_PATH EXPECTED_JSON');
  process.exit(64);
}
const expected = JSON.parse(expectedJson);
const STEP = 60_000; // ms: the deadline of each wait on the page (a debug server over 100,000 keys)
const PAGE = 100;

const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function nextLine(what) {
  const { value, done } = await stdin.next();
  if (done) throw new Error(`standard input ended while waiting for ${what}`);
  return value.trim();
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

const sel = (key) => JSON.stringify(key);

let browser;
let page;
// A last resort if something hangs past every step's own deadline.
const watchdog = setTimeout(() => {
  console.error('check.mjs: gave up after 170 s');
  process.exit(2);
}, 170_000);

try {
  browser = await chromium.launch({
    executablePath: process.env.FUSEBOX_TEST_CHROMIUM || '/usr/bin/chromium',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
  page = await browser.newPage({ viewport: { width: 1600, height: 1200 }, deviceScaleFactor: 1 });
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console error: ${m.text()}`);
  });
  // Every page of keys the server sends: never more than a page of rows.
  const pages = [];
  page.on('response', async (r) => {
    if (!r.url().includes('/api/keys?')) return;
    try {
      const body = await r.json();
      pages.push({ url: r.url(), keys: body.keys.map((k) => k.key) });
    } catch { /* an answer cut short by navigation */ }
  });

  await page.goto(url);
  await page.locator('#status[data-state="live"]').waitFor({ timeout: STEP });
  // A mark that a reload would wipe out.
  await page.evaluate(() => { window.__notReloaded = true; });

  // Totals, engine-wide.
  const total = expected.keys.toLocaleString('en-US');
  await page.locator('#n-keys', { hasText: total }).waitFor({ timeout: STEP });
  const count = async (id) => (await page.locator(id).textContent()).trim();
  const n = (x) => x.toLocaleString('en-US');
  check(await count('#n-OPEN') === n(expected.open.length), `open: ${await count('#n-OPEN')}`);
  check(await count('#n-ISOLATED') === n(expected.isolated.length), `isolated: ${await count('#n-ISOLATED')}`);
  const closed = expected.keys - expected.open.length - expected.isolated.length;
  check(await count('#n-CLOSED') === n(closed), `closed: ${await count('#n-CLOSED')}`);

  // The keys not closed come first, and are exactly the open and isolated ones.
  const broken = [...expected.open, ...expected.isolated].sort();
  const attention = await page.locator('#attention-rows tr').evaluateAll((rows) =>
    rows.map((r) => ({ key: r.dataset.key, phase: r.dataset.phase })));
  check(JSON.stringify(attention.map((r) => r.key)) === JSON.stringify(broken),
    `not-closed rows: ${JSON.stringify(attention)}`);
  check(attention.every((r) => r.phase !== 'CLOSED'), `a closed row among the not-closed: ${JSON.stringify(attention)}`);
  for (const key of expected.open) {
    await page.locator(`#attention-rows tr[data-key=${sel(key)}][data-phase="OPEN"]`).waitFor({ timeout: STEP });
  }
  const order = await page.evaluate(() => {
    const sections = [...document.querySelectorAll('section.keys')].map((s) => s.id);
    return sections;
  });
  check(order[0] === 'attention', `sections in order: ${order}`);

  // Sparklines: the busy keys' request rates moved.
  for (const key of expected.busy) {
    await page.waitForFunction((k) => {
      const row = document.querySelector(`#busiest-rows tr[data-key="${k}"]`);
      const svg = row && row.querySelector('svg.spark-requests');
      if (!svg || Number(svg.dataset.points) < 2) return false;
      const line = svg.querySelector('polyline');
      return line && line.getAttribute('points').split(' ').length >= 2
        && Number(row.querySelector('.c-rate .rate-now').textContent) > 0;
    }, key, { timeout: STEP });
  }
  await page.locator('#attention-rows svg.spark-requests[data-points]:not([data-points="0"])').first()
    .waitFor({ timeout: STEP });

  // The prefix filter pages on the server.
  const browseKeys = () => page.locator('#browse-rows tr').evaluateAll((rows) => rows.map((r) => r.dataset.key));
  await page.locator('#prefix').fill(expected.prefix);
  // The filter applies after a pause in typing: wait for a full page of it.
  await page.waitForFunction(([p, n]) => {
    const rows = [...document.querySelectorAll('#browse-rows tr')];
    return rows.length === n && rows.every((r) => r.dataset.key.startsWith(p));
  }, [expected.prefix, PAGE], { timeout: STEP });
  await page.locator('#page-label', { hasText: `page 1 · keys 1–${PAGE}` }).waitFor({ timeout: STEP });
  const first = await browseKeys();
  check(first.length === PAGE, `page 1 has ${first.length} rows`);
  check(first.every((k) => k.startsWith(expected.prefix)), `page 1: ${first.slice(0, 3)}...`);
  check(JSON.stringify(first) === JSON.stringify([...first].sort()), 'page 1 is in key order');
  await page.locator('#next').click({ timeout: STEP });
  await page.locator('#page-label', { hasText: `page 2 · keys ${PAGE + 1}–${2 * PAGE}` }).waitFor({ timeout: STEP });
  await page.waitForFunction((f) => {
    const rows = [...document.querySelectorAll('#browse-rows tr')];
    return rows.length > 0 && rows[0].dataset.key > f;
  }, first[first.length - 1], { timeout: STEP });
  const second = await browseKeys();
  check(second.length === PAGE, `page 2 has ${second.length} rows`);
  check(second.every((k) => k.startsWith(expected.prefix)), 'page 2 keeps the prefix');
  check(second[0] > first[first.length - 1], `page 2 starts after page 1: ${second[0]}`);
  check(pages.some((p) => p.url.includes('after=') && p.url.includes(encodeURIComponent(expected.prefix))),
    `no /api/keys request with a cursor: ${pages.map((p) => p.url)}`);
  check(pages.length > 0 && pages.every((p) => p.keys.length <= PAGE),
    `a page of more than ${PAGE} keys: ${pages.map((p) => p.keys.length)}`);
  // The rows shown get sparklines once sampled.
  await page.waitForFunction(() => [...document.querySelectorAll('#browse-rows svg.spark-requests')]
    .some((s) => Number(s.dataset.points) >= 2), null, { timeout: STEP });
  await page.locator('#prev').click({ timeout: STEP });
  await page.locator('#page-label', { hasText: `page 1 · keys 1–${PAGE}` }).waitFor({ timeout: STEP });
  await page.waitForFunction((f) => document.querySelector('#browse-rows tr')?.dataset.key === f,
    first[0], { timeout: STEP });
  await page.locator('#prev[disabled]').waitFor({ timeout: STEP });

  // Back to every key.
  await page.locator('#prefix').fill('');
  await page.locator('#status[data-state="live"]').waitFor({ timeout: STEP });
  await page.locator('#n-keys', { hasText: total }).waitFor({ timeout: STEP });
  console.log('ready');

  const line = await nextLine('"tripped KEY"');
  const match = /^tripped (.+)$/.exec(line);
  if (!match) throw new Error(`expected "tripped KEY", read ${JSON.stringify(line)}`);
  const key = match[1];
  const row = page.locator(`#attention-rows tr[data-key=${sel(key)}]`);

  await page.locator(`#attention-rows tr[data-key=${sel(key)}][data-phase="OPEN"]`).waitFor({ timeout: STEP });
  await row.locator('.pill', { hasText: 'OPEN' }).waitFor({ timeout: STEP });
  await page.locator(`#timeline li.to-OPEN[data-key=${sel(key)}]`).first().waitFor({ timeout: STEP });
  await page.locator('#n-OPEN', { hasText: String(expected.open.length + 1) }).waitFor({ timeout: STEP });
  if (!(await page.evaluate(() => window.__notReloaded === true))) {
    throw new Error('the page was reloaded');
  }
  await page.screenshot({ path: screenshot.replace(/\.png$/, '-open.png'), fullPage: true });

  await row.locator('button[data-action="close"]').click({ timeout: STEP });
  const dialog = page.locator('#reason-dialog');
  await dialog.waitFor({ state: 'visible', timeout: STEP });
  // Without a reason the dialog refuses and says why.
  await page.locator('#reason-submit').click({ timeout: STEP });
  await page.locator('#reason-error', { hasText: 'why' }).waitFor({ timeout: STEP });
  await page.locator('#reason-input').fill('INC-4711 resolved: provider is back');
  await page.locator('#reason-submit').click({ timeout: STEP });
  await dialog.waitFor({ state: 'hidden', timeout: STEP });

  await page
    .locator(`#timeline li.kind-close[data-key=${sel(key)}]`, { hasText: 'INC-4711 resolved' })
    .first()
    .waitFor({ timeout: STEP });
  await page.locator('#n-OPEN', { hasText: String(expected.open.length) }).waitFor({ timeout: STEP });
  // The next round drops the closed key from the not-closed table, and
  // the totals agree.
  await page.waitForFunction((k) => !document.querySelector(`#attention-rows tr[data-key="${k}"]`), key,
    { timeout: STEP });
  await page.locator('#n-OPEN', { hasText: String(expected.open.length) }).waitFor({ timeout: STEP });
  await page.waitForFunction((k) => {
    const row = document.querySelector(`#busiest-rows tr[data-key="${k}"]`);
    return !row || row.dataset.phase === 'CLOSED';
  }, key, { timeout: STEP });
  // Back to the top of the page, without a button focused.
  await page.evaluate(() => { document.activeElement?.blur(); window.scrollTo(0, 0); });
  for (const wrap of await page.locator('.table-wrap').all()) {
    await wrap.evaluate((w) => { w.scrollLeft = 0; });
  }
  if (problems.length > 0) throw new Error(problems.join('\n'));
  // The top of the page: the totals, the keys not closed, the busiest.
  await page.screenshot({ path: screenshot });
  console.log('done');
  clearTimeout(watchdog);
  await browser.close();
  process.exit(0);
} catch (e) {
  console.error(`check.mjs: ${e.stack || e}`);
  if (page) {
    await page.screenshot({ path: screenshot.replace(/\.png$/, '-failure.png'), fullPage: true }).catch(() => {});
  }
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
}
