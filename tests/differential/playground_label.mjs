#!/usr/bin/env node
// tests/differential/playground_label.mjs BASE_URL ID OWNER WEIGHTS DESCRIPTION [SCREENSHOT.png]:
// the playground's header says what the server serves, in headless
// chromium: the model line names ID and "by OWNER", the line under it is
// DESCRIPTION exactly, in the warning style when WEIGHTS is "random" and
// plain otherwise. tests/test_api.sh (case model_labels) runs it against a
// `gpt2d synth` checkpoint (random weights) and one carrying a trained
// model's metadata. Exit 77 (skipped) when puppeteer-core or chromium is
// missing.
import { launchBrowser } from './browser.mjs';

const [base, id, owner, weights, description, shot] = process.argv.slice(2);
const browser = await launchBrowser();
const fail = async (page, msg) => {
  console.error('FAIL: ' + msg);
  if (shot) await page.screenshot({ path: shot, fullPage: true }).catch(() => {});
  await browser.close();
  process.exit(1);
};
const page = await browser.newPage();
await page.setViewport({ width: 1200, height: 900 });
await page.goto(base + '/', { waitUntil: 'networkidle0', timeout: 20000 });
await page.waitForFunction((want) => document.getElementById('model-info').textContent.includes(want),
  { timeout: 10000 }, 'model ' + id + ' by ' + owner)
  .catch(async () => fail(page, 'the model line: ' + await page.$eval('#model-info', (e) => e.textContent)));
const about = await page.$eval('#model-about', (e) => ({
  text: e.textContent, hidden: e.hidden, random: e.classList.contains('random'),
  color: getComputedStyle(e).color,
}));
if (about.hidden || about.text !== description) await fail(page, 'the description line: ' + JSON.stringify(about));
if (about.random !== (weights === 'random')) await fail(page, 'the warning style for ' + weights + ': ' + JSON.stringify(about));
if (shot) await page.screenshot({ path: shot, fullPage: true });
await browser.close();
