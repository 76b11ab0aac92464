#!/usr/bin/env python3
"""bench/tokenize_flood.py GPT2D [RUNS [ROUTE [SERVE OPTIONS...]]]: a
stream's inter-token gap alone and while eight clients post 1 MB bodies to
ROUTE, /tokenize (default) or /v1/completions (a 1 MB prompt that
max_prompt_tokens refuses): the scenario of tests/test_hostile.py
tokenize_flood, with its numbers printed. GPT-2-small width, 4 layers,
--tokenize-concurrency 1. Each run starts a fresh server; one line per
run, then the medians."""
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_hostile as h  # noqa: E402


class Ctx:
    pass


def one(models, root, route, extra):
    ctx = Ctx()
    ctx.gpt2d, ctx.dir, ctx.servers = models.gpt2d, root, []
    srv = h.Server(ctx, models.get("slow"), "--max-body-bytes", "2000000", "--max-prompt-tokens", "1024",
                   "--tokenize-concurrency", "1", *extra)
    try:
        body = {"model": "gpt2", "prompt": "Flood", "max_tokens": 40, "ignore_eos": True, "stream": True}
        alone = h.Stream(srv.port, body)
        alone.wait(30, "the unloaded stream")
        unloaded = statistics.median(alone.token_gaps())
        flood_body = {"prompt": "hello " * 170000}
        if route == "/v1/completions":
            flood_body.update(model="gpt2", max_tokens=1)
        big = json.dumps(flood_body).encode()
        stop, posted = threading.Event(), [0]

        def flood():
            while not stop.is_set():
                try:
                    h.request(srv.port, "POST", route, big, timeout=4)
                    posted[0] += 1
                except (OSError, h.http.client.HTTPException):
                    pass
        threads = [threading.Thread(target=flood, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        loaded = h.Stream(srv.port, body)
        loaded.closed.wait(8)
        gaps = loaded.token_gaps()
        stop.set()
        loaded.sock.close()
        for t in threads:
            t.join(6)
        return unloaded, statistics.median(gaps), posted[0]
    finally:
        srv.stop()


def main(argv):
    gpt2d = os.path.realpath(argv[1])
    runs = int(argv[2]) if len(argv) > 2 else 5
    route = argv[3] if len(argv) > 3 else "/tokenize"
    root = tempfile.mkdtemp(prefix="gpt2d-bench-flood-")
    models = h.Models(gpt2d, root)
    res = []
    for i in range(runs):
        u, l, p = one(models, root, route, argv[4:])
        res.append((u, l))
        print("run %d: unloaded %.1f ms, flooded %.1f ms (%d bodies posted)" % (i + 1, u * 1e3, l * 1e3, p),
              flush=True)
    print("median: unloaded %.1f ms, flooded %.1f ms" % (statistics.median(r[0] for r in res) * 1e3,
                                                        statistics.median(r[1] for r in res) * 1e3))


if __name__ == "__main__":
    main(sys.argv)
