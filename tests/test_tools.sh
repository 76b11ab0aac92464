#!/usr/bin/env bash
# tests/test_tools.sh GPT2D [CASE...]: function tools against a live server
# (docs/api.md, "Tool calls"): chat's calls on the wire, whole and
# streamed, and through the OpenAI Node client, the AI SDK and LangChain
# (differential/openai_tools.mjs, the Responses API there too); a chat
# template file's own tool format (its listing, marker and result form,
# read back by the prompt's token count, a call recognised by its marker);
# and what GET /v1/responses/{id}/input_items shows of function_call and
# function_call_output items, item references to them included. Each case
# is a function case_NAME; name cases to run only those, `--list` lists
# them (tests/lib/cases.sh). A missing npm package skips what needs it
# (exit 77 at the end), and fails with GPT2D_REQUIRE_ALL=1 or CI.
set -euo pipefail
gpt2d=$(realpath "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/gpt2d-tools-XXXXXX)
. "$here/lib/cases.sh"
. "$here/lib/server.sh"
cleanup() { srv_stop_all; rm -rf "$dir"; }
trap cleanup EXIT

srv_model "$dir/long" long
# Tools need room: their list alone is over the tiny model's 128 positions.
fixture_long() {
    srv_start long "$dir/long" --kv-cache-mb 64 --api-key test-key-123
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

# A template file's own tool format: the listing, the call's form and
# marker (no lead), the result's form. The prompt chat makes of a turn with
# an earlier call and its result is the text docs/api.md describes (its
# token count against /tokenize's of that text); a required call is valid;
# with auto, a reply whose first token begins the file's marker is a call.
case_tool_template() {
cat > "$dir/tools.tmpl" <<'T'
system = "<|im_start|>system\n{content}<|im_end|>\n"
user = "<|im_start|>user\n{content}<|im_end|>\n"
assistant = "<|im_start|>assistant\n{content}<|im_end|>\n"
generation = "<|im_start|>assistant\n"
stop = "<|im_end|>"
tools = "# Tools\n{tools}"
tool_call = "<call>{call}</call>"
tool_call_lead = ""
tool_result = "<result>{content}</result>"
T
srv_start tmpl "$dir/long" --kv-cache-mb 64 --chat-template "$dir/tools.tmpl"
/usr/bin/python3 - "$base" <<'PY'
import json, sys, urllib.request
base = sys.argv[1]
def call(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)
add = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "add", "description": "Adds", "parameters": add}}]
turn = [{"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"}]
listing = json.dumps({"name": "add", "parameters": add, "description": "Adds"}, separators=(",", ":"))
want = ("<|im_start|>system\n# Tools\n" + listing + "<|im_end|>\n"
        "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
        "<|im_start|>assistant\n<call>{\"name\":\"add\",\"arguments\":{\"a\":2,\"b\":3}}</call><|im_end|>\n"
        "<|im_start|>user\n<result>5</result><|im_end|>\n"
        "<|im_start|>assistant\n<call>")
d = call("/v1/chat/completions", {"messages": turn, "tools": tools, "tool_choice": "required",
                                  "max_tokens": 60, "seed": 1})
n = call("/tokenize", {"prompt": want})["count"]
assert d["usage"]["prompt_tokens"] == n, (d["usage"], n)
c = d["choices"][0]
assert c["finish_reason"] == "tool_calls", c
a = json.loads(c["message"]["tool_calls"][0]["function"]["arguments"])
assert set(a) == {"a", "b"} and all(type(v) is int for v in a.values()), a
# auto: the marker's first token pushed; the rest of the marker is forced.
first = call("/tokenize", {"prompt": "<call>"})["tokens"][0]
d = call("/v1/chat/completions", {"messages": turn[:1], "tools": tools, "max_tokens": 60, "seed": 2,
                                  "logit_bias": {str(first): 100}})
c = d["choices"][0]
assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None, c
print("tool template: ok")
PY
}

# GET /v1/responses/{id}/input_items as OpenAI's: function_call items
# {id, type, status, call_id, name, arguments (as sent)} and
# function_call_output items {id, type, status, call_id, output}; an
# item_reference to a stored response's call (its fc_ id) is that call.
case_responses_tool_items() {
/usr/bin/python3 - "$base" <<'PY'
import json, sys, urllib.request
base = sys.argv[1]
H = {"Authorization": "Bearer test-key-123", "Content-Type": "application/json"}
def call(path, body=None):
    req = urllib.request.Request(base + path, json.dumps(body).encode() if body else None, H)
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)
add = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
tools = [{"type": "function", "name": "add", "parameters": add}]
args = "{\"a\": 2, \"b\": 3}"
items = [{"role": "user", "content": "Add 2 and 3."},
         {"type": "function_call", "call_id": "call_x", "name": "add", "arguments": args},
         {"type": "function_call_output", "call_id": "call_x", "output": "5"}]
r = call("/v1/responses", {"input": items, "tools": tools, "max_output_tokens": 4, "seed": 1})
hexid = r["id"][len("resp_"):]
got = call("/v1/responses/%s/input_items?order=asc" % r["id"])["data"]
assert got[0]["type"] == "message" and got[0]["id"] == "msg_%s_in0" % hexid, got
assert got[1] == {"id": "fc_%s_in1" % hexid, "type": "function_call", "status": "completed",
                  "call_id": "call_x", "name": "add", "arguments": args}, got[1]
assert got[2] == {"id": "fco_%s_in2" % hexid, "type": "function_call_output", "status": "completed",
                  "call_id": "call_x", "output": "5"}, got[2]
# A call made here, its output sent back by previous_response_id.
r1 = call("/v1/responses", {"input": "Add 2 and 3.", "tools": tools, "tool_choice": "required",
                            "max_output_tokens": 60, "seed": 2})
fc = r1["output"][0]
assert fc["type"] == "function_call" and fc["id"] == "fc_" + r1["id"][len("resp_"):], fc
r2 = call("/v1/responses", {"previous_response_id": r1["id"], "tools": tools, "max_output_tokens": 4,
                            "input": [{"type": "function_call_output", "call_id": fc["call_id"], "output": "5"}]})
got = call("/v1/responses/%s/input_items" % r2["id"])["data"]
assert [g["type"] for g in got] == ["function_call_output"] and got[0]["call_id"] == fc["call_id"], got
# The call by reference: the stored call, as it was made.
r3 = call("/v1/responses", {"tools": tools, "max_output_tokens": 4, "input": [
    {"type": "item_reference", "id": fc["id"]},
    {"type": "function_call_output", "call_id": fc["call_id"], "output": "5"}]})
got = call("/v1/responses/%s/input_items?order=asc" % r3["id"])["data"]
want = {k: fc[k] for k in ("type", "call_id", "name", "arguments")}
assert {k: got[0][k] for k in want} == want and got[0]["status"] == "completed", (got[0], fc)
print("responses tool items: ok")
PY
}

# logprobs with tools, as OpenAI defines them (the tokens of the message's
# content): a reply that is text has every token's entry, whole and
# streamed; a call has none ({"content": null}; streamed, its chunks'
# logprobs null); Responses: a text reply's output_text part has them, a
# function_call item has no logprobs.
case_tool_logprobs() {
/usr/bin/python3 - "$base" <<'PY'
import json, sys, urllib.request
base = sys.argv[1]
H = {"Authorization": "Bearer test-key-123", "Content-Type": "application/json"}
def call(path, body, raw=False):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), H)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode() if raw else json.load(r)
def chunks(raw):
    return [json.loads(l[6:]) for l in raw.split("\n\n") if l.startswith("data: {")]
add = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
tools = [{"type": "function", "function": {"name": "add", "parameters": add}}]
msgs = [{"role": "user", "content": "Add 2 and 3."}]
lp = {"logprobs": True, "top_logprobs": 2}
# auto, a text reply: every token's entry, the same whole and streamed.
body = dict({"messages": msgs, "tools": tools, "max_tokens": 8, "seed": 1}, **lp)
d = call("/v1/chat/completions", body)
c = d["choices"][0]
assert "tool_calls" not in c["message"], c
ents = c["logprobs"]["content"]
assert len(ents) == d["usage"]["completion_tokens"] and all(len(e["top_logprobs"]) == 2 for e in ents), d
got = []
for ch in chunks(call("/v1/chat/completions", dict(body, stream=True), raw=True)):
    got += ((ch["choices"][0]["logprobs"] or {}).get("content") or [])
assert got == ents, (got, ents)
# a call (required; auto pushed to the marker): content null, whole and streamed.
first = call("/tokenize", {"prompt": " <"})["tokens"][0]
for extra in ({"tool_choice": "required"}, {"logit_bias": {str(first): 100}}):
    body = dict({"messages": msgs, "tools": tools, "max_tokens": 100, "seed": 2}, **lp, **extra)
    c = call("/v1/chat/completions", body)["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["logprobs"] == {"content": None}, c
    for ch in chunks(call("/v1/chat/completions", dict(body, stream=True), raw=True)):
        assert ch["choices"][0]["logprobs"] is None, ch
# Responses: a text reply's part has them; a call's item has none.
rtools = [{"type": "function", "name": "add", "parameters": add}]
r = call("/v1/responses", {"input": "Add 2 and 3.", "tools": rtools, "max_output_tokens": 8, "seed": 1,
                           "include": ["message.output_text.logprobs"]})
part = r["output"][0]["content"][0]
assert r["output"][0]["type"] == "message" and len(part["logprobs"]) == r["usage"]["output_tokens"], r
r = call("/v1/responses", {"input": "Add 2 and 3.", "tools": rtools, "tool_choice": "required",
                           "max_output_tokens": 60, "seed": 1, "include": ["message.output_text.logprobs"]})
assert r["output"][0]["type"] == "function_call" and "logprobs" not in r["output"][0], r
print("tool logprobs: ok")
PY
}

CASES=(tool_calls:long tool_logprobs:long tool_clients:long responses_tool_items:long tool_template)
run_cases "$@"
