#!/usr/bin/env bash
# bench/compare.sh BUILD_A BUILD_B [ROUNDS [BUILD_C...]]: builds of gpt2d side
# by side on one GPT-2-small-shaped synth checkpoint (aligned), alternating
# A, B, (C, ...) A, B, ... for ROUNDS rounds (default 3), so that all see the
# same machine:
#  - `gpt2d bench` (prefill of 512 tokens; decode at 1, 4, 16, 64 sequences);
#  - `gpt2d serve` under bench/load_stream.py: 4 concurrent 512-token
#    prompts (8 tokens each), then 16 streams of 128 tokens (32-token
#    prompts). The load generator's prompts are equal, so a build with the
#    prefix cache computes their beginning once.
# LOADS overrides the server's loads: load_stream.py arguments
# (CONCURRENCY PER_WORKER MAX_TOKENS PROMPT_TOKENS), separated by '|', e.g.
# LOADS='1 3 128 32|16 1 128 32|64 1 128 32' for 1, 16 and 64 streams;
# NO_ENGINE=1 skips `gpt2d bench` (the server's figures only).
# A build is a meson build directory (BUILD/server/gpt2d), optionally
# followed by options for its `gpt2d serve`, in one word: "build
# --prefix-cache false" measures the server without the cache. An older
# commit can be built with `git worktree add /tmp/old REV && meson setup
# /tmp/old/build ...`. Prints one JSON line per measurement, tagged with the
# build as given.
set -euo pipefail
cd "$(dirname "$0")/.."
specs=("${1:?BUILD_A}" "${2:?BUILD_B}")
rounds=${3:-3}
shift $(($# < 3 ? $# : 3))
specs+=("$@")
. bench/lib.sh
read -r -a words <<< "${specs[1]}"
bench_setup compare "${words[0]}"
for _ in $(seq "$rounds"); do
    for spec in "${specs[@]}"; do
        read -r -a words <<< "$spec"
        build=${words[0]}
        [ "${NO_ENGINE:-0}" = 1 ] || "$build/server/gpt2d" bench --model "$dir" |
            python3 -c 'import json, sys; d = json.load(sys.stdin); print(json.dumps({"build": sys.argv[1], "bench": {"prefill_512": d["prefill_512"]["tokens_per_s"], "decode": {x["sequences"]: x["tokens_per_s"] for x in d["decode"]}, "attention_share": {x["sequences"]: x["time_share"]["attention"] for x in d["decode"]}}}))' "$spec"
        bench_serve "$build" "$dir" "${words[@]:1}"
        IFS='|' read -r -a loads <<< "${LOADS:-4 1 8 512|16 1 128 32}"
        for load in "${loads[@]}"; do
            # shellcheck disable=SC2086
            echo "{\"build\": \"$spec\", \"serve\": $(python3 bench/load_stream.py "$base" $load)}"
        done
        bench_stop
    done
done
