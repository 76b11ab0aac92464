#!/usr/bin/python3
"""tools/train/chat_rate.py URL PROMPTS [--max-tokens N] [--seed S] [--api-key K]:
how many ordinary chat turns get a reply, through a gpt2d server's
/v1/chat/completions: each prompt of PROMPTS (one a line, # comments) is
the one user message of a request, greedy (temperature 0) and at
temperature 0.8 (seed S); a reply counts when its content has at least one
word (a letter or digit). Prints the rates and the empty or wordless
replies as JSON. Standard library only."""
import argparse
import json
import re
import sys
import urllib.request


def post(url, body, key):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": "Bearer " + key} if key else {})})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def prompts(path):
    return [ln.strip() for ln in open(path, encoding="utf-8") if ln.strip() and not ln.startswith("#")]


def rates(url, ps, max_tokens=48, seed=1, key=None):
    out = {"prompts": len(ps), "max_tokens": max_tokens, "seed": seed}
    for name, temp in (("greedy", 0), ("temperature_0.8", 0.8)):
        ok, bad, samples = 0, [], []
        for i, p in enumerate(ps):
            r = post(url.rstrip("/") + "/v1/chat/completions",
                     {"messages": [{"role": "user", "content": p}], "max_tokens": max_tokens,
                      "temperature": temp, "seed": seed}, key)
            text = r["choices"][0]["message"]["content"]
            if re.search(r"\w", text):
                ok += 1
            else:
                bad.append([p, text])
            if i < 5:
                samples.append([p, text])
        out[name] = {"replied": ok, "rate": ok / len(ps), "no_word": bad, "samples": samples}
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url"), p.add_argument("prompts")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--api-key")
    a = p.parse_args()
    print(json.dumps(rates(a.url, prompts(a.prompts), a.max_tokens, a.seed, a.api_key), indent=1))


if __name__ == "__main__":
    sys.exit(main())
