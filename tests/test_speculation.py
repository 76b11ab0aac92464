#!/usr/bin/env python3
"""tests/test_speculation.py GPT2D MODEL_DIR: speculative decoding changes no
answer, end to end.

Three servers on the trained checkpoint MODEL_DIR (models/gpt2d-tiny), and
the same on its q8 copy: OFF (speculative_tokens 0), LOOKUP (the default:
prompt lookup, k = 4, speculating in steps of up to 64 sequences) and DRAFT
(the checkpoint as its own draft model, k = 6). Hundreds of requests, sent
8 at a time so that they share steps, go to all three: /v1/completions,
/v1/chat/completions and /v1/responses, streamed or whole, greedy and
seeded, with top-k, top-p, penalties, logit_bias, logprobs, echo, n, stop
strings, max_tokens from 1, json_object outputs, text that quotes its
prompt (lookup's case), some with a prediction (the OFF answer, a damaged
copy of it, or noise), the same prompts again (the prefix cache). Every
answer must equal OFF's: text, logprobs, finish reasons, usage (without its
timings and prediction counts). Then: each drafter drafted and had tokens
accepted (/metrics); the parameters' refusals; a draft model with another
vocabulary refused at start-up with one clear line; the OpenAI client
(differential/openai_speculation.mjs).
"""
import concurrent.futures as cf
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
import gpt2d_server as gs  # noqa: E402

QUOTE = ("In the beginning God created the heaven and the earth. And the earth was without form, "
         "and void; and darkness was upon the face of the deep.")
WORDS = ["light", "water", "the", "sea", "and", "God", "said", "land", "day", "night", "king",
         "ship", "cat", "house", "gold", "river"]


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer test-key-123"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def essence(path, body, status, raw):
    """What must not change: a whole answer without ids, times and
    prediction counts; a stream's events' content in order."""
    if status != 200:
        return status, raw
    if body.get("stream"):
        out = []
        for ev in raw.split("\n\n"):
            ev = ev.strip()
            if not ev.startswith("data: ") or ev == "data: [DONE]":
                continue
            d = json.loads(ev[6:])
            for k in ("id", "created", "system_fingerprint", "response_id", "item_id"):
                d.pop(k, None)
            if "response" in d:
                d["response"] = strip_response(d["response"])
            if isinstance(d.get("usage"), dict):
                d["usage"] = strip_usage(d["usage"])
            out.append(d)
        return status, out
    d = json.loads(raw)
    if path == "/v1/responses":
        return status, strip_response(d)
    for k in ("id", "created", "system_fingerprint"):
        d.pop(k, None)
    d["usage"] = strip_usage(d["usage"])
    return status, d


def strip_usage(u):
    """Without timings and prediction counts, and without the prompt's
    cached tokens: which request reaches the prefix cache first depends on
    the order they arrive in, speculation or not."""
    u = dict(u)
    for k in ("timings", "completion_tokens_details", "prompt_tokens_details", "input_tokens_details"):
        u.pop(k, None)
    return u


def strip_response(r):
    r = dict(r)
    for k in ("id", "created_at", "completed_at"):
        r.pop(k, None)
    if isinstance(r.get("usage"), dict):
        r["usage"] = strip_usage(r["usage"])
    for item in r.get("output") or []:
        item.pop("id", None)
    return r


def make_request(rng, i, answers):
    route = rng.choice(["/v1/completions", "/v1/completions", "/v1/chat/completions", "/v1/responses"])
    quoting = rng.random() < 0.4
    text = (QUOTE + " " + QUOTE[: rng.randrange(10, 80)]) if quoting else \
        " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 30)))
    body = {"max_tokens": rng.choice([1, 2, 3, 5, 8, 17, 33, 60])}
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body["temperature"] = rng.choice([0.5, 0.8, 1.0, 1.4])
        body["seed"] = rng.randrange(1 << 30)
    if rng.random() < 0.3:
        body["top_p"] = rng.choice([0.5, 0.9])
    if rng.random() < 0.3 and route != "/v1/responses":
        body["top_k"] = rng.choice([1, 5, 40])
    if rng.random() < 0.25 and route != "/v1/responses":
        body["presence_penalty"] = rng.choice([-1.0, 0.5, 1.5])
        body["frequency_penalty"] = rng.choice([-0.5, 0.7])
    if rng.random() < 0.2 and route != "/v1/responses":
        body["logit_bias"] = {str(rng.randrange(50257)): rng.choice([-5, 3, 8]), "13": 2}
    if rng.random() < 0.2 and route != "/v1/responses":
        body["stop"] = rng.choice([["."], [" the", "\n"], ["and"]])
    if rng.random() < 0.3:
        body["stream"] = True
        if route == "/v1/chat/completions":
            body["stream_options"] = {"include_usage": True}
    if route == "/v1/completions":
        body["prompt"] = text
        if rng.random() < 0.4:
            body["logprobs"] = rng.randrange(0, 6)
            if rng.random() < 0.3 and not body.get("stream"):
                body["echo"] = True
        if rng.random() < 0.15 and not body.get("stream"):
            body["n"] = 2
            body.setdefault("seed", 5)
    elif route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": text}]
        if rng.random() < 0.3:
            body["logprobs"] = True
            body["top_logprobs"] = rng.randrange(0, 4)
        if rng.random() < 0.1:
            body["response_format"] = {"type": "json_object"}
    else:
        body = {"input": text, "max_output_tokens": max(16, body["max_tokens"]),
                **{k: v for k, v in body.items() if k in ("temperature", "top_p", "stream", "seed")}}
        if rng.random() < 0.1:
            body["text"] = {"format": {"type": "json_object"}}
    # A prediction: an earlier request again with OFF's answer to it as
    # its prediction, or a damaged copy of the answer, or noise.
    if answers and rng.random() < 0.25:
        route, past, p = rng.choice(answers)
        body = dict(past)
        if rng.random() < 0.4:
            p = p[: len(p) // 2] + " zebra " + p[len(p) // 2:]
        elif rng.random() < 0.2:
            p = "completely unrelated words " * 3
        body["prediction"] = {"type": "content", "content": p}
    return route, body


def answer_text(route, status, raw):
    if status != 200 or '"stream"' in raw[:0]:
        return None
    try:
        d = json.loads(raw)
    except ValueError:
        return None
    if route == "/v1/completions":
        return d["choices"][0]["text"]
    if route == "/v1/chat/completions":
        return d["choices"][0]["message"]["content"]
    return None


def metric(base, name, drafter):
    req = urllib.request.Request(base + "/metrics", headers={"Authorization": "Bearer test-key-123"})
    with urllib.request.urlopen(req, timeout=30) as r:
        page = r.read().decode()
    line = '%s{drafter="%s"} ' % (name, drafter)
    for ln in page.splitlines():
        if ln.startswith(line):
            return int(ln[len(line):])
    raise AssertionError("no %s for %s" % (line, drafter))


def compare(servers, n, seed, label):
    rng = random.Random(seed)
    answers, reqs = [], []
    for i in range(n):
        route, body = make_request(rng, i, answers)
        reqs.append((route, body))
        if i % 3 == 0:  # some prompts again: the prefix cache
            reqs.append((route, dict(body)))
        if i % 4 == 0:
            # OFF's answers feed later predictions.
            st, raw = post(servers["off"], route, {k: v for k, v in body.items() if k != "stream"})
            t = answer_text(route, st, raw)
            if t and "prediction" not in body:
                answers.append((route, body, t))
    results = {}
    with cf.ThreadPoolExecutor(8) as pool:
        for name, base in servers.items():
            futs = [pool.submit(post, base, route, body) for route, body in reqs]
            results[name] = [f.result() for f in futs]
    bad = ok = 0
    for j, (route, body) in enumerate(reqs):
        want = essence(route, body, *results["off"][j])
        ok += want[0] == 200
        for name in servers:
            if name == "off":
                continue
            got = essence(route, body, *results[name][j])
            if got != want:
                bad += 1
                print("DIFF %s %s: %s %s\n  off: %s\n  %s: %s" % (
                    label, name, route, json.dumps(body)[:300], str(want)[:600], name, str(got)[:600]))
    assert bad == 0, "%s: %d answers differ" % (label, bad)
    assert ok > len(reqs) * 0.8, "%s: only %d of %d answered 200" % (label, ok, len(reqs))
    print("%s: %d requests, the same answers from %s" % (label, len(reqs), ", ".join(servers)))


def refusals(base):
    for body, param in (({"prompt": "x", "prediction": "text"}, "prediction"),
                        ({"prompt": "x", "prediction": {"type": "text", "content": "a"}}, "prediction.type"),
                        ({"prompt": "x", "prediction": {"type": "content"}}, "prediction.content"),
                        ({"prompt": "x", "prediction": {"type": "content", "content": [{"type": "image"}]}},
                         "prediction.content"),
                        ({"prompt": "x", "speculative_tokens": 9}, "speculative_tokens"),
                        ({"prompt": "x", "speculative_tokens": -1}, "speculative_tokens"),
                        ({"prompt": "x", "speculative_drafter": "eagle"}, "speculative_drafter")):
        st, raw = post(base, "/v1/completions", body)
        d = json.loads(raw)
        assert st == 400 and d["error"]["param"] == param, (body, st, raw)


def main():
    gpt2d, model = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="gpt2d-spec-")
    try:
        q8 = os.path.join(tmp, "q8")
        os.mkdir(q8)
        for f in ("vocab.json", "merges.txt", "config.json"):
            shutil.copy(os.path.join(model, f), q8)
        subprocess.run([gpt2d, "convert", os.path.join(model, "model.safetensors"),
                        os.path.join(q8, "model.safetensors"), "--dtype", "q8"],
                       check=True, capture_output=True)
        common = ["--kv-cache-mb", "256", "--api-key", "test-key-123"]
        for label, m, n in (("f32", model, 240), ("q8", q8, 80)):
            srv = {
                "off": gs.Server(gpt2d, m, common + ["--speculative-tokens", "0"],
                                 log_path=os.path.join(tmp, label + "-off.log")),
                "lookup": gs.Server(gpt2d, m, common + ["--speculative-max-batch", "64"],
                                    log_path=os.path.join(tmp, label + "-lookup.log")),
                "draft": gs.Server(gpt2d, m, common + ["--draft-model", m, "--speculative-drafter",
                                                       "draft_model", "--speculative-tokens", "6"],
                                   log_path=os.path.join(tmp, label + "-draft.log")),
            }
            try:
                bases = {k: v.base for k, v in srv.items()}
                compare(bases, n, 11 if label == "f32" else 12, label)
                for name, d in (("lookup", "lookup"), ("draft", "draft_model"), ("lookup", "prediction")):
                    dr = metric(bases[name], "gpt2d_spec_drafted_tokens_total", d)
                    ac = metric(bases[name], "gpt2d_spec_accepted_tokens_total", d)
                    assert dr > 0 and 0 < ac <= dr, (label, name, d, dr, ac)
                    print("%s %s: %s drafted %d, accepted %d (%.0f%%)" % (label, name, d, dr, ac, 100 * ac / dr))
                assert metric(bases["off"], "gpt2d_spec_drafted_tokens_total", "lookup") == 0
                if label == "f32":
                    refusals(bases["lookup"])
                    st, raw = post(bases["off"], "/v1/completions",
                                   {"prompt": "x", "speculative_drafter": "draft_model"})
                    assert st == 400 and "draft_model" in raw, (st, raw)
                    rc = subprocess.run(["node", os.path.join(HERE, "differential", "openai_speculation.mjs"),
                                         bases["off"] + "/v1", bases["lookup"] + "/v1", "lookup"]).returncode
                    if rc == 77:
                        gs.skip("the openai npm package is missing")
                    assert rc == 0, "openai_speculation.mjs (lookup)"
                    rc = subprocess.run(["node", os.path.join(HERE, "differential", "openai_speculation.mjs"),
                                         bases["off"] + "/v1", bases["draft"] + "/v1", "draft_model"]).returncode
                    assert rc == 0, "openai_speculation.mjs (draft_model)"
            finally:
                for s in srv.values():
                    s.stop()
        # A draft whose vocabulary differs: refused at start-up, in one line.
        other = os.path.join(tmp, "other")
        os.mkdir(other)
        gs.make_model(gpt2d, other, ["--layers", "1", "--embd", "32", "--heads", "2", "--ctx", "512",
                                     "--vocab", "600"])
        log = os.path.join(tmp, "refused.log")
        with open(log, "wb") as f:
            rc = subprocess.run(gs.serve_argv(gpt2d, model, ["--draft-model", other]), stdout=f,
                                stderr=subprocess.STDOUT, timeout=60).returncode
        text = gs.read_text(log)
        assert rc != 0 and "vocabulary" in text and "draft" in text, (rc, text[-500:])
        print("a draft with another vocabulary: refused (%s)" % text.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("speculation: ok")


if __name__ == "__main__":
    main()
