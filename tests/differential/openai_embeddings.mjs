#!/usr/bin/env node
// tests/differential/openai_embeddings.mjs BASE_URL [API_KEY]: POST
// /v1/embeddings through the clients people build retrieval on: the
// official OpenAI client for Node (embeddings.create with float and with
// base64, which the client sends by default and decodes itself), the AI
// SDK's embed and embedMany (openai.embedding(model)), and LangChain's
// OpenAIEmbeddings (embedQuery, embedDocuments). Every client must get the
// same vector for the same text (the server's bits, whatever the encoding
// and the batch), of the model's width and length 1. Exit 77 (skipped)
// when the packages are not installed.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let OpenAI, createOpenAI, embed, embedMany, OpenAIEmbeddings;
try {
  OpenAI = require('openai');
  ({ createOpenAI } = require('@ai-sdk/openai'));
  ({ embed, embedMany } = require('ai'));
  ({ OpenAIEmbeddings } = require('@langchain/openai'));
} catch (e) {
  console.error('SKIP: npm packages openai / ai / @ai-sdk/openai / @langchain/openai are not installed (cd tests/differential && npm ci): ' + e.message);
  process.exit(77);
}
const baseURL = process.argv[2];
const apiKey = process.argv[3] || 'test-key-123';
const fail = (msg) => { console.error('FAIL: ' + msg); process.exit(1); };
const same = (a, b, what) => {
  if (a.length !== b.length) fail(`${what}: ${a.length} numbers against ${b.length}`);
  for (let i = 0; i < a.length; i++)
    if (Math.fround(a[i]) !== Math.fround(b[i])) fail(`${what}: number ${i} is ${a[i]}, not ${b[i]}`);
};
const unit = (v, what) => {
  const n = v.reduce((s, x) => s + x * x, 0);
  if (Math.abs(n - 1) > 1e-5) fail(`${what}: length ${Math.sqrt(n)}, not 1`);
};
const texts = ['Where is the nearest library?', 'Debian is a free operating system.', 'hello'];

// The OpenAI client: base64 is its default (it decodes the float32 bytes);
// float asked for explicitly. Both give the server's numbers.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const f = await client.embeddings.create({ model: 'gpt2', input: texts, encoding_format: 'float' });
if (f.object !== 'list' || f.data.length !== 3 || f.data.some((d, i) => d.index !== i || d.object !== 'embedding'))
  fail('openai float: ' + JSON.stringify(f).slice(0, 300));
const width = f.data[0].embedding.length;
if (width !== 64) fail(`openai float: width ${width}, not the tiny model's 64`);
if (!(f.usage.prompt_tokens > 0) || f.usage.total_tokens !== f.usage.prompt_tokens) fail('usage ' + JSON.stringify(f.usage));
f.data.forEach((d, i) => unit(d.embedding, `openai float ${i}`));
const b = await client.embeddings.create({ model: 'gpt2', input: texts });
b.data.forEach((d, i) => same(d.embedding, f.data[i].embedding, `openai base64 ${i}`));
const one = await client.embeddings.create({ model: 'gpt2', input: texts[1] });
same(one.data[0].embedding, f.data[1].embedding, 'openai one text alone');

// The AI SDK: embed (one) and embedMany (several) through openai.embedding.
const openai = createOpenAI({ baseURL, apiKey });
const e1 = await embed({ model: openai.embedding('gpt2'), value: texts[0], maxRetries: 0 });
same(e1.embedding, f.data[0].embedding, 'ai embed');
const em = await embedMany({ model: openai.embedding('gpt2'), values: texts, maxRetries: 0 });
em.embeddings.forEach((v, i) => same(v, f.data[i].embedding, `ai embedMany ${i}`));

// LangChain: embedQuery and embedDocuments.
const lc = new OpenAIEmbeddings({ model: 'gpt2', apiKey, configuration: { baseURL }, maxRetries: 0 });
same(await lc.embedQuery(texts[2]), f.data[2].embedding, 'langchain embedQuery');
(await lc.embedDocuments(texts)).forEach((v, i) => same(v, f.data[i].embedding, `langchain embedDocuments ${i}`));

// A refusal reaches the client as its error, naming the field.
try {
  await client.embeddings.create({ model: 'gpt2', input: 'x', dimensions: 8, encoding_format: 'float' });
  fail('dimensions 8 was accepted');
} catch (e) {
  if (e.status !== 400 || e.param !== 'dimensions') fail('dimensions 8: ' + e);
}
console.log('embeddings clients: ok');
