#!/usr/bin/env bash
# tests/test_lora_api.sh GPT2D [CASE...]: LoRA adapters through the server
# (issue 36), on the trained models/gpt2d-tiny and its two adapters
# (models/gpt2d-tiny-pirate, -formal): chosen by a request's model on every
# generation route, listed by /v1/models, loaded and unloaded at run time
# under lora_dir (the path checks, the limits, an unload under a running
# stream), lora_modules again on SIGHUP, the routes off without lora_dir,
# and the OpenAI Node client selecting adapters. Each case is a function
# case_NAME; name cases to run only those, `--list` lists them
# (tests/lib/cases.sh). A missing npm package skips what needs it (exit 77
# at the end), and fails with GPT2D_REQUIRE_ALL=1 or CI.
set -euo pipefail
gpt2d=$(realpath "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-lora-api-XXXXXX)
. "$here/lib/cases.sh"
. "$here/lib/server.sh"
cleanup() { srv_stop_all; rm -rf "$dir"; }
trap cleanup EXIT
auth=(-H 'Authorization: Bearer test-key-123')

# LoRA adapters (issue 36) on the trained models/gpt2d-tiny with its two
# adapters: pirate from lora_modules, formal loaded at run time by POST
# /v1/load_lora_adapter under lora_dir. The model field picks them on
# completions, chat, responses and embeddings (plain, or "<base>:<name>");
# /v1/models lists them with parent; the base and both adapters answer
# differently; the load route's refusals: a symbolic link out of lora_dir,
# "..", an adapter file linked out, a missing folder, a bad or taken name,
# max_lora_rank (a rank-16 adapter) and max_loras, the API key; the prefix
# cache keeping each adapter's prompts apart (cached_tokens); unloading
# while a stream uses the adapter lets the stream finish; the adapters'
# metrics; and the routes are 404 where lora_dir is unset.
fixture_lora() {
    mkdir -p "$dir/loras/sub"
    cp -r "$here/../models/gpt2d-tiny-formal" "$dir/loras/formal"
    cp -r "$here/../models/gpt2d-tiny-formal" "$dir/loras/sub/formal2"
    ln -s "$here/../models/gpt2d-tiny-pirate" "$dir/loras/outside"
    mkdir -p "$dir/loras/linked"
    ln -s "$here/../models/gpt2d-tiny-formal/adapter_config.json" "$dir/loras/linked/adapter_config.json"
    cp "$here/../models/gpt2d-tiny-formal/adapter_model.safetensors" "$dir/loras/linked/"
    /usr/bin/python3 - "$dir/loras/r16" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
r, C, L = 16, 128, 6
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 16, "bias": "none",
           "fan_in_fan_out": True, "target_modules": ["c_attn"]}, open(os.path.join(d, "adapter_config.json"), "w"))
hdr, off = {}, 0
for l in range(L):
    for ab, shape in (("A", [r, C]), ("B", [3 * C, r])):
        n = shape[0] * shape[1] * 4
        hdr[f"base_model.model.transformer.h.{l}.attn.c_attn.lora_{ab}.weight"] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
        off += n
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(os.path.join(d, "adapter_model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + bytes(off))
PY
    # 10 ms a step: a stream of 60 tokens is still running when it is unloaded.
    GPT2D_TEST_STEP_DELAY_MS=10 srv_start lora "$here/../models/gpt2d-tiny" --kv-cache-mb 64 --api-key test-key-123 \
        --lora-modules "pirate=$here/../models/gpt2d-tiny-pirate" --lora-dir "$dir/loras" \
        --max-loras 3 --max-lora-rank 8
}
case_lora() {
/usr/bin/python3 - "$base" "$dir" <<'PY'
import json, sys, threading, time, urllib.request, urllib.error
base, d = sys.argv[1:3]
H = {"Authorization": "Bearer test-key-123", "Content-Type": "application/json"}
def call(path, body=None, headers=H):
    req = urllib.request.Request(base + path, json.dumps(body).encode() if body is not None else None, headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
st, m = call("/v1/models")
ids = [x["id"] for x in m["data"]]
assert st == 200 and ids == ["gpt2d-tiny", "pirate"], m
assert m["data"][1]["parent"] == "gpt2d-tiny" and m["data"][1]["rank"] == 8, m["data"][1]
P = "Hello, my friend. The weather today"
def text(model, **kw):
    st, c = call("/v1/completions", dict(model=model, prompt=P, max_tokens=24, temperature=0, **kw))
    assert st == 200 and c["model"] == model.split(":")[-1], (model, st, c)  # the adapter's plain name
    return c["choices"][0]["text"]
# Loads: relative to lora_dir, refusals first.
load = lambda body, h=H: call("/v1/load_lora_adapter", body, h)
for body, why in (({"lora_name": "x", "lora_path": "outside"}, "symlink out"),
                  ({"lora_name": "x", "lora_path": d + "/loras/outside"}, "symlink out, absolute"),
                  ({"lora_name": "x", "lora_path": "sub/../../loras/../" + d.rsplit("/", 1)[1] + "/../.."}, ".."),
                  ({"lora_name": "x", "lora_path": "../loras/../.."}, "../"),
                  ({"lora_name": "x", "lora_path": "linked"}, "adapter_config.json linked out"),
                  ({"lora_name": "x", "lora_path": "missing"}, "no such folder"),
                  ({"lora_name": "x y", "lora_path": "formal"}, "bad name"),
                  ({"lora_name": "gpt2d-tiny", "lora_path": "formal"}, "the base's name"),
                  ({"lora_name": "pirate", "lora_path": "formal"}, "taken"),
                  ({"lora_name": "big", "lora_path": "r16"}, "rank 16 > max_lora_rank 8"),
                  ({"lora_name": "x"}, "no lora_path")):
    st, e = load(body)
    assert st == 400 and "error" in e, (why, st, e)
    print("refused (%s): %s" % (why, e["error"]["message"]))
st, e = load({"lora_name": "formal", "lora_path": "formal"}, {"Content-Type": "application/json"})
assert st == 401, (st, e)
st, ok = load({"lora_name": "formal", "lora_path": "formal"})
assert st == 200 and ok["rank"] == 8 and "added successfully" in ok["message"], ok
st, ok = load({"lora_name": "formal2", "lora_path": d + "/loras/sub/formal2"})
assert st == 200, ok
st, e = load({"lora_name": "f3", "lora_path": "formal"})
assert st == 400 and "max_loras" in e["error"]["message"], e
st, m = call("/v1/models")
assert [x["id"] for x in m["data"]] == ["gpt2d-tiny", "pirate", "formal", "formal2"], m
st, one = call("/v1/models/formal")
assert st == 200 and one["parent"] == "gpt2d-tiny", one
t = {name: text(name) for name in ("gpt2d-tiny", "pirate", "formal", "formal2")}
assert len({t["gpt2d-tiny"], t["pirate"], t["formal"]}) == 3, t
assert t["formal2"] == t["formal"], t
assert text("gpt2d-tiny:pirate") == t["pirate"]
st, e = call("/v1/completions", {"model": "nope", "prompt": P, "max_tokens": 1})
assert st == 404 and e["error"]["code"] == "model_not_found", e
# The prefix cache never crosses adapters: a 48-token prompt cached under
# the base is computed again under pirate (cached_tokens 0), then cached
# for pirate's next request.
long = " ".join(["word%d" % i for i in range(24)])
def cached(model):
    st, c = call("/v1/completions", {"model": model, "prompt": long, "max_tokens": 1})
    assert st == 200, c
    return c["usage"]["prompt_tokens_details"]["cached_tokens"]
assert cached("gpt2d-tiny") == 0 and cached("gpt2d-tiny") > 0
assert cached("pirate") == 0, "pirate took the base's cached blocks"
assert cached("pirate") > 0 and cached("formal") == 0
# Chat, responses and embeddings pick adapters too.
chats = {}
for name in ("gpt2d-tiny", "pirate", "formal"):
    st, c = call("/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "How is the sea?"}],
                                          "max_tokens": 24, "temperature": 0})
    assert st == 200 and c["model"] == name, c
    chats[name] = c["choices"][0]["message"]["content"]
assert len(set(chats.values())) == 3, chats
st, rr = call("/v1/responses", {"model": "pirate", "input": "How is the sea?", "max_output_tokens": 16, "temperature": 0})
assert st == 200 and rr["model"] == "pirate", rr
st, e1 = call("/v1/embeddings", {"model": "pirate", "input": P})
st2, e0 = call("/v1/embeddings", {"model": "gpt2d-tiny", "input": P})
assert st == st2 == 200 and e1["model"] == "pirate" and e1["data"][0]["embedding"] != e0["data"][0]["embedding"]
# Unload while a stream uses the adapter: the stream finishes as it began.
out, started = {}, threading.Event()
def stream():
    req = urllib.request.Request(base + "/v1/completions", json.dumps(
        {"model": "formal", "prompt": P, "max_tokens": 60, "temperature": 0, "ignore_eos": True, "stream": True}).encode(), H)
    with urllib.request.urlopen(req, timeout=60) as r:
        first = r.readline().decode()
        started.set()
        out["body"] = first + r.read().decode()
th = threading.Thread(target=stream)
th.start()
assert started.wait(30)
st, u = call("/v1/unload_lora_adapter", {"lora_name": "formal"})
assert st == 200 and "removed successfully" in u["message"] and u["in_use"] >= 1, u
th.join()
chunks = [json.loads(l[6:]) for l in out["body"].split("\n") if l.startswith("data: {")]
streamed = "".join(c["choices"][0]["text"] for c in chunks)
assert out["body"].rstrip().endswith("data: [DONE]") and streamed.startswith(t["formal"]), out["body"][-300:]
st, e = call("/v1/completions", {"model": "formal", "prompt": P, "max_tokens": 1})
assert st == 404, e
st, e = call("/v1/unload_lora_adapter", {"lora_name": "formal"})
assert st == 404, e
# Loaded again: the same text.
st, ok = load({"lora_name": "formal", "lora_path": "formal"})
assert st == 200 and text("formal") == t["formal"]
req = urllib.request.Request(base + "/metrics", None, H)
page = urllib.request.urlopen(req, timeout=10).read().decode()
assert 'gpt2d_lora_adapters 3' in page and 'gpt2d_lora_requests_total{adapter="pirate"}' in page, page[-2000:]
print("lora: ok", json.dumps(t))
PY
grep -q "LoRA adapter 'formal' loaded from $dir/loras/formal" "$dir/lora.log" || fail "no load line"
# max_lora_rank at start-up: a clear line, and no server.
set +e
"$gpt2d" serve --model "$here/../models/gpt2d-tiny" --port 0 --max-lora-rank 4 \
    --lora-modules "pirate=$here/../models/gpt2d-tiny-pirate" > "$dir/rank.out" 2> "$dir/rank.err"; rc=$?
set -e
[ "$rc" != 0 ] && grep -q "pirate: .*rank 8 is above max_lora_rank 4" "$dir/rank.err" || fail "rank at start-up: $rc $(cat "$dir/rank.err")"
}
# lora_modules again on SIGHUP: an adapter no longer listed is unloaded, a
# new one loaded (off the loop), a bad one logged and skipped; the model
# keeps serving throughout.
case_lora_reload() {
printf 'lora_modules = pirate=%s\n' "$here/../models/gpt2d-tiny-pirate" > "$dir/lora.conf"
srv_start reload "$here/../models/gpt2d-tiny" --kv-cache-mb 64 --config "$dir/lora.conf"
ids() { curl -s "$base/v1/models" | python3 -c 'import json,sys; print(" ".join(m["id"] for m in json.load(sys.stdin)["data"]))'; }
[ "$(ids)" = "gpt2d-tiny pirate" ] || fail "at start-up: $(ids)"
printf 'lora_modules = formal=%s, bad=%s\n' "$here/../models/gpt2d-tiny-formal" "$dir/nowhere" > "$dir/lora.conf"
kill -HUP "$last_pid"
for _ in $(seq 50); do [ "$(ids)" = "gpt2d-tiny formal" ] && break; sleep 0.1; done
[ "$(ids)" = "gpt2d-tiny formal" ] || fail "after SIGHUP: $(ids)"
grep -q "SIGHUP: LoRA adapter 'pirate' unloaded (no longer in lora_modules)" "$dir/reload.log" || fail "no unload line"
grep -q "SIGHUP: LoRA adapter 'bad' not loaded from $dir/nowhere" "$dir/reload.log" || fail "no line for the bad adapter"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "formal", "prompt": "Hello", "max_tokens": 4}')
[ "$code" = 200 ] || fail "formal after SIGHUP: $code"
}
# Without lora_dir, the run-time routes are off.
case_lora_off() {
srv_start off "$here/../models/gpt2d-tiny" --kv-cache-mb 64 --api-key test-key-123
for route in load_lora_adapter unload_lora_adapter; do
    code=$(curl -s -o "$dir/off.json" -w '%{http_code}' "$base/v1/$route" "${auth[@]}" -H 'Content-Type: application/json' \
        -d '{"lora_name": "x", "lora_path": "/tmp"}')
    [ "$code" = 404 ] && grep -q 'lora_dir is not set' "$dir/off.json" || fail "$route without lora_dir: $code $(cat "$dir/off.json")"
done
}
# The OpenAI Node client selects the adapters by model
# (tests/differential/openai_lora.mjs).
case_lora_clients() {
need_node_module openai
node "$here/differential/openai_lora.mjs" "$base/v1" test-key-123 || fail "lora clients"
}

CASES=(lora:lora lora_clients:lora lora_reload lora_off)
run_cases "$@"
