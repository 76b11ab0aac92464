#!/usr/bin/env node
// tests/differential/playground.mjs BASE_URL SCREENSHOT.png [API_KEY [ORIGIN]]:
// the playground page in a real headless browser (Debian's chromium, driven
// by npm puppeteer-core): load it, (with API_KEY: see it ask for the key and
// type it), see the served model and weights format, run a streamed
// completion, and check that the text and each token's probability appear
// and that a click shows the alternatives. With ORIGIN (a page server the
// gpt2d server lists in cors_origins, on 127.0.0.1), a page there calls the
// chat API across origins (preflight included), and the same page on
// localhost, another origin, is refused by the browser. The screenshot is
// kept as the test's artifact. Exit 77 (skipped) when puppeteer-core or
// chromium is missing.
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';

const require = createRequire(import.meta.url);
let puppeteer;
try {
  puppeteer = require('puppeteer-core');
} catch (e) {
  console.error('SKIP: npm package puppeteer-core is not installed (cd tests/differential && npm ci)');
  process.exit(77);
}
const chromium = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);
if (!chromium) {
  console.error('SKIP: no chromium (scripts/setup.sh installs Debian\'s)');
  process.exit(77);
}
const [base, shot, apiKey, origin] = process.argv.slice(2);
const auth = apiKey ? { Authorization: 'Bearer ' + apiKey } : {};
const fail = async (browser, page, msg) => {
  console.error('FAIL: ' + msg);
  if (page && shot) await page.screenshot({ path: shot, fullPage: true }).catch(() => {});
  await browser.close();
  process.exit(1);
};

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
});
const page = await browser.newPage();
await page.setViewport({ width: 1200, height: 900 });
const external = [];
const consoleErrors = [];
page.on('request', (req) => { if (!req.url().startsWith(base)) external.push(req.url()); });
page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
page.on('pageerror', (e) => consoleErrors.push(String(e)));

// 'load', not 'networkidle0', with keys on: puppeteer never sees a 401 that
// carries WWW-Authenticate finish, though the page has read it.
const res = await page.goto(base + '/', { waitUntil: apiKey ? 'load' : 'networkidle0', timeout: 20000 });
if (res.status() !== 200) await fail(browser, page, 'GET / is ' + res.status());
if (!(res.headers()['content-type'] || '').startsWith('text/html')) await fail(browser, page, 'content-type ' + res.headers()['content-type']);
if (apiKey) {
  // Keys are on: the page asks for one, and works once it is typed.
  await page.waitForFunction(() => !document.getElementById('key-box').hidden
    && /needs an API key/.test(document.getElementById('model-info').textContent), { timeout: 10000 })
    .catch(() => fail(browser, page, 'the page did not ask for the API key'));
  await page.type('#api_key', apiKey);
  await page.$eval('#api_key', (e) => e.dispatchEvent(new Event('change')));
}
await page.waitForFunction(() => /model gpt2/.test(document.getElementById('model-info').textContent), { timeout: 10000 })
  .catch(() => fail(browser, page, 'the model line: ' + 'never showed the model'));
const info = await page.$eval('#model-info', (e) => e.textContent);
if (!/weights f32/.test(info)) await fail(browser, page, 'no weights format in ' + JSON.stringify(info));

// A streamed completion with logprobs, 64 tokens, greedy.
await page.$eval('#prompt', (e) => { e.value = 'The quick brown fox'; });
await page.$eval('#max_tokens', (e) => { e.value = '64'; });
await page.$eval('#temperature', (e) => { e.value = '0'; });
await page.$eval('#n', (e) => { e.value = '2'; });
// Record how many token spans the first choice shows each time the output
// changes: streamed output grows in several steps before the end.
await page.evaluate(() => {
  window.seenCounts = [];
  new MutationObserver(() => {
    const c = document.querySelector('.choice .text');
    if (c && !/^done in/.test(document.getElementById('status').textContent)) window.seenCounts.push(c.querySelectorAll('.tok').length);
  }).observe(document.getElementById('outputs'), { childList: true, subtree: true, characterData: true });
});
// The answer (about 60 KB of events) comes at 30 KB/s, so it arrives in
// pieces however fast the server writes it.
await page.emulateNetworkConditions({ download: 30000, upload: 10000000, latency: 0 });
await page.click('#run');
await page.waitForFunction(() => /^done in/.test(document.getElementById('status').textContent), { timeout: 30000 })
  .catch(async () => fail(browser, page, 'status: ' + await page.$eval('#status', (e) => e.textContent)));
const result = await page.evaluate(() => [...document.querySelectorAll('.choice')].map((c) => ({
  index: c.dataset.index,
  text: c.querySelector('.text').textContent,
  tokens: [...c.querySelectorAll('.tok')].map((t) => ({ lp: Number(t.dataset.lp), title: t.title, bg: t.style.background })),
})));
if (result.length !== 2) await fail(browser, page, 'choices shown: ' + result.length);
for (const ch of result) {
  if (!ch.text.startsWith('The quick brown fox') || ch.text.length <= 'The quick brown fox'.length) await fail(browser, page, 'text ' + JSON.stringify(ch.text));
  if (ch.tokens.length < 1) await fail(browser, page, 'no token spans');
  for (const t of ch.tokens) {
    if (!(t.lp <= 0) || !/p = [0-9.]+%/.test(t.title) || !t.bg) await fail(browser, page, 'token ' + JSON.stringify(t));
  }
}

await page.emulateNetworkConditions(null);
const partial = new Set((await page.evaluate(() => window.seenCounts)).filter((n) => n > 0 && n < result[0].tokens.length));
if (partial.size < 3) await fail(browser, page, 'the output was not rendered as it arrived: partial token counts seen ' + JSON.stringify([...partial]));

// The same request through the API gives the same text (greedy).
const api = await (await fetch(base + '/v1/completions', {
  method: 'POST', headers: { 'Content-Type': 'application/json', ...auth },
  body: JSON.stringify({ prompt: 'The quick brown fox', max_tokens: 64, temperature: 0 }),
})).json();
if ('The quick brown fox' + api.choices[0].text !== result[0].text) await fail(browser, page, `page ${JSON.stringify(result[0].text)} vs API ${JSON.stringify(api.choices[0].text)}`);

// A click on a token shows its alternatives, most likely first.
await page.click('.choice .tok');
const alts = await page.$$eval('#alts tr', (rows) => rows.map((r) => r.textContent));
if (alts.length < 2) await fail(browser, page, 'alternatives ' + JSON.stringify(alts));
if (external.length) await fail(browser, page, 'requests outside the server: ' + external.join(' '));
// With keys on, the browser logs the first /v1/models call's 401 (the page
// reads it to ask for the key); nothing else may be logged.
const unexpected = consoleErrors.filter((e) => !(apiKey && /status of 401/.test(e)));
if (unexpected.length) await fail(browser, page, 'console errors: ' + unexpected.join(' | '));
await page.screenshot({ path: shot, fullPage: true });

// Another page, served elsewhere, calls the chat API (a JSON POST with a
// key: the browser sends a preflight first); from an origin not listed the
// browser refuses to hand over the answer.
let cross = '';
if (origin) {
  const call = (base, key) => fetch(base + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: 'Bearer ' + key },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3 }),
  }).then(async (r) => ({ status: r.status, id: r.headers.get('X-Request-Id'), body: await r.json() }))
    .catch((e) => ({ error: String(e) }));
  const other = await browser.newPage();
  await other.goto(origin + '/', { timeout: 20000 });
  const ok = await other.evaluate(call, base, apiKey || 'none');
  if (ok.status !== 200 || ok.body.object !== 'chat.completion' || !ok.id) await fail(browser, other, 'a call from ' + origin + ': ' + JSON.stringify(ok));
  const refusedOrigin = origin.replace('127.0.0.1', 'localhost');
  await other.goto(refusedOrigin + '/', { timeout: 20000 });
  const refused = await other.evaluate(call, base, apiKey || 'none');
  if (!refused.error) await fail(browser, other, 'a call from ' + refusedOrigin + ' was not refused: ' + JSON.stringify(refused));
  // A copy of the playground served from ORIGIN (/playground.html, written
  // by the caller), pointed at the server with ?api=, works the same.
  await other.goto(origin + '/playground.html?api=' + encodeURIComponent(base), { timeout: 20000 });
  if (apiKey) {
    await other.waitForFunction(() => !document.getElementById('key-box').hidden, { timeout: 10000 })
      .catch(() => fail(browser, other, 'the copy did not ask for the API key'));
    await other.type('#api_key', apiKey);
    await other.$eval('#api_key', (e) => e.dispatchEvent(new Event('change')));
  }
  await other.waitForFunction((b) => document.getElementById('model-info').textContent.includes('model gpt2')
    && document.getElementById('model-info').textContent.includes('at ' + b), { timeout: 10000 }, base)
    .catch(async () => fail(browser, other, 'the copy: ' + await other.$eval('#model-info', (e) => e.textContent)));
  await other.$eval('#prompt', (e) => { e.value = 'The quick brown fox'; });
  await other.$eval('#max_tokens', (e) => { e.value = '64'; });
  await other.$eval('#temperature', (e) => { e.value = '0'; });
  await other.click('#run');
  await other.waitForFunction(() => /^done in/.test(document.getElementById('status').textContent), { timeout: 30000 })
    .catch(async () => fail(browser, other, 'the copy: ' + await other.$eval('#status', (e) => e.textContent)));
  const copied = await other.$eval('.choice .text', (e) => e.textContent);
  if (copied !== result[0].text) await fail(browser, other, `the copy wrote ${JSON.stringify(copied)}, gpt2d's page ${JSON.stringify(result[0].text)}`);
  // gpt2d's own page never calls another server, whatever ?api= says (its
  // Content-Security-Policy allows only its origin), so a link cannot make
  // it send a typed key elsewhere.
  const own = await browser.newPage();
  const elsewhere = [];
  own.on('request', (r) => { if (r.url().startsWith(origin)) elsewhere.push(r.url()); });
  await own.goto(base + '/?api=' + encodeURIComponent(origin), { waitUntil: 'load', timeout: 20000 });
  await own.waitForFunction(() => /cannot reach the server/.test(document.getElementById('model-info').textContent), { timeout: 10000 })
    .catch(async () => fail(browser, own, '?api= on gpt2d\'s own page: ' + await own.$eval('#model-info', (e) => e.textContent)));
  if (elsewhere.length) await fail(browser, own, 'gpt2d\'s page called ' + elsewhere.join(' '));
  cross = `; cross-origin chat from ${origin} ok, from ${refusedOrigin} refused; the page's copy on ${origin} ok, gpt2d's own page kept to its origin`;
}
await browser.close();
console.log(`playground: ok (${result[0].tokens.length} tokens shown, ${alts.length} alternatives, ${partial.size} partial renderings${cross}; screenshot ${shot})`);
