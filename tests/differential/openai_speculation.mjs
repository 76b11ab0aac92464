#!/usr/bin/env node
// tests/differential/openai_speculation.mjs BASE_URL_OFF BASE_URL_ON DRAFTER:
// speculative decoding through the official OpenAI client for Node. Two
// servers on one checkpoint: OFF with speculation off, ON with it on
// (DRAFTER: "lookup" or "draft_model", the drafter ON uses by default).
// Every call gives the same answer on both: chat and completions, streamed
// and whole, greedy and seeded, with logprobs; on ON, OpenAI's prediction
// field (Predicted Outputs) equal to OFF's answer is accepted token for
// token (usage.completion_tokens_details.accepted_prediction_tokens) and
// a wrong prediction changes nothing; ON's /metrics show its drafter and
// the prediction drafting. Exit 77 (skipped) when the package is missing.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let OpenAI;
try {
  OpenAI = require('openai');
} catch (e) {
  console.error('SKIP: the npm package openai is not installed (cd tests/differential && npm ci): ' + e.message);
  process.exit(77);
}
const [offURL, onURL, drafter] = process.argv.slice(2);
const fail = (msg) => { console.error('FAIL: ' + msg); process.exit(1); };
const off = new OpenAI({ baseURL: offURL, apiKey: 'test-key-123' });
const on = new OpenAI({ baseURL: onURL, apiKey: 'test-key-123' });
const model = 'gpt2d-tiny';

// The parts of an answer that must not change: usage without its timings,
// prediction counts and cached prompt tokens (the prefix cache has what
// came before, speculation or not).
function essence(d) {
  const u = { ...d.usage };
  delete u.timings;
  delete u.completion_tokens_details;
  delete u.prompt_tokens_details;
  return JSON.stringify({ choices: d.choices, usage: u });
}

async function streamed(client, body) {
  const s = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, lps = [];
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      text += c.delta?.content ?? '';
      if (c.logprobs?.content) lps.push(...c.logprobs.content);
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, lps: JSON.stringify(lps), tokens: usage?.completion_tokens };
}

const quote = 'And God said, Let there be light: and there was light. And God saw the light, that it was good: ' +
  'and God divided the light from the darkness.';
const chats = [
  { messages: [{ role: 'user', content: 'Say this again: ' + quote }], temperature: 0, max_tokens: 60 },
  { messages: [{ role: 'user', content: 'Tell me about the sea.' }], temperature: 0.8, seed: 7, max_tokens: 40, logprobs: true, top_logprobs: 3 },
  { messages: [{ role: 'system', content: 'Answer briefly.' }, { role: 'user', content: 'Who made the light?' }], temperature: 1.0, seed: 3, top_p: 0.9, max_tokens: 48 },
];
let predictionAccepted = 0;
for (const [i, body] of chats.entries()) {
  const a = await off.chat.completions.create({ model, ...body });
  const b = await on.chat.completions.create({ model, ...body });
  if (essence(a) !== essence(b)) fail(`chat ${i}: the answers differ:\n${essence(a)}\n${essence(b)}`);
  const sa = await streamed(off, { model, ...body }), sb = await streamed(on, { model, ...body });
  if (JSON.stringify(sa) !== JSON.stringify(sb)) fail(`chat ${i} streamed: the answers differ`);
  if (sa.text !== a.choices[0].message.content) fail(`chat ${i}: streamed and whole differ`);
  // The answer as its own prediction: every drafted token is accepted.
  const content = a.choices[0].message.content;
  const p = await on.chat.completions.create({ model, ...body, prediction: { type: 'content', content } });
  if (essence(p) !== essence(a)) fail(`chat ${i} with a prediction: the answer changed`);
  const det = p.usage.completion_tokens_details;
  if (!det || det.rejected_prediction_tokens === undefined) fail(`chat ${i}: no completion_tokens_details`);
  predictionAccepted += det.accepted_prediction_tokens;
  if (a.usage.completion_tokens > 4 && det.accepted_prediction_tokens === 0)
    fail(`chat ${i}: a prediction equal to the answer had none of its tokens accepted`);
  // A wrong prediction (parts, as OpenAI allows) changes nothing.
  const w = await on.chat.completions.create({
    model, ...body,
    prediction: { type: 'content', content: [{ type: 'text', text: 'Nothing like ' }, { type: 'text', text: 'the answer at all.' }] },
  });
  if (essence(w) !== essence(a)) fail(`chat ${i} with a wrong prediction: the answer changed`);
  const ps = await streamed(on, { model, ...body, prediction: { type: 'content', content } });
  if (JSON.stringify(ps) !== JSON.stringify(sa)) fail(`chat ${i} streamed with a prediction: the answer changed`);
}
// The legacy completions route through the client, with logprobs and echo.
const cbody = { model, prompt: quote + ' ' + quote.slice(0, 60), max_tokens: 40, temperature: 0, logprobs: 2, echo: true };
const ca = await off.completions.create(cbody), cb = await on.completions.create(cbody);
if (essence(ca) !== essence(cb)) fail('completions: the answers differ');
// What ON counted.
const page = await (await fetch(onURL.replace(/\/v1$/, '') + '/metrics')).text();
const count = (name, d) => Number((page.match(new RegExp(`^${name}\\{drafter="${d}"\\} (\\d+)$`, 'm')) || [])[1] ?? NaN);
for (const d of [drafter, 'prediction']) {
  const drafted = count('gpt2d_spec_drafted_tokens_total', d), accepted = count('gpt2d_spec_accepted_tokens_total', d);
  if (!(drafted > 0 && accepted > 0 && accepted <= drafted)) fail(`metrics: drafter ${d} drafted ${drafted}, accepted ${accepted}`);
}
console.log(`openai client: same answers with speculation (${drafter}) on and off; predictions accepted ${predictionAccepted} tokens`);
