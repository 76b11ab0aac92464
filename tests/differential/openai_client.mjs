#!/usr/bin/env node
// tests/differential/openai_client.mjs BASE_URL: the official OpenAI client
// for Node (npm openai) against gpt2d: completions.create without and with
// stream. Exit 77 (skipped) when the package is not installed.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let OpenAI;
try {
  OpenAI = require('openai');
} catch (e) {
  console.error('SKIP: npm package openai is not installed (cd tests/differential && npm ci)');
  process.exit(77);
}
const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: 'test-key-123', maxRetries: 0 });
const fail = (msg) => { console.error('FAIL: ' + msg); process.exit(1); };

const r = await client.completions.create({ model: 'gpt2', prompt: 'Hello, my name is', max_tokens: 7, temperature: 0, ignore_eos: true });
if (r.object !== 'text_completion' || !r.id.startsWith('cmpl-')) fail('shape ' + JSON.stringify(r));
if (r.choices.length !== 1 || typeof r.choices[0].text !== 'string' || r.choices[0].finish_reason !== 'length') fail('choice ' + JSON.stringify(r.choices));
if (r.usage.completion_tokens !== 7 || r.usage.prompt_tokens !== 5) fail('usage ' + JSON.stringify(r.usage));

const stream = await client.completions.create({ model: 'gpt2', prompt: 'Hello, my name is', max_tokens: 7, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
let text = '', finishes = 0, usage = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.choices.length === 0) { usage = chunk.usage; continue; }
  text += chunk.choices[0].text;
  if (chunk.choices[0].finish_reason) finishes++;
}
if (text !== r.choices[0].text) fail(`streamed text ${JSON.stringify(text)} != ${JSON.stringify(r.choices[0].text)}`);
if (finishes !== 1) fail('finish chunks: ' + finishes);
if (!usage || usage.completion_tokens !== 7) fail('stream usage ' + JSON.stringify(usage));

try {
  await client.completions.create({ model: 'gpt2', prompt: 'x', temperature: 9 });
  fail('temperature 9 accepted');
} catch (e) {
  if (e.status !== 400 || e.param !== 'temperature') fail('error ' + e.status + ' ' + e.param);
}
console.log(`openai client: ok (${chunks} chunks, text ${JSON.stringify(text)})`);
