#!/usr/bin/env node
// tests/differential/tiktoken_diff.mjs GPT2D VOCAB_DIR DUMP_CLASSES: gpt2d's tokenizer
// against tiktoken's "gpt2" encoding (npm tiktoken: tiktoken's Rust core
// compiled to WASM).
//
//  1. Character classes: for every Unicode scalar value, tiktoken's own regex
//     engine decides whether it is \p{L}, \p{N} or \s (an encoding whose
//     pattern is just that class and whose tokens are the 256 bytes returns
//     exactly the bytes of the matching characters); gpt2d's classes come
//     from tests/dump_classes (bpe_char_class). Every code point must agree.
//  2. Ids: fixed texts plus 20,000 seeded random strings mixing letters and
//     digits of many scripts, every kind of white space, contractions in both
//     cases, combining marks, emoji with ZWJ and skin tones, code, JSON, long
//     words and runs; `gpt2d tokenize --jsonl` must return exactly
//     encode_ordinary's ids for every one.
//  3. Special: the fixed texts and 2,000 random ones with "<|endoftext|>"
//     (and near misses of it) put in at random places; `gpt2d tokenize
//     --jsonl --special` must return exactly encode(text, 'all')'s ids, the
//     encoding the server gives its prompts.
//
// Exit 0: all agree. 1: a mismatch. 77 (meson's "skipped"): the npm packages
// are not installed, so nothing was compared; never a silent pass.
import { createRequire } from 'node:module';
import { spawnSync } from 'node:child_process';

const require = createRequire(import.meta.url);
let tiktoken;
try {
  tiktoken = require('tiktoken');
} catch (e) {
  console.error('SKIP: npm package tiktoken is not installed (cd tests/differential && npm ci)');
  process.exit(77);
}
const [gpt2d, vocabDir, dumpClasses] = process.argv.slice(2);
if (!gpt2d || !vocabDir || !dumpClasses) {
  console.error('usage: tiktoken_diff.mjs GPT2D VOCAB_DIR DUMP_CLASSES');
  process.exit(2);
}
const run = (args, input, prog = gpt2d) => {
  const r = spawnSync(prog, args, { input, maxBuffer: 1 << 30 });
  if (r.status !== 0) throw new Error(`${prog} ${args.join(' ')}: exit ${r.status}: ${r.stderr}`);
  return r.stdout;
};
let failures = 0;

// ---- 1. Character classes -------------------------------------------------
{
  const ours = run([], '', dumpClasses);
  if (ours.length !== 0x110000) throw new Error(`--classes gave ${ours.length} bytes`);
  const byteRanks = [];
  for (let b = 0; b < 256; b++) byteRanks.push(Buffer.from([b]).toString('base64') + ' ' + b);
  const classes = [['\\p{L}', 1], ['\\p{N}', 2], ['\\s', 3]];
  const counts = {};
  for (const [pat, cls] of classes) {
    const enc = new tiktoken.Tiktoken(byteRanks.join('\n'), {}, pat);
    let theirs = 0, bad = 0;
    for (let start = 0; start < 0x110000; start += 4096) {
      const cps = [];
      for (let cp = start; cp < start + 4096; cp++) if (cp < 0xd800 || cp > 0xdfff) cps.push(cp);
      const text = String.fromCodePoint(...cps);
      const got = new Set(Array.from(Buffer.from(enc.encode_ordinary(text)).toString('utf8'), (c) => c.codePointAt(0)));
      theirs += got.size;
      for (const cp of cps) {
        if (got.has(cp) !== (ours[cp] === cls)) {
          if (bad < 10) console.error(`class mismatch ${pat} U+${cp.toString(16).toUpperCase()}: tiktoken ${got.has(cp)}, gpt2d class ${ours[cp]}`);
          bad++;
        }
      }
    }
    enc.free();
    counts[pat] = theirs;
    failures += bad;
  }
  console.log(`classes: ${0x110000 - 2048} code points; tiktoken sees ${counts['\\p{L}']} letters, ${counts['\\p{N}']} numbers, ${counts['\\s']} white space; mismatches: ${failures}`);
}

// ---- 2. Ids ----------------------------------------------------------------
function mulberry32(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(20261202);
const pick = (a) => a[Math.floor(rand() * a.length)];
const cp = (...xs) => String.fromCodePoint(...xs);
const range = (lo, hi) => () => cp(lo + Math.floor(rand() * (hi - lo + 1)));

const spaces = [' ', '\t', '\n', '\r', '\v', '\f', '\u0085', '\u00a0', '\u1680', '\u2000', '\u2001', '\u2002', '\u2003', '\u2004', '\u2005', '\u2006', '\u2007', '\u2008', '\u2009', '\u200a', '\u2028', '\u2029', '\u202f', '\u205f', '\u3000', '\u180e', '\u200b', '\ufeff', '\r\n'];
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'", "''", "'x"];
const words = ['the', 'The', 'hello', 'world', 'don', 'we', 'tokenization', 'GPT', 'año', 'naïve', 'straße', 'Ελληνικά', 'русский', 'עברית', 'العربية', 'हिन्दी', 'ไทย', '日本語', '中文', '한국어', 'ひらがな', 'カタカナ', 'Ⅻ', '½', '²', '٣٤', '१२३', '௧௨', 'x̃', 'é', 'ﬁ', 'ǅ'];
const gens = [
  range(0x41, 0x5a), range(0x61, 0x7a), range(0x30, 0x39), range(0x21, 0x2f), range(0x3a, 0x40),
  range(0x5b, 0x60), range(0x7b, 0x7e), range(0xc0, 0x24f), range(0x370, 0x3ff), range(0x400, 0x4ff),
  range(0x590, 0x5ff), range(0x600, 0x6ff), range(0x900, 0x97f), range(0xe00, 0xe7f),
  range(0x3040, 0x30ff), range(0x4e00, 0x9fff), range(0xac00, 0xd7a3), range(0x300, 0x36f),
  range(0x660, 0x669), range(0x966, 0x96f), range(0x2160, 0x2188), range(0xbc, 0xbe),
  range(0x1f300, 0x1f64f), range(0x1f900, 0x1f9ff), range(0x1f3fb, 0x1f3ff),
  () => '\u200d', () => '\ufe0f', () => pick(spaces), () => pick(contractions), () => pick(words),
  range(0x1c80, 0x1c8a), range(0x10000, 0x1ffff), range(0x20000, 0x3134f), range(0xe000, 0xf8ff),
  () => { let c; do { c = Math.floor(rand() * 0x110000); } while (c >= 0xd800 && c <= 0xdfff); return cp(c); },
  () => cp(0),
];
function randomString() {
  const n = 1 + Math.floor(rand() * 24);
  let s = '';
  for (let i = 0; i < n; i++) {
    const g = pick(gens);
    let piece = g();
    if (rand() < 0.03) piece = piece.repeat(2 + Math.floor(rand() * 300)); // runs
    s += piece;
    if (rand() < 0.3) s += ' ';
  }
  return s;
}
const fixed = [
  'Hello, world!', 'Hello, my name is', ' world', 'tokenization', '日本', '<|endoftext|>',
  "don't we'll", "o'clock", 'abc123 45', 'a  b', 'a\n\nb', 'a   ', ' \n x', 'año €5 日本語',
  "I'M HE'S we've they're she'd it'll YOU'LL I'D", "'s's 's 'S ''s", 'x\u3000y x \u00a0y',
  '👩‍👩‍👧‍👦 👍🏽 🏳️‍🌈 🇯🇵 ❤️', 'e\u0301 n\u0303 a\u0308\u0308', 'Ⅻ ½ ² ٣ १२३ ௧',
  'int main(void) {\n    return 0;\n}\n', '{"a": [1, 2.5e-3, null], "b": "x\\ny"}\n',
  'def f(x):\n\tif x:\n\t\treturn x ** 2  # square\n', '    indented\n\n\n   \t \n',
  'a'.repeat(5000), 'ab'.repeat(3000), ' '.repeat(1000) + 'x', '\n'.repeat(500),
  'pneumonoultramicroscopicsilicovolcanoconiosis', 'Supercalifragilisticexpialidocious'.repeat(50),
  '1234567890'.repeat(100), '!!!???...'.repeat(100), spaces.join(''), spaces.join('a'),
  ...spaces.map((s) => `a${s}b${s}${s}c ${s}`), 'https://example.com/a?b=c&d=e#f',
  'Ǆǅǆ ǈ ǋ ᾈ', '\u0085x \ufeffy \u180ez', 'tab\tsep\tvalues\r\nline2\r\n',
];
const texts = fixed.slice();
for (let i = 0; i < 20000; i++) texts.push(randomString());

const enc = tiktoken.get_encoding('gpt2');
const want = texts.map((t) => Array.from(enc.encode_ordinary(t)));
enc.free();
const out = run(['tokenize', '--model', vocabDir, '--jsonl'], texts.map((t) => JSON.stringify(t)).join('\n') + '\n')
  .toString('utf8').split('\n');
let idBad = 0, ids = 0, bytes = 0;
for (let i = 0; i < texts.length; i++) {
  const got = out[i] === undefined ? null : JSON.parse(out[i]);
  ids += want[i].length;
  bytes += Buffer.byteLength(texts[i]);
  if (JSON.stringify(got) !== JSON.stringify(want[i])) {
    if (idBad < 10) console.error(`id mismatch on ${JSON.stringify(texts[i]).slice(0, 200)}\n  tiktoken ${JSON.stringify(want[i]).slice(0, 200)}\n  gpt2d    ${JSON.stringify(got).slice(0, 200)}`);
    idBad++;
  }
}
failures += idBad;
console.log(`ids: ${texts.length} texts (${fixed.length} fixed, 20000 random), ${bytes} bytes, ${ids} ids; mismatches: ${idBad}`);

// ---- 3. Special ------------------------------------------------------------
const EOT = '<|endoftext|>';
const marks = [EOT, EOT, EOT + EOT, ` ${EOT} `, '<|endoftext|', '|endoftext|>', '<|endoftext |>', '<|ENDOFTEXT|>'];
const special = [
  EOT, `${EOT}Hello`, `Hello${EOT}`, `Hello ${EOT} world`, `a ${EOT}`, `${EOT}${EOT}`,
  `\n\n${EOT}\n\n`, `don't${EOT}'s`, `<|endoftext${EOT}|>`, `<<|endoftext|>>`, '',
  ...fixed.slice(0, 40).map((t) => `${t}${EOT}${t}`),
];
for (let i = 0; i < 2000; i++) {
  const t = randomString();
  const cps = Array.from(t);
  const k = 1 + Math.floor(rand() * 3);
  for (let j = 0; j < k; j++) cps.splice(Math.floor(rand() * (cps.length + 1)), 0, pick(marks));
  special.push(cps.join(''));
}
const enc2 = tiktoken.get_encoding('gpt2');
const wantSp = special.map((t) => Array.from(enc2.encode(t, 'all')));
enc2.free();
const outSp = run(['tokenize', '--model', vocabDir, '--jsonl', '--special'], special.map((t) => JSON.stringify(t)).join('\n') + '\n')
  .toString('utf8').split('\n');
let spBad = 0, eots = 0;
for (let i = 0; i < special.length; i++) {
  const got = outSp[i] === undefined ? null : JSON.parse(outSp[i]);
  eots += wantSp[i].filter((x) => x === 50256).length;
  if (JSON.stringify(got) !== JSON.stringify(wantSp[i])) {
    if (spBad < 10) console.error(`special id mismatch on ${JSON.stringify(special[i]).slice(0, 200)}\n  tiktoken ${JSON.stringify(wantSp[i]).slice(0, 200)}\n  gpt2d    ${JSON.stringify(got).slice(0, 200)}`);
    spBad++;
  }
}
if (eots < special.length) { console.error(`special: only ${eots} <|endoftext|> tokens in ${special.length} texts`); spBad++; }
failures += spBad;
console.log(`special: ${special.length} texts, ${eots} <|endoftext|> tokens; mismatches: ${spBad}`);
console.log(failures === 0 ? 'tiktoken differential: 100% agreement' : `tiktoken differential: ${failures} mismatches`);
process.exit(failures === 0 ? 0 : 1);
