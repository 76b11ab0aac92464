#!/usr/bin/env bash
# tests/test_api.sh GPT2D [SCREENSHOT_DIR] [CASE...]: the API surface around
# completions: chat's fields against a live server and through the OpenAI
# client and LangChain's ChatOpenAI, chat templates (default, a file, none),
# model names, /v1/models/{id} with odd ids, /version, the playground page in
# headless chromium (keys on, CORS preflights, a copy on another origin),
# /metrics after traffic of every kind through promtool, the naming rules
# and docs/operations.md's table, what the server says it serves (a random
# and a trained-labelled checkpoint: the log, /v1/models through the OpenAI
# Node client, /version, the playground's header), the info line (and its
# silence when idle)
# and the access line, and the command line's --version and option mistakes
# on every subcommand. Each case is a function case_NAME; name cases to run
# only those, `--list` lists them (tests/lib/cases.sh). A missing promtool,
# chromium or npm package skips what needs it (exit 77 at the end), and
# fails with GPT2D_REQUIRE_ALL=1 (scripts/test.sh) or CI.
set -euo pipefail
gpt2d=$(realpath "$1")
shift
shots=
if [ $# -gt 0 ] && [ -d "$1" ]; then shots=$1; shift; fi
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-api-XXXXXX)
. "$here/lib/cases.sh"
. "$here/lib/server.sh"
cleanup() { srv_stop_all; rm -rf "$dir"; }
trap cleanup EXIT

srv_model "$dir/model" tiny
start() { srv_start "$1" "$dir/model" --kv-cache-mb 64 "${@:2}"; } # name, options... -> sets $port and $base
post() { curl -s -m 30 "$base$1" -H 'Content-Type: application/json' -d "$2"; }

# The default server: two model names, the default template, keys.
fixture_main() {
    start main --model-name gpt2,gpt-3.5-turbo-instruct,openai-community/gpt2 --api-key test-key-123 --info-interval 1
}
# Tools need room: their list alone is over the tiny model's 128 positions.
fixture_long() {
    srv_model "$dir/long" long
    srv_start long "$dir/long" --kv-cache-mb 64 --api-key test-key-123
}
auth=(-H 'Authorization: Bearer test-key-123')
v=$("$gpt2d" --version)

# ---- The command line ---------------------------------------------------------
# gpt2d --version, gpt2d version and gpt2d serve --version: one line, the
# same as /version's first three fields (checked below).
case_command_line() {
[[ "$v" =~ ^gpt2d\ [0-9][^\ ]*\ \([^,]+,\ [a-z]+\)$ ]] || fail "gpt2d --version: $v"
[ "$("$gpt2d" version)" = "$v" ] && [ "$("$gpt2d" serve --version)" = "$v" ] || fail "the version lines differ"
set +e
"$gpt2d" serve --foo > "$dir/foo.out" 2> "$dir/foo.err"; rc=$?
set -e
[ "$rc" = 2 ] || fail "serve --foo exit $rc"
grep -q "unknown option '--foo'" "$dir/foo.err" || fail "serve --foo: $(head -1 "$dir/foo.err")"
grep -q 'usage: gpt2d serve' "$dir/foo.err" || fail "serve --foo prints no usage"
# Every subcommand words a mistake the same way: an unknown option (with the
# usage), an option without its value, a bad value, a value for a flag.
cli() { # expected stderr line, args...
    local want=$1 rc; shift
    set +e
    "$gpt2d" "$@" < /dev/null > /dev/null 2> "$dir/cli.err"; rc=$?
    set -e
    [ "$rc" = 2 ] || fail "gpt2d $* exited $rc"
    [ "$(head -1 "$dir/cli.err")" = "$want" ] || fail "gpt2d $*: $(head -1 "$dir/cli.err") (want: $want)"
}
for cmd in serve generate convert inspect synth tokenize detokenize bench; do
    cli "gpt2d $cmd: unknown option '--foo'" "$cmd" --foo
    grep -q "^usage: gpt2d $cmd" "$dir/cli.err" || fail "gpt2d $cmd --foo prints no usage"
done
cli "gpt2d generate: --model needs a value" generate --model
cli "gpt2d synth: --layers needs a value" synth out --layers
cli "gpt2d synth: bad value for --layers: '0'" synth out --layers 0
cli "gpt2d bench: bad value for --threads: 'x'" bench --threads x
cli "gpt2d inspect: --json takes no value" inspect --json=1 file
cli "gpt2d detokenize: --jsonl is only for tokenize" detokenize --jsonl
cli "gpt2d bench: --model DIR is required" bench
cli "gpt2d convert: unknown option '-x'" convert -xy a b
# serve --help points at the model tools and lists the commands and the
# --no- form of every boolean.
"$gpt2d" serve --help > "$dir/help.out"
for want in gpt2d-download "gpt2d convert" --print-defaults --version --no-prefix-cache --no-ui; do
    grep -q -- "$want" "$dir/help.out" || fail "serve --help lacks $want"
done
# --model given a file: model.safetensors means its folder; another file is
# refused, saying what --model takes.
cli "gpt2d serve: model: $dir/help.out is a file; --model takes the folder that holds model.safetensors, vocab.json and merges.txt (gpt2d convert writes a model.safetensors)" \
    serve --model "$dir/help.out"
srv_start file "$dir/model/model.safetensors" --kv-cache-mb 64 --no-prefix-cache --api-key sk-file-789
# The start-up lines a person tries first: the playground and a curl line
# with the port bound, the key named but never written.
grep -q "the playground: http://127.0.0.1:$port/ " "$dir/file.log" || fail "no playground line"
grep -q "try: curl -s http://127.0.0.1:$port/v1/completions .*Bearer \$GPT2D_API_KEY" "$dir/file.log" ||
    fail "no curl line: $(grep try: "$dir/file.log")"
! grep -q "sk-file-789" "$dir/file.log" || fail "the API key is in the log"
# A port in use is said before the model loads (no "loading" line), exit 1.
set +e
"$gpt2d" serve --model "$dir/model" --port "$port" > "$dir/inuse.out" 2> "$dir/inuse.err"; rc=$?
set -e
[ "$rc" = 1 ] || fail "serve on a port in use exited $rc"
grep -q "port $port on 127.0.0.1 is in use" "$dir/inuse.err" || fail "port in use: $(cat "$dir/inuse.err")"
! grep -q "loading" "$dir/inuse.err" || fail "the model loaded before the port was checked"
[ "$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$base/health")" = 200 ] || fail "serve --model DIR/model.safetensors"
}

# ---- Chat templates: a bad file stops start-up naming its line ------------------
case_bad_template() {
printf 'user = "{content}"\nassistant = "no placeholder"\n' > "$dir/bad.tmpl"
set +e
"$gpt2d" serve --model "$dir/model" --port 0 --chat-template "$dir/bad.tmpl" > /dev/null 2> "$dir/tmpl.err"; rc=$?
set -e
[ "$rc" = 2 ] || fail "bad template exit $rc"
grep -q "chat_template: $dir/bad.tmpl:2: assistant must hold {content} exactly once" "$dir/tmpl.err" ||
    fail "bad template: $(cat "$dir/tmpl.err")"
}

case_model_ids() {
curl -s "${auth[@]}" "$base/v1/models/gpt-3.5-turbo-instruct" > "$dir/m1.json"
curl -s "${auth[@]}" -o "$dir/m2.json" -w '%{http_code}' "$base/v1/models/gpt-4" > "$dir/m2.code"
python3 - "$dir/m1.json" "$dir/m2.json" "$(cat "$dir/m2.code")" <<'PY' || fail "/v1/models/{id}"
import json, sys
m1, m2 = (json.load(open(p)) for p in sys.argv[1:3])
assert m1.pop("kernels") in ("avx512", "avx2", "portable"), m1  # an F32 model: the widening kernels
assert m1 == {"id": "gpt-3.5-turbo-instruct", "object": "model", "created": 0, "owned_by": "gpt2d", "dtype": "f32", "layout": "hf",
              "weights": "random", "description": "random weights: the text is nonsense", "max_model_len": 128}, m1
assert sys.argv[3] == "404" and m2["error"]["code"] == "model_not_found", (sys.argv[3], m2)
PY
# Odd ids: an id with a slash, sent as it is or percent-encoded (newer
# OpenAI SDKs encode path parameters), is found; a trailing slash or
# another path is another id (404 model_not_found); no id is no route.
for case in 'openai-community/gpt2 200 openai-community/gpt2' 'openai-community%2Fgpt2 200 openai-community/gpt2' \
            '%67pt2 200 gpt2' 'gpt2?x=1 200 gpt2' 'gpt2/ 404 model_not_found' 'gpt2/x 404 model_not_found' \
            'gpt%00 404 model_not_found' 'NONE 404 -'; do
    read -r id want what <<< "$case"
    [ "$id" != NONE ] || id=
    code=$(curl -s "${auth[@]}" -o "$dir/mid.json" -w '%{http_code}' "$base/v1/models/$id")
    got=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["id"] if "id" in d else (d["error"]["code"] or "-"))' "$dir/mid.json")
    [ "$code $got" = "$want $what" ] || fail "/v1/models/$id: $code $got (want $want $what)"
done
}

# No model, the first name, an alias: the same greedy text, reported as the first name.
case_model_names() {
for body in '{"prompt":"Hi","max_tokens":5,"temperature":0}' \
            '{"model":"gpt2","prompt":"Hi","max_tokens":5,"temperature":0}' \
            '{"model":"gpt-3.5-turbo-instruct","prompt":"Hi","max_tokens":5,"temperature":0}'; do
    curl -s "${auth[@]}" "$base/v1/completions" -d "$body" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["model"], json.dumps(d["choices"][0]["text"]))'
done > "$dir/names.txt"
[ "$(sort -u "$dir/names.txt" | wc -l)" = 1 ] || fail "model names: $(cat "$dir/names.txt")"
grep -q '^gpt2 ' "$dir/names.txt" || fail "the first name is not reported: $(cat "$dir/names.txt")"
}

# The chat prompt is the documented transcript: the same greedy text as the
# completion of that transcript, stopped at the next turn's marker.
case_chat_transcript() {
transcript='Be brief.\n\nUser: Hi there\n\nAssistant:'
curl -s "${auth[@]}" "$base/v1/completions" -d "{\"prompt\":\"$transcript\",\"max_tokens\":20,\"temperature\":0,\"stop\":[\"\\n\\nUser:\",\"\\nUser:\",\"\\n\\nAssistant:\",\"\\nAssistant:\"]}" > "$dir/tc.json"
curl -s "${auth[@]}" "$base/v1/chat/completions" -d '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}],"max_tokens":20,"temperature":0}' > "$dir/chat.json"
python3 - "$dir/tc.json" "$dir/chat.json" <<'PY' || fail "chat against the transcript"
import json, sys
tc, chat = (json.load(open(p)) for p in sys.argv[1:])
assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-"), chat
msg = chat["choices"][0]["message"]
assert msg["role"] == "assistant", msg
# trim_reply: the reply starts at its first word (spaces and empty lines
# before it dropped), and ends before white space still held for a stop
# string when the model ends its turn
text = tc["choices"][0]["text"]
held = 2 if text.endswith("\n\n") else 1 if text.endswith("\n") else 0  # a prefix of a stop
assert msg["content"] == text[:len(text) - held].lstrip(" \n\t\r"), (msg, tc["choices"][0])
assert chat["choices"][0]["finish_reason"] == tc["choices"][0]["finish_reason"], (chat, tc)
assert chat["usage"]["prompt_tokens"] == tc["usage"]["prompt_tokens"], (chat["usage"], tc["usage"])
PY
}

# Chat request fields against a live server, each against an independent
# expectation (the same server's completions, or another chat request).
case_chat_fields() {
python3 - "$base" test-key-123 <<'PY' || fail "chat fields"
import json, sys, urllib.error, urllib.request
base, key = sys.argv[1:]
def call(route, body):
    req = urllib.request.Request(base + route, json.dumps(body).encode(),
                                 {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read().decode()
            return r.status, raw if body.get("stream") else json.loads(raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
def chat(**kw):
    kw.setdefault("messages", [{"role": "user", "content": "Hi there"}])
    st, d = call("/v1/chat/completions", kw)
    assert st == 200, (kw, st, d)
    return d
def refused(param, **kw):
    kw.setdefault("messages", [{"role": "user", "content": "Hi"}])
    st, d = call("/v1/chat/completions", kw)
    assert st == 400 and d["error"]["param"] == param and d["error"]["type"] == "invalid_request_error", (kw, st, d)
def content(d, i=0):
    return d["choices"][i]["message"]["content"]
def ntok(text):
    return call("/tokenize", {"prompt": text})[1]["count"]
# n: two choices, indexed; a seed repeats both, another seed differs.
a = chat(n=2, seed=11, max_tokens=8, temperature=1, ignore_eos=True)
assert [c["index"] for c in a["choices"]] == [0, 1], a
assert a["usage"]["completion_tokens"] == 16, a["usage"]
b = chat(n=2, seed=11, max_tokens=8, temperature=1, ignore_eos=True)
assert [content(a, i) for i in (0, 1)] == [content(b, i) for i in (0, 1)], (a, b)
c = chat(n=2, seed=12, max_tokens=8, temperature=1, ignore_eos=True)
assert [content(a, i) for i in (0, 1)] != [content(c, i) for i in (0, 1)], (a, c)
# stop: the reply ends before the request's stop string, finish_reason stop.
g = content(chat(max_tokens=12, temperature=0, ignore_eos=True, stop=["\n\nUser:", "\nUser:", "\n\nAssistant:", "\nAssistant:"]))
cut = g[len(g) // 2:][:2]
s = chat(max_tokens=12, temperature=0, ignore_eos=True, stop=[cut])
assert len(g) >= 4 and content(s) == g[:g.index(cut)], (g, cut, s)
assert s["choices"][0]["finish_reason"] == "stop", s
# logit_bias: +100 on "," (11) makes every token a comma.
lb = chat(max_tokens=4, temperature=0, logit_bias={"11": 100})
assert content(lb) == ",,,," and lb["usage"]["completion_tokens"] == 4, lb
# max_completion_tokens, and over max_tokens; logprobs in chat's shape.
m = chat(max_completion_tokens=3, max_tokens=9, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=2)
assert m["usage"]["completion_tokens"] == 3 and m["choices"][0]["finish_reason"] == "length", m
lp = m["choices"][0]["logprobs"]["content"]
assert len(lp) == 3 and all(len(t["top_logprobs"]) == 2 and t["bytes"] == list(t["token"].encode()) for t in lp), lp
# Text parts are the string; a system message alone, an assistant turn
# last (a new reply follows it): prompts of the documented transcript.
p1 = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}], max_tokens=6, temperature=0)
p2 = chat(max_tokens=6, temperature=0)
assert content(p1) == content(p2) and p1["usage"]["prompt_tokens"] == p2["usage"]["prompt_tokens"], (p1, p2)
so = chat(messages=[{"role": "system", "content": "Be brief."}], max_tokens=2)
assert so["usage"]["prompt_tokens"] == ntok("Be brief.\n\nAssistant:"), so
al = chat(messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], max_tokens=2)
assert al["usage"]["prompt_tokens"] == ntok("User: Hi\n\nAssistant: Hello\n\nAssistant:"), al
# Streamed with n=2 and include_usage: each choice's role chunk, deltas
# and one finish, the usage last with the timings, then [DONE].
st, raw = call("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 3,
                                        "stream": True, "stream_options": {"include_usage": True}, "seed": 5})
events = [e[len("data: "):] for e in raw.split("\n\n") if e.startswith("data: ")]
assert st == 200 and events[-1] == "[DONE]", raw[-200:]
chunks = [json.loads(e) for e in events[:-1]]
assert all(c["object"] == "chat.completion.chunk" and "usage" in c for c in chunks), chunks
for i in (0, 1):
    mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
    assert mine[0]["delta"] == {"role": "assistant", "content": ""}, mine
    assert [x["finish_reason"] for x in mine].count("length") == 1 and mine[-1]["delta"] == {}, mine
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6, chunks[-1]
assert set(chunks[-1]["usage"]["timings"]) == {"ttft_ms", "total_ms", "completion_tokens_per_second"}, chunks[-1]
# Refused with a 400 naming the field.
refused("response_format", response_format={"type": "xml"})
refused("response_format.json_schema.schema",
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string", "format": "hostname"}}})
refused("tools", tools=[{"type": "web_search"}])
refused("tool_choice", tool_choice="required")
refused("function_call", function_call="sometimes")
refused("messages", messages=[])
refused("messages", messages=[{"role": "wizard", "content": "Hi"}])
refused("messages", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
refused("top_logprobs", logprobs=True, top_logprobs=6)
# Past the context: the error names the field the request used.
for field in ("max_tokens", "max_completion_tokens"):
    st, d = call("/v1/chat/completions", {"messages": [{"role": "user", "content": "w " * 100}], field: 100})
    assert st == 400 and d["error"]["code"] == "context_length_exceeded" and d["error"]["param"] == field, (field, st, d)
print("chat fields: ok")
PY
}

# The official OpenAI client and LangChain's ChatOpenAI.
case_chat_clients() {
need_node_module openai
need_node_module @langchain/openai
node "$here/differential/openai_chat.mjs" "$base/v1" test-key-123 || fail "chat clients"
}

# POST /v1/responses through the clients that send it by default: the
# OpenAI client, the AI SDK's openai(model), LangChain with useResponsesApi
# (tests/differential/openai_responses.mjs); then its access line and its
# route label in /metrics.
case_responses_clients() {
need_node_module openai
need_node_module ai
need_node_module @ai-sdk/openai
need_node_module @langchain/openai
node "$here/differential/openai_responses.mjs" "$base/v1" test-key-123 || fail "responses clients"
grep -q 'access POST /v1/responses status=200' "$dir/main.log" || fail "no access line for POST /v1/responses"
grep -q 'access GET /v1/responses/resp_[0-9a-f]*/input_items status=200' "$dir/main.log" ||
    fail "no access line for GET /v1/responses/{id}/input_items"
curl -s "${auth[@]}" "$base/metrics" > "$dir/resp.metrics"
grep -q '^gpt2d_requests_total{route="/v1/responses",status="200"} [1-9]' "$dir/resp.metrics" &&
    grep -q '^gpt2d_requests_total{route="/v1/responses/{id}",status="404"} [1-9]' "$dir/resp.metrics" ||
    fail "the /v1/responses route labels: $(grep responses "$dir/resp.metrics")"
}

# /version, and the info line while busy.
case_version() {
# Alone, this case makes the chat traffic the chat cases would have made.
grep -q 'access POST /v1/chat/completions status=200' "$dir/main.log" ||
    curl -s "${auth[@]}" "$base/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3}' > /dev/null
curl -s "$base/version" > "$dir/version.json"
python3 - "$dir/version.json" "$v" <<'PY' || fail "/version"
import json, sys
v = json.load(open(sys.argv[1]))
assert list(v) == ["version", "commit", "buildtype", "sanitize", "kernels", "model", "dtype", "layout", "tls", "scheme",
                   "owned_by", "weights", "description"], v
assert v["tls"] in ("gnutls", "none") and v["scheme"] == "http", v
assert v["owned_by"] == "gpt2d" and v["weights"] == "random" and v["description"] == "random weights: the text is nonsense", v
assert v["sanitize"] in ("none", "address", "thread", "undefined", "address,undefined", "memory"), v
assert v["kernels"] in ("avx512", "avx2", "portable") and v["model"] == "gpt2" and v["dtype"] == "f32" and v["layout"] == "hf", v
assert all(isinstance(x, str) and x for x in v.values()), v  # a description too, for a random checkpoint
assert sys.argv[2] == "gpt2d %s (%s, %s)" % (v["version"], v["commit"], v["buildtype"]), (sys.argv[2], v)
PY
grep -q 'info running [0-9]*, queued [0-9]*; prompt [0-9.]* tokens/s, generation [0-9.]* tokens/s; KV cache' "$dir/main.log" ||
    { sleep 1.2; grep -q 'info running' "$dir/main.log"; } || fail "no info line while busy"
grep -q 'access POST /v1/chat/completions status=200 .* ttft_ms=[0-9.]* tokens_per_s=[0-9.]*' "$dir/main.log" ||
    fail "access line without ttft_ms/tokens_per_s"
# An id only where the route gives the answer one: chat's chatcmpl-, not
# /health's or /v1/models' lines.
grep -q 'access POST /v1/chat/completions status=200 id=chatcmpl-[0-9a-f]* request_id=' "$dir/main.log" ||
    fail "no chatcmpl- id on the chat access line"
curl -s "$base/health" > /dev/null
sleep 0.2
grep -q 'access GET /health ' "$dir/main.log" || fail "no access line for GET /health"
! grep -E 'access GET /(health|v1/models) .* id=' "$dir/main.log" ||
    fail "an id on a route that gives none: $(grep -E 'access GET /(health|v1/models) .* id=' "$dir/main.log" | head -2)"
# Silent when idle: the interval's line after the last request, then none.
sleep 2.2
idle=$(grep -c 'info running' "$dir/main.log")
sleep 2.2
[ "$(grep -c 'info running' "$dir/main.log")" = "$idle" ] || fail "info lines while idle: $(grep 'info running' "$dir/main.log" | tail -3)"
}

# /metrics after traffic of every kind (a fresh page has few series):
# errors, a refused key, streams of both routes, prefix cache hits.
case_metrics() {
long=$(python3 -c 'print(" ".join(["word%d" % i for i in range(40)]))')
for _ in 1 2; do
    curl -s "${auth[@]}" "$base/v1/completions" -d "{\"prompt\":\"$long\",\"max_tokens\":2}" > /dev/null
done
curl -s "${auth[@]}" "$base/v1/completions" -d '{"prompt":"Hi","max_tokens":3,"stream":true}' > /dev/null
curl -s "${auth[@]}" "$base/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"stream":true}' > /dev/null
curl -s "${auth[@]}" "$base/v1/completions" -d '{"prompt":"Hi","temperature":9}' > /dev/null
curl -s "$base/v1/completions" -d '{"prompt":"Hi"}' > /dev/null
curl -s "${auth[@]}" "$base/nowhere" > /dev/null
curl -s "${auth[@]}" -H 'Origin: http://evil.example' "$base/v1/completions" -d '{"prompt":"Hi"}' > /dev/null
curl -s "${auth[@]}" "$base/v1/models/gpt-4" > /dev/null # model_ids' 404, for this case alone
curl -s -H 'Host: evil.example' "$base/health" > /dev/null # 421: a refusal's series
curl -s "$base/metrics" > "$dir/metrics.txt"
if command -v promtool > /dev/null; then
    promtool check metrics < "$dir/metrics.txt" > "$dir/promtool.out" 2>&1 || fail "promtool: $(cat "$dir/promtool.out")"
else
    # GPT2D_REQUIRE_ALL=1 (scripts/test.sh) or CI: the lint must run.
    skip_part "promtool is missing (scripts/setup.sh --test installs prometheus): the metrics lint was not run"
fi
# The conventions promtool does not check, the traffic's series, and
# docs/operations.md against the live families (both ways): a new metric
# without its line in the doc fails here.
python3 - "$dir/metrics.txt" "$here/../docs/operations.md" <<'PY' || fail "/metrics conventions or docs"
import re, sys
page = open(sys.argv[1]).read()
helps = dict(re.findall(r"^# HELP (\S+) (.+)$", page, re.M))
types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M))
assert set(helps) == set(types), set(helps) ^ set(types)
for name, kind in types.items():
    assert kind in ("counter", "gauge", "histogram"), (name, kind)
    assert (kind == "counter") == name.endswith("_total"), ("_total is for counters only", name, kind)
    assert not re.search(r"_(ms|milliseconds|us|kb|mb|kib|mib|percent|minutes|hours)(_|$)", name), ("base units only", name)
    if re.search(r"time|duration|latency", name):
        assert re.search(r"_seconds(_total)?$", name), ("a time in seconds", name)
    if "memory" in name:
        assert name.endswith("_bytes"), ("a size in bytes", name)
    assert name.startswith(("gpt2d_", "process_")), name
samples = {}
for line in page.splitlines():
    if line and not line.startswith("#"):
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})? (\S+)$', line)
        assert m, line
        fam = re.sub(r"_(bucket|sum|count)$", "", m.group(1)) if m.group(1) not in types else m.group(1)
        assert fam in types, ("a sample without HELP/TYPE", line)
        samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
def val(key):
    assert key in samples, key
    return samples[key]
for key in ('gpt2d_requests_total{route="/v1/completions",status="200"}',
            'gpt2d_requests_total{route="/v1/completions",status="400"}',
            'gpt2d_requests_total{route="/v1/completions",status="401"}',
            'gpt2d_requests_total{route="/v1/chat/completions",status="200"}',
            'gpt2d_requests_total{route="/v1/models/{id}",status="404"}',
            'gpt2d_requests_total{route="other",status="404"}',
            'gpt2d_requests_total{route="/v1/completions",status="403"}',
            "gpt2d_prefix_cache_hit_tokens_total", "gpt2d_steps_total",
            "gpt2d_completion_tokens_total", "gpt2d_time_to_first_token_seconds_count"):
    assert val(key) > 0, key
doc = open(sys.argv[2]).read()
sec = doc[doc.index("## Metrics and alerts"):]
sec = sec[:sec.index("\n## ", 3)]
documented = set(re.findall(r"`((?:gpt2d|process)_[a-z0-9_]+)", sec))
missing, stale = set(types) - documented, documented - set(types)
assert not missing, ("families /metrics writes that docs/operations.md does not document", sorted(missing))
assert not stale, ("families docs/operations.md documents that /metrics does not write", sorted(stale))
print("metrics: %d families, all documented, %d series" % (len(types), len(samples)))
PY
for m in process_cpu_seconds_total process_resident_memory_bytes process_open_fds process_max_fds process_start_time_seconds; do
    grep -q "^$m " "$dir/metrics.txt" || fail "/metrics has no $m"
done
}

# ---- chat_template = none: the chat route says where to go ----------------------
case_nochat() {
start nochat --chat-template none --ui false
code=$(curl -s -o "$dir/nochat.json" -w '%{http_code}' "$base/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}]}')
[ "$code" = 400 ] && grep -q '/v1/completions' "$dir/nochat.json" || fail "chat_template none: $code $(cat "$dir/nochat.json")"
code=$(curl -s -o "$dir/noresp.json" -w '%{http_code}' "$base/v1/responses" -d '{"input":"x"}')
[ "$code" = 400 ] && grep -q '"code":"chat_not_supported"' "$dir/noresp.json" ||
    fail "chat_template none, /v1/responses: $code $(cat "$dir/noresp.json")"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/")
[ "$code" = 404 ] || fail "--ui false still serves / ($code)"
}

# ---- A template file ----------------------------------------------------------
case_template() {
cat > "$dir/chatml.tmpl" <<'T'
# A ChatML-style template, as a fine-tuned checkpoint might have learnt.
system = "<|im_start|>system\n{content}<|im_end|>\n"
user = "<|im_start|>user\n{content}<|im_end|>\n"
assistant = "<|im_start|>assistant\n{content}<|im_end|>\n"
generation = "<|im_start|>assistant\n"
stop = "<|im_end|>"
trim_reply = false
T
start tmpl --chat-template "$dir/chatml.tmpl"
post /v1/completions '{"prompt":"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n","max_tokens":12,"temperature":0,"stop":"<|im_end|>"}' > "$dir/t1.json"
post /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":12,"temperature":0}' > "$dir/t2.json"
python3 - "$dir/t1.json" "$dir/t2.json" <<'PY' || fail "template file"
import json, sys
t1, t2 = (json.load(open(p)) for p in sys.argv[1:])
assert t2["choices"][0]["message"]["content"] == t1["choices"][0]["text"], (t1, t2)
PY
}

# ---- The playground, in headless chromium ----------------------------------------
# With keys on (the page asks for one) and a second origin: a page server
# for the cross-origin calls, listed in cors_origins.
case_playground() {
[ -x /usr/bin/chromium ] || [ -x /usr/bin/chromium-browser ] ||
    skip "no chromium (scripts/setup.sh --test installs Debian's)"
need_node_module puppeteer-core
mkdir -p "$dir/www" && echo '<!doctype html><title>elsewhere</title>' > "$dir/www/index.html"
python3 -u -m http.server 0 --bind 127.0.0.1 --directory "$dir/www" > "$dir/www.log" 2>&1 &
srv_pids+=($!)
for _ in $(seq 100); do
    oport=$(sed -n 's|.* port \([0-9]*\) .*|\1|p' "$dir/www.log")
    [ -n "$oport" ] && break
    sleep 0.1
done
[ -n "$oport" ] || fail "the page server did not start"
origin="http://127.0.0.1:$oport"
# Each step sleeps 20 ms, so a stream reaches the page in pieces at the
# source, whatever the browser's network throttling does (CI once saw a
# 64-token stream rendered in one piece under load).
GPT2D_TEST_STEP_DELAY_MS=20 start ui --api-key ui-key-456 --cors-origins "$origin"
# The chat route's preflight: answered for the listed origin, 403 for another.
curl -s -D "$dir/pre.h" -o /dev/null -X OPTIONS "$base/v1/chat/completions" -H "Origin: $origin" \
     -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type'
grep -q '^HTTP/1.1 204' "$dir/pre.h" && grep -qi "^Access-Control-Allow-Origin: $origin" "$dir/pre.h" &&
    grep -qi '^Access-Control-Allow-Headers: .*Authorization' "$dir/pre.h" &&
    grep -qi '^Access-Control-Allow-Methods: .*POST' "$dir/pre.h" || fail "chat preflight: $(cat "$dir/pre.h")"
code=$(curl -s -D "$dir/pre2.h" -o /dev/null -w '%{http_code}' -X OPTIONS "$base/v1/chat/completions" \
       -H 'Origin: http://evil.example' -H 'Access-Control-Request-Method: POST')
[ "$code" = 403 ] && ! grep -qi '^Access-Control-Allow-Origin' "$dir/pre2.h" || fail "chat preflight from a refused origin: $code"
curl -s "$base/" > "$dir/www/playground.html"   # the page, served elsewhere too
shot=${shots:-$dir}/playground.png
node "$here/differential/playground.mjs" "$base" "$shot" ui-key-456 "$origin" || fail "playground"
}
# ---- What the server says it serves -----------------------------------------------
# A checkpoint's own words (wformat.h: gpt2d.model_name, owned_by,
# description, weights) in the start-up log, /v1/models (as the OpenAI Node
# client reads it), /version and the playground's header: for a `gpt2d
# synth` checkpoint (random weights: said everywhere) and one carrying a
# trained model's metadata, set by synth --meta and kept by convert to the
# served bf16 panel64 layout, as the embedded gpt2d-tiny is.
case_model_labels() {
desc="gpt2d-tiny: a small model trained by the gpt2d project on test text; not OpenAI's GPT-2"
mkdir -p "$dir/trained/raw"
"$gpt2d" synth "$dir/trained/raw/model.safetensors" --layers 2 --embd 64 --heads 2 --ctx 128 \
    --meta gpt2d.model_name=gpt2d-tiny --meta gpt2d.owned_by=gpt2d --meta "gpt2d.description=$desc" \
    --meta gpt2d.weights=trained
"$gpt2d" convert "$dir/trained/raw/model.safetensors" "$dir/trained/model.safetensors" --dtype bf16 --layout panel64 2> /dev/null
cp "$dir/model/vocab.json" "$dir/model/merges.txt" "$dir/trained/"
labels() { # name model want_id want_owner want_weights want_description [serve options]
    local name=$1 model=$2 id=$3 owner=$4 weights=$5 description=$6
    srv_start "$name" "$model" --kv-cache-mb 64 "${@:7}"
    curl -s "$base/v1/models" > "$dir/$name.models"
    curl -s "$base/version" > "$dir/$name.version"
    curl -s "$base/v1/completions" -d '{"model":"gpt2","prompt":"Hi","max_tokens":2}' > "$dir/$name.gpt2"
    curl -s "$base/v1/completions" -d "{\"model\":\"$id\",\"prompt\":\"Hi\",\"max_tokens\":2}" > "$dir/$name.own"
    if command -v node > /dev/null && [ -d "$here/differential/node_modules/openai" ]; then
        node "$here/differential/models_list.mjs" "$base/v1" > "$dir/$name.node" || fail "$name: models.list"
    else
        skip_part "node or the npm package openai is missing: models.list was not checked"
        echo '{}' > "$dir/$name.node"
    fi
    python3 - "$dir/$name" "$id" "$owner" "$weights" "$description" <<'PY' || fail "$name: the labels"
import json, sys
p, want_id, owner, weights, description = sys.argv[1:]
models, version = json.load(open(p + ".models")), json.load(open(p + ".version"))
m = models["data"][0]
want = {"id": want_id, "object": "model", "created": 0, "owned_by": owner, "weights": weights, "description": description}
assert {k: m[k] for k in want} == want, m
assert (version["model"], version["owned_by"], version["weights"], version["description"]) == (want_id, owner, weights, description), version
# "gpt2", the default name, is still accepted; answers report the served name.
for f in (".gpt2", ".own"):
    a = json.load(open(p + f))
    assert a.get("model") == want_id, (f, a)
node = json.load(open(p + ".node"))
if node:  # what the OpenAI client for Node makes of it: the same fields, unchanged
    assert node["list"] == [m] and node["retrieved"] == m, (node, m)
PY
    local log=$dir/$name.log
    grep -qF "info model: $id, owned by $owner: $description" "$log" || fail "$name: the log's model line: $(grep 'model:' "$log")"
    if [ "$weights" = random ]; then
        grep -q 'warn random weights: the text is nonsense' "$log" && grep -q 'serving .*; random weights: the text is nonsense) on' "$log" ||
            fail "$name: no random-weights warning: $(head -8 "$log")"
    else
        ! grep -q 'random weights' "$log" || fail "$name: a trained model called random: $(grep 'random' "$log")"
    fi
    if [ "$name" = named ]; then
        : # the page reads the same /v1/models: two browsers are enough
    elif [ -x /usr/bin/chromium ] || [ -x /usr/bin/chromium-browser ]; then
        [ -d "$here/differential/node_modules/puppeteer-core" ] || skip "npm package puppeteer-core is missing (cd tests/differential && npm ci)"
        node "$here/differential/playground_label.mjs" "$base" "$id" "$owner" "$weights" "$description" \
            "${shots:-$dir}/playground-$name.png" || fail "$name: the playground's header"
    else
        skip_part "no chromium (scripts/setup.sh --test installs Debian's): the playground's header was not checked"
    fi
}
labels random "$dir/model" gpt2 gpt2d random "random weights: the text is nonsense"
labels trained "$dir/trained" gpt2d-tiny gpt2d trained "$desc"
# A name given on the command line wins over the checkpoint's.
labels named "$dir/trained" my-model gpt2d trained "$desc" --model-name my-model,gpt2
}

# Function tools on chat, on the wire: tool_choice auto answers text, and
# a reply whose first token begins the marker (forced here with logit_bias)
# becomes a call, whole and streamed (no marker in any content delta);
# required and a named function; the prompt reads earlier calls and tool
# results; refusals name the field (a schema outside the subset: `tools`).
case_tool_calls() {
/usr/bin/python3 - "$base" <<'PY'
import json, sys, urllib.request, urllib.error
base = sys.argv[1]
H = {"Authorization": "Bearer test-key-123", "Content-Type": "application/json"}
def call(path, body, raw=False):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), H)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, (r.read().decode() if raw else json.load(r))
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
add = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "add", "description": "Adds", "parameters": add}}]
msgs = [{"role": "user", "content": "Add 2 and 3."}]
def valid(c):
    f = c["function"]
    a = json.loads(f["arguments"])
    assert f["name"] == "add" and set(a) == {"a", "b"} and all(type(v) is int for v in a.values()), c
    assert c["type"] == "function" and c["id"].startswith("call_") and len(c["id"]) == 29, c
st, tok = call("/tokenize", {"prompt": " <"})
marker0 = tok["tokens"][0]
# auto, no push: text, as without tools.
st, d = call("/v1/chat/completions", {"messages": msgs, "tools": tools, "max_tokens": 6, "seed": 1})
m = d["choices"][0]["message"]
assert st == 200 and isinstance(m["content"], str) and "tool_calls" not in m, d
# auto, the first token pushed to begin the marker: a call, valid.
push = {"logit_bias": {str(marker0): 100}}
st, d = call("/v1/chat/completions", dict({"messages": msgs, "tools": tools, "max_tokens": 100, "seed": 2}, **push))
c = d["choices"][0]
assert st == 200 and c["finish_reason"] == "tool_calls" and c["message"]["content"] is None, d
valid(c["message"]["tool_calls"][0])
# ... streamed: no marker in the content, the same call.
st, raw = call("/v1/chat/completions", dict({"messages": msgs, "tools": tools, "max_tokens": 100, "seed": 2,
                                             "stream": True}, **push), raw=True)
name, args, finish = "", "", None
for line in raw.split("\n\n"):
    if not line.startswith("data: {"):
        continue
    ch = json.loads(line[6:])["choices"][0]
    assert "<tool" not in (ch["delta"].get("content") or ""), ch
    for t in ch["delta"].get("tool_calls", []):
        name += t.get("function", {}).get("name", "")
        args += t.get("function", {}).get("arguments", "")
    finish = ch["finish_reason"] or finish
assert finish == "tool_calls" and name == "add" and args == c["message"]["tool_calls"][0]["function"]["arguments"], (name, args, finish)
# required and named, n = 2: every choice a valid call.
for choice in ("required", {"type": "function", "function": {"name": "add"}}):
    st, d = call("/v1/chat/completions", {"messages": msgs, "tools": tools, "tool_choice": choice, "n": 2,
                                          "max_tokens": 100, "seed": 3})
    assert st == 200 and len(d["choices"]) == 2, d
    for c in d["choices"]:
        assert c["finish_reason"] == "tool_calls", c
        valid(c["message"]["tool_calls"][0])
# tool_choice none: the tools are not offered (no call, no format).
st, d = call("/v1/chat/completions", dict({"messages": msgs, "tools": tools, "tool_choice": "none",
                                           "max_tokens": 6, "seed": 2}, **push))
assert st == 200 and "tool_calls" not in d["choices"][0]["message"], d
# A conversation with an earlier call and its result.
turn = msgs + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
st, d = call("/v1/chat/completions", {"messages": turn, "tools": tools, "max_tokens": 4})
assert st == 200, d
# Refusals, each naming its field.
deep = {"type": "integer"}  # past the structured outputs' nesting bound
for _ in range(70):
    deep = {"items": deep}
deep = {"type": "object", "properties": {"x": deep}}
for body, param in (
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}],
          "tool_choice": "required"}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f%d" % i}} for i in range(129)]}, "tools"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools"),
        ({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "sub"}}}, "tool_choice"),
        ({"tools": tools, "response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": deep}}], "tool_choice": "required"}, "tools")):
    st, d = call("/v1/chat/completions", dict({"messages": msgs, "max_tokens": 4}, **body))
    assert st == 400 and d["error"]["param"] == param, (param, st, d)
print("tool calls: ok")
PY
}

# Function tools on chat through the clients (tests/differential/openai_tools.mjs):
# the OpenAI client (required, a named function, streamed, a follow-up with
# the result), the AI SDK's generateText with toolChoice 'required' and
# LangChain's bindTools and withStructuredOutput (functionCalling); every
# call's arguments validated against its schema.
case_tool_clients() {
need_node_module openai
need_node_module ai
need_node_module @ai-sdk/openai
need_node_module @langchain/openai
need_node_module ajv
node "$here/differential/openai_tools.mjs" "$base/v1" test-key-123 || fail "tool clients"
}

# POST /v1/embeddings: OpenAI's shape (float and base64 the same numbers),
# the vector against the numpy reference (the mean of ln_f's rows, length
# 1) on the tiny checkpoint, the same bits alone and among 80 other inputs,
# token-id inputs, usage, the route's refusals, and its access line.
case_embeddings() {
/usr/bin/python3 - "$base" "$here/reference/gpt2_numpy.py" "$dir/model" "$gpt2d" <<'PY'
import base64, json, struct, subprocess, sys, urllib.request, urllib.error
base, ref, model, gpt2d = sys.argv[1:5]
H = {"Authorization": "Bearer test-key-123", "Content-Type": "application/json"}
def call(body):
    req = urllib.request.Request(base + "/v1/embeddings", json.dumps(body).encode(), H)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
text = "The quick brown fox jumps over the lazy dog."
st, d = call({"input": text, "model": "gpt2"})
assert st == 200 and d["object"] == "list" and d["model"] == "gpt2", (st, d)
e = d["data"][0]
assert e["object"] == "embedding" and e["index"] == 0 and isinstance(e["embedding"], list), e
ids = json.loads(subprocess.run([gpt2d, "tokenize", "--model", model], input=text.encode(),
                                capture_output=True, check=True).stdout)
assert d["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}, d["usage"]
want = json.loads(subprocess.run(["/usr/bin/python3", ref, "embed", model] + [str(i) for i in ids],
                                 capture_output=True, check=True).stdout)
got = e["embedding"]
assert len(got) == len(want) == 64
err = max(abs(a - b) for a, b in zip(got, want))
assert err < 1e-4, "embedding vs the numpy reference: max error %g" % err
assert abs(sum(x * x for x in got) - 1) < 1e-5
# Token ids give the same vector; base64 carries the same float32 bits.
st, d2 = call({"input": ids})
assert st == 200 and d2["data"][0]["embedding"] == got
st, d3 = call({"input": [text], "encoding_format": "base64"})
raw = base64.b64decode(d3["data"][0]["embedding"])
assert list(struct.unpack("<%df" % (len(raw) // 4), raw)) == [struct.unpack("<f", struct.pack("<f", x))[0] for x in got]
# Among 80 other inputs (run a window at a time): the same bits, in order.
batch = ["input number %d, %s" % (i, "word " * (i % 13)) for i in range(80)]
batch.insert(41, text)
st, d4 = call({"input": batch})
assert st == 200 and [x["index"] for x in d4["data"]] == list(range(81))
assert d4["data"][41]["embedding"] == got, "the same text in a batch of 81 differs from alone"
st, d5 = call({"input": [[5, 6, 7], [8, 9]]})
assert st == 200 and len(d5["data"]) == 2 and d5["usage"]["prompt_tokens"] == 5
# Refusals, each naming its field.
for body, param in (({}, "input"), ({"input": ""}, "input"), ({"input": []}, "input"),
                    ({"input": ["a", [1]]}, "input"), ({"input": [[1], "a"]}, "input"),
                    ({"input": [70000]}, "input"), ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
                    ({"input": "x", "dimensions": 32}, "dimensions"), ({"input": "x", "dimensions": "64"}, "dimensions"),
                    ({"input": "w " * 200}, "input"), ({"input": ["x"] * 3000}, "input")):
    st, d = call(body)
    assert st == 400 and d["error"]["param"] == param, (body if len(json.dumps(body)) < 200 else param, st, d)
st, d = call({"input": "x", "dimensions": 64})
assert st == 200
st, d = call({"input": "x", "model": "nope"})
assert st == 404 and d["error"]["code"] == "model_not_found", d
print("embeddings: ok (max error against numpy %.2e)" % err)
PY
grep -q 'access POST /v1/embeddings status=200' "$dir/main.log" || fail "no access line for POST /v1/embeddings"
# The page whole first: grep -q's early exit would make curl's pipe fail.
metrics_page=$(curl -s "$base/metrics")
grep -q 'gpt2d_requests_total{route="/v1/embeddings",status="200"}' <<< "$metrics_page" ||
    fail "no route label for /v1/embeddings"
}

# Embeddings through the clients: the OpenAI Node client (float and
# base64), the AI SDK's embed and embedMany, LangChain's OpenAIEmbeddings.
case_embeddings_clients() {
need_node_module openai
need_node_module ai
need_node_module @ai-sdk/openai
need_node_module @langchain/openai
node "$here/differential/openai_embeddings.mjs" "$base/v1" test-key-123 || fail "embeddings clients"
}

# The long fixture last of the shared ones: starting it sets $base.
CASES=(command_line bad_template model_ids:main model_names:main chat_transcript:main
       chat_fields:main chat_clients:main responses_clients:main embeddings:main embeddings_clients:main
       version:main metrics:main tool_calls:long tool_clients:long nochat template playground
       model_labels)
run_cases "$@"
