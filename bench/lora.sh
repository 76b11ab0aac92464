#!/usr/bin/env bash
# bench/lora.sh [BUILD] [DTYPE] [LAYOUT]: LoRA adapters served unmerged
# (issue 36), GPT-2 small's shape (a synth checkpoint converted to DTYPE
# and LAYOUT, bf16 panel64 by default: the serving format), on this
# machine's cores. Two parts:
#   1. bench/bench_lora through the scheduler: 16 streams spread over 8
#      different rank-8 adapters (all four projections) against 16 base
#      streams, 1 stream with and without an adapter, the adapters' factors
#      in F32 and in BF16, and each adapter's load time;
#   2. through `gpt2d serve`: a rank-16 adapter loaded by POST
#      /v1/load_lora_adapter while a stream runs: the route's time and the
#      stream's longest gap between tokens before and during the load.
# The adapters are random (numpy), as PEFT's layout writes them. Numbers
# for docs/benchmarks.md; a benchmark, never a test.
set -euo pipefail
build=${1:-build}
dtype=${2:-bf16}
layout=${3:-panel64}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
bench_setup lora "$build"
"$build/server/gpt2d" convert "$dir/model.safetensors" "$dir/conv.safetensors" --dtype "$dtype" \
    --layout "$layout" > /dev/null
mv "$dir/conv.safetensors" "$dir/model.safetensors"
/usr/bin/python3 - "$dir/loras" <<'PY'
import json, os, struct, sys
import numpy as np
root = sys.argv[1]
L, C = 12, 768
dims = {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C), "mlp.c_proj": (4 * C, C)}
def write(name, r, seed):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 16, "bias": "none",
               "fan_in_fan_out": True, "target_modules": ["c_attn", "c_proj", "c_fc"]},
              open(os.path.join(d, "adapter_config.json"), "w"))
    rng = np.random.default_rng(seed)
    hdr, blobs, off = {}, [], 0
    for l in range(L):
        for m, (i, o) in dims.items():
            for ab, shape in (("A", (r, i)), ("B", (o, r))):
                a = (rng.standard_normal(shape) * 0.02).astype("<f4").tobytes()
                hdr[f"base_model.model.transformer.h.{l}.{m}.lora_{ab}.weight"] = {
                    "dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(a)]}
                blobs.append(a)
                off += len(a)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
for k in range(8):
    write(f"r8_{k}", 8, k)
write("r16", 16, 99)
PY
echo "== $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; $dtype $layout"
"$build/bench/bench_lora" "$dir" "$dir"/loras/r8_{0..7} --tokens "${TOKENS:-64}" --rounds "${ROUNDS:-3}"

# 2. A rank-16 load beside a running stream.
bench_serve "$build" "$dir" --lora-dir "$dir/loras" --kv-cache-mb 512
/usr/bin/python3 - "$base" <<'PY'
import json, sys, threading, time, urllib.request
base = sys.argv[1]
H = {"Content-Type": "application/json"}
times, started = [], threading.Event()
def stream():
    req = urllib.request.Request(base + "/v1/completions", json.dumps(
        {"prompt": "The weather today", "max_tokens": 300, "temperature": 0, "ignore_eos": True,
         "stream": True}).encode(), H)
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.monotonic())
                if len(times) == 40:
                    started.set()
th = threading.Thread(target=stream)
th.start()
started.wait(60)
t0 = time.monotonic()
req = urllib.request.Request(base + "/v1/load_lora_adapter", json.dumps({"lora_name": "r16", "lora_path": "r16"}).encode(), H)
ans = json.load(urllib.request.urlopen(req, timeout=60))
t1 = time.monotonic()
th.join()
gaps = [(b - a, b) for a, b in zip(times, times[1:])]
before = max(g for g, t in gaps if t < t0)
during = max([g for g, t in gaps if t0 <= t <= t1 + 0.2] or [0])
print("rank-16 load through POST /v1/load_lora_adapter: %.1f ms for the route (%.1f ms of it reading and "
      "checking the folder, on the work queue); the stream's longest token gap before it %.1f ms, while it "
      "loaded (and 200 ms after) %.1f ms" % ((t1 - t0) * 1e3, ans["load_ms"], before * 1e3, during * 1e3))
PY
