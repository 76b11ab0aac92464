#!/usr/bin/env python3
"""tests/test_server_threads.py GPT2D: every thread of `gpt2d serve` busy at
once, for ThreadSanitizer (scripts/test.sh runs it in build-tsan/) and as a
plain functional test elsewhere.

The loop thread serves short streams and the 1 s tick (which reads the
scheduler's statistics while a step runs on the work queue); the tokenizer
threads parse and tokenize large bodies (/tokenize, completion and chat
bodies of 64 KiB and more, good and bad), some of whose clients leave
mid-way; requests sharing a prompt prefix take it from the prefix cache
while steps run; a SIGHUP reloads the configuration in the middle. Every answer is
checked against what the request deserves, a large body must give the
same completion as its compact form, and the server must exit 0 on
SIGTERM with no sanitizer report in its log.
"""
import http.client
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
import gpt2d_server  # noqa: E402 (tests/lib: the harness every server test uses)

PAD = 70 * 1024  # JSON whitespace: a body over the 64 KiB inline limit


def start(gpt2d, root):
    model = gpt2d_server.make_model(gpt2d, os.path.join(root, "model"), gpt2d_server.SHAPES["threads"])
    conf = os.path.join(root, "gpt2d.conf")
    with open(conf, "w") as f:
        f.write("log_level = info\n")
    log = os.path.join(root, "serve.log")
    try:
        srv = gpt2d_server.Server(gpt2d, model, ["--config", conf, "--max-prompt-tokens", "200",
                                                 "--tokenize-concurrency", "2"], log_path=log, timeout=60)
    except gpt2d_server.StartError as e:
        sys.exit("FAIL: gpt2d serve did not start: %s\n%s" % (e, gpt2d_server.read_text(log)))
    return srv, srv.port, log, conf


def post(port, path, body, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body, {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def main(argv):
    gpt2d = os.path.realpath(argv[1])
    root = tempfile.mkdtemp(prefix="gpt2d-threads-")
    proc, port, log, conf = start(gpt2d, root)
    failures = []
    lock = threading.Lock()

    def fail(msg):
        with lock:
            failures.append(msg)

    greedy = {"model": "gpt2", "prompt": "The threads", "max_tokens": 6, "temperature": 0}
    want = json.loads(post(port, "/v1/completions", json.dumps(greedy))[1])["choices"][0]["text"]
    # Prompts sharing 100 tokens, each run once before the load: under it,
    # every repeat takes its 6 full shared blocks and its tail's (96 + 16
    # of 114 tokens) from the prefix cache and gives the same text.
    shared = [{"model": "gpt2", "prompt": list(range(500, 600)) + list(range(k, k + 14)), "max_tokens": 6,
               "temperature": 1, "seed": 7} for k in (1000, 2000)]
    shared_want = [json.loads(post(port, "/v1/completions", json.dumps(b))[1])["choices"][0]["text"] for b in shared]

    def shared_ok(k):
        def ok(d):
            cached = d["usage"]["prompt_tokens_details"]["cached_tokens"]
            if d["choices"][0]["text"] == shared_want[k] and cached == 112:
                return True
            return "shared prefix %d: %r, cached %d; wanted %r, 112" % (k, d["choices"][0]["text"], cached,
                                                                       shared_want[k])
        return ok

    cases = [
        ("/v1/completions", json.dumps(shared[0]), 200, shared_ok(0)),
        ("/v1/completions", json.dumps(shared[1]), 200, shared_ok(1)),
        # (path, body, status wanted, check of the answer)
        ("/v1/completions", json.dumps(greedy) + " " * PAD, 200,
         lambda d: d["choices"][0]["text"] == want or "a padded body gave %r, not %r" % (d["choices"][0]["text"], want)),
        ("/v1/completions", json.dumps({"model": "gpt2", "prompt": "hello " * 12000, "max_tokens": 2}), 400,
         lambda d: "max_prompt_tokens" in d["error"]["message"] or d["error"]["message"]),
        ("/v1/completions", '{"model": "gpt2", "prompt": "x", "max_tokens": -1}' + " " * PAD, 400,
         lambda d: d["error"]["param"] == "max_tokens" or d["error"]),
        ("/v1/completions", '{"model": "gpt2", "prompt": "x"' + " " * PAD, 400,
         lambda d: d["error"]["type"] == "invalid_request_error" or d["error"]),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
         + " " * PAD, 200, lambda d: d["object"] == "chat.completion" and d["id"].startswith("chatcmpl-") or d),
        ("/v1/completions", json.dumps({"model": "other", "prompt": "x"}) + " " * PAD, 404,
         lambda d: d["error"]["code"] == "model_not_found" or d["error"]),
        ("/tokenize", json.dumps({"prompt": "hello" + " hello" * 11999}), 200,
         lambda d: d["count"] == 12000 or d["count"]),
        ("/v1/completions", json.dumps({"model": "gpt2", "prompt": "Go", "max_tokens": 12, "stream": True}), 200,
         lambda d: True),
    ]

    def worker(path, body, status, ok, n):
        for _ in range(n):
            try:
                got, data = post(port, path, body)
            except (OSError, http.client.HTTPException) as e:
                fail("%s: %s" % (path, e))
                return
            if got != status:
                fail("%s: status %d, wanted %d: %s" % (path, got, status, data[:200]))
                continue
            if path != "/v1/completions" or b"data:" not in data:
                verdict = ok(json.loads(data))
                if verdict is not True:
                    fail("%s: %s" % (path, verdict))

    threads = [threading.Thread(target=worker, args=c + (4,)) for c in cases]
    for t in threads:
        t.start()
    time.sleep(0.5)
    with open(conf, "a") as f:
        f.write("log_level = debug\n")
    proc.signal(signal.SIGHUP)
    for _ in range(6):  # clients that leave while their body is tokenized
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=0.05)
        try:
            c.request("POST", "/v1/completions", json.dumps(greedy) + " " * PAD)
            c.getresponse()
        except (OSError, http.client.HTTPException):
            pass
        c.close()
    for t in threads:
        t.join(240)
    try:
        status, _ = post(port, "/v1/completions", json.dumps(greedy))
        if status != 200:
            fail("after the load: status %d" % status)
    except (OSError, http.client.HTTPException) as e:
        fail("after the load: %s" % e)
    rc = proc.terminate(60)
    if rc is None:
        proc.stop()
        rc = "killed after 60 s"
    text = open(log).read()
    if rc != 0:
        fail("exit status %s" % rc)
    if "Sanitizer" in text or "runtime error" in text:
        fail("a sanitizer report in the log")
    if "SIGHUP: configuration reloaded" not in text:
        fail("no reload line after SIGHUP")
    if failures:
        print("\n".join("FAIL: " + f for f in failures) + "\n== serve.log\n" + text[-6000:], file=sys.stderr)
        return 1
    shutil.rmtree(root, ignore_errors=True)
    print("ok: %d large and small requests from %d threads, a reload and early leavers; clean exit"
          % (4 * len(cases), len(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
