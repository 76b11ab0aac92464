#!/usr/bin/env bash
# bench/spec.sh [BUILD] [ROUNDS]: speculative decoding's aims, side by side
# (bench_spec: every round runs each mode once, in turn; medians and
# ratios to plain decoding in the same run). BUILD: a build directory
# (default build), ROUNDS: rounds a figure (default 7).
#   1. The verify step's efficiency and its cost when nothing is accepted:
#      a prediction that is the output (right) and one that proposes a
#      wrong token after each of the output's (wrong), k = 4, GPT-2-small
#      shape (`gpt2d synth`), BF16 and q8 (panel64), 1 stream, 128 tokens.
#   2. Prompt lookup on a quoting workload with the trained default model:
#      models/gpt2d-tiny continues a passage (Genesis 1:1-5, King James
#      Version) after the passage and its first seven words again, greedy,
#      128 tokens; the acceptance rate with it.
#   3. A draft model: models/gpt2d-tiny (6 layers, width 128) drafted by
#      DRAFT_DIR (default /tmp/gpt2d-draft: a 2-layer, width-64 model trained
#      on the same data, tools/train/README.md), on the same workload and on
#      a prompt of ordinary prose; and the GPT-2-XL shape drafted by the
#      GPT-2-small shape (random weights: a right draft shows the ceiling,
#      the accepted rate is what a real pair would give).
#   4. Many streams: 16 and 64 streams with speculation on (prompt lookup,
#      the default threshold) and off, and the threshold itself: a right
#      draft at 1, 2, 4, 8 and 16 streams with speculation in every step.
# A benchmark, never a test: minutes, and on a shared machine noisy; the
# ratios within one round are what to compare.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-7}
draft=${DRAFT_DIR:-/tmp/gpt2d-draft}
bs="$build/bench/bench_spec"
gpt2d="$build/server/gpt2d"
dir=$(mktemp -d /tmp/gpt2d-bench-spec-XXXXXX)
trap 'rm -rf "$dir"' EXIT
echo "== $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) ($(nproc) CPUs); flags: $(grep -o -w -m1 -E 'avx512_bf16|avx512_vnni|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
"$gpt2d" synth "$dir/small.safetensors" > /dev/null
for f in bf16 q8; do
    mkdir -p "$dir/$f"
    "$gpt2d" convert "$dir/small.safetensors" "$dir/$f/model.safetensors" --dtype $f --layout panel64 > /dev/null 2>&1
done
echo "== 1. verify efficiency (k = 4, GPT-2-small shape, 1 stream, 128 tokens)"
"$bs" "$dir/bf16" 128 1 4 "$rounds"
"$bs" "$dir/q8" 128 1 4 "$rounds"
echo "== 2. prompt lookup, quoting workload, models/gpt2d-tiny"
passage='In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the light from the darkness. And God called the light Day, and the darkness he called Night. And the evening and the morning were the first day.'
printf '%s\n\n%s' "$passage" "In the beginning God created the heaven" |
    "$gpt2d" tokenize --model models/gpt2d-tiny | tr -d '[],' > "$dir/quote.txt"
printf '%s' "The history of the kingdom begins with a war between two brothers, and the people of the land" |
    "$gpt2d" tokenize --model models/gpt2d-tiny | tr -d '[],' > "$dir/prose.txt"
"$bs" models/gpt2d-tiny 128 1 4 "$rounds" "$dir/quote.txt"
echo "== 3. draft model"
if [ -f "$draft/model.safetensors" ]; then
    "$bs" models/gpt2d-tiny 128 1 4 "$rounds" "$dir/quote.txt" "$draft"
    "$bs" models/gpt2d-tiny 128 1 4 "$rounds" "$dir/prose.txt" "$draft"
else
    echo "(no draft model in $draft: see tools/train/README.md)"
fi
mkdir -p "$dir/xl" "$dir/smalld"
"$gpt2d" synth "$dir/xl.safetensors" --layers 48 --embd 1600 --heads 25 > /dev/null
"$gpt2d" convert "$dir/xl.safetensors" "$dir/xl/model.safetensors" --dtype bf16 --layout panel64 > /dev/null 2>&1
rm -f "$dir/xl.safetensors"
cp "$dir/bf16/model.safetensors" "$dir/smalld/"
"$bs" "$dir/xl" 32 1 4 3 - "$dir/smalld"
echo "== 4. many streams (lookup at the default threshold), and the threshold"
for s in 16 64; do "$bs" "$dir/bf16" 64 "$s" 4 "$rounds"; done
for s in 1 2 4 8 16; do SPEC_MAX_BATCH=64 "$bs" "$dir/bf16" 64 "$s" 4 "$rounds"; done
