#!/usr/bin/env bash
# bench/models.sh [BUILD] [DTYPE] [STREAMS]: two checkpoints in one daemon
# (issue 36) against one alone, GPT-2 small's shape (two synth checkpoints
# of other seeds, converted to DTYPE panel64; bf16 by default: the serving
# format), on this machine's cores, through `gpt2d serve` and
# bench/load_stream.py (128 tokens a stream, 32-token prompts). Each round,
# side by side:
#   alone  one checkpoint, STREAMS streams (16), and STREAMS/2;
#   two    both checkpoints in one server, STREAMS/2 streams to each at once.
# Prints each run's aggregate tokens/s and the ratios the issue's aim reads:
# each checkpoint's rate beside the other against half the rate of one
# alone at STREAMS (the same load split in two), and against one alone at
# STREAMS/2. ROUNDS (3) rounds; medians. A benchmark, never a test.
set -euo pipefail
build=${1:-build}
dtype=${2:-bf16}
streams=${3:-16}
half=$((streams / 2))
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
bench_setup models "$build"
mkdir -p "$dir/b"
"$build/server/gpt2d" synth "$dir/b/model.safetensors" --seed 2 > /dev/null
cp "$dir/vocab.json" "$dir/merges.txt" "$dir/b/"
for m in "$dir" "$dir/b"; do
    "$build/server/gpt2d" convert "$m/model.safetensors" "$m/conv.safetensors" --dtype "$dtype" \
        --layout panel64 > /dev/null
    mv "$m/conv.safetensors" "$m/model.safetensors"
done
echo "== $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; $dtype panel64; $streams streams"
rate() { python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["tokens_per_s"])'; }
load() { LOAD_MODEL=$1 python3 "$here/load_stream.py" "$base" "$2" 1 128 32 | rate; }
for r in $(seq "${ROUNDS:-3}"); do
    bench_serve "$build" "$dir" --kv-cache-mb 2048 --max-running 128
    full=$(load gpt2 "$streams")
    halfr=$(load gpt2 "$half")
    bench_stop
    bench_serve "$build" "$dir" --model "$dir,b=$dir/b" --kv-cache-mb 2048 --max-running 128
    load gpt2 "$half" > "$dir/a.rate" &
    pa=$!
    load b "$half" > "$dir/b.rate" &
    pb=$!
    wait "$pa" "$pb"
    bench_stop
    echo "round $r: alone $streams: $full tok/s, alone $half: $halfr; two ($half each): $(cat "$dir/a.rate") + $(cat "$dir/b.rate")"
    echo "$full $halfr $(cat "$dir/a.rate") $(cat "$dir/b.rate")" >> "$dir/rounds"
done
python3 - "$dir/rounds" "$streams" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
n = int(sys.argv[2])
med = lambda xs: statistics.median(xs)
full, half = med([r[0] for r in rows]), med([r[1] for r in rows])
a, b = med([r[2] for r in rows]), med([r[3] for r in rows])
print("medians: alone %d %.1f tok/s, alone %d %.1f; two: %.1f + %.1f = %.1f" % (n, full, n // 2, half, a, b, a + b))
print("each beside the other / (alone at %d) / 2: %.2f, %.2f (aim >= 0.9)" % (n, a / (full / 2), b / (full / 2)))
print("each beside the other / alone at %d: %.2f, %.2f" % (n // 2, a / half, b / half))
PY
