#!/usr/bin/env node
// tests/differential/openai_models.mjs BASE_URL [API_KEY]: several
// checkpoints in one daemon chosen by `model` through the OpenAI client for
// Node (issue 36), on the server of tests/test_models.sh (gpt2d-tiny, its q8
// copy tiny-q8, and rand, a random checkpoint): models.list() names the
// three, models.retrieve() finds one, a greedy completion and chat under
// each answer with the name asked for (streamed: the same text), rand's
// text differs from gpt2d-tiny's, and a model that is not served is the
// client's NotFoundError. Exit 77 (skipped) when the npm package openai is
// missing.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let OpenAI;
try {
  OpenAI = require('openai');
} catch (e) {
  console.error('SKIP: npm package openai is not installed (cd tests/differential && npm ci)');
  process.exit(77);
}
const client = new OpenAI({ baseURL: process.argv[2], apiKey: process.argv[3] || 'unused' });
const fail = (msg) => { console.error('FAIL: ' + msg); process.exit(1); };

const ids = [];
for await (const m of client.models.list()) ids.push(m.id);
if (ids.join(' ') !== 'gpt2d-tiny tiny-q8 rand') fail(`models.list(): ${ids}`);
const got = await client.models.retrieve('tiny-q8');
if (got.id !== 'tiny-q8' || got.dtype !== 'q8') fail(`models.retrieve('tiny-q8'): ${JSON.stringify(got)}`);

const prompt = 'The river runs';
const texts = {};
for (const model of ids) {
  const c = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0 });
  if (c.model !== model) fail(`completions: model ${c.model}, asked ${model}`);
  texts[model] = c.choices[0].text;
  let streamed = '';
  const s = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 0, stream: true });
  for await (const ch of s) {
    if (ch.model !== model) fail(`stream: model ${ch.model}, asked ${model}`);
    streamed += ch.choices[0]?.text ?? '';
  }
  if (streamed !== texts[model]) fail(`${model}: streamed ${JSON.stringify(streamed)} != ${JSON.stringify(texts[model])}`);
  const chat = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hello?' }], max_tokens: 8, temperature: 0,
  });
  if (chat.model !== model) fail(`chat: model ${chat.model}, asked ${model}`);
}
if (texts.rand === texts['gpt2d-tiny']) fail(`rand and gpt2d-tiny wrote the same: ${JSON.stringify(texts)}`);
try {
  await client.completions.create({ model: 'gpt-4', prompt, max_tokens: 4 });
  fail('gpt-4 was served');
} catch (e) {
  if (!(e instanceof OpenAI.NotFoundError)) fail(`gpt-4: ${e}`);
}
console.log('openai client: three checkpoints by model');
