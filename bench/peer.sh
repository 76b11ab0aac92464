#!/usr/bin/env bash
# bench/peer.sh GPT2D_BUILD LLAMA_BUILD [ROUNDS]: gpt2d next to its peer,
# llama.cpp, on this machine, on the same weights: one GPT-2-small-shaped
# synth checkpoint, converted by `gpt2d convert --layout panel64` (p-f32,
# p-bf16, p-q8), and as it is in Hugging Face's layout (hf-f32), and by
# bench/to_gguf.py for the peer (f32, f16, then Q8_0 by
# LLAMA_BUILD/bin/llama-quantize). Builds nothing: LLAMA_BUILD is a CMake
# build directory of llama.cpp holding bin/llama-bench, bin/llama-server and
# bin/llama-quantize (built by hand outside this repository). For ROUNDS
# rounds (default 1), alternating the two engines format by format
# (p-f32 | f32, hf-f32 | f32, p-bf16 | f16, p-q8 | q8_0), prints one JSON
# line per measurement:
#  - offline: `gpt2d bench --sequences 1,16 --tokens 128` next to
#    `llama-bench -t 2 -p 512 -n 128 -r 3` (prefill of 512 tokens, decode of
#    128 at one sequence; gpt2d also decodes 16 sequences);
#  - serving: each server's peak RSS after one stream of three requests of
#    128 tokens each (32-token prompt, bench/load_stream.py), then 16 and 64
#    streams. llama-server
#    runs with 2 threads and 64 slots of 256 positions (-c 16384 -np 64
#    --cont-batching), so that 64 streams of 160 positions fit at once.
# llama.cpp's CPU threads meet at OpenMP spin barriers: with another process
# on one of the two cores its figures fall several-fold (llama-bench f32
# prefill 101 tok/s loaded, 893 quiet), far more than gpt2d's, so compare
# only runs made on a quiet machine. A build from `git archive` (no .git)
# reports its build as "0 (unknown)".
# A benchmark, never a test.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?GPT2D_BUILD}
llama=$(cd "${2:?LLAMA_BUILD}" && pwd)
rounds=${3:-1}
for b in llama-bench llama-server llama-quantize; do
    [ -x "$llama/bin/$b" ] || { echo "peer.sh: no $llama/bin/$b" >&2; exit 1; }
done
. bench/lib.sh
bench_setup peer "$build"
lsrv=
trap 'bench_stop; peer_stop; rm -rf "$dir"' EXIT

# peer_serve GGUF: starts llama-server on GGUF on a free loopback port (log:
# $dir/llama-server.log); sets lsrv (its pid) and base. Fails if /health does
# not answer 200 within 60 s.
peer_serve() {
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$llama/bin/llama-server" -m "$1" --host 127.0.0.1 --port "$port" -t 2 -c 16384 -np 64 \
        --cont-batching > "$dir/llama-server.log" 2>&1 &
    lsrv=$!
    base="http://127.0.0.1:$port"
    for _ in $(seq 600); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$base/health")" = 200 ] && return 0
        kill -0 "$lsrv" 2>/dev/null || break
        sleep 0.1
    done
    echo "llama-server did not start: $(tail -n 3 "$dir/llama-server.log")" >&2
    return 1
}

# peer_stop: stops the server peer_serve started.
peer_stop() {
    [ -n "$lsrv" ] || return 0
    kill "$lsrv" 2>/dev/null || true
    wait "$lsrv" 2>/dev/null || true
    lsrv=
}

# streams ENGINE TAG PID: the 1-stream run (three requests one after the
# other, so that one request's luck does not make the figure) with PID's
# peak RSS, then 16 and 64 streams, against $base.
streams() {
    local s
    s=$(python3 bench/load_stream.py "$base" 1 3 128 32)
    echo "{\"engine\": \"$1\", \"format\": \"$2\", \"serve_1_stream\": $s, \"serve_peak_rss_mb\": $(awk '/VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$3/status")}"
    for n in 16 64; do
        echo "{\"engine\": \"$1\", \"format\": \"$2\", \"serve_${n}_streams\": $(python3 bench/load_stream.py "$base" "$n" 1 128 32)}"
    done
}

for dt in f32 bf16 q8; do
    mkdir "$dir/p-$dt"
    "$build/server/gpt2d" convert "$dir/model.safetensors" "$dir/p-$dt/model.safetensors" \
        --dtype "$dt" --layout panel64 2>/dev/null
    cp "$dir"/*.json "$dir"/merges.txt "$dir/p-$dt/"
done
/usr/bin/python3 bench/to_gguf.py "$dir" "$dir/f32.gguf" --dtype f32
/usr/bin/python3 bench/to_gguf.py "$dir" "$dir/f16.gguf" --dtype f16
"$llama/bin/llama-quantize" "$dir/f16.gguf" "$dir/q8_0.gguf" Q8_0 > "$dir/quantize.log" 2>&1 ||
    { echo "llama-quantize failed: $(tail -n 3 "$dir/quantize.log")" >&2; exit 1; }

# hf-f32: the synth checkpoint itself, in Hugging Face's layout (a
# fine-tune as users have it, without `gpt2d convert`), beside the same
# peer format as p-f32.
pairs=("p-f32 f32" "hf-f32 f32" "p-bf16 f16" "p-q8 q8_0")
for _ in $(seq "$rounds"); do
    for p in "${pairs[@]}"; do
        read -r ours theirs <<< "$p"
        m=$dir/$ours
        [ "$ours" = hf-f32 ] && m=$dir
        "$build/server/gpt2d" bench --model "$m" --sequences 1,16 --tokens 128 |
            python3 -c 'import json, sys; d = json.load(sys.stdin); print(json.dumps({"engine": "gpt2d", "format": sys.argv[1], "bench": {"weight_mb": round(d["model"]["weight_bytes"] / 1e6, 1), "bw_gb_s": d["machine"]["read_bandwidth_gb_s"], "prefill_512": d["prefill_512"]["tokens_per_s"], "decode": {x["sequences"]: x["tokens_per_s"] for x in d["decode"]}}}))' "$ours"
        "$llama/bin/llama-bench" -m "$dir/$theirs.gguf" -t 2 -p 512 -n 128 -r 3 -o json 2>/dev/null |
            python3 -c 'import json, sys; d = json.load(sys.stdin); pp = [x for x in d if x["n_prompt"] and not x["n_gen"]][0]; tg = [x for x in d if x["n_gen"] and not x["n_prompt"]][0]; print(json.dumps({"engine": "llama.cpp", "build": "%s (%s)" % (pp["build_number"], pp["build_commit"]), "format": sys.argv[1], "bench": {"weight_mb": round(pp["model_size"] / 1e6, 1), "prefill_512": round(pp["avg_ts"], 1), "prefill_sd": round(pp["stddev_ts"], 1), "decode": {"1": round(tg["avg_ts"], 1)}, "decode_sd": round(tg["stddev_ts"], 1)}}))' "$theirs"
        bench_serve "$build" "$m"
        streams gpt2d "$ours" "$srv"
        bench_stop
        peer_serve "$dir/$theirs.gguf"
        streams llama.cpp "$theirs" "$lsrv"
        peer_stop
        # The next pair's `gpt2d bench` ran 20-45 % slower right after a
        # 64-stream llama-server run than alone (BF16 decode 105-137
        # against 187-193 tok/s minutes later): a pause lets the machine
        # settle.
        sleep 10
    done
done
