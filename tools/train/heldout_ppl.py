#!/usr/bin/python3
"""tools/train/heldout_ppl.py URL HELDOUT_U16 [--window N] [--max-windows M] [--api-key K]:
perplexity of the model a gpt2d server serves on held-out text, through the
API: every window of N token ids (default: the model's context length, from
/v1/models... or 512) is sent as a prompt with "max_tokens": 0, "echo": true,
"logprobs": 0, and the returned log-probabilities of every token but each
window's first are summed. Prints the token count, the mean negative
log-likelihood and the perplexity. Standard library only."""
import argparse
import json
import math
import struct
import sys
import urllib.request


def post(url, body, key):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": "Bearer " + key} if key else {})})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url"), p.add_argument("heldout")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--api-key")
    p.add_argument("--max-windows", type=int, help="score only the first N windows")
    a = p.parse_args()
    raw = open(a.heldout, "rb").read()
    ids = list(struct.unpack(f"<{len(raw) // 2}H", raw))
    nll, n = 0.0, 0
    for k, i in enumerate(range(0, len(ids) - 1, a.window)):
        if a.max_windows is not None and k >= a.max_windows:
            break
        win = ids[i:i + a.window]
        if len(win) < 2:
            break
        r = post(a.url.rstrip("/") + "/v1/completions",
                 {"prompt": win, "max_tokens": 0, "echo": True, "logprobs": 0}, a.api_key)
        lps = r["choices"][0]["logprobs"]["token_logprobs"]
        assert lps[0] is None and len(lps) == len(win), "unexpected logprobs shape"
        nll -= sum(lps[1:])
        n += len(lps) - 1
    print(json.dumps({"tokens": n, "window": a.window, "nll": nll / n, "perplexity": math.exp(nll / n)}))


if __name__ == "__main__":
    sys.exit(main())
