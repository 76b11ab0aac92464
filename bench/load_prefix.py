#!/usr/bin/env python3
"""bench/load_prefix.py BASE_URL SCENARIO ...: prefix-cache load (stdlib only).
Prompts are token-id lists (random ids from a seeded generator), so their
lengths and overlaps are exact.

  ttft BASE REPEATS
      a 512-token prompt whose first 496 tokens were seen before (the warm
      request follows one with the same 496 and a different tail), against a
      512-token prompt never seen (cold); one request at a time, max_tokens 1.
  echo BASE REPEATS
      echo + logprobs 1 + max_tokens 0 (scoring) on 512-token prompts, one
      request at a time: a new prompt without echo (max_tokens 1), the same
      prompt again, the same with echo (its blocks keep no logprobs yet, so
      it computes), and echo again (from the blocks the first echo left
      their logprobs with).
  batch BASE REPEATS
      one request at a time, each a new 400-token context: scoring 8
      continuations of 16 tokens (a list of 8 prompts, echo, logprobs 1,
      max_tokens 0, as evaluation harnesses send them), then n = 4 choices
      of 32 tokens on the context + a 16-token tail; seconds per request.
  load BASE CONCURRENCY PER SHARED_EVERY PREFIX SUFFIX MAX_TOKENS SEED
      CONCURRENCY streaming workers, PER requests each; request i of worker k
      shares a PREFIX-token prefix when (k * PER + i) % SHARED_EVERY == 0
      (1: all, 2: half, 0: none), else its whole prompt is unique; every
      prompt has a unique SUFFIX-token tail. Time to first token, aggregate
      completion tokens/s and the cached_tokens the server reported.
Prints one JSON line."""
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

from sse_client import events, pct

base, scenario = sys.argv[1], sys.argv[2]
u = urllib.parse.urlparse(base)


def ids(rng, n):
    return [rng.randrange(256, 50000) for _ in range(n)]


def stream(conn, prompt, max_tokens, seed):
    """(ttft, tokens, cached_tokens) of one streaming completion."""
    body = json.dumps({"model": "gpt2", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0.8, "seed": seed, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, (resp.status, resp.read()[:200])
    first, n, cached = None, 0, None
    for d in events(resp):
        if d.get("usage"):
            cached = d["usage"]["prompt_tokens_details"]["cached_tokens"]
        if not d["choices"] or d["choices"][0]["finish_reason"]:
            continue
        if first is None:
            first = time.monotonic() - t0
        n += 1
    return first, n, cached


if scenario == "ttft":
    repeats = int(sys.argv[3])
    rng = random.Random(1)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    cold, warm, cached = [], [], []
    for r in range(repeats):
        cold.append(stream(conn, ids(rng, 512), 1, r)[0])
        seen = ids(rng, 496)
        stream(conn, seen + ids(rng, 16), 1, r)  # the earlier request
        t, _, c = stream(conn, seen + ids(rng, 16), 1, r)
        warm.append(t)
        cached.append(c)
    print(json.dumps({"scenario": "ttft", "repeats": repeats,
                      "cold_p50": round(pct(cold, 50), 4), "warm_p50": round(pct(warm, 50), 4),
                      "ratio_p50": round(pct(warm, 50) / pct(cold, 50), 3),
                      "cold": [round(x, 4) for x in cold], "warm": [round(x, 4) for x in warm],
                      "warm_cached_tokens": cached}))
elif scenario == "echo":
    repeats = int(sys.argv[3])
    rng = random.Random(2)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)

    def timed(body):
        t0 = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        d = json.loads(conn.getresponse().read())
        return time.monotonic() - t0, d["usage"]["prompt_tokens_details"]["cached_tokens"]

    runs = {"cold": [], "cached": [], "echo_cold": [], "echo_cached": []}
    for r in range(repeats):
        p = ids(rng, 512)
        plain = {"model": "gpt2", "prompt": p, "max_tokens": 1}
        score = {"model": "gpt2", "prompt": p, "max_tokens": 0, "echo": True, "logprobs": 1}
        runs["cold"].append(timed(plain)[0])
        runs["cached"].append(timed(plain)[0])
        t, c = timed(score)
        assert c == 0, c
        runs["echo_cold"].append(t)
        t, c = timed(score)
        assert c == 480, c
        runs["echo_cached"].append(t)
    out = {"scenario": "echo", "repeats": repeats}
    for k, v in runs.items():
        out[k + "_p50"] = round(pct(v, 50), 4)
        out[k] = [round(x, 4) for x in v]
    print(json.dumps(out))
elif scenario == "batch":
    repeats = int(sys.argv[3])
    rng = random.Random(3)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)

    def timed(body):
        t0 = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        d = json.loads(conn.getresponse().read())
        return time.monotonic() - t0, d["usage"]

    score, choices, cached = [], [], []
    for r in range(repeats):
        ctx = ids(rng, 400)
        t, us = timed({"model": "gpt2", "prompt": [ctx + ids(rng, 16) for _ in range(8)],
                       "max_tokens": 0, "echo": True, "logprobs": 1})
        score.append(t)
        cached.append(us["prompt_tokens_details"]["cached_tokens"])
        t, us = timed({"model": "gpt2", "prompt": ids(rng, 400) + ids(rng, 16), "n": 4,
                       "max_tokens": 32, "temperature": 0.8, "seed": r, "ignore_eos": True})
        choices.append(t)
    print(json.dumps({"scenario": "batch", "repeats": repeats,
                      "score8_p50": round(pct(score, 50), 3), "n4_p50": round(pct(choices, 50), 3),
                      "score8": [round(x, 3) for x in score], "n4": [round(x, 3) for x in choices],
                      "score8_cached_tokens": cached}))
elif scenario == "load":
    conc, per, every, nprefix, nsuffix, max_tokens, seed = (int(x) for x in sys.argv[3:10])
    prefix = ids(random.Random(seed), nprefix)
    ttft, tokens, cached = [], [0], [0]
    lock = threading.Lock()

    def worker(k):
        rng = random.Random(seed * 7919 + k)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        for i in range(per):
            j = k * per + i
            shared = every > 0 and j % every == 0
            prompt = (prefix if shared else ids(rng, nprefix)) + ids(rng, nsuffix)
            t, n, c = stream(conn, prompt, max_tokens, j)
            with lock:
                ttft.append(t)
                tokens[0] += n
                cached[0] += c or 0

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.monotonic() - t0
    print(json.dumps({"scenario": "load", "concurrency": conc, "requests": conc * per,
                      "shared_every": every, "prefix": nprefix, "suffix": nsuffix,
                      "max_tokens": max_tokens, "seconds": round(dt, 2),
                      "tokens_per_s": round(tokens[0] / dt, 1),
                      "ttft_mean": round(sum(ttft) / len(ttft), 3),
                      "ttft_p50": round(pct(ttft, 50), 3), "ttft_p90": round(pct(ttft, 90), 3),
                      "cached_tokens": cached[0]}))
else:
    sys.exit(__doc__)
