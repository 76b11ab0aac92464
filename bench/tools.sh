#!/usr/bin/env bash
# bench/tools.sh BUILD [ROUNDS] [DTYPE]: a forced tool call against the same
# JSON under response_format, per token. On one GPT-2-small-shaped
# checkpoint (DTYPE f32 by default), per round and alternating: 6 chat
# requests with tool_choice required (one tool whose parameters are the
# schema below), then 6 with response_format json_schema of that schema,
# each max_tokens 96, seeds 1-6; their completion tokens per second of wall
# time, one request at a time. Prints a JSON line per round with the ratio
# tool / format (aim >= 0.95: the call costs no more per token than the
# format).
set -euo pipefail
build=${1:?usage: bench/tools.sh BUILD [ROUNDS] [DTYPE]}
rounds=${2:-3}
dtype=${3:-f32}
. "$(dirname "$0")/lib.sh"
bench_setup tools "$build"
model=$dir
if [ "$dtype" != f32 ]; then
    mkdir -p "$dir/$dtype"
    "$build/server/gpt2d" convert "$dir/model.safetensors" "$dir/$dtype/model.safetensors" --dtype "$dtype" > /dev/null
    cp "$dir/vocab.json" "$dir/merges.txt" "$dir/config.json" "$dir/$dtype/"
    model=$dir/$dtype
fi
bench_serve "$build" "$model"
python3 - "$base" "$rounds" <<'PY'
import json, sys, time, urllib.request
base, rounds = sys.argv[1], int(sys.argv[2])
schema = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 40}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "unit": {"enum": ["celsius", "fahrenheit"]}, "hourly": {"type": "boolean"}},
    "required": ["city", "days", "unit", "hourly"], "additionalProperties": False}
msgs = [{"role": "user", "content": "What will the weather be in Lisbon next week?"}]
tool = {"messages": msgs, "tool_choice": "required", "max_tokens": 96,
        "tools": [{"type": "function", "function": {"name": "forecast", "parameters": schema}}]}
fmt = {"messages": msgs, "max_tokens": 96,
       "response_format": {"type": "json_schema", "json_schema": {"name": "forecast", "schema": schema}}}
def run(body):
    toks, secs = 0, 0.0
    for seed in range(1, 7):
        req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(dict(body, seed=seed)).encode(),
                                     {"Content-Type": "application/json"})
        t0 = time.monotonic()
        with urllib.request.urlopen(req, timeout=300) as r:
            d = json.load(r)
        secs += time.monotonic() - t0
        toks += d["usage"]["completion_tokens"]
    return toks / secs, toks
run(tool); run(fmt)  # warm-up: the compiled formats are cached after this
for rnd in range(1, rounds + 1):
    t, tn = run(tool)
    f, fn = run(fmt)
    print(json.dumps({"round": rnd, "tool_tok_s": round(t, 1), "tool_tokens": tn,
                      "format_tok_s": round(f, 1), "format_tokens": fn, "ratio": round(t / f, 3)}))
PY
