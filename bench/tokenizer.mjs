#!/usr/bin/env node
// bench/tokenizer.mjs FILE RUNS: tiktoken's gpt2 encode_ordinary (npm
// tiktoken, WASM) on FILE, one JSON line per run, like bench_tokenizer.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '../tests/differential/package.json'));
const { get_encoding } = require('tiktoken');
const [file, runs] = process.argv.slice(2);
const buf = readFileSync(file);
const text = buf.toString('utf8');
const enc = get_encoding('gpt2');
enc.encode_ordinary('warm up');
for (let r = 0; r < Number(runs); r++) {
  const t0 = process.hrtime.bigint();
  const ids = enc.encode_ordinary(text);
  const dt = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ impl: 'tiktoken', mb: buf.length / 1e6, seconds: dt, mb_per_s: buf.length / 1e6 / dt, ids: ids.length }));
}
enc.free();
