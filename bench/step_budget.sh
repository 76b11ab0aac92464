#!/usr/bin/env bash
# bench/step_budget.sh [BUILD] [ROUNDS] [BUDGET...]: the per-step prompt-token
# budget (step_tokens) against two loads, one server per budget, alternating
# budgets for ROUNDS rounds (default 3; budgets default 512 256 128) on a
# GPT-2-small-shaped synth checkpoint: 16 streams of 128 tokens with 32-token
# prompts (time to first token of short prompts arriving together), and 4
# concurrent 512-token prompts (long prompts; the pause they cause in running
# streams shows as inter-token latency p99). One JSON line per measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
shift $(($# > 2 ? 2 : $#))
budgets=("$@")
[ ${#budgets[@]} -gt 0 ] || budgets=(512 256 128)
. bench/lib.sh
bench_setup budget "$build"
for _ in $(seq "$rounds"); do
    for st in "${budgets[@]}"; do
        bench_serve "$build" "$dir" --step-tokens "$st"
        for load in "16 1 128 32" "4 1 8 512"; do
            # shellcheck disable=SC2086
            echo "{\"step_tokens\": $st, \"serve\": $(python3 bench/load_stream.py "$base" $load)}"
        done
        bench_stop
    done
done
