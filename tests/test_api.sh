#!/usr/bin/env bash
# tests/test_api.sh GPT2D [SCREENSHOT_DIR]: the API surface around
# completions: chat through the OpenAI client and LangChain's ChatOpenAI,
# chat templates (default, a file, none), model names, /v1/models/{id},
# /version, the playground page in headless chromium, /metrics through
# promtool, the info line and the access line, and the command line's
# --version and unknown options.
set -euo pipefail
gpt2d=$(realpath "$1")
shots=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-api-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$dir"/*.log; do echo "== $f"; tail -20 "$f"; done >&2; exit 1; }

mkdir -p "$dir/model"
"$gpt2d" synth "$dir/model/model.safetensors" --layers 2 --embd 64 --heads 4 --ctx 128 --seed 3 >/dev/null
cp "$here/../tokenizer/data/vocab.json" "$here/../tokenizer/data/merges.txt" "$dir/model/"

start() { # name, options... -> sets $port and $base
    local name=$1; shift
    : > "$dir/$name.log"
    "$gpt2d" serve --model "$dir/model" --port 0 --kv-cache-mb 64 "$@" > "$dir/$name.log" 2>&1 &
    pids+=($!)
    last_pid=$!
    for _ in $(seq 300); do
        port=$(sed -n 's|.* on http://127.0.0.1:\([0-9]*\)$|\1|p' "$dir/$name.log")
        [ -n "$port" ] && { base="http://127.0.0.1:$port"; return 0; }
        kill -0 "$last_pid" 2>/dev/null || fail "$name exited during start-up"
        sleep 0.1
    done
    fail "$name did not start"
}
post() { curl -s -m 30 "$base$1" -H 'Content-Type: application/json' -d "$2"; }

# ---- The command line ---------------------------------------------------------
"$gpt2d" --version | grep -q '^gpt2d [0-9]' || fail "gpt2d --version"
"$gpt2d" serve --version | grep -q '^gpt2d [0-9].*(' || fail "gpt2d serve --version"
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

# ---- Chat templates: a bad file stops start-up naming its line ------------------
printf 'user = "{content}"\nassistant = "no placeholder"\n' > "$dir/bad.tmpl"
set +e
"$gpt2d" serve --model "$dir/model" --port 0 --chat-template "$dir/bad.tmpl" > /dev/null 2> "$dir/tmpl.err"; rc=$?
set -e
[ "$rc" = 2 ] || fail "bad template exit $rc"
grep -q "chat_template: $dir/bad.tmpl:2: assistant must hold {content} exactly once" "$dir/tmpl.err" ||
    fail "bad template: $(cat "$dir/tmpl.err")"

# ---- The default server: two model names, the default template, keys ------------
start main --model-name gpt2,gpt-3.5-turbo-instruct --api-key test-key-123 --info-interval 1
auth=(-H 'Authorization: Bearer test-key-123')
curl -s "${auth[@]}" "$base/v1/models/gpt-3.5-turbo-instruct" > "$dir/m1.json"
curl -s "${auth[@]}" -o "$dir/m2.json" -w '%{http_code}' "$base/v1/models/gpt-4" > "$dir/m2.code"
python3 - "$dir/m1.json" "$dir/m2.json" "$(cat "$dir/m2.code")" <<'PY' || fail "/v1/models/{id}"
import json, sys
m1, m2 = (json.load(open(p)) for p in sys.argv[1:3])
assert m1 == {"id": "gpt-3.5-turbo-instruct", "object": "model", "created": 0, "owned_by": "gpt2d", "dtype": "f32"}, m1
assert sys.argv[3] == "404" and m2["error"]["code"] == "model_not_found", (sys.argv[3], m2)
PY
# No model, the first name, an alias: the same greedy text, reported as the first name.
for body in '{"prompt":"Hi","max_tokens":5,"temperature":0}' \
            '{"model":"gpt2","prompt":"Hi","max_tokens":5,"temperature":0}' \
            '{"model":"gpt-3.5-turbo-instruct","prompt":"Hi","max_tokens":5,"temperature":0}'; do
    curl -s "${auth[@]}" "$base/v1/completions" -d "$body" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["model"], json.dumps(d["choices"][0]["text"]))'
done > "$dir/names.txt"
[ "$(sort -u "$dir/names.txt" | wc -l)" = 1 ] || fail "model names: $(cat "$dir/names.txt")"
grep -q '^gpt2 ' "$dir/names.txt" || fail "the first name is not reported: $(cat "$dir/names.txt")"

# The chat prompt is the documented transcript: the same greedy text as the
# completion of that transcript, stopped at the turn separator.
transcript='Be brief.\n\nUser: Hi there\n\nAssistant:'
curl -s "${auth[@]}" "$base/v1/completions" -d "{\"prompt\":\"$transcript\",\"max_tokens\":20,\"temperature\":0,\"stop\":[\"\\n\\n\",\"\\nUser:\"]}" > "$dir/tc.json"
curl -s "${auth[@]}" "$base/v1/chat/completions" -d '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}],"max_tokens":20,"temperature":0}' > "$dir/chat.json"
python3 - "$dir/tc.json" "$dir/chat.json" <<'PY' || fail "chat against the transcript"
import json, sys
tc, chat = (json.load(open(p)) for p in sys.argv[1:])
assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-"), chat
msg = chat["choices"][0]["message"]
assert msg["role"] == "assistant", msg
assert msg["content"] == tc["choices"][0]["text"].lstrip(" "), (msg, tc["choices"][0])
assert chat["choices"][0]["finish_reason"] == tc["choices"][0]["finish_reason"], (chat, tc)
assert chat["usage"]["prompt_tokens"] == tc["usage"]["prompt_tokens"], (chat["usage"], tc["usage"])
PY

# The official OpenAI client and LangChain's ChatOpenAI.
node "$here/differential/openai_chat.mjs" "$base/v1" test-key-123 || fail "chat clients"

# /version, and the info line while busy.
curl -s "$base/version" > "$dir/version.json"
python3 - "$dir/version.json" <<'PY' || fail "/version"
import json, sys
v = json.load(open(sys.argv[1]))
assert set(v) >= {"version", "commit", "buildtype", "kernels", "model"}, v
assert v["kernels"] in ("avx512", "avx2", "portable") and v["model"] == "gpt2", v
PY
grep -q 'info running [0-9]*, queued [0-9]*; prompt [0-9.]* tokens/s, generation [0-9.]* tokens/s; KV cache' "$dir/main.log" ||
    { sleep 1.2; grep -q 'info running' "$dir/main.log"; } || fail "no info line while busy"
grep -q 'access POST /v1/chat/completions status=200 .* ttft_ms=[0-9.]* tokens_per_s=[0-9.]*' "$dir/main.log" ||
    fail "access line without ttft_ms/tokens_per_s"

# /metrics: promtool's linter is clean on the live page.
curl -s "$base/metrics" > "$dir/metrics.txt"
if command -v promtool > /dev/null; then
    promtool check metrics < "$dir/metrics.txt" > "$dir/promtool.out" 2>&1 || fail "promtool: $(cat "$dir/promtool.out")"
else
    [ -z "${CI:-}" ] || fail "promtool is missing (scripts/setup.sh installs prometheus)"
    echo "promtool not installed: the metrics lint was not run" >&2
fi
grep -q '^gpt2d_build_info{version="[^"]*",commit="[^"]*",buildtype="[^"]*",kernels="[^"]*",dtype="[^"]*",model="gpt2"} 1$' "$dir/metrics.txt" ||
    fail "gpt2d_build_info"
for m in process_cpu_seconds_total process_resident_memory_bytes process_open_fds process_max_fds process_start_time_seconds; do
    grep -q "^$m " "$dir/metrics.txt" || fail "/metrics has no $m"
done

# ---- chat_template = none: the chat route says where to go ----------------------
start nochat --chat-template none --ui false
code=$(curl -s -o "$dir/nochat.json" -w '%{http_code}' "$base/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}]}')
[ "$code" = 400 ] && grep -q '/v1/completions' "$dir/nochat.json" || fail "chat_template none: $code $(cat "$dir/nochat.json")"
code=$(curl -s -o /dev/null -w '%{http_code}' "$base/")
[ "$code" = 404 ] || fail "--ui false still serves / ($code)"

# ---- A template file ----------------------------------------------------------
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

# ---- The playground, in headless chromium ----------------------------------------
start ui
shot=${shots:-$dir}/playground.png
node "$here/differential/playground.mjs" "$base" "$shot" || fail "playground"
echo "api: ok"
