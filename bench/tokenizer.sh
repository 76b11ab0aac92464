#!/usr/bin/env bash
# bench/tokenizer.sh [BUILD] [ROUNDS]: encode throughput (MB/s of UTF-8 input,
# one thread) of gpt2d's tokenizer and of tiktoken (npm, WASM) on the same
# texts in the same run, alternating, ROUNDS (default 5) rounds of 3 encodes
# each; medians and their ratio. Two texts of ~8 MB: "code+docs" (this
# repository's C sources and Markdown, repeated) and "prose" (English-like
# text: words drawn from the GPT-2 vocabulary with a Zipf law, with
# punctuation and paragraphs; deterministic). The id counts of the two
# implementations must be equal, or the run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
dir=$(mktemp -d /tmp/gpt2d-bench-tok-XXXXXX)
trap 'rm -rf "$dir"' EXIT
git ls-files '*.c' '*.h' '*.md' ':!tokenizer/unicode_classes.h' | xargs cat > "$dir/one.txt"
: > "$dir/code+docs.txt"
while [ "$(stat -c %s "$dir/code+docs.txt")" -lt 8000000 ]; do cat "$dir/one.txt" >> "$dir/code+docs.txt"; done
python3 - "$dir/prose.txt" tokenizer/data/vocab.json <<'PY'
import json, random, sys
rng = random.Random(7)
vocab = json.load(open(sys.argv[2]))
words = [k[1:] for k in vocab if k.startswith("\u0120") and k[1:].isalpha() and k[1:].isascii()]
weights = [1.0 / (i + 1) for i in range(len(words))]
out, size = [], 0
while size < 8_000_000:
    sent = rng.choices(words, weights, k=rng.randint(5, 25))
    s = " ".join(sent).capitalize() + rng.choice([".", ".", ".", "?", "!", ","]) + " "
    if rng.random() < 0.1:
        s += "\n\n"
    out.append(s)
    size += len(s)
open(sys.argv[1], "w").write("".join(out))
PY
for r in $(seq "$rounds"); do
    for text in code+docs prose; do
        "$build/bench/bench_tokenizer" "$dir/$text.txt" tokenizer/data 3 | sed "s/^{/{\"text\": \"$text\", /"
        node bench/tokenizer.mjs "$dir/$text.txt" 3 | sed "s/^{/{\"text\": \"$text\", /"
    done
done > "$dir/runs.jsonl"
python3 - "$dir/runs.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| text | MB | gpt2d MB/s | tiktoken MB/s | ratio |")
print("|---|---:|---:|---:|---:|")
for text in ("code+docs", "prose"):
    g = [r for r in rows if r["text"] == text and r["impl"] == "gpt2d"]
    t = [r for r in rows if r["text"] == text and r["impl"] == "tiktoken"]
    assert {r["ids"] for r in g} == {r["ids"] for r in t}, "id counts differ"
    mg = statistics.median(r["mb_per_s"] for r in g)
    mt = statistics.median(r["mb_per_s"] for r in t)
    print(f"| {text} | {g[0]['mb']:.1f} | {mg:.1f} | {mt:.1f} | {mg / mt:.2f} |")
PY
