// Drives fusebox's dashboard in headless Chromium for tests/suite/dashboard.rs.
//
//   node check.mjs URL SCREENSHOT_PATH
//
// Loads the page and prints "ready" once it is live. Then waits for a line
// "tripped KEY" on standard input (the Rust test trips KEY over gRPC), and
// checks, without reloading, that the page shows KEY as OPEN; presses Close,
// answers the reason dialog, waits for CLOSED and for the close in the
// timeline, saves a screenshot at SCREENSHOT_PATH and prints "done".
// Exits 0 on success; on any failure, prints why on standard error, saves
// SCREENSHOT_PATH with "-failure" before ".png", and exits 1.

import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';

const [url, screenshot] = process.argv.slice(2);
if (!url || !screenshot) {
  console.error('usage: node check.mjs URL SCREENSHOT_PATH');
  process.exit(64);
}
const STEP = 15_000; // ms: the deadline of each wait on the page

const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function nextLine(what) {
  const { value, done } = await stdin.next();
  if (done) throw new Error(`standard input ended while waiting for ${what}`);
  return value.trim();
}

let browser;
let page;
// A last resort if something hangs past every step's own deadline.
const watchdog = setTimeout(() => {
  console.error('check.mjs: gave up after 120 s');
  process.exit(2);
}, 120_000);

try {
  browser = await chromium.launch({
    executablePath: process.env.FUSEBOX_TEST_CHROMIUM || '/usr/bin/chromium',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
  page = await browser.newPage({ viewport: { width: 1500, height: 860 }, deviceScaleFactor: 1 });
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console error: ${m.text()}`);
  });

  await page.goto(url);
  await page.locator('#status[data-state="live"]').waitFor({ timeout: STEP });
  // A mark that a reload would wipe out.
  await page.evaluate(() => { window.__notReloaded = true; });
  console.log('ready');

  const line = await nextLine('"tripped KEY"');
  const match = /^tripped (.+)$/.exec(line);
  if (!match) throw new Error(`expected "tripped KEY", read ${JSON.stringify(line)}`);
  const key = match[1];
  const row = page.locator(`#rows tr[data-key=${JSON.stringify(key)}]`);

  await page.locator(`#rows tr[data-key=${JSON.stringify(key)}][data-phase="OPEN"]`).waitFor({ timeout: STEP });
  await row.locator('.pill', { hasText: 'OPEN' }).waitFor({ timeout: STEP });
  await page.locator(`#timeline li.to-OPEN[data-key=${JSON.stringify(key)}]`).first().waitFor({ timeout: STEP });
  if (!(await page.evaluate(() => window.__notReloaded === true))) {
    throw new Error('the page was reloaded');
  }
  await page.screenshot({ path: screenshot.replace(/\.png$/, '-open.png') });

  await row.locator('button[data-action="close"]').click({ timeout: STEP });
  const dialog = page.locator('#reason-dialog');
  await dialog.waitFor({ state: 'visible', timeout: STEP });
  // Without a reason the dialog refuses and says why.
  await page.locator('#reason-submit').click({ timeout: STEP });
  await page.locator('#reason-error', { hasText: 'why' }).waitFor({ timeout: STEP });
  await page.locator('#reason-input').fill('INC-4711 resolved: provider is back');
  await page.locator('#reason-submit').click({ timeout: STEP });
  await dialog.waitFor({ state: 'hidden', timeout: STEP });

  await page.locator(`#rows tr[data-key=${JSON.stringify(key)}][data-phase="CLOSED"]`).waitFor({ timeout: STEP });
  await page
    .locator(`#timeline li.kind-close[data-key=${JSON.stringify(key)}]`, { hasText: 'INC-4711 resolved' })
    .first()
    .waitFor({ timeout: STEP });
  if (problems.length > 0) throw new Error(problems.join('\n'));
  await page.screenshot({ path: screenshot });
  console.log('done');
  clearTimeout(watchdog);
  await browser.close();
  process.exit(0);
} catch (e) {
  console.error(`check.mjs: ${e.stack || e}`);
  if (page) {
    await page.screenshot({ path: screenshot.replace(/\.png$/, '-failure.png') }).catch(() => {});
  }
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
}
