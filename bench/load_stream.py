#!/usr/bin/env python3
"""bench/load_stream.py BASE_URL CONCURRENCY REQUESTS_PER_WORKER MAX_TOKENS PROMPT_TOKENS [gaps]:
a streaming load generator (stdlib only). Each worker sends streaming
completions back to back; the client parses the SSE stream and records the
time to first token, the gaps between tokens, and the tokens received.
Prints one JSON line with p50/p90/p99 and the aggregate tokens/s. With
`gaps`, it also prints to stderr which token indices the gaps over twice
the median came at: a pause that hits every stream at the same index (all
streams crossing a KV block boundary together) shows up as one index with
CONCURRENCY gaps, a pause in time (the machine) as scattered ones.
Tokens are counted by the events, or by the usage a server sends unasked
(llama-server's last event: it holds back the events of tokens that end
inside a UTF-8 character, so its events undercount). LOAD_MODEL sets the
requests' `model` (default gpt2)."""
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

from sse_client import events, pct

base, conc, per, max_tokens, prompt_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
show_gaps = len(sys.argv) > 6 and sys.argv[6] == "gaps"
MODEL = os.environ.get("LOAD_MODEL", "gpt2")  # the `model` asked for (several checkpoints: bench/models.sh)
u = urllib.parse.urlparse(base)
ttft, itl, tokens = [], [], [0]
gap_index = []  # (gap, token index) for `gaps`
lock = threading.Lock()


def worker(k):
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    for i in range(per):
        # prompt_tokens tokens: " x" repeated is one token each in GPT-2.
        body = json.dumps({"model": MODEL, "prompt": " x" * prompt_tokens, "max_tokens": max_tokens,
                           "temperature": 0.8, "seed": k * 1000 + i, "ignore_eos": True,
                           "stream": True})
        t0 = time.monotonic()
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed the kept-alive connection after the last
            # stream (llama-server does): the request again on a new one.
            conn.close()
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
            t0 = time.monotonic()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
        assert resp.status == 200, resp.status
        first, last, n, usage = None, None, 0, None
        for d in events(resp):
            if d.get("usage"):
                usage = d["usage"]["completion_tokens"]
            if not d["choices"] or d["choices"][0]["finish_reason"]:
                continue
            now = time.monotonic()
            if first is None:
                first = now
                with lock:
                    ttft.append(now - t0)
            else:
                with lock:
                    itl.append(now - last)
                    gap_index.append((now - last, n))
            last = now
            n += 1
        with lock:
            tokens[0] += n if usage is None else usage


t0 = time.monotonic()
threads = [threading.Thread(target=worker, args=(k,)) for k in range(conc)]
for t in threads:
    t.start()
for t in threads:
    t.join()
dt = time.monotonic() - t0
print(json.dumps({"concurrency": conc, "requests": conc * per, "max_tokens": max_tokens,
                  "prompt_tokens": prompt_tokens, "seconds": round(dt, 2),
                  "tokens_per_s": round(tokens[0] / dt, 1),
                  "ttft_p50": round(pct(ttft, 50), 3), "ttft_p90": round(pct(ttft, 90), 3),
                  "ttft_p99": round(pct(ttft, 99), 3),
                  "itl_p50": round(pct(itl, 50), 4), "itl_p99": round(pct(itl, 99), 4)}))
if show_gaps and itl:
    median = pct(itl, 50)
    counts = {}
    for gap, index in gap_index:
        if gap > 2 * median:
            counts[index] = counts.get(index, 0) + 1
    print("gaps over 2x the median (%.1f ms), by token index: %s"
          % (median * 1e3, ", ".join("%d: %d" % kv for kv in sorted(counts.items()))), file=sys.stderr)
