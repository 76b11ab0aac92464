#!/usr/bin/env python3
"""bench/load_stream.py BASE_URL CONCURRENCY REQUESTS_PER_WORKER MAX_TOKENS PROMPT_TOKENS:
a streaming load generator (stdlib only). Each worker sends streaming
completions back to back; the client parses the SSE stream and records the
time to first token, the gaps between tokens, and the tokens received.
Prints one JSON line with p50/p90/p99 and the aggregate tokens/s."""
import http.client
import json
import sys
import threading
import time
import urllib.parse

from sse_client import events, pct

base, conc, per, max_tokens, prompt_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
u = urllib.parse.urlparse(base)
ttft, itl, tokens = [], [], [0]
lock = threading.Lock()


def worker(k):
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    for i in range(per):
        # prompt_tokens tokens: " x" repeated is one token each in GPT-2.
        body = json.dumps({"model": "gpt2", "prompt": " x" * prompt_tokens, "max_tokens": max_tokens,
                           "temperature": 0.8, "seed": k * 1000 + i, "ignore_eos": True,
                           "stream": True})
        t0 = time.monotonic()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.status
        first, last, n = None, None, 0
        for d in events(resp):
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
            last = now
            n += 1
        with lock:
            tokens[0] += n


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
