#!/usr/bin/env bash
# bench/compare.sh BUILD_A BUILD_B [ROUNDS]: two builds of gpt2d side by side
# on one GPT-2-small-shaped synth checkpoint (aligned), alternating A, B, A,
# B, ... for ROUNDS rounds (default 3), so that both see the same machine:
#  - `gpt2d bench` (prefill of 512 tokens; decode at 1, 4, 16, 64 sequences);
#  - `gpt2d serve` under bench/load_stream.py: 4 concurrent 512-token
#    prompts (8 tokens each), then 16 streams of 128 tokens (32-token
#    prompts).
# Prints one JSON line per measurement, tagged with the build. A build is a
# meson build directory (BUILD/server/gpt2d); an older commit can be built
# with `git worktree add /tmp/old REV && meson setup /tmp/old/build ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
a=${1:?BUILD_A}
b=${2:?BUILD_B}
rounds=${3:-3}
. bench/lib.sh
bench_setup compare "$b"
for _ in $(seq "$rounds"); do
    for build in "$a" "$b"; do
        "$build/server/gpt2d" bench --model "$dir" |
            python3 -c 'import json, sys; d = json.load(sys.stdin); print(json.dumps({"build": sys.argv[1], "bench": {"prefill_512": d["prefill_512"]["tokens_per_s"], "decode": {x["sequences"]: x["tokens_per_s"] for x in d["decode"]}, "attention_share": {x["sequences"]: x["time_share"]["attention"] for x in d["decode"]}}}))' "$build"
        bench_serve "$build" "$dir"
        for load in "4 1 8 512" "16 1 128 32"; do
            # shellcheck disable=SC2086
            echo "{\"build\": \"$build\", \"serve\": $(python3 bench/load_stream.py "$base" $load)}"
        done
        bench_stop
    done
done
