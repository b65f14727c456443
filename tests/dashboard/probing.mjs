// Drives fusebox's dashboard in headless Chromium for
// tests/suite/dashboard.rs: a half-open key's probing in words.
//
//   node probing.mjs URL SCREENSHOT_PATH EXPECTED_JSON
//
// EXPECTED_JSON: {"key": K, "break": TEXT, "sub": TEXT, "policy": TEXT},
// what the engine holds: K is half-open. Loads the page and checks that
// K's row in the "Not closed" table is HALF_OPEN, that its break cell
// reads TEXT then SUB (the probe slots held, and the successes counted
// toward closing), and that the key's tooltip names the policy's
// half_open (POLICY). Saves a screenshot at SCREENSHOT_PATH and prints
// "done". On any failure, prints why on standard error, saves
// SCREENSHOT_PATH with "-failure" before ".png", and exits 1.

import { chromium } from 'playwright-core';

const [url, screenshot, expectedJson] = process.argv.slice(2);
if (!url || !screenshot || !expectedJson) {
  console.error('usage: node probing.mjs URL SCREENSHOT_PATH EXPECTED_JSON');
  process.exit(64);
}
const expected = JSON.parse(expectedJson);
const STEP = 30_000; // ms: the deadline of each wait on the page

function check(condition, message) {
  if (!condition) throw new Error(message);
}

let browser;
let page;
const watchdog = setTimeout(() => {
  console.error('probing.mjs: gave up after 110 s');
  process.exit(2);
}, 110_000);

try {
  browser = await chromium.launch({
    executablePath: process.env.FUSEBOX_TEST_CHROMIUM || '/usr/bin/chromium',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
  page = await browser.newPage({ viewport: { width: 1600, height: 900 }, deviceScaleFactor: 1 });
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console error: ${m.text()}`);
  });

  await page.goto(url);
  await page.locator('#status[data-state="live"]').waitFor({ timeout: STEP });
  const row = page.locator(`#attention-rows tr[data-key=${JSON.stringify(expected.key)}][data-phase="HALF_OPEN"]`);
  await row.waitFor({ timeout: STEP });
  await row.locator('.pill', { hasText: 'HALF-OPEN' }).waitFor({ timeout: STEP });
  const cell = row.locator('td.c-break');
  const main = (await cell.locator('span.probing').textContent()).trim();
  const sub = (await cell.locator('span.break-sub').textContent()).trim();
  check(main === expected.break, `the break cell reads ${JSON.stringify(main)}, not ${JSON.stringify(expected.break)}`);
  check(sub === expected.sub, `under it: ${JSON.stringify(sub)}, not ${JSON.stringify(expected.sub)}`);
  check(await cell.locator('span.break-sub').isVisible(), 'the successes line is hidden');
  const tip = await row.locator('td.c-key span.key').getAttribute('title');
  check(tip && tip.includes(expected.policy), `the key's tooltip does not name the policy: ${JSON.stringify(tip)}`);
  const why = await cell.locator('span.probing').getAttribute('title');
  check(why && why.includes(expected.policy), `the break cell's tooltip does not name the policy: ${JSON.stringify(why)}`);
  if (problems.length > 0) throw new Error(problems.join('\n'));
  await page.screenshot({ path: screenshot });
  console.log('done');
  clearTimeout(watchdog);
  await browser.close();
  process.exit(0);
} catch (e) {
  console.error(`probing.mjs: ${e.stack || e}`);
  if (page) {
    await page.screenshot({ path: screenshot.replace(/\.png$/, '-failure.png'), fullPage: true }).catch(() => {});
  }
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
}
