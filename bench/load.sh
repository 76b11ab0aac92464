#!/usr/bin/env bash
# bench/load.sh [BUILD] [RUNS]: time and peak RSS to load a GPT-2-small-shaped
# checkpoint (gpt2d synth, with the mask buffers, as the published file),
# aligned and misaligned, copied and mapped. Each configuration runs RUNS
# times (default 5) in fresh processes, interleaved, with a warm page cache;
# the table gives the medians.
set -euo pipefail
build=${1:-build}
runs=${2:-5}
dir=$(mktemp -d /tmp/gpt2d-bench-load-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$build/server/gpt2d" synth "$dir/aligned.safetensors" --mask-buffers
"$build/server/gpt2d" synth "$dir/misaligned.safetensors" --mask-buffers --misaligned
cat "$dir"/*.safetensors > /dev/null # warm the page cache
for i in $(seq "$runs"); do
    for file in aligned misaligned; do
        for mode in copy mmap; do
            printf '{"file": "%s", "run": %d, "r": ' "$file" "$i"
            "$build/bench/bench_load" "$dir/$file.safetensors" "$mode" | tr -d '\n'
            echo '}'
        done
    done
done > "$dir/runs.jsonl"
python3 - "$dir/runs.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| file | mode | open ms | open+touch ms | peak RSS MB | private MB | tensors mapped |")
print("|---|---|---:|---:|---:|---:|---:|")
for f in ("aligned", "misaligned"):
    for m in ("copy", "mmap"):
        rs = [r["r"] for r in rows if r["file"] == f and r["r"]["mode"] == m]
        med = lambda k: statistics.median(x[k] for x in rs)
        print(f"| {f} | {m} | {med('open_ms'):.0f} | {med('open_ms') + med('touch_ms'):.0f} | "
              f"{med('hwm_kb') / 1024:.0f} | {med('anon_kb') / 1024:.0f} | "
              f"{rs[0]['mapped']}/{rs[0]['tensors']} |")
PY
