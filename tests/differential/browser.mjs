// tests/differential/browser.mjs: the headless browser the playground tests
// drive: Debian's chromium through npm puppeteer-core. Exits 77 (skipped,
// with the reason) when either is missing, so a caller's run_cases counts
// the skip (and CI's GPT2D_REQUIRE_ALL turns it into a failure).
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';

export async function launchBrowser() {
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
    console.error('SKIP: no chromium (scripts/setup.sh --test installs Debian\'s)');
    process.exit(77);
  }
  return puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
    protocolTimeout: 60000, // a hung step fails in a minute, not three
  });
}
