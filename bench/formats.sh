#!/usr/bin/env bash
# bench/formats.sh BUILD [ROUNDS] [OLD_BUILD]: every weight format side by
# side on one GPT-2-small-shaped synth checkpoint, alternating f32, f16,
# bf16, q8 in the Hugging Face layout and in gpt2d's panel64 layout
# (`gpt2d convert --layout panel64`; tagged p-f32 and so on), and OLD_BUILD's
# f32 (e.g. a build of the commit before a change), for ROUNDS rounds
# (default 3):
#  - `gpt2d bench --sequences 1,16` (prefill of 512 tokens, decode at 1 and
#    16 sequences, the bandwidth bound of each format's bytes);
#  - `gpt2d serve`: peak RSS (VmHWM) after one 1-stream run of 128 tokens
#    (bench/load_stream.py), with its tokens/s, then 16 and 64 streams of
#    128 tokens (32-token prompts).
# Prints one JSON line per measurement. A benchmark, never a test.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?BUILD}
rounds=${2:-3}
old=${3:-}
. bench/lib.sh
bench_setup formats "$build"
for dt in f16 bf16 q8; do
    mkdir "$dir/$dt"
    "$build/server/gpt2d" convert "$dir/model.safetensors" "$dir/$dt/model.safetensors" --dtype "$dt" 2>/dev/null
    cp "$dir"/*.json "$dir"/merges.txt "$dir/$dt/"
done
runs=()
for dt in f32 f16 bf16 q8; do
    mkdir "$dir/p-$dt"
    "$build/server/gpt2d" convert "$dir/model.safetensors" "$dir/p-$dt/model.safetensors" \
        --dtype "$dt" --layout panel64 2>/dev/null
    cp "$dir"/*.json "$dir"/merges.txt "$dir/p-$dt/"
    m=$dir/$dt
    [ "$dt" = f32 ] && m=$dir
    runs+=("$build $dt $m" "$build p-$dt $dir/p-$dt")
done
[ -n "$old" ] && runs+=("$old f32-before $dir")
for _ in $(seq "$rounds"); do
    for r in "${runs[@]}"; do
        read -r b tag m <<< "$r"
        "$b/server/gpt2d" bench --model "$m" --sequences 1,16 |
            python3 -c 'import json, sys; d = json.load(sys.stdin); print(json.dumps({"format": sys.argv[1], "bench": {"weight_mb": round(d["model"]["weight_bytes"] / 1e6, 1), "bw_gb_s": d["machine"]["read_bandwidth_gb_s"], "bound": d["decode_bandwidth_bound_tokens_per_s"], "prefill_512": d["prefill_512"]["tokens_per_s"], "decode": {x["sequences"]: x["tokens_per_s"] for x in d["decode"]}, "fraction_of_bound": d["decode"][0]["fraction_of_bandwidth_bound"], "lm_head_share_1": d["decode"][0]["time_share"]["lm_head"]}}))' "$tag"
        bench_serve "$b" "$m"
        s=$(python3 bench/load_stream.py "$base" 1 1 128 32)
        echo "{\"format\": \"$tag\", \"serve_1_stream\": $s, \"serve_peak_rss_mb\": $(awk '/VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$srv/status")}"
        for n in 16 64; do
            echo "{\"format\": \"$tag\", \"serve_${n}_streams\": $(python3 bench/load_stream.py "$base" "$n" 1 128 32)}"
        done
        bench_stop
    done
done
