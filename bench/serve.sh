#!/usr/bin/env bash
# bench/serve.sh [BUILD]: gpt2d serve under load on a GPT-2-small-shaped
# checkpoint (gpt2d synth, aligned), on loopback:
#  - streaming: bench/load_stream.py at 1, 4, 16 and 64 concurrent streams
#    (128 tokens each, 32-token prompts): time to first token, inter-token
#    latency (p50/p99), aggregate completion tokens/s; and 4 concurrent
#    512-token prompts (time to first token);
#  - non-streaming short completions with wrk (bench/wrk_completions.lua).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
dir=$(mktemp -d /tmp/gpt2d-bench-serve-XXXXXX)
trap 'kill $srv 2>/dev/null || true; rm -rf "$dir"' EXIT
"$build/server/gpt2d" synth "$dir/model.safetensors" >/dev/null
cp tokenizer/data/vocab.json tokenizer/data/merges.txt "$dir/"
: > "$dir/serve.log"
"$build/server/gpt2d" serve --model "$dir" --port 0 --kv-cache-mb 4096 > "$dir/serve.log" 2>&1 &
srv=$!
for _ in $(seq 100); do
    port=$(sed -n 's|.* on http://127.0.0.1:\([0-9]*\)$|\1|p' "$dir/serve.log")
    [ -n "$port" ] && break
    sleep 0.1
done
base="http://127.0.0.1:$port"
for c in 1 4 16 64; do
    per=$(( c >= 16 ? 1 : 2 ))
    python3 bench/load_stream.py "$base" "$c" "$per" 128 32
done
python3 bench/load_stream.py "$base" 4 1 8 512
wrk -t2 -c16 -d20s -s bench/wrk_completions.lua "$base/v1/completions" | sed -n '/Latency/p;/Non-2xx/p;/Requests\/sec/p'
