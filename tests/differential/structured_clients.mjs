#!/usr/bin/env node
// tests/differential/structured_clients.mjs BASE_URL: structured outputs
// through the real clients: the OpenAI Node SDK's chat.completions.parse
// with zodResponseFormat, the AI SDK's generateObject with a chat model, and
// LangChain's withStructuredOutput (method jsonSchema), each with a zod
// schema; then every schema of the corpus (CORPUS_DIR, tests/structured)
// through each of the three clients as plain JSON Schema (the OpenAI SDK's
// response_format, the AI SDK's jsonSchema(), LangChain's schema object),
// every answer validated by ajv. The corpus bounds every string and array
// but tree.json's depth: its answer may be cut by the token limit (then
// "length", and not validated); every other answer completes. Exit 77
// (skipped) when the packages are not installed.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

let OpenAI, zodResponseFormat, z, generateObject, jsonSchema, createOpenAI, ChatOpenAI, Ajv2020, addFormats;
try {
  OpenAI = require('openai');
  ({ zodResponseFormat } = require('openai/helpers/zod'));
  ({ z } = require('zod'));
  ({ generateObject, jsonSchema } = await import('ai'));
  Ajv2020 = require('ajv/dist/2020').default;
  addFormats = require('ajv-formats').default;
  ({ createOpenAI } = await import('@ai-sdk/openai'));
  ({ ChatOpenAI } = require('@langchain/openai'));
} catch (e) {
  console.error('SKIP: npm packages openai / zod / ai / @ai-sdk/openai / @langchain/openai are not installed (cd tests/differential && npm ci): ' + e.message);
  process.exit(77);
}
const baseURL = process.argv[2];
const corpusDir = process.argv[3];
const apiKey = process.argv[4] || 'test-key-123';
const fail = (msg) => { console.error('FAIL: ' + msg); process.exit(1); };

const Person = z.object({
  name: z.string().max(10),
  age: z.number().int().min(0).max(120),
  role: z.enum(['admin', 'user', 'guest']),
  tags: z.array(z.string().max(4)).max(2),
  nick: z.string().max(6).nullable(),
});
const messages = [{ role: 'user', content: 'Describe a person as JSON.' }];

// OpenAI SDK: parse() sends response_format json_schema (strict) and parses
// the content with the zod schema.
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
for (const temperature of [0, 1]) {
  for (const seed of [1, 2]) {
    const r = await client.beta.chat.completions.parse({
      model: 'gpt2', messages, temperature, seed, max_tokens: 200,
      response_format: zodResponseFormat(Person, 'person'),
    });
    const c = r.choices[0];
    if (c.finish_reason !== 'stop') fail(`openai parse: finish_reason ${c.finish_reason}: ${c.message.content}`);
    const p = c.message.parsed;
    if (!p || Person.safeParse(p).success !== true) fail('openai parse: ' + c.message.content);
  }
}
console.log('openai chat.completions.parse + zodResponseFormat: ok');

// The AI SDK: generateObject with the provider's chat model.
const provider = createOpenAI({ baseURL, apiKey });
for (const seed of [1, 2]) {
  const { object, finishReason } = await generateObject({
    model: provider.chat('gpt2'), schema: Person, prompt: 'Describe a person.',
    temperature: 1, seed, maxOutputTokens: 200, maxRetries: 0,
  });
  if (Person.safeParse(object).success !== true) fail('ai generateObject: ' + JSON.stringify(object));
  if (finishReason !== 'stop') fail('ai generateObject: finishReason ' + finishReason);
}
console.log('ai generateObject (chat model): ok');

// LangChain: withStructuredOutput, method jsonSchema.
const llm = new ChatOpenAI({ model: 'gpt2', apiKey, configuration: { baseURL }, temperature: 0, maxTokens: 200, maxRetries: 0 });
const structured = llm.withStructuredOutput(Person, { name: 'person', method: 'jsonSchema' });
const out = await structured.invoke('Describe a person.');
if (Person.safeParse(out).success !== true) fail('langchain withStructuredOutput: ' + JSON.stringify(out));
console.log('langchain withStructuredOutput (jsonSchema): ok');

// Every schema of the corpus through the three clients, as JSON Schema.
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
const UNBOUNDED = new Set(['tree.json']);
let valid = 0, cut = 0;
const check = (client, name, schema, value, finish) => {
  if (finish === 'length' && UNBOUNDED.has(name)) { cut++; return; }
  if (finish !== 'stop') fail(`${client} ${name}: finish ${finish}: ${JSON.stringify(value)}`);
  const validate = ajv.compile(schema);
  if (!validate(value)) fail(`${client} ${name}: ${JSON.stringify(value)} is invalid: ${ajv.errorsText(validate.errors)}`);
  valid++;
};
const lc = new ChatOpenAI({ model: 'gpt2', apiKey, configuration: { baseURL }, temperature: 1, maxTokens: 300, maxRetries: 0, modelKwargs: { seed: 5 } });
for (const name of readdirSync(corpusDir).filter((f) => f.endsWith('.json')).sort()) {
  const schema = JSON.parse(readFileSync(join(corpusDir, name), 'utf8'));
  const id = name.slice(0, -5);
  // The OpenAI SDK: response_format json_schema, strict.
  const r = await client.chat.completions.create({
    model: 'gpt2', messages, temperature: 1, seed: 3, max_tokens: 300,
    response_format: { type: 'json_schema', json_schema: { name: id, schema, strict: true } },
  });
  const c = r.choices[0];
  check('openai', name, schema, c.finish_reason === 'stop' ? JSON.parse(c.message.content) : c.message.content, c.finish_reason);
  // The AI SDK: generateObject with jsonSchema() on the chat model.
  try {
    const { object, finishReason } = await generateObject({
      model: provider.chat('gpt2'), schema: jsonSchema(schema), schemaName: id, prompt: 'Answer in JSON.',
      temperature: 1, seed: 4, maxOutputTokens: 300, maxRetries: 0,
    });
    check('ai', name, schema, object, finishReason);
  } catch (e) {
    // A cut answer does not parse: the SDK throws with the reason.
    if (!(UNBOUNDED.has(name) && e.finishReason === 'length')) fail(`ai ${name}: ${e.message}`);
    cut++;
  }
  // LangChain: withStructuredOutput with the schema object, its raw message kept.
  const so = lc.withStructuredOutput(schema, { name: id, method: 'jsonSchema', includeRaw: true });
  let got;
  try {
    got = await so.invoke('Answer in JSON.');
  } catch (e) {
    // A cut answer: the OpenAI SDK under LangChain throws LengthFinishReasonError.
    if (!(UNBOUNDED.has(name) && e.constructor?.name === 'LengthFinishReasonError')) fail(`langchain ${name}: ${e.message}`);
    cut++;
    continue;
  }
  const finish = got.raw.response_metadata?.finish_reason;
  check('langchain', name, schema, finish === 'stop' ? got.parsed : got.raw.content, finish);
}
console.log(`the corpus through the three clients: ${valid} answers valid, ${cut} of tree.json cut by the token limit`);
