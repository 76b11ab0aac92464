#!/usr/bin/env node
// tests/differential/openai_tools.mjs BASE_URL [API_KEY]: function tools on
// /v1/chat/completions through the clients agent code is built on: the
// OpenAI client for Node (chat.completions.create with tools and
// tool_choice required or a named function, whole and streamed: the
// streamed delta.tool_calls put together give the whole answer's call), a
// follow-up turn carrying the call and its result (role tool), the AI SDK's
// generateText with tools and toolChoice 'required' (on openai.chat), and
// LangChain's bindTools and withStructuredOutput({method:
// 'functionCalling'}); then the Responses API (a function_call item whole
// and streamed, a follow-up with its function_call_output, input_items
// listing both as OpenAI does, the AI SDK's default model). Every call's
// arguments are validated by ajv against its tool's parameters. The model
// is random: the grammar, not the model, makes the calls valid. Exit 77 (skipped) when the packages are missing.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let OpenAI, createOpenAI, generateText, tool, jsonSchema, ChatOpenAI, z, Ajv2020;
try {
  OpenAI = require('openai');
  ({ createOpenAI } = require('@ai-sdk/openai'));
  ({ generateText, tool, jsonSchema } = require('ai'));
  ({ ChatOpenAI } = require('@langchain/openai'));
  ({ z } = require('zod'));
  Ajv2020 = require('ajv/dist/2020').default;
} catch (e) {
  console.error('SKIP: npm packages openai / ai / @ai-sdk/openai / @langchain/openai / zod / ajv are not installed (cd tests/differential && npm ci): ' + e.message);
  process.exit(77);
}
const baseURL = process.argv[2];
const apiKey = process.argv[3] || 'test-key-123';
const fail = (msg) => { console.error('FAIL: ' + msg); process.exit(1); };
const ajv = new Ajv2020({ strict: false });

const weather = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 20 }, unit: { enum: ['c', 'f'] } },
  required: ['city', 'unit'], additionalProperties: false,
};
const add = {
  type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } },
  required: ['a', 'b'], additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters: weather } },
  { type: 'function', function: { name: 'add', description: 'Adds two integers', parameters: add } },
];
const schemaOf = { get_weather: weather, add };
const checkCall = (call, what, name) => {
  if (!call || call.type !== 'function' || !/^call_[0-9a-f]{24}$/.test(call.id)) fail(`${what}: the call ${JSON.stringify(call)}`);
  if (name && call.function.name !== name) fail(`${what}: called ${call.function.name}, not ${name}`);
  const s = schemaOf[call.function.name];
  if (!s) fail(`${what}: no tool ${call.function.name}`);
  let args;
  try { args = JSON.parse(call.function.arguments); } catch (e) { fail(`${what}: arguments are not JSON: ${call.function.arguments}`); }
  if (!ajv.validate(s, args)) fail(`${what}: ${call.function.arguments}: ${ajv.errorsText()}`);
  return args;
};
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

// Whole answers: required (either tool) and a named function.
for (const seed of [1, 2, 3]) {
  const r = await client.chat.completions.create({ model: 'gpt2', messages, tools, tool_choice: 'required', seed, max_tokens: 200 });
  const c = r.choices[0];
  if (c.finish_reason !== 'tool_calls' || c.message.content !== null || c.message.tool_calls.length !== 1)
    fail('required: ' + JSON.stringify(c));
  checkCall(c.message.tool_calls[0], `required seed ${seed}`);
}
const named = await client.chat.completions.create({
  model: 'gpt2', messages, tools, seed: 4, max_tokens: 200,
  tool_choice: { type: 'function', function: { name: 'add' } },
});
const call = named.choices[0].message.tool_calls[0];
checkCall(call, 'named add', 'add');

// Streamed: the deltas put together are the same call as the whole answer
// (the same seed; the id is the response's own).
const body = { model: 'gpt2', messages, tools, tool_choice: 'required', seed: 1, max_tokens: 200 };
const whole = (await client.chat.completions.create(body)).choices[0].message.tool_calls[0];
let id = null, name = '', args = '', finish = null, role = null;
for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) {
  if (!Array.isArray(chunk.choices)) fail("a chunk without choices: " + JSON.stringify(chunk));
  const d = chunk.choices[0]?.delta ?? {};
  if (d.role) role = d.role;
  for (const t of d.tool_calls ?? []) {
    if (t.index !== 0) fail('a second call index ' + t.index);
    if (t.id) { if (id) fail('the id came twice'); id = t.id; }
    if (t.function?.name) name += t.function.name;
    if (t.function?.arguments) args += t.function.arguments;
  }
  if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
}
if (role !== 'assistant' || finish !== 'tool_calls') fail(`stream: role ${role}, finish ${finish}`);
if (!/^call_[0-9a-f]{24}$/.test(id) || name !== whole.function.name || args !== whole.function.arguments)
  fail(`stream ${JSON.stringify({ id, name, args })} != whole ${JSON.stringify(whole)}`);

// The next turn: the call and its result go back; the server reads both.
const next = await client.chat.completions.create({
  model: 'gpt2', max_tokens: 8, seed: 5, tools,
  messages: [...messages, named.choices[0].message, { role: 'tool', tool_call_id: call.id, content: '{"result": 7}' }],
});
if (typeof next.choices[0].message.content !== 'string') fail('the turn after a tool result: ' + JSON.stringify(next.choices[0]));

// The AI SDK: generateText with tools and toolChoice 'required' on the chat model.
const openai = createOpenAI({ baseURL, apiKey });
const g = await generateText({
  model: openai.chat('gpt2'), prompt: 'What is the weather in Paris?', maxRetries: 0, seed: 6,
  toolChoice: 'required',
  tools: { get_weather: tool({ description: 'The weather in a city', inputSchema: jsonSchema(weather) }) },
});
if (g.toolCalls.length !== 1 || g.toolCalls[0].toolName !== 'get_weather') fail('ai toolCalls ' + JSON.stringify(g.toolCalls));
if (!ajv.validate(weather, g.toolCalls[0].input)) fail('ai input ' + JSON.stringify(g.toolCalls[0].input));

// LangChain: bindTools (a named tool), and withStructuredOutput through a function call.
const llm = new ChatOpenAI({ model: 'gpt2', apiKey, maxRetries: 0, maxTokens: 200, configuration: { baseURL } });
const bound = llm.bindTools([tools[0]], { tool_choice: 'get_weather' });
const m = await bound.invoke('What is the weather in Paris?');
if (m.tool_calls?.length !== 1 || m.tool_calls[0].name !== 'get_weather') fail('langchain bindTools ' + JSON.stringify(m.tool_calls));
if (!ajv.validate(weather, m.tool_calls[0].args)) fail('langchain args ' + JSON.stringify(m.tool_calls[0].args));
const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120) });
const so = llm.withStructuredOutput(Person, { method: 'functionCalling', name: 'person' });
const p = await so.invoke('Describe a person.');
if (!Person.safeParse(p).success) fail('langchain withStructuredOutput ' + JSON.stringify(p));

// The Responses API: a function tool's call (a function_call output item),
// streamed (the arguments' delta events put together are the done event's),
// and the next turn carrying its output by previous_response_id.
const rtools = [{ type: 'function', name: 'add', description: 'Adds two integers', parameters: add, strict: true }];
const r1 = await client.responses.create({ model: 'gpt2', input: 'Add 2 and 3', tools: rtools, tool_choice: 'required', seed: 7 });
const fc = r1.output[0];
if (r1.output.length !== 1 || fc.type !== 'function_call' || fc.name !== 'add' || !/^call_/.test(fc.call_id))
  fail('responses call ' + JSON.stringify(r1.output));
if (!ajv.validate(add, JSON.parse(fc.arguments))) fail('responses arguments ' + fc.arguments);
const r2 = await client.responses.create({
  model: 'gpt2', previous_response_id: r1.id, tools: rtools, max_output_tokens: 8, seed: 8,
  input: [{ type: 'function_call_output', call_id: fc.call_id, output: '5' }],
});
if (r2.output[0]?.type !== 'message') fail('the turn after a function_call_output: ' + JSON.stringify(r2.output));
// input_items lists them as OpenAI does: the output by its call_id, and the
// call itself (sent back as the output item it was) with its name and
// arguments.
const fco = (await client.responses.inputItems.list(r2.id)).data;
if (fco.length !== 1 || fco[0].type !== 'function_call_output' || fco[0].call_id !== fc.call_id
    || fco[0].output !== '5' || fco[0].status !== 'completed' || !/^fco_/.test(fco[0].id))
  fail('input_items of a function_call_output: ' + JSON.stringify(fco));
const r2b = await client.responses.create({
  model: 'gpt2', tools: rtools, max_output_tokens: 8, seed: 8,
  input: [{ role: 'user', content: 'Add 2 and 3' }, fc, { type: 'function_call_output', call_id: fc.call_id, output: '5' }],
});
const listed = (await client.responses.inputItems.list(r2b.id, { order: 'asc' })).data;
const lc = listed[1];
if (listed.length !== 3 || lc.type !== 'function_call' || lc.call_id !== fc.call_id || lc.name !== fc.name
    || lc.arguments !== fc.arguments || lc.status !== 'completed' || !/^fc_/.test(lc.id))
  fail('input_items of a function_call: ' + JSON.stringify(listed));
let deltas = '', done = null, added = null;
for await (const ev of await client.responses.create({ model: 'gpt2', input: 'Add 2 and 3', tools: rtools, tool_choice: { type: 'function', name: 'add' }, seed: 7, stream: true })) {
  if (ev.type === 'response.output_item.added') added = ev.item;
  if (ev.type === 'response.function_call_arguments.delta') deltas += ev.delta;
  if (ev.type === 'response.function_call_arguments.done') done = ev.arguments;
}
if (added?.type !== 'function_call' || added.name !== 'add' || done !== deltas || done !== fc.arguments)
  fail(`responses stream: ${JSON.stringify(added)} ${deltas} ${done}`);
// The AI SDK's default model speaks the Responses API.
const g2 = await generateText({
  model: openai('gpt2'), prompt: 'Add 2 and 3', maxRetries: 0, seed: 9, toolChoice: 'required',
  tools: { add: tool({ description: 'Adds two integers', inputSchema: jsonSchema(add) }) },
});
if (g2.toolCalls.length !== 1 || g2.toolCalls[0].toolName !== 'add' || !ajv.validate(add, g2.toolCalls[0].input))
  fail('ai (responses) toolCalls ' + JSON.stringify(g2.toolCalls));

// Refusals reach the client as its errors.
try {
  await client.chat.completions.create({ model: 'gpt2', messages, tools: [{ type: 'web_search' }] });
  fail('a web_search tool was accepted');
} catch (e) {
  if (e.status !== 400 || e.param !== 'tools') fail('web_search: ' + e);
}
console.log('tool clients: ok');
