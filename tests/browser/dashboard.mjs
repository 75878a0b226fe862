// Drives the dashboard in Debian's headless Chromium (never a downloaded
// browser): overview counts, filter to final failures, bulk requeue with a
// reason; the blocked keys, and a cancel of one's head; another site's image, fetch and frame of it refused. Prints one JSON line of what it saw; saves a screenshot of each
// page. Usage: node dashboard.mjs BASE_URL SCREENSHOT_DIR
import { chromium } from 'playwright-core';
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [base, shots] = process.argv.slice(2);
mkdirSync(shots, { recursive: true });
const profile = mkdtempSync(join(tmpdir(), 'sn-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1360, height: 900 },
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
});
const seen = {};
try {
  const page = context.pages()[0] ?? await context.newPage();
  page.setDefaultTimeout(20000);
  const shot = (name) => page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });

  // 1. Overview: the counts of each definition.
  await page.goto(`${base}/`);
  seen.overview = {};
  for (const row of await page.locator('tr[data-def]').all()) {
    const def = await row.getAttribute('data-def');
    const counts = {};
    for (const cell of await row.locator('td[data-count]').all()) {
      counts[await cell.getAttribute('data-count')] = Number((await cell.innerText()).trim());
    }
    seen.overview[def] = counts;
  }
  await shot('overview');

  // 2. History, filtered to billing's final failures through the form.
  await page.getByRole('link', { name: 'History' }).click();
  await page.selectOption('select[name=def]', 'billing');
  await page.selectOption('select[name=status]', 'final_failure');
  await page.getByRole('button', { name: 'Filter' }).click();
  await page.waitForURL(/status=final_failure/);
  seen.listed = await page.locator('tr[data-id]').count();
  await shot('history-final-failures');

  // A notice's detail page.
  await page.locator('tr[data-id] a').first().click();
  await page.waitForURL(/\/notices\/\d+$/);
  seen.detail_log = await page.locator('ol.timeline li').count();
  await shot('notice-detail');
  await page.goBack();

  // 3. Bulk requeue with a reason, through the confirmation step.
  await page.getByRole('link', { name: /Requeue every notice matching/ }).click();
  seen.matched = Number(await page.locator('[data-matched]').getAttribute('data-matched'));
  await shot('bulk-confirm');
  await page.fill('input[name=reason]', 'browser replay');
  await page.getByRole('button', { name: /^Requeue \d+ notices$/ }).click();
  seen.changed = Number(await page.locator('[data-changed]').getAttribute('data-changed'));
  await shot('bulk-done');

  // The definitions page, and the in-flight list after the requeue.
  await page.getByRole('link', { name: 'Definitions' }).click();
  await shot('definitions');
  await page.getByRole('link', { name: 'In flight' }).click();
  seen.in_flight_rows = await page.locator('tr[data-id]').count();
  await shot('in-flight');

  // The blocked keys, then a cancel of key b's head from its row.
  await page.getByRole('link', { name: 'Blocked keys' }).click();
  const blocked = async () => {
    const rows = [];
    for (const row of await page.locator('tr[data-key]').all()) {
      rows.push([await row.getAttribute('data-def'), await row.getAttribute('data-key'),
        Number(await row.getAttribute('data-waiting'))]);
    }
    return rows.sort();
  };
  seen.blocked = await blocked();
  await shot('blocked-keys');
  const rowB = page.locator('tr[data-key="b"]');
  const cancelB = rowB.locator('form', { has: page.getByRole('button', { name: 'Cancel' }) });
  await cancelB.locator('input[name=reason]').fill('give up b');
  await cancelB.getByRole('button', { name: 'Cancel' }).click();
  await page.waitForLoadState();
  await page.getByRole('link', { name: 'Blocked keys' }).click();
  seen.blocked_after = await blocked();

  // 4. Another site's page (served on localhost, another site than
  // 127.0.0.1): its image, fetch and frame of the dashboard are refused,
  // and nothing of the dashboard renders in its frame.
  const html = `<h1>another site</h1><img src="${base}/api/notices?q=by-img">`
    + `<iframe src="${base}/notices?q=by-frame"></iframe>`
    + `<script>fetch("${base}/api/notices?q=by-fetch", {mode: "no-cors"}).catch(() => {})</script>`;
  const other = createServer((req, res) => {
    res.setHeader('content-type', 'text/html');
    res.end(html);
  });
  await new Promise((ready) => other.listen(0, '127.0.0.1', ready));
  const evil = `http://localhost:${other.address().port}/`;
  // What each request got: its status, or why the browser dropped it
  // first (an image's text answer is blocked by ORB before the page).
  const results = {};
  const tagOf = (r) => r.url().match(/q=(by-\w+)/)?.[1];
  page.on('response', (r) => { const tag = tagOf(r); if (tag) results[tag] ??= r.status(); });
  page.on('requestfailed', (r) => {
    const tag = tagOf(r);
    if (tag) results[tag] ??= r.failure()?.errorText ?? 'failed';
  });
  await page.goto(evil);
  for (const deadline = Date.now() + 20000; Object.keys(results).length < 3;) {
    if (Date.now() > deadline) throw new Error(`cross-site requests seen: ${JSON.stringify(results)}`);
    await page.waitForTimeout(50);
  }
  seen.cross_site = { img: results['by-img'], frame: results['by-frame'], fetch: results['by-fetch'] };
  const framed = page.frames().find((f) => f.url().includes('by-frame'));
  seen.framed_rows = framed ? await framed.locator('tr[data-id], h1').count() : 0;
  await shot('cross-site');
  other.close();
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(seen));
