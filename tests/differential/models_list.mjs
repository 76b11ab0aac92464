#!/usr/bin/env node
// tests/differential/models_list.mjs BASE_URL: what the OpenAI client for
// Node makes of /v1/models, models.list() and models.retrieve() of the
// first id, printed as one JSON line {"list": [...], "retrieved": {...}}
// for the caller to compare (tests/test_api.sh, case model_labels). Exit 77
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
const client = new OpenAI({ baseURL: process.argv[2], apiKey: 'none' });
const list = [];
for await (const m of client.models.list()) list.push(m);
const retrieved = await client.models.retrieve(list[0].id);
console.log(JSON.stringify({ list, retrieved }));
