#!/usr/bin/env node
// tests/differential/playground_models.mjs BASE_URL SCREENSHOT.png: the
// playground on a server of several checkpoints and an adapter
// (tests/test_models.sh, case playground): the model picker lists every
// entry of /v1/models (an adapter with its base), the first is chosen, and
// picking another makes the header describe it (a random checkpoint's
// warning, its context) and the next completion ask for it by `model`.
// Exit 77 (skipped) when puppeteer-core or chromium is missing.
import { launchBrowser } from './browser.mjs';

const [base, shot] = process.argv.slice(2);
const browser = await launchBrowser();
const page = await browser.newPage();
const fail = async (msg) => {
  console.error('FAIL: ' + msg);
  await page.screenshot({ path: shot, fullPage: true }).catch(() => {});
  await browser.close();
  process.exit(1);
};
await page.setViewport({ width: 1200, height: 700 });
const asked = [];
page.on('request', (req) => {
  if (req.url().endsWith('/v1/completions') && req.method() === 'POST') asked.push(JSON.parse(req.postData()).model);
});
await page.goto(base + '/', { waitUntil: 'networkidle0', timeout: 20000 });
await page.waitForFunction(() => document.getElementById('model-info').dataset.model, { timeout: 10000 })
  .catch(() => fail('the page never named a model'));
const options = await page.$$eval('#model option', (os) => os.map((o) => o.textContent));
if (options.join('|') !== 'gpt2d-tiny|rand|pirate (LoRA on gpt2d-tiny)') await fail('the picker: ' + options);
if (await page.$eval('#model-pick', (e) => e.hidden)) await fail('the picker is hidden');
if (!/^model gpt2d-tiny by /.test(await page.$eval('#model-info', (e) => e.textContent))) await fail('the first is not described');
await page.select('#model', 'rand');
const info = await page.$eval('#model-info', (e) => e.textContent);
const about = await page.$eval('#model-about', (e) => [e.textContent, e.classList.contains('random')]);
if (!/^model rand by gpt2d · weights f32/.test(info) || about[0] !== 'random weights: the text is nonsense' || !about[1])
  await fail('rand picked: ' + JSON.stringify([info, about]));
await page.$eval('#max_tokens', (e) => { e.value = '8'; });
await page.click('#run');
await page.waitForFunction(() => /prompt \d+ tokens of 128/.test(document.body.textContent), { timeout: 15000 })
  .catch(() => fail('no usage line with rand\'s context of 128'));
await page.select('#model', 'pirate');
if (!/^model pirate \(LoRA on gpt2d-tiny\)/.test(await page.$eval('#model-info', (e) => e.textContent))) await fail('pirate picked');
await page.click('#run');
await page.waitForFunction(() => !document.getElementById('run').disabled, { timeout: 15000 }).catch(() => {});
for (let i = 0; i < 50 && asked.length < 2; i++) await new Promise((r) => setTimeout(r, 100));
if (asked.join(' ') !== 'rand pirate') await fail('the completions asked for ' + asked.join(' '));
await page.screenshot({ path: shot, fullPage: true });
await browser.close();
console.log('playground: the model picker (' + options.length + ' entries), rand and pirate asked for by model');
