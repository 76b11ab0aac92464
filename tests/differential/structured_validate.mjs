#!/usr/bin/env node
// tests/differential/structured_validate.mjs: validates structured outputs
// with ajv (a real JSON Schema validator, draft 2020-12, with ajv-formats).
// stdin: JSON lines {"name", "schema", "text"}; every text must parse as JSON
// and validate against its schema. Prints a count; exit 1 on the first
// failure (with the case), 77 (skipped) when the packages are missing.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

const require = createRequire(import.meta.url);
let Ajv2020, addFormats;
try {
  Ajv2020 = require('ajv/dist/2020').default;
  addFormats = require('ajv-formats').default;
} catch (e) {
  console.error('SKIP: npm packages ajv / ajv-formats are not installed (cd tests/differential && npm ci): ' + e.message);
  process.exit(77);
}
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
const lines = readFileSync(0, 'utf8').split('\n').filter((l) => l.trim() !== '');
let n = 0;
for (const line of lines) {
  const c = JSON.parse(line);
  let v;
  try {
    v = JSON.parse(c.text);
  } catch (e) {
    console.error(`FAIL: ${c.name}: not JSON: ${JSON.stringify(c.text)}`);
    process.exit(1);
  }
  const validate = ajv.compile(c.schema);
  if (!validate(v)) {
    console.error(`FAIL: ${c.name}: ${JSON.stringify(c.text)}: ${ajv.errorsText(validate.errors)}`);
    process.exit(1);
  }
  n++;
}
console.log(`ajv: ${n} outputs valid`);
