#!/usr/bin/env node
// tests/differential/openai_responses.mjs BASE_URL [API_KEY]: POST /v1/responses
// through the clients that send it by default: the official OpenAI client
// for Node (responses.create streamed and not, responses.stream, retrieve,
// inputItems.list, delete), the Vercel AI SDK's default model openai(model)
// (generateText, streamText) and LangChain's ChatOpenAI with
// useResponsesApi. The stream's events are checked against fixtures written
// from the API reference (the order, and each event's fields); the same
// seed gives the same text here as on /v1/chat/completions for the same
// conversation, a previous_response_id's conversation included. The model
// is random, so the clients are compared with each other and with chat.
// Exit 77 (skipped) when the packages are not installed.
import http from 'node:http';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let OpenAI, createOpenAI, generateText, streamText, ChatOpenAI;
try {
  OpenAI = require('openai');
  ({ createOpenAI } = require('@ai-sdk/openai'));
  ({ generateText, streamText } = require('ai'));
  ({ ChatOpenAI } = require('@langchain/openai'));
} catch (e) {
  console.error('SKIP: npm packages openai / ai / @ai-sdk/openai / @langchain/openai are not installed (cd tests/differential && npm ci): ' + e.message);
  process.exit(77);
}
const target = new URL(process.argv[2]);
const apiKey = process.argv[3] || 'test-key-123';
// Every client talks to gpt2d through a recording proxy on loopback, so the
// test sees what each sends on the wire (method, path, body), not only what
// it makes of the answers.
const seen = [];
const proxy = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    seen.push({ method: req.method, path: req.url, body: body.length ? JSON.parse(body) : null });
    const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers }, (ur) => {
      res.writeHead(ur.statusCode, ur.headers);
      ur.pipe(res);
    });
    up.on('error', (e) => { res.writeHead(502); res.end(String(e)); });
    up.end(body);
  });
});
await new Promise((resolve) => proxy.listen(0, '127.0.0.1', resolve));
const baseURL = `http://127.0.0.1:${proxy.address().port}${target.pathname}`;
// The requests a client sent since the last call.
const sent = () => seen.splice(0, seen.length);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const fail = (msg) => { console.error('FAIL: ' + msg); process.exit(1); };
const same = (a, b, what) => { if (a !== b) fail(`${what}: ${JSON.stringify(a)} != ${JSON.stringify(b)}`); };

// ---- Fixtures, from the API reference (the response object, the streaming
// events): the fields each carries, and the order of a text response's.
const RESPONSE_FIELDS = ['id', 'object', 'created_at', 'status', 'error', 'incomplete_details', 'instructions',
  'max_output_tokens', 'model', 'output', 'parallel_tool_calls', 'previous_response_id', 'reasoning', 'store',
  'temperature', 'text', 'tool_choice', 'tools', 'top_p', 'truncation', 'usage', 'user', 'metadata'];
const PLACE = ['item_id', 'output_index', 'content_index'];
const EVENT_FIELDS = {
  'response.created': ['response'],
  'response.in_progress': ['response'],
  'response.output_item.added': ['output_index', 'item'],
  'response.content_part.added': [...PLACE, 'part'],
  'response.output_text.delta': [...PLACE, 'delta'],
  'response.output_text.done': [...PLACE, 'text'],
  'response.content_part.done': [...PLACE, 'part'],
  'response.output_item.done': ['output_index', 'item'],
  'response.completed': ['response'],
  'response.incomplete': ['response'],
};
const ORDER = /^response\.created response\.in_progress response\.output_item\.added response\.content_part\.added( response\.output_text\.delta)* response\.output_text\.done response\.content_part\.done response\.output_item\.done response\.(completed|incomplete)$/;

function checkResponse(r, status) {
  for (const f of RESPONSE_FIELDS) if (!(f in r)) fail(`response lacks ${f}: ${JSON.stringify(r)}`);
  if (r.object !== 'response' || !/^resp_[0-9a-f]+$/.test(r.id)) fail('response id/object ' + JSON.stringify(r));
  if (!Number.isInteger(r.created_at) || r.model !== 'gpt2') fail('created_at/model ' + JSON.stringify(r));
  if (status && r.status !== status) fail(`status ${r.status} != ${status}`);
  if (r.status === 'in_progress') { if (r.output.length !== 0) fail('output while in progress'); return; }
  if (!['completed', 'incomplete'].includes(r.status)) fail('status ' + r.status);
  if (r.status === 'incomplete' && r.incomplete_details?.reason !== 'max_output_tokens') fail('incomplete_details ' + JSON.stringify(r.incomplete_details));
  if (r.status === 'completed' && r.incomplete_details !== null) fail('incomplete_details on a completed response');
  if (r.output.length !== 1) fail('output ' + JSON.stringify(r.output));
  const m = r.output[0];
  if (m.type !== 'message' || m.role !== 'assistant' || !/^msg_/.test(m.id) || m.status !== r.status) fail('message item ' + JSON.stringify(m));
  if (m.content.length !== 1 || m.content[0].type !== 'output_text' || typeof m.content[0].text !== 'string' ||
      !Array.isArray(m.content[0].annotations) || m.content[0].annotations.length !== 0) fail('output_text part ' + JSON.stringify(m.content));
  const u = r.usage;
  if (!(u.input_tokens > 0) || u.total_tokens !== u.input_tokens + u.output_tokens ||
      !Number.isInteger(u.input_tokens_details?.cached_tokens) || u.output_tokens_details?.reasoning_tokens !== 0) fail('usage ' + JSON.stringify(u));
}

// ---- The OpenAI client: not streamed.
const instructions = 'You are a helpful assistant.';
const question = 'Name three colours.';
const base = { model: 'gpt2', instructions, input: question, max_output_tokens: 8, temperature: 0, ignore_eos: true };
const r = await client.responses.create(base);
checkResponse(r, 'incomplete'); // ignore_eos: it runs to max_output_tokens
const oaSent = sent();
if (oaSent.length !== 1 || oaSent[0].method !== 'POST' || !oaSent[0].path.endsWith('/v1/responses') || oaSent[0].body.input !== question) fail('responses.create sent ' + JSON.stringify(oaSent));
same(r.usage.output_tokens, 8, 'output_tokens');
same(r.output_text, r.output[0].content[0].text, 'output_text (the SDK\'s)');
same(r.instructions, instructions, 'instructions echoed');

// Streamed: the events in the reference's order, sequence_number 0, 1, ...,
// the deltas joined = the done text = the final response's = the whole one.
const events = [];
for await (const ev of await client.responses.create({ ...base, stream: true })) events.push(ev);
same(events.map((e) => e.type).join(' ').match(ORDER) !== null, true, 'event order ' + events.map((e) => e.type).join(' '));
events.forEach((e, i) => {
  same(e.sequence_number, i, `sequence_number of event ${i} (${e.type})`);
  for (const f of EVENT_FIELDS[e.type]) if (!(f in e)) fail(`${e.type} lacks ${f}: ${JSON.stringify(e)}`);
  if (PLACE.every((f) => f in e) && (e.output_index !== 0 || e.content_index !== 0)) fail('place ' + JSON.stringify(e));
});
checkResponse(events[0].response, 'in_progress');
checkResponse(events[1].response, 'in_progress');
const last = events[events.length - 1];
checkResponse(last.response, 'incomplete');
const itemId = events[2].item.id;
for (const e of events.slice(3, -1)) same(e.item_id ?? e.item.id, itemId, `item id in ${e.type}`);
const deltas = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
same(deltas, events.find((e) => e.type === 'response.output_text.done').text, 'deltas vs output_text.done');
same(deltas, last.response.output[0].content[0].text, 'deltas vs the final response');
same(deltas, r.output_text, 'streamed vs not streamed');
same(last.response.id, events[0].response.id, 'one id through the stream');

// Logprobs (include): chat's entries, the very ones chat gives for the same
// conversation; streamed, the deltas' entries joined are the done event's.
const withLp = { ...base, include: ['message.output_text.logprobs'], top_logprobs: 2 };
const lr = await client.responses.create(withLp);
const lpr = lr.output[0].content[0].logprobs;
same(lpr.length, 8, 'logprobs entries');
const lchat = await client.chat.completions.create({ model: 'gpt2', messages: [{ role: 'system', content: instructions }, { role: 'user', content: question }], max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: true, top_logprobs: 2 });
same(JSON.stringify(lpr), JSON.stringify(lchat.choices[0].logprobs.content), 'logprobs vs chat');
const lpEvents = [];
for await (const ev of await client.responses.create({ ...withLp, stream: true })) lpEvents.push(ev);
const lpDeltas = lpEvents.filter((e) => e.type === 'response.output_text.delta').flatMap((e) => e.logprobs);
const lpDone = lpEvents.find((e) => e.type === 'response.output_text.done').logprobs;
same(JSON.stringify(lpDone), JSON.stringify(lpr), 'streamed logprobs vs not');
same(JSON.stringify(lpDeltas), JSON.stringify(lpr), 'the deltas\' logprobs');

// responses.stream: the SDK's own accumulation of the events.
const helper = client.responses.stream({ ...base });
let helperDeltas = '';
helper.on('response.output_text.delta', (e) => { helperDeltas += e.delta; });
const fin = await helper.finalResponse();
// (the SDK keeps its own snapshot of the events; it takes the final
// response object only from response.completed, and adds no output_text)
same(fin.output[0].content[0].text, r.output_text, 'responses.stream finalResponse');
same(helperDeltas, r.output_text, 'responses.stream deltas');

// Stored: retrieve, input items, a continuation, delete.
const got = await client.responses.retrieve(r.id);
same(JSON.stringify(got.output), JSON.stringify(r.output), 'retrieve');
const items = await client.responses.inputItems.list(r.id);
same(items.data.length, 1, 'input items');
same(items.data[0].content[0].text, question, 'input item text');

// Same seed, same output as chat for the same conversation (sampled, not
// greedy, so that the seed matters).
const seeded = { seed: 1234, temperature: 1, top_p: 0.95 };
const viaChat = async (messages, n) => (await client.chat.completions.create({ model: 'gpt2', messages, max_tokens: n, ...seeded, ignore_eos: true })).choices[0].message.content;
const r1 = await client.responses.create({ model: 'gpt2', instructions, input: question, max_output_tokens: 12, ...seeded, ignore_eos: true });
const c1 = await viaChat([{ role: 'system', content: instructions }, { role: 'user', content: question }], 12);
same(r1.output_text, c1, 'responses vs chat, same seed');
const again = await client.responses.create({ model: 'gpt2', instructions, input: question, max_output_tokens: 12, ...seeded, ignore_eos: true });
same(again.output_text, r1.output_text, 'the same seed twice');
// previous_response_id continues the conversation (not its instructions,
// which are sent again), and the prefix cache holds the previous prompt.
const r2 = await client.responses.create({ model: 'gpt2', previous_response_id: r1.id, instructions, input: [{ role: 'user', content: [{ type: 'input_text', text: 'And three more?' }] }], max_output_tokens: 6, ...seeded, ignore_eos: true });
const c2 = await viaChat([{ role: 'system', content: instructions }, { role: 'user', content: question }, { role: 'assistant', content: r1.output_text }, { role: 'user', content: 'And three more?' }], 6);
same(r2.output_text, c2, 'previous_response_id vs chat with the whole conversation');
same(r2.previous_response_id, r1.id, 'previous_response_id echoed');
if (!(r2.usage.input_tokens_details.cached_tokens > 0)) fail('no cached_tokens on a continuation: ' + JSON.stringify(r2.usage));

await client.responses.del(r1.id);
for (const call of [() => client.responses.retrieve(r1.id),
  () => client.responses.create({ model: 'gpt2', previous_response_id: r1.id, input: 'x', max_output_tokens: 1 })]) {
  try {
    await call();
    fail('a deleted response was found');
  } catch (e) {
    if (e.status !== 404) fail('deleted response: ' + e.status + ' ' + e.message);
  }
}
// A refusal in the API's shape, naming the field.
try {
  await client.responses.create({ model: 'gpt2', input: 'x', tools: [{ type: 'web_search_preview' }] });
  fail('a web_search_preview tool accepted');
} catch (e) {
  if (e.status !== 400 || e.param !== 'tools') fail('tools error ' + e.status + ' ' + e.param);
}

sent();
// ---- The AI SDK's default model, openai(model): the Responses API. Its
// requests carry no ignore_eos (nor seed), so greedy text is compared with
// the OpenAI client's for the same input.
const greedy = async (input, n) => (await client.responses.create({ model: 'gpt2', input, max_output_tokens: n, temperature: 0 }));
const openai = createOpenAI({ baseURL, apiKey });
const g = await generateText({ model: openai('gpt2'), system: instructions, prompt: question, maxOutputTokens: 8, temperature: 0, maxRetries: 0 });
const ref = await greedy([{ role: 'system', content: instructions }, { role: 'user', content: question }], 8);
same(g.text, ref.output_text, 'AI SDK generateText');
if (!/^resp_/.test(g.response.id)) fail('AI SDK response id ' + g.response.id);
same(g.usage.inputTokens, ref.usage.input_tokens, 'AI SDK usage.inputTokens');
same(g.usage.outputTokens, ref.usage.output_tokens, 'AI SDK usage.outputTokens');
same(g.finishReason, ref.status === 'completed' ? 'stop' : 'length', 'AI SDK finishReason');
// On the wire: POST /v1/responses with the input as message items.
const aiSent = sent().filter((q) => q.path.endsWith('/responses'));
same(aiSent.length, 2, 'the AI SDK\'s generateText requests to /v1/responses (and the reference\'s)');
same(JSON.stringify(aiSent[0].body.input), JSON.stringify([{ role: 'system', content: instructions }, { role: 'user', content: [{ type: 'input_text', text: question }] }]), 'the AI SDK\'s input items');
const st = streamText({ model: openai('gpt2'), system: instructions, prompt: question, maxOutputTokens: 8, temperature: 0, maxRetries: 0, onError: ({ error }) => fail('streamText ' + error) });
let stText = '';
for await (const piece of st.textStream) stText += piece;
same(stText, g.text, 'AI SDK streamText');
same((await st.usage).outputTokens, ref.usage.output_tokens, 'AI SDK streamText usage');

const stSent = sent();
if (stSent.length !== 1 || stSent[0].method !== 'POST' || !stSent[0].path.endsWith('/v1/responses') || stSent[0].body.stream !== true) fail('the AI SDK\'s streamText sent ' + JSON.stringify(stSent));

// A second turn from the first's response.messages: the AI SDK sends its own
// earlier reply as an item_reference to the stored message, which gpt2d
// resolves: the same text as sending the reply itself.
const turn1 = await generateText({ model: openai('gpt2'), prompt: question, maxOutputTokens: 6, temperature: 0, maxRetries: 0 });
sent();
const follow = 'And three more?';
const turn2 = await generateText({ model: openai('gpt2'), messages: [{ role: 'user', content: question }, ...turn1.response.messages, { role: 'user', content: follow }], maxOutputTokens: 6, temperature: 0, maxRetries: 0 });
const t2Input = sent()[0].body.input;
same(JSON.stringify(t2Input[1]), JSON.stringify({ type: 'item_reference', id: turn1.response.body?.output?.[0]?.id ?? t2Input[1].id }), 'the AI SDK\'s reference to its reply');
if (!/^msg_/.test(t2Input[1].id)) fail('the AI SDK\'s second turn: ' + JSON.stringify(t2Input));
const ref2 = await greedy([{ role: 'user', content: question }, { role: 'assistant', content: turn1.text }, { role: 'user', content: follow }], 6);
same(turn2.text, ref2.output_text, 'the AI SDK\'s second turn (an item_reference) vs the whole conversation');
sent();

// ---- LangChain's ChatOpenAI with useResponsesApi.
const lc = new ChatOpenAI({ model: 'gpt2', apiKey, configuration: { baseURL }, useResponsesApi: true, temperature: 0, maxTokens: 8, maxRetries: 0 });
const lcRef = await greedy([{ role: 'user', content: question }], 8);
const ai = await lc.invoke(question);
const aiText = typeof ai.content === 'string' ? ai.content : ai.content.map((p) => p.text ?? '').join('');
same(aiText, lcRef.output_text, 'LangChain invoke');
let lcText = '';
for await (const piece of await lc.stream(question)) lcText += typeof piece.content === 'string' ? piece.content : piece.content.map((p) => p.text ?? '').join('');
same(lcText, lcRef.output_text, 'LangChain stream');
const lcSent = sent().map((q) => `${q.method} ${q.path} ${q.body?.stream ? 'stream' : 'whole'}`);
same(lcSent.join(', '), 'POST /v1/responses whole, POST /v1/responses whole, POST /v1/responses stream', 'LangChain\'s requests (the reference first)');
proxy.close();

console.log(`responses clients: ok (${events.length} events; reply ${JSON.stringify(r.output_text)}, seeded ${JSON.stringify(r1.output_text)}, AI SDK ${JSON.stringify(g.text)}, LangChain ${JSON.stringify(aiText)})`);
