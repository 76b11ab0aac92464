#!/usr/bin/env node
// tests/differential/openai_lora.mjs BASE_URL [API_KEY]: LoRA adapters
// chosen by `model` through the OpenAI client for Node (issue 36), on
// models/gpt2d-tiny served with its two trained adapters (pirate, formal;
// tests/test_api.sh, case lora_clients): models.list() names each adapter
// with `parent` set to the base's id and models.retrieve() finds one; greedy
// completions and chat under the base, pirate and formal give three
// different texts, each answer's `model` the name asked for, the same text
// under "<base>:<adapter>"; streamed, the same text as whole. Exit 77
// (skipped) when the npm package openai is missing.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let OpenAI;
try {
  OpenAI = require('openai');
} catch (e) {
  console.error('SKIP: npm package openai is not installed (cd tests/differential && npm ci)');
  process.exit(77);
}
const client = new OpenAI({ baseURL: process.argv[2], apiKey: process.argv[3] || 'test-key-123' });
const fail = (msg) => { console.error('FAIL: ' + msg); process.exit(1); };

const list = [];
for await (const m of client.models.list()) list.push(m);
const base = list[0].id;
for (const name of ['pirate', 'formal']) {
  const m = list.find((x) => x.id === name);
  if (!m || m.parent !== base) fail(`models.list(): ${name}: ${JSON.stringify(m)}`);
}
const got = await client.models.retrieve('pirate');
if (got.id !== 'pirate' || got.parent !== base) fail(`models.retrieve('pirate'): ${JSON.stringify(got)}`);

const prompt = 'Hello, my friend. The weather today';
const texts = {};
for (const model of [base, 'pirate', 'formal']) {
  const c = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
  if (c.model !== model) fail(`completions: model ${c.model}, asked ${model}`);
  texts[model] = c.choices[0].text;
  let streamed = '';
  const s = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true });
  for await (const ch of s) {
    if (ch.model !== model) fail(`stream: model ${ch.model}, asked ${model}`);
    streamed += ch.choices[0]?.text ?? '';
  }
  if (streamed !== texts[model]) fail(`${model}: streamed ${JSON.stringify(streamed)} != ${JSON.stringify(texts[model])}`);
}
if (new Set(Object.values(texts)).size !== 3) fail(`the base and the two adapters do not all differ: ${JSON.stringify(texts)}`);
const qualified = await client.completions.create({ model: `${base}:pirate`, prompt, max_tokens: 24, temperature: 0 });
if (qualified.choices[0].text !== texts.pirate) fail(`${base}:pirate differs from pirate`);

const chats = {};
for (const model of [base, 'pirate', 'formal']) {
  const c = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'How is the sea today?' }], max_tokens: 24, temperature: 0,
  });
  if (c.model !== model) fail(`chat: model ${c.model}, asked ${model}`);
  chats[model] = c.choices[0].message.content;
}
if (new Set(Object.values(chats)).size !== 3) fail(`chat: the base and the two adapters do not all differ: ${JSON.stringify(chats)}`);
try {
  await client.completions.create({ model: 'nope', prompt, max_tokens: 1 });
  fail('an unknown model was served');
} catch (e) {
  if (e.status !== 404) fail(`an unknown model: ${e}`);
}
console.log(`lora clients: ok ${JSON.stringify({ texts, chats })}`);
