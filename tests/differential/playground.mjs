#!/usr/bin/env node
// tests/differential/playground.mjs BASE_URL SCREENSHOT.png [API_KEY [ORIGIN]]:
// the playground page in a real headless browser (Debian's chromium, driven
// by npm puppeteer-core): load it, (with API_KEY: see it ask for the key and
// type it), see the served model and weights format, run a streamed
// completion, and check that the text and each token's probability appear
// and that a click shows the alternatives. With ORIGIN (a page server the
// gpt2d server lists in cors_origins, on 127.0.0.1), a page there calls the
// chat API across origins (preflight included), and the same page on
// localhost, another origin, is refused by the browser. Then the chat view:
// a system prompt and two streamed turns (each reply the API's own text for
// the same messages and seed, with its token spans and numbers), the page
// reloaded (history, system prompt, view and settings come back from
// localStorage), regenerate (the last reply replaced), continue, copy, a new
// tab asking for the key in the chat view, and a stream cut mid-way by a
// proxy in this script (the page keeps the partial text and says
// "connection lost — output incomplete", in both views). The screenshot is
// kept as the test's artifact, with SCREENSHOT-{completion,chat}-{desktop,
// phone}.png beside it (1200x900 and 390x844). Exit 77 (skipped) when
// puppeteer-core or chromium is missing.
import http from 'node:http';
import { launchBrowser } from './browser.mjs';

const [base, shot, apiKey, origin] = process.argv.slice(2);
const auth = apiKey ? { Authorization: 'Bearer ' + apiKey } : {};
const fail = async (browser, page, msg) => {
  console.error('FAIL: ' + msg);
  if (page && shot) await page.screenshot({ path: shot, fullPage: true }).catch(() => {});
  await browser.close();
  process.exit(1);
};

const browser = await launchBrowser();
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
// pieces however fast the server writes it (and test_api.sh's server sleeps
// 20 ms a step, so it is written in pieces too).
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
const seen = await page.evaluate(() => window.seenCounts);
const partial = new Set(seen.filter((n) => n > 0 && n < result[0].tokens.length));
if (partial.size < 3) {
  await fail(browser, page, 'the output was not rendered as it arrived: partial token counts seen '
    + JSON.stringify([...partial]) + ' of ' + result[0].tokens.length + '; every count recorded: ' + JSON.stringify(seen));
}

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
  await own.waitForFunction(() => /^cannot reach gpt2d at .* is it running\?$/.test(document.getElementById('model-info').textContent), { timeout: 10000 })
    .catch(async () => fail(browser, own, '?api= on gpt2d\'s own page: ' + await own.$eval('#model-info', (e) => e.textContent)));
  if (elsewhere.length) await fail(browser, own, 'gpt2d\'s page called ' + elsewhere.join(' '));
  // A server it cannot reach is said in a user's words, in both views, not
  // as the browser's bare "Failed to fetch".
  const unreachable = 'cannot reach gpt2d at ' + origin + ' \u2014 is it running?';
  await own.click('#run');
  await own.waitForFunction((w) => document.getElementById('status').textContent === w, { timeout: 10000 }, unreachable)
    .catch(async () => fail(browser, own, 'completion, no server: ' + await own.$eval('#status', (e) => e.textContent)));
  await own.click('#tab-chat');
  await own.type('#message', 'Hello');
  await own.click('#send');
  await own.waitForFunction((w) => document.getElementById('chat-status').textContent === w, { timeout: 10000 }, unreachable)
    .catch(async () => fail(browser, own, 'chat, no server: ' + await own.$eval('#chat-status', (e) => e.textContent)));
  await own.click('#new-chat');  // the failed turn is not left in the origin's storage
  await own.close();
  cross = `; cross-origin chat from ${origin} ok, from ${refusedOrigin} refused; the page's copy on ${origin} ok, gpt2d's own page kept to its origin`;
}
// ---- The chat view ---------------------------------------------------------------
// Screenshots beside SHOT: NAME-{completion,chat}-{desktop,phone}.png.
const shotAs = (what) => shot.replace(/(\.png)?$/, '-' + what + '.png');
const desktop = { width: 1200, height: 900 }, phone = { width: 390, height: 844 };
const LOST = 'connection lost — output incomplete';
const field = (p, id, value) => p.$eval('#' + id, (e, v) => { e.value = v; e.dispatchEvent(new Event('change')); }, value);
const chatStatus = (p) => p.$eval('#chat-status', (e) => e.textContent);
const waitChat = async (p, want, what) => p.waitForFunction((w) => document.getElementById('chat-status').textContent === w,
  { timeout: 30000 }, want).catch(async () => fail(browser, p, what + ': chat status ' + JSON.stringify(await chatStatus(p))));
const messages = (p) => p.$$eval('#messages .msg', (ms) => ms.map((m) => ({
  role: m.classList.contains('user') ? 'user' : 'assistant',
  text: m.querySelector('.text').textContent,
  toks: m.querySelectorAll('.tok').length,
  meta: m.querySelector('.meta').textContent,
  note: m.querySelector('.notice').textContent,
})));
// The reply the API gives for these messages and seed (the page's settings).
const system = 'You are a terse assistant.';
const apiReply = async (turns, seed) => {
  const r = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...auth },
    body: JSON.stringify({
      messages: [{ role: 'system', content: system }, ...turns.map((m) => ({ role: m.role, content: m.text }))],
      max_tokens: 16, temperature: 0.8, seed,
    }),
  });
  return (await r.json()).choices[0].message.content;
};

await page.bringToFront();  // after ORIGIN's pages: a tab behind others draws no frames
await page.click('header h1');  // closes the alternatives
await page.screenshot({ path: shotAs('completion-desktop'), fullPage: true });
await page.setViewport(phone);
await page.screenshot({ path: shotAs('completion-phone'), fullPage: true });
await page.setViewport(desktop);
await page.click('#tab-chat');
const shown = await page.evaluate(() => [document.getElementById('chat-view').hidden, document.getElementById('complete-view').hidden,
  document.getElementById('tab-chat').getAttribute('aria-selected')]);
if (shown.join() !== 'false,true,true') await fail(browser, page, 'the chat tab did not show the chat view: ' + shown);
await field(page, 'max_tokens', '16');
await field(page, 'temperature', '0.8');
await field(page, 'seed', '1');
await page.type('#system', system);

// Two streamed turns, the first throttled so it arrives in pieces.
await page.evaluate(() => {
  window.chatCounts = [];
  new MutationObserver(() => {
    const m = [...document.querySelectorAll('#messages .msg.assistant .text')].pop();
    if (m && document.getElementById('chat-status').textContent === 'generating…') window.chatCounts.push(m.querySelectorAll('.tok').length);
  }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
});
await page.emulateNetworkConditions({ download: 6000, upload: 10000000, latency: 0 });
await page.type('#message', 'Hello there');
await page.keyboard.press('Enter');
await waitChat(page, 'done', 'the first turn');
await page.emulateNetworkConditions(null);
const chatPartial = new Set((await page.evaluate(() => window.chatCounts)).filter((n) => n > 0));
if (chatPartial.size < 3) await fail(browser, page, 'the reply was not shown as it arrived: token counts seen ' + JSON.stringify([...chatPartial]));
await page.type('#message', 'And then?');
await page.click('#send');
await waitChat(page, 'done', 'the second turn');
const turns = await messages(page);
if (turns.map((m) => m.role).join() !== 'user,assistant,user,assistant') await fail(browser, page, 'messages ' + JSON.stringify(turns));
if (turns[0].text !== 'Hello there' || turns[2].text !== 'And then?') await fail(browser, page, 'the user turns ' + JSON.stringify(turns));
for (const i of [1, 3]) {
  const want = await apiReply(turns.slice(0, i), 1);
  if (turns[i].text !== want) await fail(browser, page, `reply ${i}: page ${JSON.stringify(turns[i].text)}, API ${JSON.stringify(want)}`);
  if (turns[i].toks < 1) await fail(browser, page, `reply ${i} has no token spans`);
  if (!/tokens\/s/.test(turns[i].meta) || !/prompt \d+ tokens/.test(turns[i].meta) || !/context \d+/.test(turns[i].meta)) await fail(browser, page, `reply ${i}'s numbers: ${JSON.stringify(turns[i].meta)}`);
}
await page.click('#messages .msg.assistant .tok');
if ((await page.$$eval('#alts tr', (r) => r.length)) < 2) await fail(browser, page, 'no alternatives for a chat token');
await page.click('header h1');  // closes the alternatives
await page.screenshot({ path: shotAs('chat-desktop'), fullPage: true });
await page.setViewport(phone);
const wide = await page.evaluate(() => document.documentElement.scrollWidth);
if (wide > phone.width) await fail(browser, page, `at phone width the page is ${wide} px wide`);
await page.screenshot({ path: shotAs('chat-phone'), fullPage: true });
await page.setViewport(desktop);

// A reload: the chat, the system prompt, the view and the settings come back.
await page.reload({ waitUntil: 'load' });
await page.waitForFunction(() => /model gpt2/.test(document.getElementById('model-info').textContent), { timeout: 10000 })
  .catch(() => fail(browser, page, 'after the reload the model line never showed the model'));
const back = await messages(page);
const kept = await page.evaluate(() => [document.getElementById('system').value, document.getElementById('chat-view').hidden,
  document.getElementById('seed').value, document.getElementById('max_tokens').value]);
if (JSON.stringify(back.map((m) => [m.text, m.toks, m.meta])) !== JSON.stringify(turns.map((m) => [m.text, m.toks, m.meta]))) await fail(browser, page, 'after the reload: ' + JSON.stringify(back));
if (JSON.stringify(kept) !== JSON.stringify([system, false, '1', '16'])) await fail(browser, page, 'after the reload, system prompt, view hidden, seed, max_tokens: ' + JSON.stringify(kept));

// Regenerate with another seed: the last reply is replaced by the API's.
await field(page, 'seed', '2');
await page.click('#regen');
await waitChat(page, 'done', 'regenerate');
const regen = await messages(page);
const want2 = await apiReply(turns.slice(0, 3), 2);
if (regen.length !== 4 || regen.slice(0, 3).some((m, i) => m.text !== turns[i].text)) await fail(browser, page, 'regenerate changed the history: ' + JSON.stringify(regen));
if (regen[3].text !== want2 || want2 === turns[3].text) await fail(browser, page, `regenerated ${JSON.stringify(regen[3].text)}, API (seed 2) ${JSON.stringify(want2)}, before ${JSON.stringify(turns[3].text)}`);

// Continue: more text on the same reply.
await page.click('#continue');
await waitChat(page, 'done', 'continue');
const cont = await messages(page);
if (cont.length !== 4 || !cont[3].text.startsWith(regen[3].text) || cont[3].text.length <= regen[3].text.length) await fail(browser, page, 'continue: ' + JSON.stringify(cont[3]));

// Copy: the message's text on the clipboard.
await browser.defaultBrowserContext().overridePermissions(base, ['clipboard-read', 'clipboard-write', 'clipboard-sanitized-write']);
await page.click('#messages .msg.assistant:last-child .copy');
const clip = await page.evaluate(() => navigator.clipboard.readText());
if (clip !== cont[3].text) await fail(browser, page, `copied ${JSON.stringify(clip)}, the message is ${JSON.stringify(cont[3].text)}`);

// A new tab (no key yet) opens in the chat view, with the history, and asks for the key.
const tab = await browser.newPage();
await tab.goto(base + '/', { waitUntil: 'load', timeout: 20000 });
if (apiKey) {
  await tab.waitForFunction(() => !document.getElementById('key-box').hidden && !document.getElementById('chat-view').hidden
    && /needs an API key/.test(document.getElementById('model-info').textContent), { timeout: 10000 })
    .catch(() => fail(browser, tab, 'the chat view did not ask for the API key'));
}
if ((await messages(tab)).length !== 4) await fail(browser, tab, 'a new tab does not show the chat');
await tab.close();

// A stream cut mid-way. The page is served through a proxy here (so that
// its own origin is the proxy's) that passes everything on, but cuts the
// connection of a stream after `cut.after` events when asked.
// cut.after: events the proxy passes of the next POST's answer; cut.sent:
// their text; cut.drop: set once they are written, it cuts both sockets.
const cut = { after: 0, sent: '', drop: null };
const target = new URL(base);
const proxy = http.createServer((req, res) => {
  const headers = { ...req.headers, host: target.host };
  delete headers.origin;  // the page's POSTs carry the proxy's origin
  const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers }, (ur) => {
    res.writeHead(ur.statusCode, ur.headers);
    const limit = req.method === 'POST' ? cut.after : 0;
    if (!limit) return ur.pipe(res);
    cut.after = 0;
    cut.sent = '';
    let buf = '', events = 0;
    ur.on('data', (d) => {
      if (events >= limit) return;
      buf += d.toString('utf8');
      let at;
      while (events < limit && (at = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, at + 2);
        buf = buf.slice(at + 2);
        events++;
        if (event.startsWith('data: {')) {
          const c = (JSON.parse(event.slice(6)).choices || [])[0] || {};
          cut.sent += c.text ?? c.delta?.content ?? '';
        }
        const last = events === limit;
        // The test cuts (cut.drop) once the page shows what was passed: a
        // browser drops what a stream has queued but not yet handed to the
        // page when it errors, so a cut on a timer could race the page.
        res.write(event, () => { if (last) cut.drop = () => { ur.destroy(); res.socket.destroy(); }; });
      }
    });
  });
  up.on('error', () => res.destroy());
  req.pipe(up);
});
await new Promise((ok) => proxy.listen(0, '127.0.0.1', ok));
// Once the proxy has written its events and the page shows their text
// (shown(text) in the page), the connection is cut.
const cutWhenShown = async (p, shown, what) => {
  for (const t0 = Date.now(); !cut.drop; await new Promise((ok) => setTimeout(ok, 20))) {
    if (Date.now() - t0 > 30000) await fail(browser, p, what + ': the proxy never passed its events');
  }
  await p.waitForFunction(shown, { timeout: 30000 }, cut.sent)
    .catch(() => fail(browser, p, what + ': the page never showed ' + JSON.stringify(cut.sent)));
  cut.drop();
  cut.drop = null;
};
const via = 'http://127.0.0.1:' + proxy.address().port;
const cutPage = await browser.newPage();
await cutPage.goto(via + '/', { waitUntil: 'load', timeout: 20000 });
if (apiKey) {
  await cutPage.waitForFunction(() => !document.getElementById('key-box').hidden, { timeout: 10000 })
    .catch(() => fail(browser, cutPage, 'through the proxy, the page did not ask for the key'));
  await cutPage.type('#api_key', apiKey);
  await cutPage.$eval('#api_key', (e) => e.dispatchEvent(new Event('change')));
}
await cutPage.waitForFunction(() => /model gpt2/.test(document.getElementById('model-info').textContent), { timeout: 10000 })
  .catch(() => fail(browser, cutPage, 'through the proxy, the model line never showed the model'));
await cutPage.click('#tab-chat');
await field(cutPage, 'max_tokens', '64');
await field(cutPage, 'temperature', '0');
cut.after = 6;  // the role chunk and five pieces of text
await cutPage.type('#message', 'Hi');
await cutPage.keyboard.press('Enter');
await cutWhenShown(cutPage, (sent) => {
  const ms = document.querySelectorAll('#messages .msg .text');
  return ms.length >= 2 && ms[1].textContent === sent;
}, 'the cut chat stream');
await waitChat(cutPage, LOST, 'the cut chat stream');
const lost = (await messages(cutPage))[1];
if (!cut.sent || lost.text !== cut.sent || lost.note !== LOST) await fail(browser, cutPage, `cut chat: the page kept ${JSON.stringify(lost)}, the proxy passed ${JSON.stringify(cut.sent)}`);
await cutPage.reload({ waitUntil: 'load' });
const lostBack = (await messages(cutPage))[1];
if (lostBack.text !== cut.sent || lostBack.note !== LOST) await fail(browser, cutPage, 'the cut reply after a reload: ' + JSON.stringify(lostBack));
// The completion view says the same and keeps its text.
await cutPage.click('#tab-complete');
await cutPage.$eval('#prompt', (e) => { e.value = 'The quick brown fox'; });
await field(cutPage, 'n', '1');
cut.after = 5;
await cutPage.click('#run');
await cutWhenShown(cutPage, (sent) => (document.querySelector('.choice .text') || {}).textContent
  === 'The quick brown fox' + sent, 'the cut completion');
await cutPage.waitForFunction((w) => document.getElementById('status').textContent === w, { timeout: 30000 }, LOST)
  .catch(async () => fail(browser, cutPage, 'the cut completion: status ' + await cutPage.$eval('#status', (e) => e.textContent)));
const lostText = await cutPage.$eval('.choice .text', (e) => e.textContent);
if (lostText !== 'The quick brown fox' + cut.sent || !cut.sent) await fail(browser, cutPage, `cut completion: the page kept ${JSON.stringify(lostText)}, the proxy passed ${JSON.stringify(cut.sent)}`);
proxy.close();
if (external.length) await fail(browser, page, 'requests outside the server: ' + external.join(' '));
const unexpectedChat = consoleErrors.filter((e) => !(apiKey && /status of 401/.test(e)));
if (unexpectedChat.length) await fail(browser, page, 'console errors: ' + unexpectedChat.join(' | '));

await browser.close();
console.log(`playground: ok (${result[0].tokens.length} tokens shown, ${alts.length} alternatives, ${partial.size} partial renderings${cross}; `
  + `chat: 2 turns (${chatPartial.size} partial renderings), reload, regenerate, continue, copy, a cut stream kept in both views; `
  + `screenshots ${shot} and ${shotAs('{completion,chat}-{desktop,phone}')})`);

