#!/usr/bin/env python3
"""bench/soak.py BASE_URL PID MODEL_FILE MINUTES [CLIENTS]: a soak of one
`gpt2d serve` (stdlib only; bench/soak.sh starts the server and runs it).
An https:// BASE_URL is verified against the certificate file SOAK_CACERT.

CLIENTS (64 by default) threads from one address, each on a kept-alive
connection (a new one after a cancel or a close), send mixed traffic until
MINUTES have passed, and check every answer against what it must be:

  stream     a streamed completion (1-16 tokens, ignore_eos): 200, chunks of
             text_completion, one finish_reason "length", [DONE] last, the
             usage's completion_tokens = max_tokens
  whole      a whole completion with n = 1-3: n choices, each finished by
             "length", usage.completion_tokens = n x max_tokens
  chat       a chat completion: the assistant's message, finish "length"
  cancel     a stream left after its first event (the socket closed)
  tokenize   /tokenize of "Hello, world!" ([15496, 11, 995, 0], the real
             GPT-2 tokenizer's ids) or of a random text, then /detokenize of
             the ids gives the text back
  chain      a stored-response chain on /v1/responses: 2-4 turns, each
             with previous_response_id the turn before's (store, the
             default): 200, status "incomplete" for max_output_tokens
             (ignore_eos), output_tokens = max_output_tokens, the id
             echoed; then GET of the last one gives it back, DELETE
             deletes it, and a GET after is 404 response_not_found
  schema     structured outputs: a chat completion with response_format
             json_schema (strict), or a /v1/responses with text.format
             json_schema, one of 8 schemas (an enum, a boolean, a bounded
             integer): a whole output ("stop", "completed") parses and
             validates; one cut by the token limit ("length",
             "incomplete") used every token it had
  bad        a request that must be refused: malformed JSON (400),
             temperature 9 (400, param temperature), an unknown route
             (404), max_tokens over the limit (400), each in the JSON error
             envelope

Halfway, the server gets SIGHUP (a configuration reload) and its model file
a `touch` (the same bytes: nothing may happen). Anything else than the
expected answer (a 429 or 503 included, a reset, a timeout) is an
unexpected error, counted and the first few described.

A monitor samples /metrics every second: process_resident_memory_bytes,
process_open_fds, gpt2d_kv_blocks_used. Printed at start (idle, before the
load), at their peak, and at the end (idle again: no sequence running or
queued, the clients' connections closed, a few seconds after). The last
line is one JSON object with everything. Exit status 1 when any error was
unexpected, the server did not survive, or its descriptors or KV blocks in
use at the end are not those of the start; else 0. Resident memory is
reported, not judged: it rises while the KV pool's pages are first touched
(its quarters show whether it levels off).
"""
import http.client
import json
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse

base, pid, model_file, minutes = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
clients = int(sys.argv[5]) if len(sys.argv) > 5 else 64
u = urllib.parse.urlparse(base)
HOST, PORT = u.hostname, u.port
WORDS = ("the model a server token stream answer cache block prompt reply tokens alpha beta gamma "
         "delta 42 1999 café naïve 東京 ünïcödé emoji 🙂 tab\tnew\nline").split(" ")

lock = threading.Lock()
counts = {}       # kind -> requests answered as expected
errors = []       # (kind, what) of the unexpected, all kept (counted), the first printed
stop_at = [0.0]
schema_whole = [0]  # schema outputs that ended whole (parsed and validated), not cut by the limit


class Unexpected(Exception):
    pass


def want(cond, what):
    if not cond:
        raise Unexpected(what)


# HTTPS (bench/soak.sh TLS=1): the server's certificate is SOAK_CACERT.
TLS = None
if u.scheme == "https":
    import ssl
    TLS = ssl.create_default_context(cafile=os.environ["SOAK_CACERT"])


def connection(timeout=120):
    if TLS is not None:
        return http.client.HTTPSConnection(HOST, PORT, timeout=timeout, context=TLS)
    return http.client.HTTPConnection(HOST, PORT, timeout=timeout)


def post(conn, path, body, stream=False):
    """(status, parsed JSON or the response itself when stream)."""
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if stream and r.status == 200:
        return r.status, r
    raw = r.read()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        raise Unexpected("%s %d: not JSON: %r" % (path, r.status, raw[:120]))


def call(conn, method, path):
    """(status, parsed JSON) of a request without a body."""
    conn.request(method, path)
    r = conn.getresponse()
    raw = r.read()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        raise Unexpected("%s %s %d: not JSON: %r" % (method, path, r.status, raw[:120]))


def sse_events(resp):
    """Every SSE event's data of resp, [DONE] included, until the end."""
    buf, out = b"", []
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
    for ev in buf.split(b"\n\n"):
        ev = ev.strip(b"\n")
        if ev.startswith(b"data: "):
            out.append(ev[6:].decode())
        elif ev and not ev.startswith(b":"):
            raise Unexpected("an SSE event that is neither data nor a comment: %r" % ev[:80])
    return out


def envelope(d, status, what):
    want(isinstance(d, dict) and isinstance(d.get("error"), dict)
         and set(d["error"]) == {"message", "type", "param", "code"}, "%s: %d without the error envelope: %r"
         % (what, status, d))
    return d["error"]


def prompt(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24)))


def do_stream(conn, rng):
    k = rng.randint(1, 16)
    st, r = post(conn, "/v1/completions", {"model": "gpt2", "prompt": prompt(rng), "max_tokens": k,
                                           "ignore_eos": True, "stream": True, "seed": rng.randint(0, 1 << 30),
                                           "stream_options": {"include_usage": True}}, stream=True)
    want(st == 200, "stream: status %d %r" % (st, r))
    evs = sse_events(r)
    want(evs and evs[-1] == "[DONE]", "stream: no [DONE] last: %r" % evs[-2:])
    chunks = [json.loads(e) for e in evs[:-1]]
    want(all(c["object"] == "text_completion" for c in chunks), "stream: a chunk of another object")
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    want(finishes.count("length") == 1 and finishes.count(None) == len(finishes) - 1,
         "stream: finish reasons %r" % finishes)
    usage = [c["usage"] for c in chunks if not c["choices"] and c.get("usage")]
    want(len(usage) == 1 and usage[0]["completion_tokens"] == k, "stream: usage %r, want %d tokens" % (usage, k))


def do_whole(conn, rng):
    k, n = rng.randint(1, 12), rng.randint(1, 3)
    st, d = post(conn, "/v1/completions", {"model": "gpt2", "prompt": prompt(rng), "max_tokens": k, "n": n,
                                           "ignore_eos": True, "temperature": 0.9,
                                           "seed": rng.randint(0, 1 << 30)})
    want(st == 200, "whole: status %d %r" % (st, d))
    want(len(d["choices"]) == n and sorted(c["index"] for c in d["choices"]) == list(range(n)),
         "whole: %d choices, want %d" % (len(d["choices"]), n))
    want(all(c["finish_reason"] == "length" and isinstance(c["text"], str) for c in d["choices"]),
         "whole: choices %r" % d["choices"])
    want(d["usage"]["completion_tokens"] == n * k, "whole: usage %r, want %d" % (d["usage"], n * k))


def do_chat(conn, rng):
    k = rng.randint(1, 12)
    st, d = post(conn, "/v1/chat/completions", {"model": "gpt2", "max_tokens": k, "ignore_eos": True,
                                                "messages": [{"role": "user", "content": prompt(rng)}]})
    want(st == 200, "chat: status %d %r" % (st, d))
    c = d["choices"][0]
    want(d["object"] == "chat.completion" and c["message"]["role"] == "assistant"
         and isinstance(c["message"]["content"], str) and c["finish_reason"] == "length",
         "chat: %r" % d)
    want(d["usage"]["completion_tokens"] == k, "chat: usage %r, want %d" % (d["usage"], k))


def do_chain(conn, rng):
    prev = None
    for turn in range(rng.randint(2, 4)):
        k = rng.randint(1, 8)
        body = {"model": "gpt2", "input": prompt(rng), "max_output_tokens": k, "ignore_eos": True,
                "seed": rng.randint(0, 1 << 30)}
        if prev is not None:
            body["previous_response_id"] = prev
        st, d = post(conn, "/v1/responses", body)
        want(st == 200, "chain turn %d: status %d %r" % (turn, st, d))
        want(d["object"] == "response" and d["id"].startswith("resp_") and d["store"] is True,
             "chain turn %d: %r" % (turn, d))
        want(d["previous_response_id"] == prev, "chain turn %d: previous_response_id %r, want %r"
             % (turn, d["previous_response_id"], prev))
        want(d["status"] == "incomplete" and d["incomplete_details"] == {"reason": "max_output_tokens"},
             "chain turn %d: status %r %r" % (turn, d["status"], d["incomplete_details"]))
        want(d["usage"]["output_tokens"] == k, "chain turn %d: usage %r, want %d" % (turn, d["usage"], k))
        want(isinstance(d["output_text"], str), "chain turn %d: output_text %r" % (turn, d["output_text"]))
        prev = d["id"]
    st, d = call(conn, "GET", "/v1/responses/" + prev)
    want(st == 200 and d["id"] == prev, "chain: GET of the last response: %d %r" % (st, d))
    st, d = call(conn, "DELETE", "/v1/responses/" + prev)
    want(st == 200 and d == {"id": prev, "object": "response.deleted", "deleted": True},
         "chain: DELETE: %d %r" % (st, d))
    st, d = call(conn, "GET", "/v1/responses/" + prev)
    e = envelope(d, st, "GET after DELETE")
    want(st == 404 and e["code"] == "response_not_found", "chain: GET after DELETE: %d %r" % (st, e))


MOODS = ("calm", "busy", "idle", "late", "glad", "grey", "warm", "cold")


def schema_of(i):
    """One of 8 schemas: a few compiled formats, cached and reused."""
    return {"type": "object", "additionalProperties": False, "required": ["ok", "mood", "n"],
            "properties": {"ok": {"type": "boolean"}, "mood": {"enum": list(MOODS[:i + 1])},
                           "n": {"type": "integer", "minimum": 0, "maximum": 99}}}


def check_schema_output(text, i, what):
    with lock:
        schema_whole[0] += 1
    try:
        v = json.loads(text)
    except ValueError:
        raise Unexpected("%s: a whole output that is not JSON: %r" % (what, text[:120]))
    want(isinstance(v, dict) and set(v) == {"ok", "mood", "n"} and isinstance(v["ok"], bool)
         and v["mood"] in MOODS[:i + 1] and isinstance(v["n"], int) and 0 <= v["n"] <= 99,
         "%s: the output does not validate against schema %d: %r" % (what, i, text[:120]))


def do_schema(conn, rng):
    i, k = rng.randrange(len(MOODS)), rng.randint(4, 40)
    if rng.random() < 0.5:
        st, d = post(conn, "/v1/chat/completions", {
            "model": "gpt2", "max_tokens": k, "seed": rng.randint(0, 1 << 30),
            "messages": [{"role": "user", "content": prompt(rng)}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "soak%d" % i, "strict": True, "schema": schema_of(i)}}})
        want(st == 200, "schema (chat): status %d %r" % (st, d))
        c = d["choices"][0]
        if c["finish_reason"] == "stop":
            check_schema_output(c["message"]["content"], i, "schema (chat)")
        else:
            want(c["finish_reason"] == "length" and d["usage"]["completion_tokens"] == k,
                 "schema (chat): finish %r after %r tokens of %d" % (c["finish_reason"], d["usage"], k))
        return
    st, d = post(conn, "/v1/responses", {
        "model": "gpt2", "input": prompt(rng), "max_output_tokens": k, "seed": rng.randint(0, 1 << 30),
        "store": False,
        "text": {"format": {"type": "json_schema", "name": "soak%d" % i, "strict": True, "schema": schema_of(i)}}})
    want(st == 200 and d["object"] == "response", "schema (responses): status %d %r" % (st, d))
    if d["status"] == "completed":
        check_schema_output(d["output_text"], i, "schema (responses)")
    else:
        want(d["status"] == "incomplete" and d["usage"]["output_tokens"] == k,
             "schema (responses): status %r after %r tokens of %d" % (d["status"], d["usage"], k))


FIRST_EVENT = re.compile(rb"(?:^|\n\n)data: \{[^\n]*\n\n")


def do_cancel(conn, rng):
    """Leaves a 64-token stream after its first event; the connection is
    closed (the caller opens a new one)."""
    st, r = post(conn, "/v1/completions", {"model": "gpt2", "prompt": prompt(rng), "max_tokens": 64,
                                           "ignore_eos": True, "stream": True}, stream=True)
    want(st == 200, "cancel: status %d %r" % (st, r))
    buf = b""
    while not FIRST_EVENT.search(buf):  # a queued stream gets ": waiting" comments first
        chunk = r.read1(4096)
        want(chunk, "cancel: the stream ended before its first event: %r" % buf[:120])
        buf += chunk
    conn.sock.shutdown(socket.SHUT_RDWR)  # a TLS socket too: the server reads an end, no close_notify
    conn.close()


def do_tokenize(conn, rng):
    text = "Hello, world!" if rng.random() < 0.5 else prompt(rng)
    st, d = post(conn, "/tokenize", {"prompt": text})
    want(st == 200 and d["count"] == len(d["tokens"]), "tokenize: %d %r" % (st, d))
    if text == "Hello, world!":
        want(d["tokens"] == [15496, 11, 995, 0], "tokenize: 'Hello, world!' gave %r" % d["tokens"])
    st, e = post(conn, "/detokenize", {"tokens": d["tokens"]})
    want(st == 200 and e["prompt"] == text, "detokenize: %d %r, want %r" % (st, e, text))


def do_bad(conn, rng):
    which = rng.randrange(4)
    if which == 0:
        st, d = post(conn, "/v1/completions", b'{"model": "gpt2", "prompt": ')
        envelope(d, st, "malformed JSON")
        want(st == 400, "malformed JSON: %d" % st)
    elif which == 1:
        st, d = post(conn, "/v1/completions", {"model": "gpt2", "prompt": "x", "temperature": 9})
        e = envelope(d, st, "temperature 9")
        want(st == 400 and e["param"] == "temperature", "temperature 9: %d %r" % (st, e))
    elif which == 2:
        st, d = post(conn, "/v1/nothing", {"x": 1})
        envelope(d, st, "unknown route")
        want(st == 404, "unknown route: %d" % st)
    else:
        st, d = post(conn, "/v1/completions", {"model": "gpt2", "prompt": "x", "max_tokens": 10 ** 7})
        envelope(d, st, "max_tokens 10^7")
        want(st == 400, "max_tokens 10^7: %d" % st)


def do_embed(conn, rng):
    n = rng.randint(1, 40)
    body = {"model": "gpt2", "input": [prompt(rng) for _ in range(n)]}
    if rng.random() < 0.5:
        body["encoding_format"] = "base64"
    st, d = post(conn, "/v1/embeddings", body)
    want(st == 200, "embeddings: status %d %r" % (st, d))
    want(len(d["data"]) == n and [e["index"] for e in d["data"]] == list(range(n)), "embeddings: %r" % d["data"][:1])
    e = d["data"][0]["embedding"]
    if isinstance(e, list):
        want(abs(sum(x * x for x in e) - 1) < 1e-4, "embeddings: length %r" % sum(x * x for x in e))


TOOL = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 12}},
        "required": ["a", "b"], "additionalProperties": False}


def do_tool(conn, rng):
    body = {"model": "gpt2", "max_tokens": 64, "seed": rng.randint(0, 1 << 30), "tool_choice": "required",
            "messages": [{"role": "user", "content": prompt(rng)}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": TOOL}}]}
    st, d = post(conn, "/v1/chat/completions", body)
    want(st == 200, "tool: status %d %r" % (st, d))
    c = d["choices"][0]
    if c["finish_reason"] == "length":  # cut by max_tokens: the call's text as it came
        return
    want(c["finish_reason"] == "tool_calls", "tool: %r" % c)
    a = json.loads(c["message"]["tool_calls"][0]["function"]["arguments"])
    want(set(a) == {"a", "b"} and type(a["a"]) is int and len(a["b"]) <= 12, "tool: arguments %r" % a)


KINDS = [("stream", do_stream, 26), ("whole", do_whole, 17), ("chat", do_chat, 7), ("cancel", do_cancel, 9),
         ("tokenize", do_tokenize, 14), ("chain", do_chain, 8), ("schema", do_schema, 8), ("bad", do_bad, 11),
         ("embed", do_embed, 5), ("tool", do_tool, 5)]


def client(i):
    rng = random.Random(1000 + i)
    conn = connection()
    population = [k for k in KINDS for _ in range(k[2])]
    while time.monotonic() < stop_at[0]:
        name, fn, _ = rng.choice(population)
        try:
            fn(conn, rng)
            with lock:
                counts[name] = counts.get(name, 0) + 1
            if name == "cancel":
                conn = connection()
        except (Unexpected, OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
            with lock:
                errors.append((name, "%s: %s" % (e.__class__.__name__, e)))
            conn.close()
            conn = connection()
    conn.close()


def metrics():
    """{name: value} of the unlabelled series the soak watches."""
    c = connection(30)
    try:
        c.request("GET", "/metrics")
        body = c.getresponse().read().decode()
    finally:
        c.close()
    out = {}
    for name in ("process_resident_memory_bytes", "process_open_fds", "gpt2d_kv_blocks_used",
                 "gpt2d_running_sequences", "gpt2d_queued_requests", "gpt2d_prefix_cache_blocks",
                 "gpt2d_kv_blocks_capacity", "gpt2d_structured_cache_bytes"):
        m = re.search(r"^%s (\S+)$" % name, body, re.M)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


samples = []


def monitor(done):
    while not done.is_set():
        try:
            samples.append(metrics())
        except OSError as e:
            with lock:
                errors.append(("metrics", "%s: %s" % (e.__class__.__name__, e)))
        done.wait(1.0)


def idle_sample(timeout=120):
    """A sample once nothing runs or waits, a few seconds on (the cancelled
    streams' sequences end, keep-alive connections close)."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics()
        if m["gpt2d_running_sequences"] == 0 and m["gpt2d_queued_requests"] == 0:
            break
        if time.monotonic() > deadline:
            return m
        time.sleep(0.5)
    time.sleep(3)
    return metrics()


def alive():
    try:
        os.kill(pid, 0)
        return not open("/proc/%d/stat" % pid).read().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def main():
    start = idle_sample()
    t0 = time.monotonic()
    stop_at[0] = t0 + minutes * 60
    done = threading.Event()
    mon = threading.Thread(target=monitor, args=(done,), daemon=True)
    mon.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    # Halfway: a reload and a touch of the model file (the same bytes).
    time.sleep(minutes * 30)
    os.kill(pid, signal.SIGHUP)
    os.utime(model_file)
    midway = "SIGHUP and a touch of %s at %.0f s" % (os.path.basename(model_file), time.monotonic() - t0)
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    done.set()
    mon.join()
    survived = alive()
    end = idle_sample() if survived else {}
    if not survived:
        errors.append(("server", "the server (pid %d) is gone" % pid))
    peak = {k: max(s[k] for s in samples) for k in start} if samples else {}
    total = sum(counts.values())
    mib = 1 << 20
    print("soak: %d clients for %.1f min over %s; %s" % (clients, elapsed / 60, u.scheme, midway))
    print("requests answered as expected: %d (%s)" % (total, ", ".join("%s %d" % (k, counts.get(k, 0))
                                                                        for k, _, _ in KINDS)))
    print("structured outputs that ended whole and validated: %d of %d" % (schema_whole[0], counts.get("schema", 0)))
    print("unexpected errors: %d" % len(errors))
    for kind, what in errors[:10]:
        print("  %s: %s" % (kind, what[:300]))
    print("%-22s %10s %10s %10s" % ("", "start", "peak", "end"))
    for k, scale, unit in (("process_resident_memory_bytes", mib, "RSS MiB"), ("process_open_fds", 1, "descriptors"),
                           ("gpt2d_kv_blocks_used", 1, "KV blocks used"),
                           ("gpt2d_structured_cache_bytes", 1024, "format cache KiB")):
        print("%-22s %10.1f %10.1f %10s" % (unit, start[k] / scale, peak.get(k, float("nan")) / scale,
                                            "%.1f" % (end[k] / scale) if end else "-"))
    # Resident memory over the run: the KV pool's pages and the allocator's
    # arenas are touched once (a rise that levels off); a leak keeps rising.
    quarters = [samples[min(len(samples) - 1, len(samples) * q // 4)]["process_resident_memory_bytes"] / mib
                for q in (1, 2, 3, 4)] if samples else []
    print("RSS MiB at 1/4, 1/2, 3/4 and the end of the load: %s" % ", ".join("%.1f" % q for q in quarters))
    if end:
        print("KV pool: %d blocks; %d hold cached prompts at the end (the prefix cache gives them up only "
              "when no never-used block is left, so the pool's pages are touched progressively)"
              % (end["gpt2d_kv_blocks_capacity"], end["gpt2d_prefix_cache_blocks"]))
    back = bool(end) and all(end[k] == start[k] for k in ("process_open_fds", "gpt2d_kv_blocks_used"))
    print("descriptors and KV blocks back to the start at idle: %s" % ("yes" if back else "NO"))
    print(json.dumps({"clients": clients, "minutes": round(elapsed / 60, 2), "requests": total, "by_kind": counts,
                      "unexpected_errors": len(errors), "start": start, "peak": peak, "end": end,
                      "rss_mib_quarters": quarters, "back_to_start": back, "survived": survived}))
    return 1 if errors or not survived or not back else 0


if __name__ == "__main__":
    sys.exit(main())
