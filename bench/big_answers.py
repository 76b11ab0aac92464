#!/usr/bin/env python3
"""bench/big_answers.py GPT2D [COPIES [SERVE OPTIONS...]]: what large
whole answers cost the server, the scenario of tests/test_hostile.py
big_answers_allowed with its numbers printed: COPIES (8) clients at once
each ask for a prompt of 1,000 token ids x n 16, echo, logprobs 5,
max_tokens 1 (a 2.9 MB answer that the default max_response_bytes allows),
after one such answer alone has filled the prefix cache, while a stream
runs beside them. Prints the stream's longest inter-token gap alone and
beside, the server's RSS rise (VmRSS sampled every 20 ms), each answer's
bytes and time, and whether every answer is whole, valid JSON. The
checkpoint is the hostile suite's "long" (2 layers, width 64, context
1024) with a 20 ms step delay; --max-queue 512 is always given."""
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_hostile as h  # noqa: E402

BODY_BYTES = h.ALLOWED_BYTES
STREAM = dict(h.LONG_STREAM, prompt="Beside", max_tokens=60)


def run(srv, copies):
    """(alone gap s, beside gap s, RSS rise MiB, [(status, bytes, seconds, why)])."""
    alone = h.Stream(srv.port, STREAM)
    alone.wait(30, "the stream alone")
    gap_alone = max(alone.token_gaps())
    st, _, b = h.request(srv.port, "POST", "/v1/completions", BODY_BYTES, timeout=600)  # fills the cache
    print("one answer alone: %s" % (h.allowed_answer_whole(st, b) or "whole"), flush=True)
    rss0, peak, done = srv.rss_kib(), [0], threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], srv.rss_kib())
            except (h.Fail, OSError):
                pass
            time.sleep(0.02)
    threading.Thread(target=sample, daemon=True).start()
    stream = h.Stream(srv.port, dict(STREAM, max_tokens=1000))  # closed when the answers are in
    results, ends = [], []
    t_start = time.monotonic()

    def one():
        t0 = time.monotonic()
        st, _, b = h.request(srv.port, "POST", "/v1/completions", BODY_BYTES, timeout=600)
        results.append((st, b, time.monotonic() - t0))  # checked later: this process's CPU is the stream reader's
        ends.append(time.monotonic())
    ts = [threading.Thread(target=one) for _ in range(copies)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    t_end = time.monotonic()
    stream.sock.shutdown(2)
    stream.wait(10, "the stream beside")
    done.set()
    stream.arrivals = [(a, c) for a, c in stream.arrivals if a <= t_end]
    if os.environ.get("GAPS"):  # where the longest gaps fall against the answers' ends
        times = [a for a, _ in stream.arrivals]
        gaps = sorted(((b - a, a - t_start) for a, b in zip(times, times[1:])), reverse=True)[:5]
        print("longest gaps (ms, at s):", ["%.0f@%.1f" % (g * 1e3, at) for g, at in gaps], flush=True)
        print("the answers ended at s:", ["%.1f" % (e - t_start) for e in sorted(ends)])
        st, _, m = h.request(srv.port, "GET", "/metrics")
        print("engine steps by duration:", " ".join(
            l.split("le=")[1] for l in m.decode().splitlines() if l.startswith("gpt2d_step_duration_seconds_bucket")))
    results = [(st, len(b), secs, h.allowed_answer_whole(st, b)) for st, b, secs in results]
    return gap_alone, max(stream.token_gaps()), (peak[0] - rss0) / 1024, results


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    gpt2d, copies = argv[1], int(argv[2]) if len(argv) > 2 else 8
    root = tempfile.mkdtemp(prefix="gpt2d-big-answers-")
    models = h.Models(os.path.realpath(gpt2d), root)

    class Ctx:
        pass
    ctx = Ctx()
    ctx.gpt2d, ctx.dir, ctx.servers = models.gpt2d, root, []
    srv = h.Server(ctx, models.get("long"), "--max-queue", "512", *argv[3:], env=h.STEP_DELAY)
    try:
        gap_alone, gap, rise, results = run(srv, copies)
    finally:
        srv.stop()
    for st, n, secs, why in results:
        print("answer: status %d, %d bytes, %.2f s%s" % (st, n, secs, ", " + why if why else ", whole"))
    print("stream's longest gap: %.0f ms alone, %.0f ms beside %d answers" % (gap_alone * 1e3, gap * 1e3, copies))
    print("RSS rise: %.0f MiB" % rise)
    print("median answer time: %.2f s" % statistics.median(r[2] for r in results))
    return 0 if all(not r[3] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
