#!/usr/bin/env bash
# tests/test_models.sh GPT2D [CASE...]: several checkpoints in one daemon
# (issue 36): `model = DIR,NAME=DIR...` serves each under its name, the
# request's model picks one on every route, and each answers with the same
# bits as a server of that checkpoint alone, in any mix of concurrent
# requests; the prefix cache never crosses checkpoints; /v1/models and
# /metrics (the model label) name each; start-up refuses what cannot be
# served together with one line; a change to any checkpoint's file drains
# and exits 3; SIGHUP names a changed list as needing a restart; steps go to
# the checkpoints in turn; the OpenAI Node client selects them. Each case is
# a function case_NAME (tests/lib/cases.sh); `--list` lists them.
set -euo pipefail
gpt2d=$(realpath "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-models-XXXXXX)
. "$here/lib/cases.sh"
. "$here/lib/server.sh"
cleanup() { srv_stop_all; rm -rf "$dir"; }
trap cleanup EXIT
tiny="$here/../models/gpt2d-tiny"

# The checkpoints: the trained gpt2d-tiny (BF16, panel64), its q8 copy, and
# a random synth one of another shape (2 layers, width 64, context 128).
fixture_ckpts() {
    [ -f "$dir/q8/model.safetensors" ] && return 0
    mkdir -p "$dir/q8"
    "$gpt2d" convert "$tiny/model.safetensors" "$dir/q8/model.safetensors" --dtype q8 > /dev/null
    cp "$tiny/vocab.json" "$tiny/merges.txt" "$tiny/config.json" "$dir/q8/"
    srv_model "$dir/rand" tiny > /dev/null
}

# Every answer of the three-checkpoint server equals the answer of a server
# of that checkpoint alone (tokens, logprobs and their alternatives), for
# completions, chat, embeddings, streamed or whole, greedy and sampled,
# with the requests to all three running at once.
fixture_three() {
    fixture_ckpts
    srv_start alone_tiny "$tiny" --kv-cache-mb 64
    base_tiny=$base
    srv_start alone_q8 "$dir/q8" --kv-cache-mb 64 --model-name tiny-q8
    base_q8=$base
    srv_start alone_rand "$dir/rand" --kv-cache-mb 64 --model-name rand
    base_rand=$base
    srv_start three "$tiny,tiny-q8=$dir/q8,$dir/rand" --kv-cache-mb 96
    three_pid=$last_pid
}
case_same_bits() {
/usr/bin/python3 - "$base" "$base_tiny" "$base_q8" "$base_rand" <<'PY'
import json, sys, threading, urllib.request, urllib.error
three, alone = sys.argv[1], dict(zip(["gpt2d-tiny", "tiny-q8", "rand"], sys.argv[2:5]))
def call(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
def strip(status, text, stream):
    """The parts that must be equal: choices (or data), without ids and times."""
    if stream:
        events = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: {")]
        return status, [(e.get("model"), e.get("choices")) for e in events]
    o = json.loads(text)
    for k in ("id", "created", "system_fingerprint"):
        o.pop(k, None)
    if "usage" in o:
        o["usage"].pop("prompt_tokens_details", None)
        o["usage"].pop("timings", None)
    return status, o
jobs = []
for m in alone:
    for i, seed in enumerate([1, 2, 3]):
        jobs.append((m, "/v1/completions", {"model": m, "prompt": "The history of the river %d" % i, "max_tokens": 24,
                                           "temperature": 0.9, "seed": seed, "logprobs": 3}))
        jobs.append((m, "/v1/completions", {"model": m, "prompt": "Once upon a time %d" % i, "max_tokens": 20,
                                           "temperature": 0, "stream": True, "logprobs": 2, "echo": i == 0}))
    jobs.append((m, "/v1/chat/completions", {"model": m, "messages": [{"role": "user", "content": "How are you?"}],
                                            "max_tokens": 16, "temperature": 0.7, "seed": 5, "n": 2}))
    jobs.append((m, "/v1/embeddings", {"model": m, "input": ["one text", "another text"]}))
want = [strip(*call(alone[m], p, b), b.get("stream", False)) for m, p, b in jobs]
for w, (m, p, b) in zip(want, jobs):
    assert w[0] == 200, (m, p, w)
got = [None] * len(jobs)
def run(i):
    m, p, b = jobs[i]
    got[i] = strip(*call(three, p, b), b.get("stream", False))
for rnd in range(2):  # twice: the second round starts from the prefix cache
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in ts: t.start()
    for t in ts: t.join()
    for i, (w, g) in enumerate(zip(want, got)):
        assert w == g, "round %d, %s %s: alone %s\nbeside the others %s" % (rnd, jobs[i][0], jobs[i][1], w, g)
texts = {m: json.loads(call(three, "/v1/completions", {"model": m, "prompt": "Hello", "max_tokens": 12, "temperature": 0})[1])["choices"][0]["text"] for m in alone}
assert len(set(texts.values())) >= 2, texts
print("same bits: %d requests, twice, three checkpoints at once" % len(jobs))
PY
}

# What the server says about each checkpoint, and where they differ.
case_models_listed() {
/usr/bin/python3 - "$base" <<'PY'
import json, re, sys, urllib.request, urllib.error
base = sys.argv[1]
def call(path, body=None):
    req = urllib.request.Request(base + path, json.dumps(body).encode() if body is not None else None,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
st, t = call("/v1/models")
data = json.loads(t)["data"]
assert [m["id"] for m in data] == ["gpt2d-tiny", "tiny-q8", "rand"], data
assert [m["dtype"] for m in data] == ["bf16", "q8", "f32"], data
assert [m["max_model_len"] for m in data] == [512, 512, 128], data
assert data[2]["weights"] == "random" and data[0]["weights"] == "trained", data
st, t = call("/v1/models/rand")
assert st == 200 and json.loads(t)["id"] == "rand", t
st, t = call("/v1/models/nope")
assert st == 404 and "serves 'gpt2d-tiny' and other checkpoints (GET /v1/models)" in t, t
st, t = call("/v1/completions", {"model": "nope", "prompt": "x"})
assert st == 404 and json.loads(t)["error"]["code"] == "model_not_found", t
# Each checkpoint's own limits: rand's context is 128 positions.
st, t = call("/v1/completions", {"model": "rand", "prompt": "x " * 100, "max_tokens": 60})
assert st == 400 and "context" in t, t
st, t = call("/v1/completions", {"model": "rand", "prompt": "x " * 100, "max_tokens": 20})
assert st == 200, t
st, t = call("/v1/completions", {"model": "gpt2d-tiny", "prompt": "x " * 100, "max_tokens": 60})
assert st == 200, t
st, t = call("/v1/embeddings", {"model": "rand", "input": "x", "dimensions": 64})
assert st == 200 and len(json.loads(t)["data"][0]["embedding"]) == 64, t
st, t = call("/v1/embeddings", {"model": "rand", "input": "x", "dimensions": 128})
assert st == 400 and "width, 64" in t, t
st, t = call("/v1/embeddings", {"model": "gpt2d-tiny", "input": "x", "dimensions": 128})
assert st == 200, t
# The prefix cache never crosses checkpoints: a prompt cached under one is
# computed whole under another.
P = {"prompt": "A prompt long enough to fill two blocks of the cache: " * 3, "max_tokens": 1}
cached = lambda m: json.loads(call("/v1/completions", dict(P, model=m))[1])["usage"]["prompt_tokens_details"]["cached_tokens"]
assert cached("gpt2d-tiny") == 0
assert cached("gpt2d-tiny") > 0
assert cached("tiny-q8") == 0
assert cached("tiny-q8") > 0
# /metrics: the scheduler's families by model, the requests by model.
st, t = call("/metrics")
for m in ("gpt2d-tiny", "tiny-q8", "rand"):
    for fam in ("gpt2d_running_sequences", "gpt2d_kv_blocks_capacity", "gpt2d_steps_total",
                "gpt2d_prefix_cache_lookups_total", "gpt2d_model_requests_total", "gpt2d_model_weight_bytes"):
        assert re.search(r'^%s\{model="%s"\} \d+$' % (fam, m), t, re.M), (fam, m)
    assert int(re.search(r'^gpt2d_steps_total\{model="%s"\} (\d+)$' % m, t, re.M).group(1)) > 0, m
assert not re.search(r"^gpt2d_running_sequences ", t, re.M)
req = {m: int(re.search(r'^gpt2d_model_requests_total\{model="%s"\} (\d+)$' % m, t, re.M).group(1)) for m in ("tiny-q8", "rand")}
assert req["tiny-q8"] >= 2 and req["rand"] >= 3, req
# The KV budget split so that each holds the same positions: blocks of
# gpt2d-tiny (6 layers, width 128) and tiny-q8 equal, rand's (2 x 64) 6x as many.
cap = {m: int(re.search(r'^gpt2d_kv_blocks_capacity\{model="%s"\} (\d+)$' % m, t, re.M).group(1)) for m in ("gpt2d-tiny", "tiny-q8", "rand")}
assert cap["gpt2d-tiny"] == cap["tiny-q8"] and abs(cap["rand"] - cap["gpt2d-tiny"]) <= 1, cap
print("listed, limits, prefix cache and metrics by checkpoint:", cap)
PY
grep -q "info model tiny-q8: $dir/q8, 6 layers, width 128, q8 weights; KV" "$dir/three.log" || fail "no start-up line for tiny-q8"
}

# Steps go to the checkpoints in turn: while 6 long streams keep
# gpt2d-tiny busy, short requests to rand finish long before them.
case_turns() {
GPT2D_TEST_STEP_DELAY_MS=5 srv_start turns "$tiny,$dir/rand" --kv-cache-mb 64
/usr/bin/python3 - "$base" <<'PY'
import json, sys, threading, time, urllib.request
base = sys.argv[1]
def call(body):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)
done = []
def long(i):
    call({"model": "gpt2d-tiny", "prompt": "Story %d:" % i, "max_tokens": 150, "ignore_eos": True})
    done.append(i)
ts = [threading.Thread(target=long, args=(i,)) for i in range(6)]
for t in ts: t.start()
time.sleep(0.3)
for k in range(3):
    r = call({"model": "rand", "prompt": "Hi %d" % k, "max_tokens": 20, "ignore_eos": True})
    assert r["usage"]["completion_tokens"] == 20, r
assert done == [], "the long streams to gpt2d-tiny ended before three short ones to rand: %s" % done
for t in ts: t.join()
print("turns: rand's requests finished while gpt2d-tiny's 6 streams ran")
PY
}

# Start-up refuses what cannot be served together, with one line each.
case_refused() {
mkdir -p "$dir/badvocab" "$dir/v600"
cp "$dir/rand/model.safetensors" "$dir/rand/merges.txt" "$dir/badvocab/"
sed 's/"!": 0/"!": 0 /' "$dir/rand/vocab.json" > "$dir/badvocab/vocab.json"
"$gpt2d" synth "$dir/v600/model.safetensors" --layers 1 --embd 32 --heads 2 --ctx 64 --vocab 600 > /dev/null
check() { # WANT_STATUS WANT_TEXT MODEL [OPTS...]
    local want=$1 text=$2 model=$3 rc=0
    shift 3
    timeout 60 "$gpt2d" serve --model "$model" --port 0 --kv-cache-mb 16 "$@" > "$dir/refused.log" 2>&1 || rc=$?
    [ "$rc" = "$want" ] && grep -qF -- "$text" "$dir/refused.log" || fail "--model $model: status $rc, want $want and '$text': $(tail -3 "$dir/refused.log")"
}
check 1 "model badvocab: $dir/badvocab: its vocab.json differs from the model's" "$tiny,$dir/badvocab"
check 1 "model v600: its vocabulary has 600 tokens, the first model's 50257" "$tiny,$dir/v600"
check 1 "model nothere: " "$tiny,nothere=$dir/nowhere"
check 2 "model: the name 'gpt2d-tiny' is taken" "$tiny,gpt2d-tiny=$dir/rand" --model-name gpt2d-tiny
check 1 "model: the name 'gpt2d-tiny' is the first checkpoint's" "$tiny,gpt2d-tiny=$dir/rand"
check 2 "model: the name 'rand' is taken" "$tiny,$dir/rand,$dir/rand"
check 1 "model: the name 'gpt2d-tiny' is the first checkpoint's" "$tiny,$tiny"
check 2 "model: the name 'pirate' is taken" "$tiny,pirate=$dir/rand" --lora-modules "pirate=$here/../models/gpt2d-tiny-pirate"
check 2 "model: 'a b' is not a checkpoint's name" "$tiny,a b=$dir/rand"
check 2 "model: more than 8 checkpoints" "$tiny$(for i in 1 2 3 4 5 6 7 8; do printf ',m%d=%s' "$i" "$dir/rand"; done)"
check 2 "model: an empty entry" "$tiny,,$dir/rand"
check 2 "the first checkpoint is named by model_name" "first=$tiny,$dir/rand"
}

# A change to the second checkpoint's file drains the server, which exits 3
# (systemd restarts it on the new file); the line names the checkpoint, and
# the restarted server's system_fingerprint differs.
case_watch() {
cp -r "$dir/rand" "$dir/rand2"
srv_start watch "$tiny,r2=$dir/rand2" --kv-cache-mb 64
fp_of() { curl -s "$base/v1/completions" -H 'Content-Type: application/json' -d '{"model": "r2", "prompt": "a", "max_tokens": 1}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["system_fingerprint"])'; }
fp=$(fp_of)
"$gpt2d" synth "$dir/new.safetensors" --layers 2 --embd 64 --heads 4 --ctx 128 --seed 9 > /dev/null
sleep 1.5 # the digest of the file as loaded
mv "$dir/new.safetensors" "$dir/rand2/model.safetensors"
rc=0
timeout 20 tail --pid="$last_pid" -f /dev/null || true
wait "$last_pid" || rc=$?
[ "$rc" = 3 ] || fail "exit status $rc after the second checkpoint's file changed"
grep -q "error the model file $dir/rand2/model.safetensors (r2) changed under the running server" "$dir/watch.log" || fail "no line naming r2"
# Restarted on the new file: system_fingerprint says its weights changed.
srv_start watch2 "$tiny,r2=$dir/rand2" --kv-cache-mb 64
[ "$(fp_of)" != "$fp" ] || fail "system_fingerprint $fp unchanged after r2's weights changed"
}

# SIGHUP with another list of checkpoints: kept, and named as needing a restart.
case_sighup() {
printf 'model = %s,%s\n' "$tiny" "$dir/rand" > "$dir/m.conf"
srv_start hup "$tiny" --config "$dir/m.conf" --kv-cache-mb 64
printf 'model = %s,%s,other=%s\n' "$tiny" "$dir/rand" "$dir/q8" > "$dir/m.conf"
kill -HUP "$last_pid"
for _ in $(seq 50); do grep -q "needs a restart (the running checkpoints are kept): model's other checkpoints" "$dir/hup.log" && break; sleep 0.1; done
grep -q "needs a restart (the running checkpoints are kept): model's other checkpoints" "$dir/hup.log" || fail "no restart line"
ids=$(curl -s "$base/v1/models" | python3 -c 'import json,sys; print(" ".join(m["id"] for m in json.load(sys.stdin)["data"]))')
[ "$ids" = "gpt2d-tiny rand" ] || fail "after SIGHUP: $ids"
}

# The draft model drafts for the first checkpoint only: the server's
# speculative_drafter = draft_model is prompt lookup for the others, and a
# request naming draft_model for another is a 400 that says so.
case_draft() {
srv_start draft "$tiny,$dir/rand" --kv-cache-mb 64 --draft-model "$dir/q8" --speculative-drafter draft_model
/usr/bin/python3 - "$base" <<'PY'
import json, sys, urllib.request, urllib.error
base = sys.argv[1]
def call(body):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
st, o = call({"model": "rand", "prompt": "Hello there", "max_tokens": 8, "temperature": 0})
assert st == 200 and o["usage"]["completion_tokens"] == 8, o
st, o = call({"model": "gpt2d-tiny", "prompt": "Hello there", "max_tokens": 8, "temperature": 0,
              "speculative_drafter": "draft_model"})
assert st == 200, o
st, o = call({"model": "rand", "prompt": "Hello there", "max_tokens": 8, "speculative_drafter": "draft_model"})
assert st == 400 and "drafts for 'gpt2d-tiny' only, not 'rand'" in o["error"]["message"], o
print("draft model: the first checkpoint's only")
PY
}

# The playground's model picker (headless chromium).
case_playground() {
[ -x /usr/bin/chromium ] || [ -x /usr/bin/chromium-browser ] ||
    skip "no chromium (scripts/setup.sh --test installs Debian's)"
need_node_module puppeteer-core
srv_start ui "$tiny,$dir/rand" --kv-cache-mb 64 --lora-modules "pirate=$here/../models/gpt2d-tiny-pirate"
node "$here/differential/playground_models.mjs" "$base" "${shots:-$dir}/playground-models.png" || fail "playground"
}

# What belongs to the primary stays the primary's, and a request's limits
# are its checkpoint's: with speculative_drafter = draft_model, another
# checkpoint's requests (which have no draft model) draft by lookup, and
# asking it for draft_model is a 400 naming the field; /v1/responses'
# truncation cuts to the picked checkpoint's context (rand: 128), inline
# and for a large body parsed off the loop (its format compiled once).
case_picked_limits() {
mkdir -p "$dir/draft"
"$gpt2d" synth "$dir/draft/model.safetensors" --layers 1 --embd 64 --heads 4 --ctx 512 > /dev/null
cp "$tiny/vocab.json" "$tiny/merges.txt" "$dir/draft/"
srv_start picked "$tiny,$dir/rand" --kv-cache-mb 64 --draft-model "$dir/draft" --speculative-drafter draft_model
/usr/bin/python3 - "$base" <<'PY'
import json, sys, urllib.request, urllib.error
base = sys.argv[1]
def call(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
for m in ("rand", "gpt2d-tiny"):
    st, t = call("/v1/completions", {"model": m, "prompt": "Hello there", "max_tokens": 8})
    assert st == 200, (m, t)
    st, t = call("/v1/embeddings", {"model": m, "input": "Hello there"})
    assert st == 200, (m, t)
st, t = call("/v1/completions", {"model": "gpt2d-tiny", "prompt": "Hi", "max_tokens": 8, "speculative_drafter": "draft_model"})
assert st == 200, t
st, t = call("/v1/completions", {"model": "rand", "prompt": "Hi", "max_tokens": 8, "speculative_drafter": "draft_model"})
assert st == 400 and json.loads(t)["error"]["param"] == "speculative_drafter" and "drafts for 'gpt2d-tiny' only" in t, t
for words in (40, 3000):  # inline, and a body over 64 KiB
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * words} for i in range(6)]
    msgs.append({"role": "user", "content": "word " * 40})
    for m, n_ctx in (("rand", 128), ("gpt2d-tiny", 512)):
        st, t = call("/v1/responses", {"model": m, "input": msgs, "truncation": "auto", "max_output_tokens": 8, "store": False})
        assert st == 200, (m, words, t)
        u = json.loads(t)["usage"]
        assert u["input_tokens"] + 8 <= n_ctx, (m, words, u)
    st, t = call("/v1/responses", {"model": "rand", "input": msgs, "max_output_tokens": 8, "store": False})
    assert st == 400 and json.loads(t)["error"]["param"] == "input" and "context is 128 tokens" in t, (words, t)
    # A format: compiled once though the prompt is made on a second trip.
    fmt = {"type": "json_schema", "name": "a", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}}
    st, t = call("/v1/responses", {"model": "rand", "input": msgs, "truncation": "auto", "max_output_tokens": 12, "store": False, "text": {"format": fmt}})
    assert st == 200, (words, t)
print("picked limits: lookup drafts and rand's context on responses")
PY
# Stopped cleanly (a sanitizer build: nothing leaked).
kill -TERM "$last_pid"
rc=0
wait "$last_pid" || rc=$?
[ "$rc" = 0 ] && ! grep -q "LeakSanitizer" "$dir/picked.log" || fail "exit status $rc: $(grep -A3 LeakSanitizer "$dir/picked.log" | head -5)"
}

# The OpenAI Node client lists and selects the checkpoints by model.
case_clients() {
need_node_module openai
node "$here/differential/openai_models.mjs" "$base/v1" || fail "models clients"
}

CASES=(same_bits:three models_listed:three clients:three turns:ckpts draft:ckpts picked_limits:ckpts refused:ckpts watch:ckpts sighup:ckpts playground:ckpts)
run_cases "$@"
