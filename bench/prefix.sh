#!/usr/bin/env bash
# bench/prefix.sh [BUILD] [ROUNDS]: the prefix cache on a GPT-2-small-shaped
# checkpoint (gpt2d synth, aligned), on loopback, with bench/load_prefix.py.
# Each round runs every load with the cache on and off, alternating, each on
# a fresh server (so nothing is cached at the start):
#  - TTFT of a 512-token prompt whose first 496 tokens were seen before,
#    against a cold 512-token prompt (cache on); what echo + logprobs costs
#    on a 512-token prompt against a plain prefill of it;
#  - 16 concurrent requests sharing a 400-token prefix (16-token tails, 32
#    tokens each);
#  - 16 concurrent unique prompts of the same shape (nothing shared);
#  - mixed traffic under KV pressure: 16 workers x 3 requests, half sharing
#    a 400-token prefix, half unique, in a 160 MiB KV pool (142 blocks of
#    16 positions; a request needs 28, so 5 run at a time without sharing);
#  - scoring 8 continuations of a 400-token context in one request (echo,
#    logprobs, max_tokens 0), and n = 4 choices of one 416-token prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-2}
. bench/lib.sh
bench_setup prefix "$build"
bench_serve "$build" "$dir"
python3 bench/load_prefix.py "$base" ttft 9
python3 bench/load_prefix.py "$base" echo 5
bench_stop
for _ in $(seq "$rounds"); do
    for cache in true false; do
        for load in "16 1 1 400 16 32 1" "16 1 0 400 16 32 2" "16 3 2 400 16 32 3"; do
            kv=4096
            case $load in "16 3 "*) kv=160 ;; esac
            bench_serve "$build" "$dir" --prefix-cache "$cache" --kv-cache-mb "$kv"
            # shellcheck disable=SC2086
            echo "{\"prefix_cache\": $cache, \"kv_cache_mb\": $kv, \"result\": $(python3 bench/load_prefix.py "$base" load $load)}"
            bench_stop
        done
        bench_serve "$build" "$dir" --prefix-cache "$cache"
        echo "{\"prefix_cache\": $cache, \"result\": $(python3 bench/load_prefix.py "$base" batch 3)}"
        bench_stop
    done
done
