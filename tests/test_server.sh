#!/usr/bin/env bash
# tests/test_server.sh GPT2D [CASE...]: gpt2d serve on loopback, driven by
# curl, a Python SSE parser and the official OpenAI Node client, on a tiny
# `gpt2d synth` checkpoint with the real GPT-2 tokenizer. Each case below is
# a function case_NAME; name cases to run only those, `--list` lists them
# (tests/lib/cases.sh); every failing case is reported at the end. KEEP=1
# keeps the scratch directory (the servers' logs).
set -euo pipefail
gpt2d=$(realpath "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-server-XXXXXX)
. "$here/lib/cases.sh"
. "$here/lib/server.sh"
cleanup() { srv_stop_all; rm -rf "$dir"; }
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap 'srv_stop_all; echo "kept $dir"' EXIT

srv_model "$dir/model" tiny
# A slower model (GPT-2-small width, 4 layers) for the queue and drain tests,
# where generation must outlast the requests that probe it; made on first use.
need_slow() { srv_model "$dir/slow" slow; }

# The server most cases share, started before the first case that needs it.
# The main server serves an adapter too (docs/api.md's LoRA example asks
# for "pirate"): one of the fuzz corpus's shape, for this model's.
fixture_main() {
    python3 - "$here/fuzz" "$dir/pirate" <<'PY'
import os, struct, sys
sys.path.insert(0, sys.argv[1])
from make_lora_corpus import adapter
b = adapter(r=4, layers=2, C=64)
n = struct.unpack("<I", b[:4])[0]
os.makedirs(sys.argv[2], exist_ok=True)
open(os.path.join(sys.argv[2], "adapter_config.json"), "wb").write(b[4:4 + n])
open(os.path.join(sys.argv[2], "adapter_model.safetensors"), "wb").write(b[4 + n:])
PY
    srv_start main "$dir/model" --lora-modules "pirate=$dir/pirate" && main_port=$port main_base=$base
}

wait_metric() { # line, e.g. "gpt2d_running_sequences 1": poll /metrics until it appears
    for _ in $(seq 200); do
        grep -q "^$1\$" <<< "$(curl -s "$base/metrics")" && return 0
        sleep 0.05
    done
    fail "metric '$1' never appeared"
}
post() { curl -s -m 30 "http://127.0.0.1:$port$1" -H 'Content-Type: application/json' -d "$2"; }
status() { curl -s -o /dev/null -w '%{http_code}' -m 30 "$@"; }
# Bad input: each with its status and an OpenAI error body.
check() { # status, method, path, body, [curl args...]
    local want=$1 method=$2 path=$3 body=$4; shift 4
    local got
    got=$(curl -s -o "$dir/err.json" -w '%{http_code}' -X "$method" "$base$path" ${body:+-d "$body"} "$@")
    [ "$got" = "$want" ] || fail "$method $path $body: status $got, want $want"
    python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert set(e) == {"message","type","param","code"}, e' "$dir/err.json" \
        || fail "$method $path: not an OpenAI error body: $(cat "$dir/err.json")"
}

prompt='Hello, my name is'
# The greedy completion of $prompt (stream compares its text with it).
greedy_json() {
    post /v1/completions "{\"model\":\"gpt2\",\"prompt\":\"$prompt\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}" > "$dir/c.json"
}
# A 40-token prompt, its scoring and a chat request (cached_tokens,
# prefix_cache_sighup).
ids40=$(python3 -c 'print(list(range(1000, 1040)))')
forty="{\"model\":\"gpt2\",\"prompt\":$ids40,\"max_tokens\":4,\"temperature\":0"
score="{\"model\":\"gpt2\",\"prompt\":$ids40,\"max_tokens\":0,\"echo\":true,\"logprobs\":1}"
chat='{"model":"gpt2","messages":[{"role":"user","content":"Tell me how the prefix cache of a language model server keeps the key and value blocks of a prompt for the next request that begins the same way."}],"max_tokens":4,"temperature":0'

case_health() {
[ "$(curl -s "$base/health")" = '{"status":"ok"}' ] || fail health
[ "$(status "$base/ready")" = 200 ] || fail ready
python3 - "$(curl -s "$base/v1/models")" <<'PY' || fail models
import json, sys
d = json.loads(sys.argv[1]); assert d["object"] == "list" and d["data"][0]["id"] == "gpt2", d
assert d["data"][0]["dtype"] == "f32", d  # the weight format served (engine.h, eng_model_dtype)
PY
}

# Greedy text through the API equals gpt2d generate.
case_greedy() {
"$gpt2d" generate --model "$dir/model" --prompt "$prompt" --tokens 12 --temperature 0 --ignore-eos 2>/dev/null > "$dir/gen.txt"
greedy_json
python3 - "$dir/gen.txt" "$dir/c.json" <<'PY' || fail "greedy text differs from gpt2d generate"
import json, sys
gen = open(sys.argv[1], "rb").read().rstrip(b"\n").decode("utf-8", "replace")
c = json.load(open(sys.argv[2]))
assert c["choices"][0]["text"] == gen, (c["choices"][0]["text"], gen)
u = dict(c["usage"])
t = u.pop("timings")  # the documented extension; the OpenAI fields stay exact
assert u == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17,
             "prompt_tokens_details": {"cached_tokens": 0}}, c["usage"]
assert all(type(v) is int for v in t.values()) and 0 <= t["ttft_ms"] <= t["total_ms"], t
# tokens/s is 12 over the unrounded total: within the rounding of total_ms
lo, hi = 12 / ((t["total_ms"] + 0.5) / 1e3), 12 / (max(t["total_ms"] - 0.5, 0.01) / 1e3)
assert lo - 0.5 <= t["completion_tokens_per_second"] <= hi + 0.5, t
assert c["choices"][0]["finish_reason"] == "length"
assert c["id"].startswith("cmpl-") and c["system_fingerprint"].startswith("fp_")
PY
}

# Streaming: SSE framing by a real parser; the same text; one finish chunk; usage.
case_stream() {
[ -s "$dir/c.json" ] || greedy_json
curl -sN -m 30 -D "$dir/h.txt" "$base/v1/completions" -d "{\"model\":\"gpt2\",\"prompt\":\"$prompt\",\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" > "$dir/s.txt"
grep -qi '^content-type: text/event-stream' "$dir/h.txt" || fail "stream content type"
grep -qi '^x-accel-buffering: no' "$dir/h.txt" || fail "X-Accel-Buffering"
python3 - "$dir/s.txt" "$dir/c.json" <<'PY' || fail "stream"
import json, sys
raw = open(sys.argv[1], encoding="utf-8").read()
assert raw.endswith("data: [DONE]\n\n"), raw[-80:]
events = [e for e in raw.split("\n\n") if e]
data = []
for e in events:
    assert e.startswith("data: ") and "\n" not in e, repr(e)
    data.append(e[6:])
assert data[-1] == "[DONE]"
chunks = [json.loads(d) for d in data[:-1]]
text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
want = json.load(open(sys.argv[2]))["choices"][0]["text"]
assert text == want, (text, want)
fin = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
assert len(fin) == 1 and fin[0]["choices"][0]["finish_reason"] == "length"
assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
PY
}

# Seeded sampling is reproducible; n and prompt arrays make choices; echo.
case_seeded() {
a=$(post /v1/completions '{"model":"gpt2","prompt":"Once","max_tokens":10,"temperature":1,"seed":5}')
b=$(post /v1/completions '{"model":"gpt2","prompt":"Once","max_tokens":10,"temperature":1,"seed":5}')
python3 - "$a" "$b" <<'PY' || fail "seeded sampling"
import json, sys
a, b = (json.loads(x)["choices"][0]["text"] for x in sys.argv[1:])
assert a == b, (a, b)
PY
python3 - "$(post /v1/completions '{"model":"gpt2","prompt":["One","Two"],"n":2,"max_tokens":3,"seed":1}')" \
          "$(post /v1/completions '{"model":"gpt2","prompt":[15496,11],"max_tokens":2,"echo":true,"temperature":0}')" <<'PY' || fail "n, prompt arrays, echo"
import json, sys
d = json.loads(sys.argv[1])
assert [c["index"] for c in d["choices"]] == [0, 1, 2, 3], d
# Each prompt counts once, whatever n (as OpenAI counts them).
assert d["usage"]["completion_tokens"] == 12 and d["usage"]["prompt_tokens"] == 2, d["usage"]
e = json.loads(sys.argv[2])
assert e["choices"][0]["text"].startswith("Hello,"), e
PY
}

# The prefix cache: a second identical request takes its prompt's full KV
# blocks from the cache (usage.prompt_tokens_details.cached_tokens) and gives
# the same text and logprobs, streamed or not; echo's prompt logprobs are the
# same; a server with --prefix-cache false gives the same bytes, never cached.
case_prefix_cache() {
long='{"model":"gpt2","prompt":"The prefix cache keeps the key and value blocks of prompts it has seen, so that a prompt which begins the same way starts from them instead of computing its beginning again.","max_tokens":8,"temperature":1,"seed":3,"logprobs":2'
first=$(post /v1/completions "$long}")
second=$(post /v1/completions "$long}")
streamed=$(curl -sN -m 30 "$base/v1/completions" -d "$long,\"stream\":true,\"stream_options\":{\"include_usage\":true}}")
echoed=$(post /v1/completions "$long,\"echo\":true}")
echoed2=$(post /v1/completions "$long,\"echo\":true}")
srv_start nocache "$dir/model" --prefix-cache false
off_port=$port
port=$main_port base=$main_base
off1=$(port=$off_port post /v1/completions "$long}")
off2=$(port=$off_port post /v1/completions "$long}")
off_echo=$(port=$off_port post /v1/completions "$long,\"echo\":true}")
off_metrics=$(curl -s "http://127.0.0.1:$off_port/metrics")
kill "$last_pid"
python3 - "$first" "$second" "$streamed" "$echoed" "$off1" "$off2" "$off_echo" "$off_metrics" "$(curl -s "$base/metrics")" "$echoed2" <<'PY' || fail "prefix cache"
import json, sys
first, second, streamed, echoed, off1, off2, off_echo = (sys.argv[i] for i in range(1, 8))
off_metrics, metrics, echoed2 = sys.argv[8:]
first, second, echoed, off1, off2, off_echo, echoed2 = (json.loads(x) for x in (first, second, echoed, off1, off2, off_echo, echoed2))
pt = first["usage"]["prompt_tokens"]
assert pt > 32, first["usage"]
assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, first["usage"]
cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
assert cached == (pt - 1) // 16 * 16, (cached, pt)  # all full blocks but the last token's
for d in (second, off1, off2):
    assert d["choices"] == first["choices"], (d["choices"], first["choices"])
chunks = [json.loads(e[6:]) for e in streamed.split("\n\n") if e.startswith("data: {")]
assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == first["choices"][0]["text"]
assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == cached, chunks[-1]
assert echoed["choices"] == off_echo["choices"], (echoed, off_echo)
# The first echo finds blocks without prompt logprobs and computes; the
# second takes the blocks the first left them with (all but one).
assert echoed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, echoed["usage"]
assert echoed2["choices"] == off_echo["choices"], (echoed2, off_echo)
assert echoed2["usage"]["prompt_tokens_details"]["cached_tokens"] == cached - 16, echoed2["usage"]
for d in (off1, off2, off_echo):
    assert d["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, d["usage"]
def metric(text, name):
    return float([l.split()[1] for l in text.splitlines() if l.startswith(name + " ")][0])
assert metric(metrics, "gpt2d_prefix_cache_hit_tokens_total") >= 2 * cached
assert metric(metrics, "gpt2d_prefix_cache_lookups_total") >= 5
assert metric(metrics, "gpt2d_prefix_cache_blocks") > 0
assert metric(metrics, "gpt2d_prefix_cache_evictions_total") == 0
for name in ("lookups_total", "hit_tokens_total", "blocks"):
    assert metric(off_metrics, "gpt2d_prefix_cache_" + name) == 0, name
PY
}

# cached_tokens, exact: a 40-token prompt seen before, with 16-token blocks,
# takes its 2 full blocks (32 tokens) and computes the other 8. Chat too:
# all full blocks of its templated prompt but the one of its last token.
# Non-streaming, and in the last chunk of a stream with include_usage.
case_cached_tokens() {
python3 - "$(post /v1/completions "$forty}")" "$(post /v1/completions "$forty}")" \
          "$(curl -sN -m 30 "$base/v1/completions" -d "$forty,\"stream\":true,\"stream_options\":{\"include_usage\":true}}")" \
          "$(post /v1/chat/completions "$chat}")" "$(post /v1/chat/completions "$chat}")" \
          "$(curl -sN -m 30 "$base/v1/chat/completions" -d "$chat,\"stream\":true,\"stream_options\":{\"include_usage\":true}}")" \
          "$(post /v1/completions "$score")" "$(post /v1/completions "$score")" <<'PY' || fail "cached_tokens, exact"
import json, sys
c1, c2, cs, h1, h2, hs, s1, s2 = sys.argv[1:]
c1, c2, h1, h2, s1, s2 = (json.loads(x) for x in (c1, c2, h1, h2, s1, s2))
def last_usage(stream):
    chunks = [json.loads(e[6:]) for e in stream.split("\n\n") if e.startswith("data: {")]
    assert len(chunks) > 1 and all(c["usage"] is None for c in chunks[:-1]), chunks
    assert chunks[-1]["choices"] == [], chunks[-1]
    return chunks[-1]["usage"]
assert c1["usage"]["prompt_tokens"] == 40, c1["usage"]
assert c1["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}, c1["usage"]
assert c2["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}, c2["usage"]
assert c2["choices"] == c1["choices"], (c1, c2)
assert last_usage(cs)["prompt_tokens_details"] == {"cached_tokens": 32}, cs
assert h1["object"] == "chat.completion", h1
pt = h1["usage"]["prompt_tokens"]
assert pt > 32, h1["usage"]
assert h1["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}, h1["usage"]
want = (pt - 1) // 16 * 16
assert h2["usage"]["prompt_tokens_details"] == {"cached_tokens": want}, (pt, h2["usage"])
assert h2["choices"] == h1["choices"], (h1, h2)
u = last_usage(hs)
assert u["prompt_tokens"] == pt and u["prompt_tokens_details"] == {"cached_tokens": want}, (pt, u)
# Scoring it (echo, max_tokens 0): the first finds blocks without prompt
# logprobs and computes all 40 rows (leaving the logprobs with them); the
# second takes block 0 (block 1's first logprob is kept, block 1 is computed).
assert s1["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}, s1["usage"]
assert s2["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}, s2["usage"]
assert s1["usage"]["completion_tokens"] == 0 and len(s1["choices"][0]["logprobs"]["tokens"]) == 40, s1
assert s2["choices"] == s1["choices"], (s1, s2)
PY
}

# The choices of one prompt share its blocks: n = 4 on a new 40-token prompt
# computes its 2 full blocks once (the first choice), and the other three
# take them (3 x 32 hit tokens); best_of = 3 likewise (2 x 32). usage counts
# the least any choice took: 0.
case_shared_blocks() {
hits() { curl -s "$base/metrics" | sed -n 's/^gpt2d_prefix_cache_hit_tokens_total //p'; }
h0=$(hits)
nreq=$(post /v1/completions "{\"model\":\"gpt2\",\"prompt\":$(python3 -c 'print(list(range(2000, 2040)))'),\"max_tokens\":2,\"n\":4,\"seed\":1}")
h1=$(hits)
breq=$(post /v1/completions "{\"model\":\"gpt2\",\"prompt\":$(python3 -c 'print(list(range(3000, 3040)))'),\"max_tokens\":2,\"best_of\":3,\"seed\":1}")
h2=$(hits)
python3 - "$h0" "$h1" "$h2" "$nreq" "$breq" <<'PY' || fail "n and best_of share prompt blocks"
import json, sys
h0, h1, h2 = (int(x) for x in sys.argv[1:4])
n, b = (json.loads(x) for x in sys.argv[4:])
assert h1 - h0 == 3 * 32 and h2 - h1 == 2 * 32, (h0, h1, h2)
assert len(n["choices"]) == 4 and len(b["choices"]) == 1, (n, b)
for d in (n, b):
    assert d["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}, d["usage"]
PY
}

# prefix_cache sizes the engine at start-up: a SIGHUP that changes it keeps
# the running value (the cache stays on, and finds what it had) and the log
# names the key as needing a restart.
case_prefix_cache_sighup() {
printf 'prefix_cache = true\n' > "$dir/pc.conf"
srv_start pc "$dir/model" --config "$dir/pc.conf"
pc1=$(post /v1/completions "$forty}")
printf 'prefix_cache = false\n' > "$dir/pc.conf"
kill -HUP "$last_pid"
for _ in $(seq 100); do grep -q 'needs a restart (the running value is kept): prefix_cache' "$dir/pc.log" && break; sleep 0.05; done
grep -q 'warn SIGHUP: changed, but needs a restart (the running value is kept): prefix_cache$' "$dir/pc.log" ||
    fail "SIGHUP changing prefix_cache: $(tail -3 "$dir/pc.log")"
pc2=$(post /v1/completions "$forty}")
kill "$last_pid"
python3 - "$pc1" "$pc2" <<'PY' || fail "prefix_cache across a SIGHUP"
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:])
assert a["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}, a["usage"]
assert b["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}, b["usage"]
assert a["choices"] == b["choices"], (a, b)
PY
}

# "<|endoftext|>" in a prompt is the token 50256, as in Hugging Face's
# tokenizer and tiktoken's encode(allowed_special="all"); no prompt (the
# spec's default, "<|endoftext|>") and "" both start from it, as `gpt2d
# generate` without --prompt does. max_tokens 0 with echo scores a text: the
# prompt's logprobs, no completion.
case_endoftext() {
gen_eot=$("$gpt2d" generate --model "$dir/model" --prompt '' --tokens 4 --temperature 0 --ignore-eos)
python3 - "$gen_eot" \
          "$(post /v1/completions '{"model":"gpt2","max_tokens":4,"temperature":0,"ignore_eos":true,"echo":true}')" \
          "$(post /v1/completions '{"model":"gpt2","prompt":"","max_tokens":4,"temperature":0,"ignore_eos":true}')" \
          "$(post /v1/completions '{"model":"gpt2","prompt":"Hello<|endoftext|> world","max_tokens":0,"echo":true,"logprobs":1}')" \
          "$(post /v1/completions '{"model":"gpt2","prompt":[15496,50256,995],"max_tokens":1,"echo":true,"logprobs":1,"temperature":0}')" \
          "$(post /tokenize '{"prompt":"a<|endoftext|>"}')" \
          "$(curl -sN -m 30 "$base/v1/completions" -d '{"model":"gpt2","prompt":"Hi","max_tokens":0,"stream":true}')" <<'PY' || fail "<|endoftext|>, empty prompts, max_tokens 0"
import json, sys
gen, none, empty, score, ids, tok, stream = sys.argv[1:]
none, empty, score, ids, tok = (json.loads(x) for x in (none, empty, score, ids, tok))
assert none["usage"]["prompt_tokens"] == 1 and empty["usage"]["prompt_tokens"] == 1, (none, empty)
assert none["choices"][0]["text"] == "<|endoftext|>" + gen, (none, gen)
assert empty["choices"][0]["text"] == gen, (empty, gen)
c = score["choices"][0]
assert c["text"] == "Hello<|endoftext|> world" and c["finish_reason"] == "length", c
assert c["logprobs"]["tokens"] == ["Hello", "<|endoftext|>", " world"], c["logprobs"]
assert {k: score["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details")} == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}, score
assert score["usage"]["timings"]["ttft_ms"] == 0, score  # no token was generated
want = ids["choices"][0]["logprobs"]
assert c["logprobs"]["token_logprobs"] == want["token_logprobs"][:3], (c, want)
assert c["logprobs"]["top_logprobs"] == want["top_logprobs"][:3], (c, want)
assert tok["tokens"] == [64, 50256], tok
events = [e[6:] for e in stream.split("\n\n") if e.startswith("data: ")]
assert events[-1] == "[DONE]", events
chunks = [json.loads(e) for e in events[:-1]]
assert [(x["choices"][0]["text"], x["choices"][0]["finish_reason"]) for x in chunks] == [("", "length")], chunks
PY
}

# logprobs: the chosen token and the top alternatives; echo with the prompt's
# (the first one null); text_offset from the start of the prompt; a token that
# is not whole UTF-8 written as bytes:\xNN; best_of picks n of best_of.
case_logprobs() {
python3 - "$(post /v1/completions '{"model":"gpt2","prompt":"Hello, 日本","max_tokens":4,"temperature":0,"logprobs":3,"echo":true}')" \
          "$(post /v1/completions '{"model":"gpt2","prompt":"Hello there","max_tokens":3,"temperature":0,"logprobs":2}')" \
          "$(post /v1/completions '{"model":"gpt2","prompt":"Hi","max_tokens":5,"n":2,"best_of":4,"seed":9}')" <<'PY' || fail "logprobs, echo, best_of"
import json, sys
e = json.loads(sys.argv[1])["choices"][0]
lp = e["logprobs"]
assert e["text"].startswith("Hello, 日本"), e["text"]
assert len(lp["tokens"]) == 7 + 4, lp["tokens"]          # 7 prompt tokens, 4 generated
assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
assert "bytes:\\x97" in lp["tokens"], lp["tokens"]   # a middle byte of 日 (" 日" is " \xe6", "\x97", "\xa5")
assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
assert lp["text_offset"][7] == len("Hello, 日本"), lp["text_offset"]
for i in range(1, len(lp["tokens"])):
    assert lp["token_logprobs"][i] <= 0 and len(lp["top_logprobs"][i]) == 3
for i in range(7, 11):  # greedy: the chosen token is the most likely one
    assert lp["token_logprobs"][i] >= max(lp["top_logprobs"][i].values()) - 1e-5, i
g = json.loads(sys.argv[2])["choices"][0]["logprobs"]
assert len(g["tokens"]) == 3 and g["text_offset"][0] == len("Hello there"), g
b = json.loads(sys.argv[3])
assert len(b["choices"]) == 2 and [c["index"] for c in b["choices"]] == [0, 1], b
assert b["usage"]["completion_tokens"] == 4 * 5, b["usage"]
PY
}

# best_of ranks by mean token logprob: with the same seed, n=4 shows all
# four candidates; n=2 of best_of=4 must be the two best of them, best first
# (ties in their original order).
case_best_of() {
python3 - "$(post /v1/completions '{"model":"gpt2","prompt":"Hi","max_tokens":6,"n":4,"best_of":4,"seed":21,"logprobs":0}')" \
          "$(post /v1/completions '{"model":"gpt2","prompt":"Hi","max_tokens":6,"n":2,"best_of":4,"seed":21,"logprobs":0}')" <<'PY' || fail "best_of ranking"
import json, sys
every = json.loads(sys.argv[1])["choices"]
best = json.loads(sys.argv[2])["choices"]
mean = lambda c: sum(c["logprobs"]["token_logprobs"]) / len(c["logprobs"]["token_logprobs"])
ranked = sorted(every, key=mean, reverse=True)  # Python's sort is stable
assert [c["text"] for c in best] == [c["text"] for c in ranked[:2]], (best, ranked)
PY
}

# A stop string that spans tokens never reaches the client.
case_stop_string() {
python3 - "$gpt2d" "$dir" "$base" <<'PY' || fail "stop string"
import json, subprocess, sys, urllib.request
gpt2d, d, base = sys.argv[1:]
ids = json.loads(subprocess.run([gpt2d, "generate", "--model", d + "/model", "--prompt", "Hello, my name is",
                                 "--tokens", "6", "--temperature", "0", "--ignore-eos", "--ids"],
                                capture_output=True, check=True).stdout)["generated"]
pieces = [subprocess.run([gpt2d, "detokenize", "--model", d + "/model"], input=json.dumps([i]).encode(),
                         capture_output=True, check=True).stdout.decode("utf-8", "replace") for i in ids]
stop = pieces[2][-2:] + pieces[3][:2]          # spans the third and fourth tokens
full = "".join(pieces)
want = full[:full.index(stop)]
for stream in (False, True):
    body = json.dumps({"model": "gpt2", "prompt": "Hello, my name is", "max_tokens": 6, "temperature": 0,
                       "ignore_eos": True, "stop": [stop], "stream": stream}).encode()
    raw = urllib.request.urlopen(urllib.request.Request(base + "/v1/completions", body)).read().decode()
    if stream:
        chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
    else:
        c = json.loads(raw)["choices"][0]
        text, finish = c["text"], [c["finish_reason"]]
    assert text == want, (stream, text, want, stop)
    assert finish == ["stop"], finish
PY
}

# Bytes that are not whole characters become U+FFFD, never invalid JSON.
case_partial_utf8() {
python3 - "$(post /v1/completions '{"model":"gpt2","prompt":"x","max_tokens":3,"temperature":0,"logit_bias":{"17312":100}}')" <<'PY' || fail "partial UTF-8"
import json, sys
t = json.loads(sys.argv[1])["choices"][0]["text"]
assert t == bytes.fromhex("e69ce69ce69c").decode("utf-8", "replace"), repr(t)
PY
}

# 16 concurrent streams, each exactly its max_tokens.
case_streams16() {
streams=()
for i in $(seq 16); do
    curl -sN -m 60 "$base/v1/completions" -d "{\"model\":\"gpt2\",\"prompt\":\"Stream $i\",\"max_tokens\":$((20 + i)),\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" > "$dir/par$i.txt" &
    streams+=($!)
done
wait "${streams[@]}" 2>/dev/null || true
for i in $(seq 16); do
    python3 - "$dir/par$i.txt" "$((20 + i))" <<'PY' || fail "stream $i"
import json, sys
raw = open(sys.argv[1]).read()
assert raw.endswith("data: [DONE]\n\n")
last = json.loads([e for e in raw.split("\n\n") if e.startswith("data: {")][-1][6:])
assert last["usage"]["completion_tokens"] == int(sys.argv[2]), last
PY
done
}

# The metrics exist and count.
case_metrics() {
m=$(curl -s "$base/metrics")
python3 - "$m" <<'PY' || fail "metrics"
import sys
m = sys.argv[1]
for name in ("gpt2d_time_to_first_token_seconds", "gpt2d_inter_token_latency_seconds",
             "gpt2d_request_duration_seconds", "gpt2d_step_duration_seconds", "gpt2d_step_batch_rows"):
    assert f"# TYPE {name} histogram" in m and f'{name}_bucket{{le="+Inf"}}' in m, name
assert 'gpt2d_requests_total{route="/v1/completions",status="200"}' in m
for g in ("gpt2d_queued_requests", "gpt2d_kv_blocks_capacity", "gpt2d_completion_tokens_total"):
    assert g in m, g
assert any(l.startswith("gpt2d_build_info{") and 'dtype="f32"' in l and l.endswith("} 1") for l in m.splitlines()), m
PY
}

# Bad input: each with its status and an OpenAI error body (check, above).
case_errors() {
check 400 POST /v1/completions '{"model":'
check 400 POST /v1/completions '{"model":"gpt2","max_tokens":"x"}'
check 400 POST /v1/completions '{"model":"gpt2","suffix":"x"}'
check 400 POST /v1/completions "{\"model\":\"gpt2\",\"prompt\":\"$(python3 -c "print('a '*120)")\",\"max_tokens\":20}"
check 404 POST /v1/completions '{"model":"gpt-4","prompt":"x"}'
check 404 GET /v1/nothing ''
check 405 GET /v1/completions ''
check 405 POST /v1/models '{}'
head -c 2000000 /dev/zero | tr '\0' 'a' > "$dir/big.txt"
check 413 POST /v1/completions "" --data-binary @"$dir/big.txt"
}

# docs/operations.md names only metrics that exist, and documents every key.
# A family with a series per LoRA adapter has none here (no adapter is
# loaded): its # TYPE line stands for it.
case_docs() {
curl -s "$base/metrics" > "$dir/metrics.txt"
for m in $(grep -o 'gpt2d_[a-z_]*' "$here/../docs/operations.md" | sort -u); do
    grep -q "^$m[{ ]\|^${m}_bucket{\|^# TYPE $m " "$dir/metrics.txt" || fail "docs/operations.md names $m, which /metrics lacks"
done
for k in $("$gpt2d" serve --help | sed -n 's/^  --\([a-z-]*\) .*default:.*/\1/p' | tr - _); do
    grep -q "^| \`$k\` |" "$here/../docs/operations.md" || fail "docs/operations.md does not document $k"
done
}

# Large bodies are tokenized on the work queue: a 240 KB /tokenize gives
# tiktoken's ids ("hello" 31373, " hello" 23748, a lone trailing " " 220), a
# 240 KB completion prompt is refused as soon as it passes the limit (issue
# 14: its tokenizing stops there, so its whole length is never known), and
# a client that leaves while its body is tokenized frees everything (ASan).
case_large_bodies() {
python3 -c 'import json; print(json.dumps({"prompt": "hello " * 40000}))' > "$dir/big_tok.json"
served() { curl -s "$base/metrics" | sed -n 's/^gpt2d_prompt_tokens_total //p'; }
before=$(served)
[ -n "$before" ] || fail "no gpt2d_prompt_tokens_total in /metrics"
curl -s "$base/tokenize" --data-binary @"$dir/big_tok.json" > "$dir/big_tok.out"
[ "$(served)" = "$before" ] || fail "/tokenize counted into gpt2d_prompt_tokens_total"
python3 - "$dir/big_tok.out" <<'PY' || fail "a large /tokenize"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["tokens"] == [31373] + [23748] * 39999 + [220] and d["count"] == 40001, d.get("count")
PY
# A large /detokenize is parsed and decoded on the work queue too.
python3 -c 'import json; print(json.dumps({"tokens": [15496] * 20000}))' > "$dir/big_detok.json"
curl -s "$base/detokenize" --data-binary @"$dir/big_detok.json" |
    python3 -c 'import json, sys; assert json.load(sys.stdin)["prompt"] == "Hello" * 20000' ||
    fail "a large /detokenize"
python3 -c 'import json; print(json.dumps({"tokens": [15496] * 20000 + [-1]}))' > "$dir/big_detok.json"
curl -s "$base/detokenize" --data-binary @"$dir/big_detok.json" | grep -q "'tokens' entry 20000 is not a token id" ||
    fail "a large /detokenize with a bad id"
python3 -c 'import json; print(json.dumps({"model": "gpt2", "prompt": "hello " * 40000}))' > "$dir/big_prompt.json"
curl -s "$base/v1/completions" --data-binary @"$dir/big_prompt.json" | grep -q 'prompt 0 has more than 1024 tokens; the limit is 1024 (max_prompt_tokens)' ||
    fail "a large prompt is not measured"
for _ in 1 2 3 4; do curl -s -m 0.01 "$base/tokenize" --data-binary @"$dir/big_tok.json" > /dev/null || true; done
[ "$(curl -s "$base/health")" = '{"status":"ok"}' ] || fail "health after clients left mid-tokenization"
}

# Every curl example of docs/api.md, with its documented answer.
case_api_examples() {
python3 "$here/api_examples.py" "$here/../docs/api.md" "$base" || fail "docs/api.md examples"
}

# The official OpenAI client (Node), pointed at the base URL.
case_openai_client() {
need_node_module openai
node "$here/differential/openai_client.mjs" "$base/v1" || fail "openai client"
}

# Authentication, and 429 with Retry-After when the queue is full.
# Every step of this server and the next sleeps 20 ms more: the tests of
# the queue, its limits, disconnects and the drain need requests that are
# still running a second later, whatever the speed of the kernels.
case_auth() {
need_slow
GPT2D_TEST_STEP_DELAY_MS=20 srv_start auth "$dir/slow" --api-key secret-key-123 --max-running 1 --max-queue 1 --step-tokens 1
check 401 GET /v1/models ''
check 401 GET /v1/models '' -H 'Authorization: Bearer wrong-key-123'
[ "$(status -H 'Authorization: Bearer secret-key-123' "$base/v1/models")" = 200 ] || fail "good key refused"
[ "$(status "$base/health")" = 200 ] || fail "health needs no key"
# One running, then one waiting: sent together, the second can find the
# first still in the queue of one and be the one refused.
busy=()
for want in "gpt2d_running_sequences 1" "gpt2d_queued_requests 1"; do
    curl -sN -m 60 -H 'Authorization: Bearer secret-key-123' "$base/v1/completions" -d '{"model":"gpt2","prompt":"x","max_tokens":120,"ignore_eos":true,"stream":true}' > /dev/null &
    busy+=($!)
    wait_metric "$want"
done
check 429 POST /v1/completions '{"model":"gpt2","prompt":"y"}' -H 'Authorization: Bearer secret-key-123' -D "$dir/h429.txt"
grep -qi '^retry-after: [0-9]' "$dir/h429.txt" || fail "429 without Retry-After"
# The two long requests were only there to fill the places: they leave
# now (waiting for them, the second queued behind the first, ran past
# curl's -m 60 under the sanitizers, and its exit status 28 failed the
# case without a word: CI's failure of stop 30).
kill "${busy[@]}" 2> /dev/null || true
wait "${busy[@]}" 2> /dev/null || true
}

# The queue's wait limit, keep-alive comments, and the per-request deadline.
case_queue() {
need_slow
# queue_timeout 2, not 1: the keep-alive comment and the timeout are both
# checked on the 1 s tick, so a request that came just after a tick could
# meet a 1 s limit at its first tick, with no comment before it.
GPT2D_TEST_STEP_DELAY_MS=20 srv_start queue "$dir/slow" --max-running 1 --queue-timeout 2 --step-tokens 1
# A client that disconnects mid-stream frees its sequence and KV blocks
# (500 tokens take over 10 s here; the client leaves once its first token
# has arrived, however long that took on a loaded or sanitized build).
curl -sN -m 60 "$base/v1/completions" -d '{"model":"gpt2","prompt":"Bye","max_tokens":500,"ignore_eos":true,"stream":true}' > "$dir/cut.txt" &
cut_pid=$!
for _ in $(seq 300); do
    grep -q '^data: {' "$dir/cut.txt" && break
    sleep 0.1
done
kill "$cut_pid" 2> /dev/null || true
wait "$cut_pid" 2> /dev/null || true
grep -q '^data: {' "$dir/cut.txt" || fail "no tokens before the disconnect"
grep -q '^data: \[DONE\]' "$dir/cut.txt" && fail "the stream finished before the client left"
# (grep reads a here-string: `echo "$m" | grep -q` under pipefail fails
# when grep, done at its match, closes the pipe before echo has written
# the rest of the 9 KB page: SIGPIPE.)
for _ in $(seq 50); do
    m=$(curl -s "$base/metrics")
    grep -q '^gpt2d_running_sequences 0$' <<< "$m" && grep -q '^gpt2d_kv_blocks_used 0$' <<< "$m" && break
    sleep 0.1
done
grep -q '^gpt2d_running_sequences 0$' <<< "$m" || fail "running sequences after disconnect"
grep -q '^gpt2d_kv_blocks_used 0$' <<< "$m" || fail "KV blocks after disconnect"
grep -q '^gpt2d_requests_aborted_total 1$' <<< "$m" || fail "the disconnect is not counted"
# The long stream holds the one slot (1,000 tokens: 20 s or more) until it
# is cut after the queued requests' checks.
curl -sN -m 60 "$base/v1/completions" -d '{"model":"gpt2","prompt":"a","max_tokens":1000,"ignore_eos":true,"stream":true}' > /dev/null &
long=$!
wait_metric "gpt2d_running_sequences 1"
curl -sN -m 60 "$base/v1/completions" -d '{"model":"gpt2","prompt":"b","max_tokens":5,"stream":true}' > "$dir/queued.txt" &
queued=$!
wait_metric "gpt2d_queued_requests 1"
check 503 POST /v1/completions '{"model":"gpt2","prompt":"c","max_tokens":5}' -D "$dir/h503.txt"
grep -qi '^retry-after: [0-9]' "$dir/h503.txt" || fail "503 without Retry-After"
wait "$queued" || true
grep -q '^: waiting$' "$dir/queued.txt" || fail "no keep-alive comment while queued: $(head -c 300 "$dir/queued.txt")"
grep -q '^data: {"error"' "$dir/queued.txt" || fail "no error event for a stream that waited too long"
tail -c 14 "$dir/queued.txt" | grep -q 'data: \[DONE\]' || fail "no [DONE] after the error event"
kill "$long" 2> /dev/null || true
wait "$long" || true
wait_metric "gpt2d_running_sequences 0"
python3 - "$(post /v1/completions '{"model":"gpt2","prompt":"d","max_tokens":900,"ignore_eos":true,"timeout":3}')" <<'PY' || fail "deadline"
import json, sys
d = json.loads(sys.argv[1])
c = d["choices"][0]
assert c["finish_reason"] == "length" and 0 < d["usage"]["completion_tokens"] < 900, d["usage"]
PY
kill -TERM "$last_pid"; wait "$last_pid" || true
}

# SIGTERM: /ready turns 503, the running stream finishes, exit 0. A server
# like auth's, its own (a case's servers are its children: wait gives the
# exit status). Its shutdown_timeout is raised from 30 s: 100 tokens of
# this model took 20 s under ASan beside three busy loops, and more in CI
# beside the other slow suites, and a drain cut at its timeout is this
# case's failure, not the server's.
case_drain() {
need_slow
GPT2D_TEST_STEP_DELAY_MS=20 srv_start drain "$dir/slow" --api-key secret-key-123 --max-running 1 --max-queue 1 --step-tokens 1 --shutdown-timeout 240
curl -sN -m 250 -H 'Authorization: Bearer secret-key-123' "$base/v1/completions" -d '{"model":"gpt2","prompt":"z","max_tokens":100,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}' > "$dir/drain.txt" &
drain=$!
wait_metric "gpt2d_running_sequences 1"
kill -TERM "$last_pid"
for _ in $(seq 100); do [ "$(status "$base/ready")" = 503 ] && break; sleep 0.02; done
[ "$(status "$base/ready")" = 503 ] || fail "/ready is not 503 while draining"
check 503 POST /v1/completions '{"model":"gpt2","prompt":"late"}' -H 'Authorization: Bearer secret-key-123'
wait "$drain" || true
wait "$last_pid"; rc=$?
[ "$rc" = 0 ] || fail "exit status $rc after SIGTERM"
grep -q '"completion_tokens":100' "$dir/drain.txt" || fail "the stream did not finish during the drain"
grep -q 'draining' "$dir/drain.log" || fail "no drain in the log"
}
CASES=(health:main greedy:main stream:main seeded:main prefix_cache:main cached_tokens:main
       shared_blocks:main prefix_cache_sighup endoftext:main logprobs:main best_of:main
       stop_string:main partial_utf8:main streams16:main metrics:main errors:main docs:main
       large_bodies:main api_examples:main openai_client:main auth queue drain)
run_cases "$@"
