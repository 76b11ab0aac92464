#!/usr/bin/env bash
# bench/embeddings.sh BUILD [ROUNDS] [DTYPE]: POST /v1/embeddings against the
# engine's own prefill. Per round, on one GPT-2-small-shaped checkpoint
# (DTYPE f32 by default; bf16, q8 as `gpt2d convert` writes them):
#   - `gpt2d bench --sequences 1`: prefill_512's tokens/s (one 512-token prompt);
#   - the server: one request of 1,000 inputs of 32 token ids each
#     (encoding_format base64), its prompt tokens / wall seconds;
#   - a 128-token stream's inter-token gaps alone, then beside that request
#     (median and p90).
# Prints a JSON line per round: the embeddings' tokens/s
# over prefill's (aim >= 0.9) and the stream's median gap beside over alone
# (aim <= 1.5).
set -euo pipefail
build=${1:?usage: bench/embeddings.sh BUILD [ROUNDS] [DTYPE]}
rounds=${2:-3}
dtype=${3:-f32}
. "$(dirname "$0")/lib.sh"
bench_setup embeddings "$build"
model=$dir
if [ "$dtype" != f32 ]; then
    mkdir -p "$dir/$dtype"
    "$build/server/gpt2d" convert "$dir/model.safetensors" "$dir/$dtype/model.safetensors" --dtype "$dtype" > /dev/null
    cp "$dir/vocab.json" "$dir/merges.txt" "$dir/config.json" "$dir/$dtype/"
    model=$dir/$dtype
fi
for r in $(seq "$rounds"); do
    prefill=$("$build/server/gpt2d" bench --model "$model" --sequences 1 --tokens 8 |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["prefill_512"]["tokens_per_s"])')
    bench_serve "$build" "$model"
    python3 - "$base" "$prefill" "$r" <<'PY'
import json, random, statistics, sys, threading, time, urllib.request
sys.path.insert(0, "bench")
import http.client
from sse_client import events, pct
base, prefill, rnd = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rng = random.Random(rnd)
inputs = [[rng.randrange(50000) for _ in range(32)] for _ in range(1000)]

def embed():
    body = json.dumps({"input": inputs, "encoding_format": "base64"}).encode()
    t0 = time.monotonic()
    with urllib.request.urlopen(urllib.request.Request(base + "/v1/embeddings", body,
                                {"Content-Type": "application/json"}), timeout=600) as r:
        d = json.load(r)
    assert len(d["data"]) == 1000
    return d["usage"]["prompt_tokens"] / (time.monotonic() - t0)

def stream_gaps(out):
    body = json.dumps({"prompt": "A stream beside", "max_tokens": 128, "ignore_eos": True,
                       "stream": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(req, timeout=600) as resp:
        for _ in events(resp):
            times.append(time.monotonic())
    out.extend(b - a for a, b in zip(times, times[1:]))

embed()  # warm-up: first touches
alone = []
stream_gaps(alone)
beside, res = [], {}
t = threading.Thread(target=lambda: res.update(tps=embed()))
t.start()
time.sleep(0.2)
stream_gaps(beside)
t.join()
tps = res["tps"]
print(json.dumps({"round": rnd, "prefill_tok_s": prefill, "embed_tok_s": round(tps, 1),
                  "ratio": round(tps / prefill, 3),
                  "itl_alone_ms": [round(statistics.median(alone) * 1e3, 2), round(pct(alone, 90) * 1e3, 2)],
                  "itl_beside_ms": [round(statistics.median(beside) * 1e3, 2), round(pct(beside, 90) * 1e3, 2)],
                  "itl_ratio": round(statistics.median(beside) / statistics.median(alone), 2)}))
PY
    bench_stop
done
