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
. bench/lib.sh
bench_setup serve "$build"
bench_serve "$build" "$dir"
for c in 1 4 16 64; do
    per=$(( c >= 16 ? 1 : 2 ))
    python3 bench/load_stream.py "$base" "$c" "$per" 128 32
done
python3 bench/load_stream.py "$base" 4 1 8 512
wrk -t2 -c16 -d20s -s bench/wrk_completions.lua "$base/v1/completions" | sed -n '/Latency/p;/Non-2xx/p;/Requests\/sec/p'
