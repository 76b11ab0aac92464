#!/usr/bin/env node
// tests/differential/openai_chat.mjs BASE_URL: the chat API through real
// clients: the official OpenAI client for Node (chat.completions.create with
// and without stream, with logprobs; models.retrieve and models.list) and
// LangChain's ChatOpenAI (invoke and stream). The model is random, so the
// checks compare the clients with each other and with the API's shapes.
// Exit 77 (skipped) when the packages are not installed.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let OpenAI, ChatOpenAI, HumanMessage, SystemMessage;
try {
  OpenAI = require('openai');
  ({ ChatOpenAI } = require('@langchain/openai'));
  ({ HumanMessage, SystemMessage } = require('@langchain/core/messages'));
} catch (e) {
  console.error('SKIP: npm packages openai / @langchain/openai are not installed (cd tests/differential && npm ci): ' + e.message);
  process.exit(77);
}
const baseURL = process.argv[2];
const apiKey = process.argv[3] || 'test-key-123';
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const fail = (msg) => { console.error('FAIL: ' + msg); process.exit(1); };

const messages = [
  { role: 'system', content: 'You are a helpful assistant.' },
  { role: 'user', content: 'Name three colours.' },
];
const base = { model: 'gpt2', messages, max_tokens: 8, temperature: 0, ignore_eos: true };

// Not streamed, with logprobs.
const r = await client.chat.completions.create({ ...base, logprobs: true, top_logprobs: 2 });
if (r.object !== 'chat.completion' || !r.id.startsWith('chatcmpl-')) fail('shape ' + JSON.stringify(r));
if (r.model !== 'gpt2') fail('model ' + r.model);
if (r.choices.length !== 1) fail('choices ' + r.choices.length);
const c = r.choices[0];
if (c.index !== 0 || c.message.role !== 'assistant' || typeof c.message.content !== 'string') fail('message ' + JSON.stringify(c));
if (!['stop', 'length'].includes(c.finish_reason)) fail('finish_reason ' + c.finish_reason);
if (!(r.usage.prompt_tokens > 10) || r.usage.total_tokens !== r.usage.prompt_tokens + r.usage.completion_tokens) fail('usage ' + JSON.stringify(r.usage));
const lp = c.logprobs && c.logprobs.content;
if (!Array.isArray(lp) || lp.length !== r.usage.completion_tokens) fail('logprobs.content ' + JSON.stringify(c.logprobs));
for (const t of lp) {
  if (typeof t.token !== 'string' || !(t.logprob <= 0) || !Array.isArray(t.bytes)) fail('logprob entry ' + JSON.stringify(t));
  if (!Array.isArray(t.top_logprobs) || t.top_logprobs.length !== 2) fail('top_logprobs ' + JSON.stringify(t));
  if (t.top_logprobs[0].logprob < t.top_logprobs[1].logprob) fail('top_logprobs order ' + JSON.stringify(t));
  if (Math.abs(t.top_logprobs[0].logprob - t.logprob) > 1e-6) fail('greedy token is not the most likely one ' + JSON.stringify(t));
}
// The reply is the tokens' text, less its leading white space and a tail of
// newlines held as the start of the stop "\n\nUser:" (the default template's trim_reply).
const joined = Buffer.concat(lp.map((t) => Buffer.from(t.bytes))).toString('utf8');
if (c.finish_reason === 'length' && joined.replace(/\n{1,2}$/, '').replace(/^\s+/, '') !== c.message.content) fail(`tokens ${JSON.stringify(joined)} vs content ${JSON.stringify(c.message.content)}`);

// Streamed: the same text, a role in the first delta, one finish, usage last.
const stream = await client.chat.completions.create({ ...base, stream: true, stream_options: { include_usage: true } });
let text = '', finishes = 0, usage = null, role = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.object !== 'chat.completion.chunk' || chunk.id !== undefined && !chunk.id.startsWith('chatcmpl-')) fail('chunk ' + JSON.stringify(chunk));
  if (chunk.choices.length === 0) { usage = chunk.usage; continue; }
  const d = chunk.choices[0].delta;
  if (d.role) role = d.role;
  if (d.content) text += d.content;
  if (chunk.choices[0].finish_reason) finishes++;
}
if (role !== 'assistant') fail('no assistant role in the deltas');
if (text !== c.message.content) fail(`streamed ${JSON.stringify(text)} != ${JSON.stringify(c.message.content)}`);
if (finishes !== 1) fail('finish chunks ' + finishes);
if (!usage || usage.completion_tokens !== r.usage.completion_tokens) fail('stream usage ' + JSON.stringify(usage));

// Errors in OpenAI's shape.
try {
  await client.chat.completions.create({ ...base, tools: [{ type: 'web_search' }] });
  fail('a web_search tool accepted');
} catch (e) {
  if (e.status !== 400 || e.param !== 'tools') fail('tools error ' + e.status + ' ' + e.param);
}

// Models.
const m = await client.models.retrieve('gpt2');
if (m.id !== 'gpt2' || m.object !== 'model') fail('models.retrieve ' + JSON.stringify(m));
try {
  await client.models.retrieve('gpt-4');
  fail('models.retrieve of another model');
} catch (e) {
  if (e.status !== 404) fail('models.retrieve error ' + e.status);
}
const list = await client.models.list();
if (!list.data.some((x) => x.id === 'gpt2')) fail('models.list ' + JSON.stringify(list.data));

// LangChain's ChatOpenAI: the same greedy reply as the OpenAI client.
const lc = new ChatOpenAI({ model: 'gpt2', apiKey, configuration: { baseURL }, temperature: 0, maxTokens: 8, maxRetries: 0, modelKwargs: { ignore_eos: true } });
const lcMessages = [new SystemMessage('You are a helpful assistant.'), new HumanMessage('Name three colours.')];
const ai = await lc.invoke(lcMessages);
if (typeof ai.content !== 'string' || ai.content !== c.message.content) fail(`langchain invoke ${JSON.stringify(ai.content)} != ${JSON.stringify(c.message.content)}`);
let lcText = '';
for await (const piece of await lc.stream(lcMessages)) lcText += piece.content;
if (lcText !== c.message.content) fail(`langchain stream ${JSON.stringify(lcText)} != ${JSON.stringify(c.message.content)}`);

console.log(`chat clients: ok (${chunks} chunks, reply ${JSON.stringify(text)})`);
