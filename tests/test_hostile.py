#!/usr/bin/env python3
"""tests/test_hostile.py GPT2D [CASE...]: issue 14, the front end against
hostile and slow clients, its lifecycle (signals, the model file) and the
protocol corners, on loopback.

Each case starts its own `gpt2d serve --port 0` on a tiny `gpt2d synth`
checkpoint with the real GPT-2 tokenizer, prints `ok CASE` or
`FAIL CASE: why`, and is bounded (30 s, tokenize_flood 75 s; connections in the low
hundreds). The script ends with `N passed, N failed` and exits 1 on any
failure. Name cases to run only those; `--list` prints them. KEEP=1 keeps
the scratch directory (the servers' logs) for a look afterwards.
"""
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# The margin of the stalled-stream memory bound: 1 MiB for the release-like
# build. A sanitizer build (meson passes GPT2D_SANITIZE, its b_sanitize)
# keeps freed memory in ASan's quarantine and pads every allocation, so the
# bound there is 64 MiB: the case then proves the cancellation and that the
# stream's output is not all held, not the exact figure.
SANITIZE = os.environ.get("GPT2D_SANITIZE", "none")
RSS_MARGIN_KIB = 1024 if SANITIZE in ("", "none") else 65536
# How much longer a sanitizer build (-O0, every access checked) may take
# where a case bounds a latency beside heavy load.
SLOW = 1 if SANITIZE in ("", "none") else 4

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
import gpt2d_server  # noqa: E402 (tests/lib: the harness every server test uses)
CASE_LIMIT_S = 30
# Cases that measure in several rounds get longer (tokenize_flood: six
# windows, and six more when the first comparison fails). Under a sanitizer
# every limit is doubled (run_cases): several cases use 60-75 % of theirs
# under ASan on a loaded machine.
CASE_LIMITS = {"tokenize_flood": 75, "completion_flood": 150, "responses_flood": 120, "big_answers_allowed": 240}


class Fail(Exception):
    """A case's assertion: the message says what was wanted and what came."""


def check(cond, why):
    if not cond:
        raise Fail(why)


# ---------------------------------------------------------------- checkpoints

class Models:
    """The checkpoints, made once on first use in the scratch directory.

    tiny: 2 layers, width 64, context 128 (the one of tests/test_server.sh).
    long: the same with a context of 1024, for long and wide streams that a
          step delay (GPT2D_TEST_STEP_DELAY_MS) makes outlast the probes.
    deep: 16 layers, width 64: 8 KiB of KV cache a position (a small pool).
    thin: 1 layer, width 32, context 1024: little KV cache per token next to
          the SSE bytes of a token with logprobs (the stalled-stream bound).
    slow: GPT-2-small width, 4 layers: real compute per token, for latency."""

    SHAPES = gpt2d_server.SHAPES

    def __init__(self, gpt2d, root):
        self.gpt2d, self.root = gpt2d, root

    def get(self, name):
        return gpt2d_server.make_model(self.gpt2d, os.path.join(self.root, "models", name), self.SHAPES[name])

    def copy(self, name, dest):
        """A private copy of a checkpoint directory (the model-file cases change it)."""
        shutil.copytree(self.get(name), dest)
        return dest


# ---------------------------------------------------------------- the server

# GPT2D_HOSTILE_NEIGHBOR=1 (the suite hostile-neighbor): every server
# serves a second checkpoint beside the case's ("neighbor", the "long2"
# synth: another shape's weights, the same tokenizer), and a client streams
# from it for as long as the case runs. The case's own checks hold for the
# first checkpoint as they do alone; the neighbor's answers must each be a
# 200 with a whole stream, or a clean refusal (429, 503), never a 500, a
# broken stream or a reset while the server runs (checked after the case).
NEIGHBOR = os.environ.get("GPT2D_HOSTILE_NEIGHBOR") == "1"


class Neighbor(threading.Thread):
    """Streams 12-token completions from the checkpoint "neighbor", one at a
    time, until stopped or the server is gone; problems lists what was wrong."""

    def __init__(self, srv, key):
        super().__init__(daemon=True)
        self.srv, self.key, self.stopped, self.problems, self.answered = srv, key, False, [], 0
        self.rotating = False  # the case changes api_key by SIGHUP (a config file): 401 is right

    def run(self):
        body = json.dumps({"model": "neighbor", "prompt": "The neighbor says", "max_tokens": 12,
                           "stream": True, "ignore_eos": True}).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = "Bearer " + self.key
        while not self.stopped and self.srv.proc.poll() is None:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=30)
                c.request("POST", "/v1/completions", body, headers)
                r = c.getresponse()
                text = r.read().decode("utf-8", "replace")
                c.close()
            except (OSError, http.client.HTTPException) as e:
                if not self.stopped and self.srv.proc.poll() is None and not self.srv.draining():
                    self.problems.append("%s: %s" % (e.__class__.__name__, e))
                time.sleep(0.05)
                continue
            if r.status == 200:
                self.answered += 1
                if "data: [DONE]" not in text and not self.srv.draining():
                    self.problems.append("a stream without its end: %r" % text[-200:])
            elif r.status not in (429, 503) and not (r.status == 401 and self.rotating):
                self.problems.append("status %d: %s" % (r.status, text[:200]))
            time.sleep(0.02)


class Server(gpt2d_server.Server):
    """One `gpt2d serve --port 0` with its log in the case's directory
    (tests/lib/gpt2d_server.py: plain "TIMESTAMP LEVEL message" lines, no
    systemd variables), stopped when the case ends."""

    def __init__(self, ctx, model_dir, *args, env=None, name="server", nice=0, ready="listen", preexec=None):
        # A 64 MiB KV pool, not the default 2 GiB: meson sets MALLOC_PERTURB_,
        # which makes glibc fill (touch) the whole pool at start-up.
        self.neighbor = None
        served = model_dir
        if NEIGHBOR and os.path.isdir(model_dir):
            served = model_dir + ",neighbor=" + ctx.models.get("long2")
        try:
            super().__init__(ctx.gpt2d, served, ["--kv-cache-mb", "64"] + list(args),
                             log_path=os.path.join(ctx.dir, name + ".log"), env=env, nice=nice, timeout=20,
                             ready=ready, preexec=preexec)
        except gpt2d_server.StartError as e:
            raise Fail(str(e))
        finally:
            if hasattr(self, "proc"):
                ctx.servers.append(self)
        if served != model_dir and ready is not None and "--tls-cert-file" not in args:
            keys = [args[i + 1] for i in range(len(args) - 1) if args[i] == "--api-key"]
            self.neighbor = Neighbor(self, keys[0] if keys else None)
            self.neighbor.rotating = "--config" in args
            self.neighbor.start()

    def draining(self):
        return "draining" in self.log() or "SIGTERM" in self.log()

    def stop(self):
        if self.neighbor is not None:
            self.neighbor.stopped = True
        super().stop()

    def rss_kib(self):
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise Fail("no VmRSS for the server")

    def metric(self, name):
        st, _, body = request(self.port, "GET", "/metrics", timeout=5)
        check(st == 200, "/metrics answered %s" % st)
        # The first sample: unlabelled, or the first checkpoint's (listed
        # first) where several are served (GPT2D_HOSTILE_NEIGHBOR).
        m = re.search(r'^%s(?:\{model="[^"]*"\})? (\S+)$' % re.escape(name), body.decode(), re.M)
        check(m is not None, "/metrics has no %s" % name)
        return float(m.group(1))

    def wait_metric_above(self, name, value, timeout, why):
        deadline = time.monotonic() + timeout
        while self.metric(name) <= value:
            check(time.monotonic() < deadline, "%s: %s stayed at most %g" % (why, name, value))
            time.sleep(0.02)

    def wait_metric(self, name, value, timeout, why):
        deadline = time.monotonic() + timeout
        while True:
            got = self.metric(name)
            if got == value:
                return
            check(time.monotonic() < deadline, "%s: %s stayed %g, want %g" % (why, name, got, value))
            time.sleep(0.05)



def describe_exit(rc):
    if rc is None:
        return "still running"
    if rc < 0:
        return "killed by %s" % signal.Signals(-rc).name
    return "exit status %d" % rc


# ---------------------------------------------------------------- raw HTTP

def connect(port, timeout=5, src=None, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if src is not None:
        s.bind((src, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def read_until_close(s, timeout):
    """Everything the server sends until it closes, or until timeout seconds
    have passed (then Fail names how much came)."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Fail("no end of the response within %.1f s (got %d bytes: %r)"
                       % (timeout, len(data), data[:200]))
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def read_response(s, timeout):
    """One response's head and body from s, without waiting for the close
    when it has a Content-Length or a chunked end: (raw, status, headers, body)."""
    deadline = time.monotonic() + timeout
    data = b""

    def more():
        nonlocal data
        left = deadline - time.monotonic()
        if left <= 0:
            raise Fail("no complete response within %.1f s (got %r)" % (timeout, data[:300]))
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return more()
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise Fail("the connection closed before a complete response (got %r)" % data[:300])
        data += chunk

    while b"\r\n\r\n" not in data:
        more()
    status, headers, rest = parse_head(data)
    while status == 100:  # an interim response, then the real one
        data = rest
        while b"\r\n\r\n" not in data:
            more()
        status, headers, rest = parse_head(data)
    head_len = len(data) - len(rest)
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(data) - head_len < n:
            more()
        return data, status, headers, data[head_len:head_len + n]
    if "chunked" in headers.get("transfer-encoding", ""):
        while not data.endswith(b"0\r\n\r\n"):
            more()
        return data, status, headers, dechunk(data[head_len:])
    return data, status, headers, rest


def parse_head(data):
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
    check(m is not None, "not an HTTP status line: %r" % lines[0])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(m.group(1)), headers, rest


def dechunk(body):
    out = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        n = int(size_line.split(b";")[0], 16)
        if n == 0:
            break
        out += body[:n]
        body = body[n + 2:]
    return out


def raw_exchange(port, data, timeout=5, src=None):
    """Sends data on a new connection and reads one response: (raw, status, headers, body)."""
    s = connect(port, timeout, src)
    try:
        s.sendall(data)
        return read_response(s, timeout)
    finally:
        s.close()


def request(port, method, path, body=None, headers=None, timeout=10, src=None):
    """One request with http.client: (status, headers (lower-case names), body)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                   source_address=(src, 0) if src else None)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def error_envelope(body, why):
    """The OpenAI error object of a JSON error body; Fail when it is not one."""
    try:
        e = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        raise Fail("%s: not a JSON error envelope: %r" % (why, body[:200]))
    check(isinstance(e, dict) and set(e) == {"message", "type", "param", "code"},
          "%s: error object %r" % (why, e))
    return e


def completion_head(length, extra=b"", path=b"/v1/completions"):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(length).encode() + b"\r\n" + extra + b"\r\n")


def closed_by_peer(s):
    """Whether the server has closed s (EOF or reset waiting to be read)."""
    s.setblocking(False)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        s.setblocking(True)


class Stream:
    """A streaming completion on a raw socket, read by a thread that keeps
    every byte with its arrival time; the chunked body is decoded at the end."""

    def __init__(self, port, body, headers=b"", rcvbuf=None, read=True):
        payload = json.dumps(body).encode()
        self.sock = connect(port, 30, rcvbuf=rcvbuf)
        self.sock.sendall(completion_head(len(payload), b"Connection: close\r\n" + headers) + payload)
        self.raw = b""
        self.arrivals = []  # (time, bytes)
        self.closed = threading.Event()
        if read:
            self.start_reading()

    def start_reading(self):
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        self.sock.settimeout(60)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.arrivals.append((time.monotonic(), chunk))
                self.raw += chunk
        except OSError:
            pass
        self.closed.set()

    def wait(self, timeout, why):
        check(self.closed.wait(timeout), "%s: the stream did not end within %.1f s (%d bytes so far: %r)"
              % (why, timeout, len(self.raw), self.raw[-200:]))

    def events(self):
        """The SSE data payloads: the stream must be a complete chunked 200."""
        status, headers, rest = parse_head(self.raw)
        check(status == 200, "stream status %d: %r" % (status, self.raw[:300]))
        check("chunked" in headers.get("transfer-encoding", ""), "the stream is not chunked: %r" % headers)
        check(rest.endswith(b"0\r\n\r\n"), "the stream has no chunked end (0-length chunk); it ends %r"
              % rest[-80:])
        text = dechunk(rest).decode("utf-8", "replace")
        return [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]

    def token_gaps(self):
        """The times between successive token events (one per SSE data line)."""
        times, buf = [], b""
        for t, chunk in self.arrivals:
            buf += chunk
            n = buf.count(b"data: {")
            times.extend([t] * n)
            buf = buf[buf.rfind(b"data: {") + 1:] if n else buf
        return [b - a for a, b in zip(times, times[1:]) if b > a]


def sse_ending(stream, why, want_word):
    """A stream cut by the server: an event naming want_word, then [DONE], then the chunked end."""
    ev = stream.events()
    check(ev and ev[-1] == "[DONE]", "%s: the last event is %r, not [DONE]" % (why, ev[-1:]))
    check(len(ev) >= 2 and want_word in ev[-2].lower(),
          "%s: the event before [DONE] does not name the %s: %r" % (why, want_word, ev[-2:-1]))


# ---------------------------------------------------------------- cases

def case_slow_headers(ctx):
    """1: 60 connections sending a header byte a second do not lock out a
    normal completion and /health, and are closed at the header deadline."""
    srv = Server(ctx, ctx.models.get("tiny"), "--request-header-timeout", "2", "--max-connections", "50")
    opened = time.monotonic()
    slow = []
    for _ in range(60):
        try:
            s = connect(srv.port, 2)
            s.sendall(b"G")
            slow.append(s)
        except OSError:
            pass  # refused at the limit: not a slow connection
    stop = threading.Event()

    def trickle():
        while not stop.wait(1.0):
            for s in slow:
                try:
                    s.send(b"E")
                except OSError:
                    pass
    threading.Thread(target=trickle, daemon=True).start()
    try:
        time.sleep(1.0)
        for method, path, body in (("POST", "/v1/completions", {"model": "gpt2", "prompt": "Hi", "max_tokens": 3}),
                                   ("GET", "/health", None)):
            t0 = time.monotonic()
            while True:  # a connection refused at the limit is retried until the 2 s are spent
                try:
                    st, _, _ = request(srv.port, method, path, body, timeout=max(0.1, t0 + 2 - time.monotonic()))
                    break
                except (OSError, http.client.HTTPException) as e:
                    check(time.monotonic() - t0 < 2, "%s %s during the slow-header flood: %s within 2 s"
                          % (method, path, e))
                    time.sleep(0.05)
            check(st == 200, "%s %s during the flood: status %d" % (method, path, st))
            check(time.monotonic() - t0 < 2, "%s %s took %.1f s during the flood"
                  % (method, path, time.monotonic() - t0))
        time.sleep(max(0.0, opened + 2 + 1.3 * min(SLOW, 2) - time.monotonic()))  # the timeout + 1 s (+ slack)
        still = sum(1 for s in slow if not closed_by_peer(s))
        check(still == 0, "%d of %d slow-header connections still open %.1f s after they opened "
              "(request_header_timeout 2)" % (still, len(slow), time.monotonic() - opened))
    finally:
        stop.set()
        for s in slow:
            s.close()


def case_idle_connections(ctx):
    """1: max_connections idle keep-alive connections; a new client is
    served within 2 s (idle ones closed first)."""
    srv = Server(ctx, ctx.models.get("tiny"), "--max-connections", "50")
    idle = []
    try:
        for _ in range(50):
            s = connect(srv.port, 5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            _, st, _, _ = read_response(s, 5)
            check(st == 200, "keep-alive /health: %d" % st)
            idle.append(s)
        t0 = time.monotonic()
        try:
            st, _, _ = request(srv.port, "GET", "/health", timeout=2)
        except (OSError, http.client.HTTPException) as e:
            raise Fail("a new client with 50 idle keep-alive connections open (max_connections 50): "
                       "%s after %.1f s" % (e.__class__.__name__ + " " + str(e), time.monotonic() - t0))
        check(st == 200, "the new client got %d" % st)
        closed = sum(1 for s in idle if closed_by_peer(s))
        check(closed >= 1, "the new client was served but no idle connection was closed")
    finally:
        for s in idle:
            s.close()


def case_per_ip_limit(ctx):
    """1: --max-connections-per-ip 4 (127.0.0.2 a trusted proxy): a fifth
    connection from 127.0.0.1 gets a 429 and is closed; 127.0.0.2 is still
    served, and so is 127.0.0.1 once one of its four closes."""
    srv = Server(ctx, ctx.models.get("tiny"), "--max-connections-per-ip", "4",
                 "--trusted-proxies", "127.0.0.2")
    held = []
    try:
        for _ in range(4):
            s = connect(srv.port, 5, src="127.0.0.1")
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            check(read_response(s, 5)[1] == 200, "one of the first four connections was not served")
            held.append(s)
        fifth = connect(srv.port, 5, src="127.0.0.1")
        held.append(fifth)
        try:
            fifth.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            got = read_until_close(fifth, 2.0)
        except Fail:
            raise Fail("a fifth connection from 127.0.0.1 stayed open for 2 s")
        except OSError:
            got = b""
        check(got.startswith(b"HTTP/1.1 429"), "a fifth connection from 127.0.0.1 got %r, not a 429" % got[:100])
        for _ in range(8):  # trusted: no limit
            st, _, _ = request(srv.port, "GET", "/health", timeout=2, src="127.0.0.2")
            check(st == 200, "127.0.0.2 got %d" % st)
        held.pop(0).close()
        time.sleep(0.3)
        st, _, _ = request(srv.port, "GET", "/health", timeout=2, src="127.0.0.1")
        check(st == 200, "127.0.0.1 got %d after one of its connections closed" % st)
    finally:
        for s in held:
            s.close()


def case_per_ip_answered(ctx):
    """issue 24 finding 1: connections over max_connections_per_ip get a
    429 JSON with Retry-After, read whole (no reset, even for a POST whose
    body the server never reads), one warn line per address per interval,
    and gpt2d_connections_refused_total{reason="per_ip"} counts each."""
    srv = Server(ctx, ctx.models.get("tiny"), "--max-connections-per-ip", "2", "--trusted-proxies", "")
    held = [connect(srv.port, 5) for _ in range(2)]
    try:
        for s in held:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            check(read_response(s, 5)[1] == 200, "one of the first two connections was not served")
        body = json.dumps({"model": "gpt2", "prompt": "x" * 3000, "max_tokens": 1}).encode()
        for i in range(20):
            s = connect(srv.port, 5)
            try:
                s.sendall(completion_head(len(body)) + body)
                try:
                    _, st, h, b = read_response(s, 5)
                except ConnectionResetError:
                    raise Fail("refusal %d: a reset instead of an answer" % i)
            finally:
                s.close()
            check(st == 429, "refusal %d: status %d" % (i, st))
            check(h.get("retry-after", "").isdigit(), "refusal %d: Retry-After %r" % (i, h.get("retry-after")))
            e = error_envelope(b, "the 429")
            check("max_connections_per_ip" in e["message"], "the 429 does not name the limit: %r" % e)
        for s in held:
            s.close()
        time.sleep(0.3)
        check(srv.metric('gpt2d_connections_refused_total{reason="per_ip"}') == 20,
              "refused per_ip: %g, want 20" % srv.metric('gpt2d_connections_refused_total{reason="per_ip"}'))
        lines = [l for l in srv.log().splitlines() if "refused a connection from 127.0.0.1" in l]
        check(len(lines) == 1, "%d log lines for 20 refusals (want 1 per interval): %s" % (len(lines), lines[:3]))
    finally:
        for s in held:
            s.close()


REFUSAL_BODY = 64 << 20  # the finding's body: 64 MiB, far past max_body_bytes and any socket buffer


def node_fetch_refusals(ctx, srv, path, tries, headers=(), body=REFUSAL_BODY, cacert=None):
    """tries POSTs of a body-byte JSON to path through Node's own fetch
    (tests/differential/refusal_fetch.mjs, one connection each; over HTTPS
    when cacert, the server's certificate, is given): the answers, one dict
    per try (status and body, or error)."""
    if shutil.which("node") is None:
        raise Skip("node is not installed (scripts/setup.sh --test installs it)")
    script = os.path.join(HERE, "differential", "refusal_fetch.mjs")
    env = dict(os.environ, NODE_EXTRA_CA_CERTS=cacert) if cacert else None
    url = "%s://127.0.0.1:%d%s" % ("https" if cacert else "http", srv.port, path)
    p = subprocess.run(["node", script, url, str(tries), str(body)] + list(headers),
                       capture_output=True, text=True, timeout=25 * SLOW, env=env)
    check(p.returncode == 0, "refusal_fetch.mjs: exit %d: %s" % (p.returncode, p.stderr[-300:]))
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def check_refusals(got, tries, status, what, word):
    """Every one of tries answers is status with an error envelope whose
    message has word: the client read the refusal, not a reset or EPIPE."""
    check(len(got) == tries, "%s: %d answers of %d tries" % (what, len(got), tries))
    bad = [g for g in got if g.get("status") != status]
    check(not bad, "%s: %d of %d tries did not read the %d (first: %r)" % (what, len(bad), tries, status, bad[0] if bad else None))
    for g in got:
        e = error_envelope(g["body"].encode(), "the %d" % status)
        check(word in e["message"], "%s: the %d does not say %r: %r" % (what, status, word, e))


def case_refusal_readable_node_fetch(ctx):
    """issue 34 part 1: a 64 MiB body to /v1/completions through Node's
    fetch (undici), 20 times: the 413 is answered from the head (Content-
    Length over max_body_bytes) before the body is read, and every try
    reads it, status and JSON, because the connection then reads and drops
    the rest for a bounded time (refusal_linger) instead of closing while
    the body is still coming (which gave 6 of 20 tries `write EPIPE`)."""
    srv = Server(ctx, ctx.models.get("tiny"))
    check_refusals(node_fetch_refusals(ctx, srv, "/v1/completions", 20), 20, 413, "64 MiB bodies", "over the limit")
    st, _, _ = request(srv.port, "GET", "/health", timeout=5)
    check(st == 200, "/health after the refusals: %d" % st)


def case_refusal_readable_tls(ctx):
    """issue 34 part 1, over HTTPS: the 413 of a 64 MiB body, answered from
    the head through libmicrohttpd's TLS records, is read by Node's fetch
    every time (10 tries): the lingering read after libmicrohttpd's close
    drops the client's records unread."""
    srv, crt = tls_server(ctx)
    check_refusals(node_fetch_refusals(ctx, srv, "/v1/completions", 10, cacert=crt), 10, 413, "64 MiB bodies over HTTPS",
                   "over the limit")


def case_refusal_readable_auth(ctx):
    """issue 34 part 1: the 401 of a missing API key, decided from the head
    with a 64 MiB body on its way, is read by Node's fetch every time (10
    tries), and so is the 403 of an Origin not in cors_origins."""
    srv = Server(ctx, ctx.models.get("tiny"), "--api-key", "sk-refusal-test")
    check_refusals(node_fetch_refusals(ctx, srv, "/v1/completions", 10), 10, 401, "no key", "API key")
    got = node_fetch_refusals(ctx, srv, "/v1/completions", 5,
                              ["Authorization: Bearer sk-refusal-test", "Origin: http://evil.example"])
    check_refusals(got, 5, 403, "a foreign Origin", "cors_origins")


def case_refusal_readable_at_accept(ctx):
    """issue 34 part 1: the refusals at accept, before a byte of the request
    is read, reach Node's fetch with a 64 MiB body on its way: the 429 of
    max_connections_per_ip (one connection of the address held) and the
    503 of max_connections (the one connection busy with a body that is
    still coming), 5 tries each."""
    srv = Server(ctx, ctx.models.get("tiny"), "--max-connections-per-ip", "1", "--trusted-proxies", "")
    held = connect(srv.port, 5)
    try:
        held.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        check(read_response(held, 5)[1] == 200, "the held connection was not served")
        check_refusals(node_fetch_refusals(ctx, srv, "/v1/completions", 5), 5, 429, "per address", "max_connections_per_ip")
    finally:
        held.close()
    srv2 = Server(ctx, ctx.models.get("tiny"), "--max-connections", "1", name="server2")
    busy = connect(srv2.port, 5)
    try:
        busy.sendall(completion_head(100))  # a body that is still coming: not idle
        time.sleep(0.3)
        check_refusals(node_fetch_refusals(ctx, srv2, "/v1/completions", 5), 5, 503, "max_connections", "max_connections")
    finally:
        busy.close()


def case_per_ip_default(ctx):
    """issue 24 finding 1: the default limit serves 256 concurrent clients
    from one address that is not exempt (trusted_proxies emptied, so the
    limit applies to 127.0.0.1), each on its own connection, with no error."""
    srv = Server(ctx, ctx.models.get("tiny"), "--trusted-proxies", "")
    socks, errors = [], []
    try:
        for i in range(256):
            socks.append(connect(srv.port, 10))
        for s in socks:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        for i, s in enumerate(socks):
            try:
                st = read_response(s, 10)[1]
                if st != 200:
                    errors.append("client %d: %d" % (i, st))
            except (Fail, OSError) as e:
                errors.append("client %d: %s" % (i, e))
        check(not errors, "%d of 256 clients failed: %s" % (len(errors), errors[:3]))
    finally:
        for s in socks:
            s.close()


def case_trusted_proxy_xff(ctx):
    """issue 24 finding 1: loopback is a trusted proxy by default: its
    X-Forwarded-For names the client in the access log (the rightmost entry
    that is not itself trusted); an untrusted peer's X-Forwarded-For is
    ignored, and its own address is logged."""
    srv = Server(ctx, ctx.models.get("tiny"), "--trusted-proxies", "127.0.0.1, 10.0.0.0/8")
    request(srv.port, "GET", "/health", headers={"X-Request-Id": "xff-trusted",
                                                 "X-Forwarded-For": "6.6.6.6, 203.0.113.7, 10.1.2.3"})
    request(srv.port, "GET", "/health", headers={"X-Request-Id": "xff-untrusted",
                                                 "X-Forwarded-For": "203.0.113.9"}, src="127.0.0.2")
    request(srv.port, "GET", "/health", headers={"X-Request-Id": "xff-v6",
                                                 "X-Forwarded-For": "2001:db8::1"})
    time.sleep(0.2)
    line = access_line(srv, "xff-trusted")
    check(" client=203.0.113.7" in line, "the trusted proxy's client: %s" % line)
    line = access_line(srv, "xff-untrusted")
    check(" client=127.0.0.2" in line, "an untrusted peer's X-Forwarded-For was believed: %s" % line)
    line = access_line(srv, "xff-v6")
    check(" client=2001:db8::1" in line, "an IPv6 client: %s" % line)
    # Two fields: the client's own first, the proxy's last; the last is the
    # one a proxy wrote.
    s = connect(srv.port)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: xff-two\r\n"
              b"X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 198.51.100.4\r\n"
              b"Connection: close\r\n\r\n")
    read_response(s, 10)
    s.close()
    time.sleep(0.2)
    line = access_line(srv, "xff-two")
    check(" client=198.51.100.4" in line, "the client's own X-Forwarded-For field was believed: %s" % line)


def case_refused_metric(ctx):
    """issue 24 finding 1: gpt2d_connections_refused_total has a series for
    every reason from the start, and max_connections' 503 carries
    Retry-After and counts as reason="max_connections"."""
    srv = Server(ctx, ctx.models.get("tiny"), "--max-connections", "2", "--max-connections-per-ip", "0")
    st, _, body = request(srv.port, "GET", "/metrics", timeout=5)
    text = body.decode()
    for reason in ("per_ip", "max_connections", "draining", "shutdown", "timeout", "host"):
        check('gpt2d_connections_refused_total{reason="%s"} 0' % reason in text,
              "no zero series for reason %s" % reason)
    # Two connections each mid-request (a head not yet complete: busy, not idle).
    held = []
    try:
        for _ in range(2):
            s = connect(srv.port, 5)
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
            held.append(s)
        time.sleep(0.3)
        s = connect(srv.port, 5)
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            _, st, h, b = read_response(s, 5)
        finally:
            s.close()
        check(st == 503 and h.get("retry-after", "").isdigit(), "over max_connections: %d %r" % (st, h))
        error_envelope(b, "max_connections' 503")
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    check(srv.metric('gpt2d_connections_refused_total{reason="max_connections"}') == 1,
          "max_connections refusals not counted")


def case_host_allow_list(ctx):
    """issue 24 finding 7: on a loopback bind only localhost, 127.0.0.1 and
    [::1] (any port) are served as Host; another name (a DNS-rebound page)
    gets 421 JSON, counted as reason="host"; allowed_hosts widens it."""
    srv = Server(ctx, ctx.models.get("tiny"))
    for host in ("127.0.0.1", "localhost:%d" % srv.port, "LOCALHOST", "[::1]:8080", "127.0.0.1:1"):
        st, _, _ = request(srv.port, "GET", "/v1/models", headers={"Host": host})
        check(st == 200, "Host %s got %d" % (host, st))
    for host in ("evil.example", "evil.example:%d" % srv.port, "127.0.0.1.evil.example", "localhost.evil",
                 "[::2]", "127.0.0.1:x"):
        st, _, body = request(srv.port, "GET", "/metrics", headers={"Host": host})
        check(st == 421, "Host %s got %d, not 421" % (host, st))
        e = error_envelope(body, "Host %s" % host)
        check(e["code"] == "host_not_allowed", "Host %s: code %r" % (host, e["code"]))
    check(srv.metric('gpt2d_connections_refused_total{reason="host"}') == 6, "host refusals not counted")
    # HTTP/1.0 without a Host is no browser's.
    _, st, _, _ = raw_exchange(srv.port, b"GET /health HTTP/1.0\r\n\r\n")
    check(st == 200, "HTTP/1.0 without Host got %d" % st)
    srv2 = Server(ctx, ctx.models.get("tiny"), "--allowed-hosts", "gpt2d.internal, localhost", name="server2")
    st, _, _ = request(srv2.port, "GET", "/health", headers={"Host": "gpt2d.internal:80"})
    check(st == 200, "an allowed_hosts name got %d" % st)
    st, _, _ = request(srv2.port, "GET", "/health", headers={"Host": "127.0.0.1"})
    check(st == 421, "127.0.0.1, not in allowed_hosts, got %d" % st)


def case_slow_body(ctx):
    """1: a body trickled slower than --body-timeout is closed (408 JSON if sent)."""
    srv = Server(ctx, ctx.models.get("tiny"), "--body-timeout", "2")
    s = connect(srv.port, 10)
    try:
        s.sendall(completion_head(100) + b'{"model":')
        t0 = time.monotonic()
        got, closed = b"", False
        while time.monotonic() - t0 < 3.5:  # the body timeout + 1.5 s
            s.settimeout(0.2)
            try:
                chunk = s.recv(65536)
                if not chunk:
                    closed = True
                    break
                got += chunk
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed = True
                break
            if time.monotonic() - t0 > 3.0 and not got:
                try:
                    s.send(b" ")  # the next byte, 3 s after the last: slower than the timeout
                except OSError:
                    closed = True
                    break
        check(closed or got, "a body stalled for %.1f s (body_timeout 2) is still open" % (time.monotonic() - t0))
        if got:
            status, _, rest = parse_head(got)
            check(status == 408, "the stalled body got %d, not 408" % status)
            error_envelope(rest[rest.find(b"{"):] if b"{" in rest else rest, "the 408")
    finally:
        s.close()


def trickle(s, data, interval, limit):
    """Sends data one byte every interval seconds on s while reading; stops at
    the server's answer or close. (the bytes that came, seconds from the first
    byte sent to the answer or close, whether it closed within a second of
    the answer); Fail past limit s."""
    t0 = time.monotonic()
    got, sent, closed = b"", 0, False
    next_send = t0
    while True:
        now = time.monotonic()
        if now - t0 > limit:
            raise Fail("no answer and no close %.1f s into a head trickled a byte every %.1f s "
                       "(%d bytes sent)" % (now - t0, interval, sent))
        if now >= next_send and sent < len(data):
            try:
                s.send(data[sent:sent + 1])
                sent += 1
            except OSError:
                return got, time.monotonic() - t0, True
            next_send += interval
        s.settimeout(max(0.01, min(0.1, next_send - time.monotonic())))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return got, time.monotonic() - t0, True
        if not chunk:
            return got, time.monotonic() - t0, True
        got += chunk
        if b"\r\n\r\n" in got:
            _, headers, rest = parse_head(got)
            if len(rest) >= int(headers.get("content-length", "0")):
                took = time.monotonic() - t0
                try:  # the close follows the answer; give it a second to arrive
                    return got + read_until_close(s, 1.0), took, True
                except Fail:
                    return got, took, False


def case_slow_body_rate(ctx):
    """1: a body trickled a byte every half second never stalls for
    --body-timeout, but comes slower than --body-min-rate: 408 JSON about
    body_timeout after the head (a second more for each body_min_rate
    bytes), not never."""
    srv = Server(ctx, ctx.models.get("tiny"), "--body-timeout", "2", "--body-min-rate", "100")
    s = connect(srv.port, 10)
    try:
        s.sendall(completion_head(1000, b"X-Request-Id: hostile-slow-rate\r\n"))
        got, took, closed = trickle(s, b"x" * 1000, 0.5, 6.0)
        check(got, "a body at 2 bytes a second was closed after %.1f s without the 408" % took)
        status, headers, rest = parse_head(got)
        check(status == 408, "a body at 2 bytes a second (body_min_rate 100) got %d" % status)
        check(1.5 <= took <= 2 + 1.5 * min(SLOW, 2), "the 408 came %.1f s after the head (body_timeout 2 + a few bytes at 100 a second)"
              % took)
        error_envelope(rest, "the slow body's 408")
        check(headers.get("x-request-id") == "hostile-slow-rate", "the 408 carries X-Request-Id %r"
              % headers.get("x-request-id"))
        check(closed, "the connection stayed open after the 408")
    finally:
        s.close()
    # A body at the minimum rate or faster is read whole: 3,000 bytes in
    # ~1.5 s (2,000 a second, over the 100 a second minimum) is served.
    body = json.dumps({"prompt": "a" * 2980}).encode()
    s = connect(srv.port, 10)
    try:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 200):
            s.sendall(body[i:i + 200])
            time.sleep(0.1)
        _, st, _, b = read_response(s, 5)
        check(st == 200, "a body at 2,000 bytes a second got %d %r" % (st, b[:100]))
    finally:
        s.close()


def case_keepalive_deadlines(ctx):
    """1: on a keep-alive connection, the next head trickled a byte a second
    gets the 408 JSON request_header_timeout after its first byte, as on a
    new connection (not connection_timeout later); a later request's body
    stalled for body_timeout gets the 408 too, with its X-Request-Id."""
    srv = Server(ctx, ctx.models.get("tiny"), "--request-header-timeout", "2", "--body-timeout", "2",
                 "--connection-timeout", "60")
    s = connect(srv.port, 5)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        check(read_response(s, 5)[1] == 200, "the first request on the connection failed")
        time.sleep(0.5)  # the client thinks, then starts its next head
        got, took, closed = trickle(s, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"p" * 40, 1.0, 6.0)
        check(got, "the trickled keep-alive head was closed after %.1f s without the 408" % took)
        status, headers, rest = parse_head(got)
        check(status == 408, "the trickled keep-alive head got %d, not 408: %r" % (status, got[:200]))
        check(1.5 <= took <= 2 + 1.5 * min(SLOW, 2), "the 408 came %.1f s after the head's first byte (request_header_timeout 2)"
              % took)
        error_envelope(rest, "the keep-alive head's 408")
        check(headers.get("x-request-id"), "the keep-alive head's 408 has no X-Request-Id: %r" % headers)
        check(closed, "the connection stayed open after the 408")
        rid = headers["x-request-id"]
    finally:
        s.close()
    # The access line of that 408 names its X-Request-Id.
    time.sleep(0.3)
    check(any(" access " in l and "status=408" in l and rid in l for l in srv.log().splitlines()),
          "no access line with status=408 and request_id %s: %s" % (rid, srv.tail(3)))
    # A keep-alive connection that sends its next request at once is served
    # (the deadline is not the idle time since the last answer).
    s = connect(srv.port, 5)
    try:
        for i in range(3):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            check(read_response(s, 5)[1] == 200, "request %d on a keep-alive connection failed" % i)
            time.sleep(1.2)  # idle, no byte: connection_timeout applies, not the head's 2 s
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        check(read_response(s, 5)[1] == 200, "a request 3.6 s into an idle keep-alive connection failed")
        # The next request's body stalls: 408 with its X-Request-Id, at body_timeout.
        s.sendall(completion_head(100, b"X-Request-Id: hostile-ka-body\r\n") + b'{"model":')
        t0 = time.monotonic()
        try:
            got = read_until_close(s, 4.0)
        except Fail as e:
            raise Fail("a keep-alive body stalled for body_timeout 2: %s" % e)
        took = time.monotonic() - t0
        check(got, "the stalled keep-alive body was closed after %.1f s without the 408" % took)
        status, headers, rest = parse_head(got)
        check(status == 408 and 1.5 <= took <= 2 + 1.5 * min(SLOW, 2), "the stalled keep-alive body: %d after %.1f s" % (status, took))
        error_envelope(rest, "the stalled body's 408")
        check(headers.get("x-request-id") == "hostile-ka-body",
              "the body's 408 carries X-Request-Id %r, not the request's" % headers.get("x-request-id"))
    finally:
        s.close()
    time.sleep(0.3)
    line = access_line(srv, "hostile-ka-body")
    check("status=408" in line and "POST /v1/completions" in line, "the stalled body's access line: %s" % line)


def case_stalled_stream(ctx):
    """2: a stream client that never reads pins at most stream_backlog_bytes
    (plus a margin), and the request is cancelled after stream_stall_timeout."""
    backlog, kv_mb = 131072, 64
    srv = Server(ctx, ctx.models.get("thin"), "--stream-backlog-bytes", str(backlog),
                 "--stream-stall-timeout", "3", "--kv-cache-mb", str(kv_mb))
    body = {"model": "gpt2", "prompt": "Hello there", "n": 16, "logprobs": 5, "echo": True,
            "max_tokens": 1000, "ignore_eos": True, "stream": True}
    # Warm up the code paths and the first KV blocks of 16 sequences with a read stream.
    warm = Stream(srv.port, dict(body, max_tokens=20))
    warm.wait(20, "the warm-up stream")
    time.sleep(0.2)
    base = srv.rss_kib()
    block_kib = kv_mb * 1024 / srv.metric("gpt2d_kv_blocks_capacity")
    tokens_before = srv.metric("gpt2d_completion_tokens_total")
    # The bound: the baseline, the backlog, the KV cache the stream holds
    # (its blocks, reserved at admission and first touched now: 16 x 1011
    # positions x 256 B, 4 MiB; the sequences keep generating while the
    # kernel's socket buffer, ~2.8 MB on loopback, absorbs the first 6 s or
    # so of output, before any backlog forms), and 1 MiB for the rest
    # (glibc's malloc arenas, one step's output, the request's state).
    # Today's server buffers the whole answer (16 x 1000 tokens x ~500 B of
    # SSE) and passes the bound after about 12 s on 2 busy cores; the fixed
    # one cancels the stream after ~6 s + the stall timeout.
    st = Stream(srv.port, body, rcvbuf=4096, read=False)
    try:
        t0 = time.monotonic()
        # Running first: a look before its admission would read 0 as its end.
        srv.wait_metric_above("gpt2d_running_sequences", 0, 10, "the stalled stream admitted")
        peak_blocks = 0
        while time.monotonic() - t0 < 15.0:  # the kernel's buffer (~6 s) + the stall timeout (3 s) + 6 s
            blocks = srv.metric("gpt2d_kv_blocks_used")
            peak_blocks = max(peak_blocks, blocks)
            rss = srv.rss_kib()
            bound = base + backlog // 1024 + peak_blocks * block_kib + RSS_MARGIN_KIB
            check(rss <= bound, "RSS %d KiB %.1f s into a stalled stream, over the bound %d KiB (baseline %d "
                  "+ backlog %d + KV %d + %d margin)" % (rss, time.monotonic() - t0, bound, base,
                                                         backlog // 1024, peak_blocks * block_kib,
                                                         RSS_MARGIN_KIB))
            if srv.metric("gpt2d_running_sequences") == 0:
                break
            time.sleep(0.1)
        check(srv.metric("gpt2d_running_sequences") == 0,
              "the stalled stream still runs %.1f s after it started (stream_stall_timeout 3)"
              % (time.monotonic() - t0))
        st.start_reading()
        st.wait(10, "reading the cancelled stream")
        sse_ending(st, "the cancelled stream", "error")
        # A request's tokens are counted when its answer is complete: now.
        deadline = time.monotonic() + 10
        while srv.metric("gpt2d_completion_tokens_total") == tokens_before and time.monotonic() < deadline:
            time.sleep(0.05)
        made = srv.metric("gpt2d_completion_tokens_total") - tokens_before
        check(0 < made < 16 * 1000, "the stalled stream generated %d tokens: want some, and not all 16,000 "
              "(cancelled)" % made)
    finally:
        st.sock.close()


def flood_windows(srv, route, big):
    """A stream's median inter-token gap without and with eight clients
    posting big to route, checked within 2x.

    The gaps are measured in alternating windows, unloaded (no body in
    flight) and loaded (the flood on), three of each, and the median of the
    loaded windows' medians is compared with that of the unloaded ones: a
    burst of load from outside the case (another build on the 2 cores)
    slows windows of both kinds instead of only the loaded ones. A failed
    comparison is measured once more, both kinds again, and must pass then."""
    body = {"model": "gpt2", "prompt": "Flood", "max_tokens": 40, "ignore_eos": True, "stream": True}
    stop, flooding = threading.Event(), threading.Event()
    lock = threading.Lock()
    state = {"posted": 0, "in_flight": 0}

    def flood():
        while not stop.is_set():
            if not flooding.wait(0.05):
                continue
            with lock:
                state["in_flight"] += 1
            try:
                request(srv.port, "POST", route, big, timeout=4)
                with lock:
                    state["posted"] += 1
            except (OSError, http.client.HTTPException):
                pass
            finally:
                with lock:
                    state["in_flight"] -= 1

    def window(loaded):
        """The median inter-token gap of one 40-token stream, with the flood on or quiet."""
        if loaded:
            flooding.set()
            time.sleep(0.5)  # every flood client has a body in the server
        else:
            flooding.clear()
            deadline = time.monotonic() + 6
            while state["in_flight"] > 0:
                check(time.monotonic() < deadline, "the %s flood did not quiet down in 6 s" % route)
                time.sleep(0.02)
        st = Stream(srv.port, body)
        try:
            st.closed.wait(8)  # what arrives in 8 s is enough to measure
            gaps = st.token_gaps()
        finally:
            st.sock.close()
        check(len(gaps) >= 10, "%d tokens in 8 s of a stream %s the %s flood (%d bodies posted)"
              % (len(gaps) + 1, "during" if loaded else "without", route, state["posted"]))
        return statistics.median(gaps)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    try:
        window(False)  # warm-up: the first stream pays for first touches
        for attempt in (1, 2):
            unloaded, loaded = [], []
            for _ in range(3):
                unloaded.append(window(False))
                loaded.append(window(True))
            u, l = statistics.median(unloaded), statistics.median(loaded)
            if l <= 2 * u:
                print("  %s flood: median inter-token gap %.1f ms, unloaded %.1f ms (%d bodies posted)"
                      % (route, l * 1e3, u * 1e3, state["posted"]))
                break
            check(attempt == 1, "median inter-token gap %.1f ms during the %s flood, unloaded %.1f ms, "
                  "twice (over 2x; windows unloaded %s, loaded %s ms; %d bodies posted)"
                  % (l * 1e3, route, u * 1e3, ["%.1f" % (x * 1e3) for x in unloaded],
                     ["%.1f" % (x * 1e3) for x in loaded], state["posted"]))
        check(state["posted"] >= 3, "only %d %s bodies were answered during the flood windows"
              % (state["posted"], route))
    finally:
        stop.set()
        flooding.clear()
        for t in threads:
            t.join(6)


def case_tokenize_flood(ctx):
    """3: eight clients posting 1 MB bodies to /tokenize keep a stream's
    median inter-token gap within 2x its unloaded value (flood_windows); a
    1 MB completion prompt over max_prompt_tokens gets 400 well before a
    full tokenization."""
    # One body tokenized at a time leaves the engine a core of the two CI has.
    srv = Server(ctx, ctx.models.get("slow"), "--max-body-bytes", "2000000", "--max-prompt-tokens", "1024",
                 "--tokenize-concurrency", "1")
    flood_windows(srv, "/tokenize", json.dumps({"prompt": "hello " * 170000}).encode())  # ~1 MB
    # Varied words (few repeats for the BPE cache), ~1 MB, ~400,000 tokens.
    text = " ".join("w%dq" % (i * 7919 % 1000003) for i in range(110000))
    # Every request here pays for sending and parsing 1 MB of JSON (jansson:
    # ~10 ms a MB, 15% of /tokenize's time on the 2-core CI machine) before
    # any token: that floor is measured with a body refused after the parse
    # and before tokenizing (an unknown model, 404), and only the time above
    # it is compared, tokenizing against tokenizing.
    t_full = t_reject = t_parse = 1e9
    for _ in range(3):  # the fastest of three, against the noise of a shared machine
        t0 = time.monotonic()
        st, _, b = request(srv.port, "POST", "/tokenize", json.dumps({"prompt": text}), timeout=25)
        t_full = min(t_full, time.monotonic() - t0)
        check(st == 200, "/tokenize of the 1 MB body: %d %r" % (st, b[:200]))
        t0 = time.monotonic()
        st, _, b = request(srv.port, "POST", "/v1/completions", json.dumps({"model": "gpt2", "prompt": text}),
                           timeout=25)
        t_reject = min(t_reject, time.monotonic() - t0)
        check(st == 400, "a 1 MB prompt over max_prompt_tokens got %d" % st)
        error_envelope(b, "the 400 for a long prompt")
        t0 = time.monotonic()
        st, _, b = request(srv.port, "POST", "/v1/completions", json.dumps({"model": "no-such", "prompt": text}),
                           timeout=25)
        t_parse = min(t_parse, time.monotonic() - t0)
        check(st == 404, "a 1 MB prompt for an unknown model got %d" % st)
    check(t_reject - t_parse < 0.15 * (t_full - t_parse),
          "the 1 MB prompt was refused after %.3f s; /tokenize of it takes %.3f s, and a body refused before "
          "tokenizing %.3f s (want the tokenizing part under 15%%: tokenizing stops at max_prompt_tokens)"
          % (t_reject, t_full, t_parse))


def case_completion_flood(ctx):
    """3: eight clients posting 1 MB completion and chat bodies (prompts
    over max_prompt_tokens: each is parsed, tokenized up to the limit and
    refused) keep a stream's median inter-token gap within 2x its unloaded
    value: a body of 64 KiB or more is parsed on a tokenizer thread, not on
    the loop thread that sends every stream's tokens (parsing them there
    took the gap from 6.5 to 23.7 ms)."""
    srv = Server(ctx, ctx.models.get("slow"), "--max-body-bytes", "2000000", "--max-prompt-tokens", "1024",
                 "--tokenize-concurrency", "1")
    big = json.dumps({"model": "gpt2", "prompt": "hello " * 170000, "max_tokens": 1}).encode()
    st, _, b = request(srv.port, "POST", "/v1/completions", big, timeout=25)
    check(st == 400 and "max_prompt_tokens" in error_envelope(b, "a 1 MB prompt")["message"],
          "a 1 MB prompt over max_prompt_tokens got %d %r" % (st, b[:200]))
    flood_windows(srv, "/v1/completions", big)
    chat = json.dumps({"messages": [{"role": "user", "content": "hello " * 170000}]}).encode()
    flood_windows(srv, "/v1/chat/completions", chat)
    # The body parsed off the loop gives what the compact one gives.
    greedy = {"model": "gpt2", "prompt": "Padded", "max_tokens": 5, "temperature": 0}
    st1, _, b1 = request(srv.port, "POST", "/v1/completions", json.dumps(greedy))
    st2, _, b2 = request(srv.port, "POST", "/v1/completions", (json.dumps(greedy) + " " * 70000).encode())
    check(st1 == 200 and st2 == 200, "greedy completions: %d, %d" % (st1, st2))
    t1, t2 = json.loads(b1)["choices"][0]["text"], json.loads(b2)["choices"][0]["text"]
    check(t1 == t2, "a body padded past 64 KiB gave %r, the compact one %r" % (t2, t1))


def case_responses_flood(ctx):
    """3: eight clients posting 1 MB /v1/responses bodies (15,000 input
    messages each, a conversation past the context: parsed, its prompt
    counted and refused) keep a stream's median inter-token gap within 2x
    its unloaded value: a Responses body of 64 KiB or more is parsed, and
    its prompt made, on a tokenizer thread as completions' and chat's are;
    one parsed on the loop thread holds every stream's next token."""
    srv = Server(ctx, ctx.models.get("slow"), "--max-body-bytes", "2000000", "--max-prompt-tokens", "1024",
                 "--tokenize-concurrency", "1")
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hello there %d" % i} for i in range(15000)]
    big = json.dumps({"model": "gpt2", "input": msgs, "max_output_tokens": 1}).encode()
    check(len(big) > 600000, "the flood's body is only %d bytes" % len(big))
    st, _, b = request(srv.port, "POST", "/v1/responses", big, timeout=25)
    check(st == 400 and "context" in error_envelope(b, "a 15,000-message input")["message"],
          "a conversation past the context got %d %r" % (st, b[:200]))
    flood_windows(srv, "/v1/responses", big)
    # The body parsed off the loop gives what the compact one gives, and a
    # large body's errors still name their field.
    greedy = {"model": "gpt2", "input": "Padded", "max_output_tokens": 5, "temperature": 0, "store": False}
    st1, _, b1 = request(srv.port, "POST", "/v1/responses", json.dumps(greedy))
    st2, _, b2 = request(srv.port, "POST", "/v1/responses", (json.dumps(greedy) + " " * 70000).encode())
    check(st1 == 200 and st2 == 200, "greedy responses: %d, %d" % (st1, st2))
    t1, t2 = json.loads(b1)["output_text"], json.loads(b2)["output_text"]
    check(t1 == t2, "a body padded past 64 KiB gave %r, the compact one %r" % (t2, t1))
    # A large body naming stored items: parsed on a tokenizer thread, the
    # store read on the loop thread, the prompt made on a second trip.
    st, _, b = request(srv.port, "POST", "/v1/responses", json.dumps(
        {"model": "gpt2", "input": "Remember", "max_output_tokens": 3, "temperature": 0}))
    check(st == 200, "a stored response: %d %r" % (st, b[:200]))
    first = json.loads(b)
    follow = {"model": "gpt2", "previous_response_id": first["id"], "max_output_tokens": 5, "temperature": 0,
              "store": False, "input": [{"type": "item_reference", "id": first["output"][0]["id"]},
                                        {"role": "user", "content": "Again"}]}
    st1, _, b1 = request(srv.port, "POST", "/v1/responses", json.dumps(follow))
    st2, _, b2 = request(srv.port, "POST", "/v1/responses", (json.dumps(follow) + " " * 70000).encode())
    check(st1 == 200 and st2 == 200, "a follow-up, compact and padded: %d %r, %d %r" % (st1, b1[:200], st2, b2[:200]))
    r1, r2 = json.loads(b1), json.loads(b2)
    check(r1["output_text"] == r2["output_text"] and r1["usage"]["input_tokens"] == r2["usage"]["input_tokens"],
          "a padded follow-up gave %r (%d input tokens), the compact one %r (%d)"
          % (r2["output_text"], r2["usage"]["input_tokens"], r1["output_text"], r1["usage"]["input_tokens"]))
    st, _, b = request(srv.port, "POST", "/v1/responses", (json.dumps(dict(follow, previous_response_id="resp_x"))
                                                          + " " * 70000).encode())
    check(st == 404 and error_envelope(b, "a padded unknown id")["param"] == "previous_response_id",
          "a padded body naming no stored response got %d %r" % (st, b[:200]))
    st, _, b = request(srv.port, "POST", "/v1/responses",
                       (json.dumps({"input": "x", "reasoning": {"effort": "high"}}) + " " * 70000).encode())
    check(st == 400 and error_envelope(b, "a padded refusal").get("param") == "reasoning",
          "a padded body asking for reasoning got %d %r" % (st, b[:200]))


def thread_nices(pid):
    """{thread id: (name, nice)} of process pid, from /proc."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                name = f.read().strip()
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                fields = f.read().rpartition(")")[2].split()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (name, int(fields[16]))  # stat's field 19, counted after the name
    return out


def case_tokenizer_priority(ctx):
    """3: the tokenizer threads run at the server's own nice + 10 (at most
    19), so that a server started under nice, or with the unit's Nice=,
    keeps its engine ahead of a flood of bodies to tokenize (an absolute
    nice 10 gave them the engine's priority: a stream's token gaps doubled
    during the tokenize flood under `nice meson test`)."""
    srv = Server(ctx, ctx.models.get("tiny"), "--tokenize-concurrency", "2", nice=3)
    deadline = time.monotonic() + 5
    while True:
        threads = thread_nices(srv.pid)
        tok = [n for name, n in threads.values() if name == "gpt2d-tok"]
        if len(tok) == 2:
            break
        check(time.monotonic() < deadline, "not two gpt2d-tok threads after 5 s: %r" % threads)
        time.sleep(0.05)
    base = threads[srv.pid][1]
    want = min(19, base + 10)
    check(tok == [want, want], "the tokenizer threads run at nice %s, the server at %d (want %d)" % (tok, base, want))


def case_tokenize_queue(ctx):
    """3: with --tokenize-concurrency 1 --max-queue 1, of three large bodies
    posted together one is tokenized, one waits and one gets 429 (JSON,
    Retry-After); a client that leaves while its body waits is dropped and
    the server goes on serving."""
    srv = Server(ctx, ctx.models.get("tiny"), "--tokenize-concurrency", "1", "--max-queue", "1",
                 "--max-body-bytes", "8000000")
    # ~6 MB of varied words: parsed and tokenized in about half a second on
    # the tokenizer thread, while the next bodies arrive (tens of ms each).
    text = " ".join("w%dq" % (i * 7919 % 1000003) for i in range(650000))
    big = json.dumps({"prompt": text}).encode()
    results = []

    def post():
        try:
            results.append(request(srv.port, "POST", "/tokenize", big, timeout=25))
        except (OSError, http.client.HTTPException) as e:
            results.append((0, {}, str(e).encode()))
    first = threading.Thread(target=post)
    first.start()
    time.sleep(0.1)
    others = [threading.Thread(target=post) for _ in range(2)]
    for t in others:
        t.start()
    for t in [first] + others:
        t.join(30)
    statuses = sorted(r[0] for r in results)
    check(statuses == [200, 200, 429], "three large bodies with one tokenizing and one waiting allowed: %s"
          % statuses)
    refused = [r for r in results if r[0] == 429][0]
    check("retry-after" in refused[1], "the 429 has no Retry-After: %r" % refused[1])
    error_envelope(refused[2], "the 429 for a full tokenize queue")
    counts = {json.loads(r[2])["count"] for r in results if r[0] == 200}
    check(len(counts) == 1, "the two tokenized bodies got different counts: %s" % counts)
    # A client that leaves while its body waits: the server drops it and
    # serves the next one (the freed slot goes to a live request).
    first = threading.Thread(target=post)
    first.start()
    time.sleep(0.1)
    s = connect(srv.port, 5)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
    time.sleep(0.1)
    s.close()
    first.join(30)
    st, _, b = request(srv.port, "POST", "/tokenize", big, timeout=25)
    check(st == 200, "a body after one whose client left while waiting: %d %r" % (st, b[:200]))
    check(srv.proc.poll() is None, "the server exited: " + srv.tail(3))


LONG_STREAM = {"model": "gpt2", "prompt": "Drain", "max_tokens": 800, "ignore_eos": True, "stream": True}
STEP_DELAY = {"GPT2D_TEST_STEP_DELAY_MS": "20"}  # 800 tokens take over 16 s
STEP_S = 0.02  # one step under STEP_DELAY


def access_line(srv, req_id):
    lines = [l for l in srv.log().splitlines() if " access " in l and req_id in l]
    check(len(lines) == 1, "%d access log lines name the request id %s" % (len(lines), req_id))
    return lines[0]


def case_sigterm_timeout(ctx):
    """4: SIGTERM with a stream longer than --shutdown-timeout 2: a final
    event and [DONE] and the chunked end; a non-streaming request gets 503
    JSON; exit 0 within the timeout + 1 s; the access log says it was cut."""
    srv = Server(ctx, ctx.models.get("long"), "--shutdown-timeout", "2", env=STEP_DELAY)
    stream = Stream(srv.port, LONG_STREAM, headers=b"X-Request-Id: hostile-cut-stream\r\n")
    plain_result = {}

    def plain():
        try:
            plain_result["r"] = request(srv.port, "POST", "/v1/completions",
                                        dict(LONG_STREAM, stream=False), timeout=20)
        except (OSError, http.client.HTTPException) as e:
            plain_result["e"] = e
    t = threading.Thread(target=plain, daemon=True)
    t.start()
    srv.wait_metric("gpt2d_running_sequences", 2, 10, "both requests running")
    t0 = time.monotonic()
    srv.signal(signal.SIGTERM)
    # The drain's 2 s, then the cut streams' endings and the exit: 1.2 s
    # more (2.4 under a sanitizer, where they took 0.15 s here).
    rc = srv.wait(2 + 1.5 * min(SLOW, 2))
    took = time.monotonic() - t0
    check(rc is not None, "still running %.1f s after SIGTERM (shutdown_timeout 2)" % took)
    check(took <= 2 + 1.2 * min(SLOW, 2), "exited %.1f s after SIGTERM (shutdown_timeout 2)" % took)
    check(rc == 0, "after SIGTERM: %s" % describe_exit(rc))
    stream.wait(2, "the cut stream")
    sse_ending(stream, "the stream cut by the shutdown", "shut")
    t.join(2)
    check("r" in plain_result, "the non-streaming request got no answer: %s" % plain_result.get("e"))
    st, _, b = plain_result["r"]
    check(st == 503, "the non-streaming request cut by the shutdown got %d" % st)
    error_envelope(b, "the 503 at shutdown")
    line = access_line(srv, "hostile-cut-stream")
    check(re.search(r"shut|cut|cancel|interrupt|abort", line),
          "the access line of the cut stream reads like a normal completion: %s" % line)


def case_drain_unanswered(ctx):
    """4: a request whose body is still coming when the drain ends (its
    shutdown_timeout, then the cut's grace) gets a 503 JSON with its
    X-Request-Id before its connection is closed, not a bare close; exit 0."""
    srv = Server(ctx, ctx.models.get("tiny"), "--shutdown-timeout", "1")
    s = connect(srv.port, 5)
    try:
        s.sendall(completion_head(100, b"X-Request-Id: hostile-drain-body\r\n") + b'{"model":')
        time.sleep(0.3)
        t0 = time.monotonic()
        srv.signal(signal.SIGTERM)
        try:
            got = read_until_close(s, 4)
        except Fail as e:
            raise Fail("a body still coming at SIGTERM (shutdown_timeout 1): %s" % e)
        took = time.monotonic() - t0
        check(got, "a body still coming at SIGTERM was closed without an answer after %.1f s" % took)
        status, headers, rest = parse_head(got)
        check(status == 503, "a body still coming when the drain ended got %d" % status)
        e = error_envelope(rest, "the 503 at the drain's end")
        check(e["code"] == "server_shutting_down", "the 503's code is %r" % e["code"])
        check(headers.get("x-request-id") == "hostile-drain-body", "the 503 carries X-Request-Id %r"
              % headers.get("x-request-id"))
    finally:
        s.close()
    rc = srv.wait(3)
    check(rc == 0, "after SIGTERM with a body still coming: %s" % describe_exit(rc))
    check("status=503" in access_line(srv, "hostile-drain-body"), "the access line: %s"
          % access_line(srv, "hostile-drain-body"))


def case_drain_tokenizing(ctx):
    """4: bodies still tokenizing or waiting for a tokenizer thread when the
    drain's grace runs out: each client gets one answer (503 JSON, or its
    200 if it was done in time) and the process exits 0 (libmicrohttpd
    aborted the process when stopped with those connections suspended)."""
    srv = Server(ctx, ctx.models.get("tiny"), "--tokenize-concurrency", "1", "--max-body-bytes", "8000000",
                 "--shutdown-timeout", "0")
    text = " ".join("w%dq" % (i * 7919 % 1000003) for i in range(650000))  # ~6 MB, ~0.5 s to tokenize
    big = json.dumps({"prompt": text}).encode()
    socks = []
    try:
        for i in range(3):
            s = connect(srv.port, 10)
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: hostile-tok-%d\r\n"
                      b"Content-Length: %d\r\n\r\n" % (i, len(big)) + big)
            socks.append(s)
        time.sleep(0.2)
        srv.signal(signal.SIGTERM)
        statuses = []
        for i, s in enumerate(socks):
            try:
                got = read_until_close(s, 5)
            except Fail as e:
                raise Fail("body %d tokenizing at SIGTERM (shutdown_timeout 0): %s" % (i, e))
            check(got.count(b"HTTP/1.1 ") == 1, "body %d got %d answers: %r" % (i, got.count(b"HTTP/1.1 "), got[:200]))
            status, headers, rest = parse_head(got)
            check(status in (200, 503), "body %d tokenizing at SIGTERM got %d" % (i, status))
            if status == 503:
                error_envelope(rest, "the 503 of body %d" % i)
                check(headers.get("x-request-id") == "hostile-tok-%d" % i, "body %d's 503 carries X-Request-Id %r"
                      % (i, headers.get("x-request-id")))
            statuses.append(status)
        check(503 in statuses, "every body was tokenized before the drain's end (%s): nothing tested" % statuses)
    finally:
        for s in socks:
            s.close()
    rc = srv.wait(5)
    check(rc == 0, "after SIGTERM with bodies tokenizing: %s (%s)" % (describe_exit(rc), srv.tail(1)))


def double_signal(ctx, second):
    srv = Server(ctx, ctx.models.get("long"), "--shutdown-timeout", "30", env=STEP_DELAY,
                 name="double-" + second.name)
    stream = Stream(srv.port, LONG_STREAM)
    srv.wait_metric("gpt2d_running_sequences", 1, 10, "the stream running")
    srv.signal(signal.SIGTERM)
    time.sleep(0.5)
    check(srv.proc.poll() is None, "exited on the first SIGTERM with a 16 s stream and shutdown_timeout 30")
    t0 = time.monotonic()
    srv.signal(second)
    rc = srv.wait(1.5)
    check(rc is not None, "still running 1.5 s after SIGTERM then %s" % second.name)
    check(rc == 0, "after SIGTERM then %s: %s" % (second.name, describe_exit(rc)))
    stream.wait(2, "the stream after the second signal")
    sse_ending(stream, "the stream cut by %s" % second.name, "shut")
    return time.monotonic() - t0


def case_ctrl_c_terminal(ctx):
    """Issue 28: Ctrl-C in a terminal (stderr a tty) is answered in a
    terminal user's words, and the server stops cleanly (status 0); the
    journal's and a pipe's lines stay as they were."""
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen([ctx.gpt2d, "serve", "--model", ctx.models.get("tiny"), "--port", "0",
                             "--kv-cache-mb", "64"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 20
        while b"listening on" not in out and b"on http://" not in out:
            check(time.monotonic() < deadline, "no start-up line on the terminal: %r" % out[-300:])
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
        proc.send_signal(signal.SIGINT)
        check(proc.wait(timeout=20) == 0, "exit status %s after Ctrl-C" % proc.returncode)
        while True:
            r, _, _ = select.select([master], [], [], 0.5)
            if not r:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = out.decode("utf-8", "replace")
    check("Ctrl-C: stopping" in text and "press Ctrl-C again to stop at once" in text,
          "no terminal words for Ctrl-C: %r" % text[-400:])
    # Nothing ran: said so, not as "0 requests still running".
    check("Ctrl-C: stopping (nothing is running)" in text, "Ctrl-C with nothing running: %r" % text[-400:])


def case_double_signal(ctx):
    """4: a second SIGTERM, or a SIGINT, ends the drain at once with the same clean ending."""
    double_signal(ctx, signal.SIGTERM)
    double_signal(ctx, signal.SIGINT)


def case_sighup_reload(ctx):
    """5: SIGHUP reloads api_key from the config file while a stream keeps
    running; a broken file is refused by file:line; SIGUSR1/2 do not kill."""
    conf = os.path.join(ctx.dir, "gpt2d.conf")
    key1, key2 = "first-key-111", "second-key-222"
    with open(conf, "w") as f:
        f.write("log_level = info\napi_key = %s\n" % key1)
    srv = Server(ctx, ctx.models.get("long"), "--config", conf, env=STEP_DELAY)
    auth = lambda k: {"Authorization": "Bearer " + k}
    stream = Stream(srv.port, dict(LONG_STREAM, max_tokens=150, stream_options={"include_usage": True}),
                    headers=b"Authorization: Bearer " + key1.encode() + b"\r\n")
    time.sleep(0.3)
    with open(conf, "w") as f:
        f.write("log_level = info\napi_key = %s\n" % key2)
    srv.signal(signal.SIGHUP)
    # The keys are looked at once the reload says it is done.
    check(srv.wait_log(r"SIGHUP: configuration reloaded; changed: .*api_key"),
          "no reload line naming api_key: " + srv.tail(3))
    check(srv.proc.poll() is None, "SIGHUP: %s" % describe_exit(srv.proc.poll()))
    st2 = request(srv.port, "GET", "/v1/models", headers=auth(key2))[0]
    st1 = request(srv.port, "GET", "/v1/models", headers=auth(key1))[0]
    check(st2 == 200 and st1 == 401, "after the reload: the new key got %d, the old one %d" % (st2, st1))
    check(re.search(r"reload", srv.log(), re.I), "no log line about the reload: " + srv.tail(3))
    with open(conf, "w") as f:
        f.write("log_level = info\nthis is not a key\napi_key = third-key-333\n")
    srv.signal(signal.SIGHUP)
    check(srv.wait_log(r"SIGHUP: reload refused"), "no refusal line for the broken file: " + srv.tail(3))
    check(srv.proc.poll() is None, "SIGHUP with a broken file: %s" % describe_exit(srv.proc.poll()))
    check(request(srv.port, "GET", "/v1/models", headers=auth(key2))[0] == 200,
          "the old config was not kept after a broken file")
    check(conf + ":2" in srv.log(), "no log line naming %s:2 for the broken file: %s" % (conf, srv.tail(2)))
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        srv.signal(sig)
        time.sleep(0.3)
        check(srv.proc.poll() is None, "%s: %s" % (sig.name, describe_exit(srv.proc.poll())))
    stream.wait(15, "the stream across the reload")
    ev = stream.events()
    check(ev[-1] == "[DONE]", "the stream across the reload ends %r" % ev[-1:])
    usage = json.loads(ev[-2]).get("usage") or {}
    check(usage.get("completion_tokens") == 150, "the stream across the reload: usage %r" % usage)


def model_file(ctx, name):
    d = ctx.models.copy("long", os.path.join(ctx.dir, name))
    return d, os.path.join(d, "model.safetensors")


def names_file(srv, path):
    """Whether a log line names the file: its path, or its directory and name."""
    d, name = os.path.split(path)
    return any(path in l or (d in l and name in l) for l in srv.log().splitlines())


def case_model_truncated(ctx):
    """6: the served file truncated: a non-zero exit and one log line naming the file, no silent SIGBUS."""
    d, path = model_file(ctx, "truncated")
    srv = Server(ctx, d)
    ok = {"model": "gpt2", "prompt": "Hi", "max_tokens": 5}
    check(request(srv.port, "POST", "/v1/completions", ok)[0] == 200, "the first completion failed")
    os.truncate(path, 1000)
    deadline = time.monotonic() + 8
    while srv.proc.poll() is None and time.monotonic() < deadline:
        try:
            request(srv.port, "POST", "/v1/completions", ok, timeout=2)
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.1)
    rc = srv.wait(1)
    check(rc == 3, "after truncating the served file: %s, want exit status 3" % describe_exit(rc))
    check(names_file(srv, path), "%s, and no log line names %s (last lines: %s)"
          % (describe_exit(rc), path, srv.tail(2)))


def case_model_overwritten(ctx):
    """6: the served file overwritten in place: /ready 503, a non-zero exit, a log line naming the file."""
    d, path = model_file(ctx, "overwritten")
    other = os.path.join(ctx.models.get("long2"), "model.safetensors")
    srv = Server(ctx, d)
    check(request(srv.port, "POST", "/v1/completions", {"model": "gpt2", "prompt": "Hi", "max_tokens": 5})[0] == 200,
          "the first completion failed")
    shutil.copyfile(other, path)  # as cp does: the same inode, truncated and rewritten (same size)
    saw_503 = False
    deadline = time.monotonic() + 6
    while srv.proc.poll() is None and time.monotonic() < deadline:
        try:
            saw_503 = saw_503 or request(srv.port, "GET", "/ready", timeout=1)[0] == 503
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.1)
    rc = srv.wait(1)
    check(rc == 3, "6 s after the served file was overwritten: %s, want exit status 3 (/ready 503 seen: %s)"
          % (describe_exit(rc), saw_503))
    check(names_file(srv, path), "no log line names %s: %s" % (path, srv.tail(2)))


def case_empty_key(ctx):
    """7: an empty api_key is a start-up error naming the key (and file:line)."""
    d = ctx.models.get("tiny")
    for how, args in (("config", None), ("--api-key ''", ["--api-key", ""])):
        if args is None:
            conf = os.path.join(ctx.dir, "empty-key.conf")
            with open(conf, "w") as f:
                f.write("log_level = info\napi_key =\n")
            args = ["--config", conf]
        try:
            srv = Server(ctx, d, *args, name="empty-key")
        except Fail as e:
            text = str(e)
            check("api_key" in text or "api-key" in text, "%s: the start-up error does not name the key: %s"
                  % (how, text))
            if how == "config":
                check(conf + ":2" in text, "the start-up error does not name %s:2: %s" % (conf, text))
            continue
        st = request(srv.port, "GET", "/v1/models")[0]
        raise Fail("%s: the server started (GET /v1/models without a key: %d)" % (how, st))


def case_auth(ctx):
    """9, 10: bearer in any case; WWW-Authenticate on 401; 401 and 413 on the head, before any body."""
    key = "good-key-12345"
    srv = Server(ctx, ctx.models.get("tiny"), "--api-key", key)
    st = request(srv.port, "GET", "/v1/models", headers={"Authorization": "bearer " + key})[0]
    check(st == 200, "'Authorization: bearer KEY' got %d" % st)
    st, h, _ = request(srv.port, "GET", "/v1/models")
    check(st == 401 and h.get("www-authenticate", "").lower().startswith("bearer"),
          "no key: %d with WWW-Authenticate %r" % (st, h.get("www-authenticate")))
    s = connect(srv.port, 3)
    try:
        s.sendall(completion_head(5000000, b"Expect: 100-continue\r\n"))
        first = b""
        s.settimeout(2)
        try:
            first = s.recv(65536)
        except socket.timeout:
            raise Fail("an unauthenticated Expect: 100-continue POST got no answer in 2 s")
        check(not first.startswith(b"HTTP/1.1 100"), "an unauthenticated POST got 100 Continue")
        check(parse_head(first + b"\r\n\r\n")[0] == 401, "the unauthenticated head got %r" % first[:60])
    finally:
        s.close()
    s = connect(srv.port, 3)
    try:
        s.sendall(completion_head(5000000, b"Authorization: Bearer " + key.encode() + b"\r\n"))
        try:
            _, st, _, b = read_response(s, 2)
        except Fail as e:
            raise Fail("Content-Length 5000000 over max_body_bytes, head only: %s" % e)
        check(st == 413, "Content-Length over max_body_bytes got %d before the body" % st)
        error_envelope(b, "the 413")
    finally:
        s.close()


def case_query_too_long(ctx):
    """issue 24 finding 6: a 9 KB query of short arguments (which do not fit
    libmicrohttpd's connection memory once split) gets a 414 JSON at once,
    not a close without a status; a plain 9 KB query too."""
    srv = Server(ctx, ctx.models.get("tiny"))
    for what, target in (("2300 arguments", b"/health?" + b"a=1&" * 2300),
                         ("one 9 KB argument", b"/v1/models?q=" + b"a" * 9000)):
        try:
            _, st, h, b = raw_exchange(srv.port, b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 3)
        except ConnectionResetError:
            raise Fail("%s: a reset, not a 414" % what)
        check(st == 414, "%s: status %d" % (what, st))
        error_envelope(b, "%s's 414" % what)
    st, _, _ = request(srv.port, "GET", "/health?" + "a=1&" * 100)
    check(st == 200, "a short query got %d" % st)


def case_header_control_byte(ctx):
    """issue 24 finding 6: a control byte (other than HTAB) in a header
    value is a 400 JSON naming the header; HTAB and trailing OWS are fine.
    (A NUL is cut off by libmicrohttpd before gpt2d sees the value: what
    follows it is never read; docs/operations.md.)"""
    srv = Server(ctx, ctx.models.get("tiny"))
    for byte in (b"\x01", b"\x1b", b"\x7f", b"\x0b"):
        _, st, _, b = raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Note: a" + byte
                                   + b"b\r\nConnection: close\r\n\r\n", 3)
        check(st == 400, "a header with byte %r got %d" % (byte, st))
        e = error_envelope(b, "the control byte's 400")
        check("X-Note" in e["message"], "the 400 does not name the header: %r" % e)
    _, st, _, _ = raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Note: a\tb \t\r\n"
                               b"Connection: close\r\n\r\n", 3)
    check(st == 200, "a header with HTAB and trailing OWS got %d" % st)


def case_auth_trailing_ows(ctx):
    """issue 24 finding 6: `Authorization: Bearer KEY ` (trailing spaces or
    tabs: OWS, not part of the value, RFC 9110 5.5) is the key; a key with a
    byte more, or a control byte after it, is not."""
    key = "good-key-12345"
    srv = Server(ctx, ctx.models.get("tiny"), "--api-key", key)
    for tail in (b" ", b"  ", b"\t", b" \t "):
        _, st, _, _ = raw_exchange(srv.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"Authorization: Bearer " + key.encode() + tail + b"\r\nConnection: close\r\n\r\n", 3)
        check(st == 200, "Bearer KEY%r got %d" % (tail, st))
    for tail in (b"x", b" x", b"\x01"):
        _, st, _, _ = raw_exchange(srv.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"Authorization: Bearer " + key.encode() + tail + b"\r\nConnection: close\r\n\r\n", 3)
        check(st in (400, 401), "Bearer KEY%r got %d" % (tail, st))


def case_logit_bias_keys(ctx):
    """issue 24 finding 6: logit_bias keys are token ids in canonical
    decimal: " 5", "+5", "05", "5 " are a 400 naming logit_bias, "5" and
    "0" are taken."""
    srv = Server(ctx, ctx.models.get("tiny"))
    for k in (" 5", "+5", "05", "5 ", "-0", "0x5"):
        st, _, body = request(srv.port, "POST", "/v1/completions",
                              {"model": "gpt2", "prompt": "Hi", "max_tokens": 1, "logit_bias": {k: 1}})
        check(st == 400, "logit_bias key %r got %d" % (k, st))
        e = error_envelope(body, "logit_bias %r" % k)
        check(e["param"] == "logit_bias", "logit_bias key %r: param %r" % (k, e["param"]))
    for k in ("5", "0"):
        st, _, body = request(srv.port, "POST", "/v1/completions",
                              {"model": "gpt2", "prompt": "Hi", "max_tokens": 1, "logit_bias": {k: 1}})
        check(st == 200, "logit_bias key %r got %d: %r" % (k, st, body[:200]))


def case_expect_no_body(ctx):
    """issue 24 finding 6: `Expect: 100-continue` on a POST without a body
    (Content-Length: 0, or none) gets its final answer at once (a 100
    before it is allowed), never seconds of nothing. (A guard: on this
    base it already answers at once.)"""
    srv = Server(ctx, ctx.models.get("tiny"))
    for extra in (b"Content-Length: 0\r\n", b""):
        t0 = time.monotonic()
        _, st, _, b = raw_exchange(srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"Expect: 100-continue\r\nContent-Type: application/json\r\n" + extra + b"\r\n", 3)
        check(st == 400 and time.monotonic() - t0 < 1, "Expect without a body: %d after %.1f s" % (st, time.monotonic() - t0))
        error_envelope(b, "the empty body's 400")


def case_log_injection(ctx):
    """8: URLs with %0a, a forged priority and ESC bytes do not forge or colour log lines."""
    srv = Server(ctx, ctx.models.get("tiny"))
    for path in (b"/%0a<3>gpt2d%20serve:%20FORGED", b"/%1b[31mRED%1b[0m%07%0d", b"/%c3%28%ff"):
        try:
            raw_exchange(srv.port, b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 3)
        except (Fail, OSError):
            pass  # the answer does not matter here, the log does
    request(srv.port, "GET", "/health")
    time.sleep(0.2)
    for line in srv.log_bytes().split(b"\n")[:-1]:
        check(not line.startswith(b"<"), "a forged log line: %r" % line)
        check(re.match(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", line), "a log line without its time stamp: %r" % line)
        check(not re.search(rb"[\x00-\x1f\x7f]", line), "a control byte in a log line: %r" % line)


def case_smuggling(ctx):
    """11: two Content-Length values -> 400 at once; unsupported Transfer-Encoding -> 501 or 400 at once."""
    srv = Server(ctx, ctx.models.get("tiny"))
    body = b'{"prompt":"a"}'
    head = (b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 14\r\nContent-Length: 4\r\n\r\n")
    try:
        _, st, _, b = raw_exchange(srv.port, head + body, 2)
    except Fail as e:
        raise Fail("two Content-Length headers: %s" % e)
    check(st == 400, "two different Content-Length headers got %d" % st)
    for te in (b"gzip, chunked", b"identity", b"chunked, chunked"):
        head = (b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: " + te + b"\r\n\r\n")
        try:
            _, st, _, _ = raw_exchange(srv.port, head, 2)
        except Fail as e:
            raise Fail("Transfer-Encoding %s: %s" % (te.decode(), e))
        check(st in (400, 501), "Transfer-Encoding %s got %d" % (te.decode(), st))


def case_chunked_over_limit(ctx):
    """10: a chunked body (no declared length) that passes max_body_bytes is
    refused with 413 JSON at once, not after the client ends it (it may
    never); the 413 carries the request's X-Request-Id and its access line."""
    srv = Server(ctx, ctx.models.get("tiny"), "--max-body-bytes", "10000")
    s = connect(srv.port, 5)
    try:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\nX-Request-Id: hostile-big-chunked\r\n\r\n")
        for _ in range(4):  # 16 KiB, and no terminating chunk
            s.sendall(b"1000\r\n" + b"x" * 4096 + b"\r\n")
        t0 = time.monotonic()
        try:
            got = read_until_close(s, 2.0)
        except Fail as e:
            raise Fail("a chunked body past max_body_bytes (10000), not ended: %s" % e)
        check(got, "a chunked body past max_body_bytes was closed without an answer after %.1f s"
              % (time.monotonic() - t0))
        status, headers, rest = parse_head(got)
        check(status == 413, "a chunked body past max_body_bytes got %d" % status)
        error_envelope(rest, "the 413 for a chunked body")
        check(headers.get("x-request-id") == "hostile-big-chunked",
              "the 413 carries X-Request-Id %r" % headers.get("x-request-id"))
    finally:
        s.close()
    time.sleep(0.3)
    check("status=413" in access_line(srv, "hostile-big-chunked"), "the 413's access line: %s"
          % access_line(srv, "hostile-big-chunked"))
    # A chunked body within the limit is still read whole and served.
    body = json.dumps({"prompt": "hello " * 1000}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 3000]), body[i:i + 3000]) for i in range(0, len(body), 3000))
    _, st, _, b = raw_exchange(srv.port, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                               b"Connection: close\r\n\r\n" + chunks + b"0\r\n\r\n")
    # "hello" + 999 x " hello" + " ": 1001 tokens.
    check(st == 200 and json.loads(b)["count"] == 1001, "a chunked body of 6 KB: %d %r" % (st, b[:100]))


def case_paths(ctx):
    """12: routing on the undecoded path; a model name with NUL is 400."""
    srv = Server(ctx, ctx.models.get("tiny"))
    body = json.dumps({"model": "gpt2", "prompt": "Hi", "max_tokens": 2}).encode()
    for path in (b"/v1%2fcompletions", b"/v1/%63ompletions"):
        _, st, _, b = raw_exchange(srv.port, completion_head(len(body), b"Connection: close\r\n", path) + body)
        check(st == 404, "POST %s got %d" % (path.decode(), st))
        error_envelope(b, "POST %s" % path.decode())
    _, st, _, b = raw_exchange(srv.port, b"GET /health%00junk HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    check(st == 404, "GET /health%%00junk got %d" % st)
    error_envelope(b, "GET /health%00junk")
    st, _, b = request(srv.port, "POST", "/v1/completions", '{"model":"gpt2\\u0000evil","prompt":"Hi","max_tokens":2}')
    check(st == 400, "model \"gpt2\\u0000evil\" got %d" % st)
    error_envelope(b, "the NUL model")


def case_origin(ctx):
    """13: an Origin not in cors_origins is 403; allowed ones get CORS headers and preflight."""
    ok_body = {"model": "gpt2", "prompt": "Hi", "max_tokens": 2}
    srv = Server(ctx, ctx.models.get("tiny"), name="origin-default")
    check(request(srv.port, "POST", "/v1/completions", ok_body)[0] == 200, "a POST without Origin failed")
    st, _, b = request(srv.port, "POST", "/v1/completions", ok_body, headers={"Origin": "http://evil.example"})
    check(st == 403, "Origin http://evil.example with the default config got %d" % st)
    error_envelope(b, "the 403 for an Origin")
    st, _, b = request(srv.port, "POST", "/v1/completions", json.dumps(ok_body),
                       headers={"Origin": "http://evil.example", "Content-Type": "text/plain"})
    check(st == 403, "a text/plain blind POST with an Origin got %d" % st)
    srv.stop()
    srv = Server(ctx, ctx.models.get("tiny"), "--cors-origins", "http://ok.example", name="origin-list")
    st, h, _ = request(srv.port, "POST", "/v1/completions", ok_body, headers={"Origin": "http://ok.example"})
    check(st == 200 and h.get("access-control-allow-origin") == "http://ok.example",
          "the allowed Origin: %d, Access-Control-Allow-Origin %r" % (st, h.get("access-control-allow-origin")))
    check(request(srv.port, "POST", "/v1/completions", ok_body, headers={"Origin": "http://evil.example"})[0] == 403,
          "an Origin outside --cors-origins was not refused")
    st, h, _ = request(srv.port, "OPTIONS", "/v1/completions", headers={
        "Origin": "http://ok.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    check(st == 204, "the preflight got %d" % st)
    check("POST" in h.get("access-control-allow-methods", "") and "access-control-allow-headers" in h,
          "the preflight's headers: %r" % h)
    srv.stop()
    srv = Server(ctx, ctx.models.get("tiny"), "--cors-origins", "*", name="origin-any")
    st, h, _ = request(srv.port, "POST", "/v1/completions", ok_body, headers={"Origin": "http://evil.example"})
    check(st == 200 and "access-control-allow-origin" in h, "--cors-origins '*': %d, headers %r" % (st, h))


def case_never_admissible(ctx):
    """14: 17 prompts x n=16 on an idle server is never a retryable 429; a
    request whose prompts x best_of can never fit the KV pool is 400."""
    srv = Server(ctx, ctx.models.get("deep"), "--kv-cache-mb", "1")
    st, h, b = request(srv.port, "POST", "/v1/completions",
                       {"model": "gpt2", "prompt": ["p%d" % i for i in range(17)], "n": 16, "max_tokens": 1},
                       timeout=20)
    check(st != 429, "17 prompts x n=16 on an idle server got 429 (Retry-After %r): %r"
          % (h.get("retry-after"), b[:200]))
    if st == 400:
        msg = error_envelope(b, "17 x 16")["message"]
        check(re.search(r"\d", msg) and ("limit" in msg.lower() or "at most" in msg.lower()),
              "the 400 for 17 x 16 does not name the limit: %r" % msg)
    else:
        check(st == 200 and len(json.loads(b)["choices"]) == 17 * 16, "17 x 16 got %d: %r" % (st, b[:200]))
    # 1 MiB of KV is 8 blocks of 16 positions here (16 layers x 8 KiB a
    # position); 210 positions never fit (today's server: 400 already).
    # Candidates that fit one by one are served in turn (200).
    t0 = time.monotonic()
    try:
        st, h, b = request(srv.port, "POST", "/v1/completions",
                           {"model": "gpt2", "prompt": "a " * 10, "max_tokens": 200, "ignore_eos": True}, timeout=5)
    except (OSError, http.client.HTTPException) as e:
        raise Fail("210 positions with a 128-position KV pool: no answer in %.1f s (%s)"
                   % (time.monotonic() - t0, e))
    check(st == 400, "210 positions with a 128-position KV pool got %d: %r" % (st, b[:200]))
    error_envelope(b, "the 400 for a request that never fits")
    st, _, b = request(srv.port, "POST", "/v1/completions",
                       {"model": "gpt2", "prompt": "a " * 10, "best_of": 4, "max_tokens": 50, "ignore_eos": True},
                       timeout=20)
    check(st == 200, "best_of 4 x 60 positions (each fits the 128-position pool) got %d: %r" % (st, b[:200]))


def case_cache_cross_key(ctx):
    """24.2: the prefix cache does not leak prompts across API keys. Key A
    sends a document with a recovery PIN; key B sends the same document with
    guesses: every guess, the right one too, gets cached_tokens 0 and no hit
    in /metrics, while A's own repeat hits, with the same text as a cold run.
    cache_salt separates users of one key on both routes (and a bad one is a
    400 naming it); prefix_cache_shared_across_keys shares on purpose."""
    ka, kb = "tenant-a-key-1111", "tenant-b-key-2222"
    filler = ("The quarterly report lists the branch offices, their staff and the"
              " numbers of the accounts they opened in the spring. ")
    # The PIN in the first KV block: a wrong guess shares no block with A's
    # prompt (nor with B's other guesses); only the right one could.
    doc = lambda pin: "Recovery PIN %s for account 88213. " % pin + filler * 5

    def ask(port, key, body, path="/v1/completions"):
        body = dict({"model": "gpt2", "max_tokens": 4, "temperature": 0}, **body)
        st, _, b = request(port, "POST", path, body, headers={"Authorization": "Bearer " + key})
        check(st == 200, "%s with key %s got %d: %r" % (path, key[:8], st, b[:200]))
        d = json.loads(b)
        c = d["choices"][0]
        text = c["message"]["content"] if "message" in c else c["text"]
        return d["usage"]["prompt_tokens_details"]["cached_tokens"], text, d["usage"]["prompt_tokens"]

    srv = Server(ctx, ctx.models.get("long"), "--api-key", ka, "--api-key", kb)
    hits = lambda: srv.metric("gpt2d_prefix_cache_hit_tokens_total")
    cached, cold, ntok = ask(srv.port, ka, {"prompt": doc("4471")})
    check(cached == 0 and ntok >= 64, "key A's first request: cached_tokens %d, %d prompt tokens" % (cached, ntok))
    # B's probe: a wrong guess, the right one, another wrong one.
    before = hits()
    for pin in ("4470", "4471", "4472"):
        cached, text, _ = ask(srv.port, kb, {"prompt": doc(pin)})
        check(cached == 0, "key B's guess %s got cached_tokens %d from key A's prompt" % (pin, cached))
        if pin == "4471":
            check(text == cold, "key B's copy of A's prompt answered %r, a cold run %r" % (text, cold))
    check(hits() == before, "key B's guesses took %g tokens from the prefix cache" % (hits() - before))
    # A's own repeat is warm and the same bits.
    cached, text, _ = ask(srv.port, ka, {"prompt": doc("4471")})
    check(cached >= 64, "key A's repeat got cached_tokens %d, want its own hit (>= 64)" % cached)
    check(text == cold, "key A's warm repeat answered %r, the cold run %r" % (text, cold))
    check(hits() - before == cached, "/metrics counted %g hit tokens for A's %d" % (hits() - before, cached))
    # cache_salt: users behind one key, on both routes; B's user of the same
    # name is another tenant still.
    for path, body in (("/v1/completions", {"prompt": doc("4471")}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": doc("4471")}]})):
        first = {}
        for key, salt in ((ka, "alice"), (ka, "bob"), (kb, "alice")):
            cached, first[(key, salt)], _ = ask(srv.port, key, dict(body, cache_salt=salt), path)
            check(cached == 0, "%s: cache_salt %r (key %s) got cached_tokens %d from another user"
                  % (path, salt, key[:8], cached))
        cached, text, _ = ask(srv.port, ka, dict(body, cache_salt="alice"), path)
        check(cached >= 64, "%s: alice's repeat under her cache_salt got cached_tokens %d" % (path, cached))
        check(text == first[(ka, "alice")], "%s: alice's warm repeat answered differently" % path)
        for bad in (5, "", "x" * 257, ["alice"]):
            st, _, b = request(srv.port, "POST", path, dict({"model": "gpt2", "max_tokens": 1}, cache_salt=bad, **body),
                               headers={"Authorization": "Bearer " + ka})
            check(st == 400 and error_envelope(b, "cache_salt %r" % (bad,))["param"] == "cache_salt",
                  "%s: cache_salt %r got %d: %r" % (path, bad, st, b[:200]))
    srv.stop()
    # One tenant on purpose: B takes A's blocks.
    srv = Server(ctx, ctx.models.get("long"), "--api-key", ka, "--api-key", kb,
                 "--prefix-cache-shared-across-keys", "true", name="shared")
    ask(srv.port, ka, {"prompt": doc("4471")})
    cached, text, _ = ask(srv.port, kb, {"prompt": doc("4471")})
    check(cached >= 64, "prefix_cache_shared_across_keys: key B got cached_tokens %d, want A's blocks" % cached)
    check(text == cold, "the shared cache answered %r, a cold run %r" % (text, cold))


def case_unseeded_replicas(ctx):
    """35: a request without a seed gets one that no other server or run
    shares (a keyed hash of a counter under a key from getrandom). Two
    replicas started together and asked the same unseeded request at the
    same moment (one second, one place in their request order: what put
    time(NULL) ^ (request number * 7919) equal on both before) answer
    different samples on every route, round after round; a replica
    restarted and asked its first life's requests again answers new
    samples, and differs from the other replica still; a seed gives the
    same text everywhere, and system_fingerprint stays the same."""
    model = ctx.models.get("tiny")
    routes = {
        "completions": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 32},
                        lambda d: d["choices"][0]["text"]),
        "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}],
                                          "max_tokens": 32}, lambda d: d["choices"][0]["message"]["content"]),
        "responses": ("/v1/responses", {"input": "Tell me a story", "max_output_tokens": 32},
                      lambda d: d["output_text"]),
    }

    def ask(srv, route, seed):
        path, body, text = routes[route]
        body = dict(body, model="gpt2", temperature=1, ignore_eos=True)
        if seed is not None:
            body["seed"] = seed
        st, _, b = request(srv.port, "POST", path, body)
        check(st == 200, "%s on %s answered %d: %r" % (route, srv.log_path, st, b[:200]))
        d = json.loads(b)
        return text(d), d.get("system_fingerprint")

    def together(srvs, route, seed=None):
        """The same request to each server at once, just after a second
        begins; their answers in srvs' order."""
        time.sleep(1.02 - time.time() % 1)
        out = [None] * len(srvs)

        def one(i):
            try:
                out[i] = ask(srvs[i], route, seed)
            except Exception as e:  # the main thread reports it
                out[i] = e
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(srvs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for o in out:
            if isinstance(o, Exception):
                raise o
        return out

    # Every request, in order, with what each server answered: a restarted
    # replica is asked the same ones to reach the same place in the order.
    plan = [("completions", None)] * 4 + [("chat", None), ("responses", None), ("completions", 1234),
                                          ("chat", 77)]
    a = Server(ctx, model, name="a")
    b = Server(ctx, model, name="b")
    first = []
    for k, (route, seed) in enumerate(plan):
        (ta, fa), (tb, fb) = together([a, b], route, seed)
        check(len(ta) > 0, "%s request %d answered no text" % (route, k))
        if seed is None:
            check(ta != tb, "two replicas gave the same unseeded %s sample %r (request %d, same second)"
                  % (route, ta, k))
        else:
            check(ta == tb, "seed %d: the replicas answered %r and %r" % (seed, ta, tb))
        check(fa == fb, "%s: system_fingerprint %r and %r on one model and build" % (route, fa, fb))
        first.append(tb)
    check(len(set(first[:4])) == 4, "one replica repeated an unseeded sample: %r" % first[:4])
    # Restart b: its first life's requests again, then more beside a.
    b.stop()
    b = Server(ctx, model, name="b-restarted")
    for k, (route, seed) in enumerate(plan):
        t, _ = ask(b, route, seed)
        if seed is None:
            check(t != first[k], "the restarted replica repeated its first life's unseeded %s sample %r "
                  "(request %d)" % (route, t, k))
        else:
            check(t == first[k], "seed %d: %r after the restart, %r before" % (seed, t, first[k]))
    for route in ("completions", "completions", "chat", "responses"):
        (ta, _), (tb, _) = together([a, b], route)
        check(ta != tb, "the restarted replica and the other gave the same unseeded %s sample %r" % (route, ta))
    (ta, _), (tb, _) = together([a, b], "completions", 1234)
    check(ta == tb == first[6], "seed 1234 after the restart: %r and %r, before %r" % (ta, tb, first[6]))


def case_head_allow(ctx):
    """15: HEAD where GET is allowed (200, no body); 405 carries Allow."""
    srv = Server(ctx, ctx.models.get("tiny"))
    for path in (b"/health", b"/ready", b"/metrics", b"/v1/models"):
        s = connect(srv.port)
        try:
            s.sendall(b"HEAD " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            got = read_until_close(s, 3)
        finally:
            s.close()
        status, _, rest = parse_head(got) if b"\r\n\r\n" in got else (0, {}, got)
        check(status == 200, "HEAD %s got %d" % (path.decode(), status))
        check(rest == b"", "HEAD %s sent a body: %r" % (path.decode(), rest[:80]))
    st, h, _ = request(srv.port, "GET", "/v1/completions")
    check(st == 405 and "POST" in h.get("allow", ""), "GET /v1/completions: %d, Allow %r" % (st, h.get("allow")))
    st, h, _ = request(srv.port, "POST", "/v1/models", {})
    check(st == 405 and "GET" in h.get("allow", ""), "POST /v1/models: %d, Allow %r" % (st, h.get("allow")))


def case_protocol_errors(ctx):
    """15: protocol errors come back once, in the JSON error envelope where
    libmicrohttpd lets the server choose the body.

    libmicrohttpd 0.9.x (Debian 12 has 0.9.75) answers a request line with
    HTTP/2 or later and a malformed Content-Length by itself, while parsing
    the head and before any callback of the server, with a fixed HTML body
    no option changes: for those two only the status (and a single answer)
    is checked. A too long target (414) or head (431) reaches the server
    (its connection memory pool is larger than its head limits), so those
    must be JSON."""
    srv = Server(ctx, ctx.models.get("tiny"))
    # (status, the server's own JSON, how many answers): libmicrohttpd 0.9.75
    # writes its 400 for a malformed Content-Length, and its 413 for one
    # over 64 bits, twice, before the server sees the request
    # (connection.c: MHD_connection_handle_idle overwrites the state that
    # parse_connection_headers set when it queued the error, and
    # build_header_response runs again; no public hook runs in between:
    # docs/operations.md has the walk through the source; fixed in 1.0.0).
    # So for those the case checks the status, the count and the close, and
    # fails when a libmicrohttpd that answers once arrives, so that this
    # exception is removed then.
    cases = [
        (400, False, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 12abc\r\n\r\n{}"),
        (413, False, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999999999999999\r\n\r\n{}"),
        (414, True, b"GET /" + b"a" * 40000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
        (431, True, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"v" * 200)
                                                                    for i in range(250)) + b"\r\n"),
        (505, False, b"GET /health HTTP/2.0\r\nHost: 127.0.0.1\r\n\r\n"),
        (505, False, b"GET /health HTTP/3.0\r\nHost: 127.0.0.1\r\n\r\n"),
    ]
    for want, ours, data in cases:
        what = data[:40].decode("latin-1").split("\r\n")[0][:40]
        s = connect(srv.port)
        try:
            try:
                s.sendall(data)
            except OSError:
                pass  # the server may answer and close before all of a long head is sent
            got = read_until_close(s, 3)
        finally:
            s.close()
        answers = 2 if b"12abc" in data or b"9999999999" in data else 1
        check(got.count(b"HTTP/1.") == answers,
              "%s: %d status lines (libmicrohttpd's known count: %d): %r"
              % (what, got.count(b"HTTP/1."), answers, got[:300]))
        status, headers, rest = parse_head(got)
        check(status == want, "%s: status %d, want %d" % (what, status, want))
        if ours:
            body = dechunk(rest) if "chunked" in headers.get("transfer-encoding", "") else rest
            error_envelope(body, "%s (%d)" % (what, want))
    # The 400 and 413 libmicrohttpd wrote have access lines (without a
    # request id: their answers have none); the 505 comes before the
    # request line's callback and has none.
    time.sleep(0.2)
    for st in (400, 413):
        check(any(" access - - status=%d " % st in l and "request_id=-" in l for l in srv.log().splitlines()),
              "no access line for libmicrohttpd's %d: %s" % (st, srv.tail(4)))
    # RFC 9112 2.3: a higher minor version of HTTP/1 is served as HTTP/1.1, not refused.
    _, st, _, _ = raw_exchange(srv.port, b"GET /health HTTP/1.2\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 3)
    check(st == 200, "GET /health HTTP/1.2 got %d, not an HTTP/1.1 answer" % st)


def case_request_id(ctx):
    """15: X-Request-Id on every response, the client's echoed, and in the access log."""
    srv = Server(ctx, ctx.models.get("tiny"))
    st, h, _ = request(srv.port, "GET", "/health", headers={"X-Request-Id": "hostile-abc-123"})
    check(h.get("x-request-id") == "hostile-abc-123", "the client's X-Request-Id came back as %r" % h.get("x-request-id"))
    for method, path, body in (("GET", "/health", None), ("GET", "/nothing", None),
                               ("POST", "/v1/completions", {"model": "gpt2", "prompt": "x", "max_tokens": 1}),
                               ("POST", "/v1/completions", "{bad")):
        st, h, _ = request(srv.port, method, path, body)
        check(h.get("x-request-id"), "%s %s (%d) has no X-Request-Id" % (method, path, st))
    st, h, _ = request(srv.port, "GET", "/health", headers={"X-Request-Id": "has space"})
    check(h.get("x-request-id") not in (None, "has space"),
          "for the X-Request-Id 'has space' the response carries %r, not a generated one" % h.get("x-request-id"))
    time.sleep(0.2)
    check(any(" access " in l and "hostile-abc-123" in l for l in srv.log().splitlines()),
          "no access log line carries the client's X-Request-Id")
    srv.stop()
    # The answers conn.c writes itself before closing a connection: the 503
    # past max_connections (every connection busy) and a new connection's
    # head 408 carry one too, and each has its access line.
    srv = Server(ctx, ctx.models.get("tiny"), "--max-connections", "2", "--request-header-timeout", "1",
                 "--body-timeout", "20", name="conn-answers")
    busy = []
    try:
        for i in range(2):  # requests in progress (a body coming): not idle, not closed to make room
            b = connect(srv.port, 5)
            b.sendall(completion_head(100, b"X-Request-Id: hostile-busy-%d\r\n" % i) + b'{"model":')
            busy.append(b)
        time.sleep(0.3)
        third = connect(srv.port, 5)
        busy.append(third)
        got = read_until_close(third, 3)
        check(got, "the connection past max_connections (all busy) got no answer")
        status, headers, rest = parse_head(got)
        check(status == 503, "the connection past max_connections got %d" % status)
        error_envelope(rest, "the 503 past max_connections")
        rid503 = headers.get("x-request-id")
        check(rid503, "the 503 past max_connections has no X-Request-Id: %r" % headers)
        for b in busy[:2]:
            b.close()
        time.sleep(0.3)
        s = connect(srv.port, 5)
        busy.append(s)
        s.sendall(b"GET /hea")
        got = read_until_close(s, 3)
        check(got, "a head left incomplete past request_header_timeout got no answer")
        status, headers, rest = parse_head(got)
        check(status == 408, "the incomplete head got %d" % status)
        rid408 = headers.get("x-request-id")
        check(rid408 and rid408 != rid503, "the head's 408 carries X-Request-Id %r (the 503's: %r)"
              % (rid408, rid503))
    finally:
        for b in busy:
            b.close()
    time.sleep(0.3)
    for st, rid in ((503, rid503), (408, rid408)):
        check(any(" access " in l and "status=%d" % st in l and rid in l for l in srv.log().splitlines()),
              "no access line with status=%d and request_id=%s: %s" % (st, rid, srv.tail(4)))


# ---------------------------------------------------------------- issue 34

def case_host_header_strict(ctx):
    """34.2: RFC 9112 3.2: an HTTP/1.1 request without Host, or one with
    several Host headers (libmicrohttpd hands over the first, and a proxy
    in front may have routed by another), is a 400 JSON error with its
    X-Request-Id, an access line and reason="host"; HTTP/1.0 needs no Host
    and is still served."""
    srv = Server(ctx, ctx.models.get("tiny"))
    refused = [
        ("HTTP/1.1 without Host", "host-none",
         b"GET /health HTTP/1.1\r\nX-Request-Id: host-none\r\nConnection: close\r\n\r\n"),
        ("two Host headers", "host-pair",
         b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\nX-Request-Id: host-pair\r\n"
         b"Connection: close\r\n\r\n"),
        ("the same Host twice", "host-same",
         b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: host-same\r\nHost: 127.0.0.1\r\n"
         b"Connection: close\r\n\r\n"),
        ("two Host headers on HTTP/1.0", "host-ten",
         b"GET /health HTTP/1.0\r\nHost: localhost\r\nHost: 127.0.0.1\r\nX-Request-Id: host-ten\r\n\r\n"),
        ("a POST without Host", "host-post",
         b"POST /tokenize HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 15\r\n"
         b"X-Request-Id: host-post\r\nConnection: close\r\n\r\n{\"prompt\": \"x\"}"),
    ]
    for what, rid, data in refused:
        _, st, h, body = raw_exchange(srv.port, data)
        check(st == 400, "%s: status %d, want 400" % (what, st))
        e = error_envelope(body, what)
        check(e["type"] == "invalid_request_error" and "Host" in e["message"], "%s: error %r" % (what, e))
        check(h.get("x-request-id") == rid, "%s: X-Request-Id %r, want %s" % (what, h.get("x-request-id"), rid))
    _, st, _, _ = raw_exchange(srv.port, b"GET /health HTTP/1.0\r\nX-Request-Id: host-old\r\n\r\n")
    check(st == 200, "HTTP/1.0 without Host got %d" % st)
    _, st, _, _ = raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    check(st == 200, "HTTP/1.1 with one Host got %d" % st)
    time.sleep(0.2)
    for what, rid, _ in refused:
        check(" status=400 " in access_line(srv, rid), "%s: its access line: %s" % (what, access_line(srv, rid)))
    check(" status=200 " in access_line(srv, "host-old"), "HTTP/1.0's access line: %s" % access_line(srv, "host-old"))
    got = srv.metric('gpt2d_connections_refused_total{reason="host"}')
    check(got == len(refused), "gpt2d_connections_refused_total{reason=\"host\"} is %g, want %d" % (got, len(refused)))


def case_request_id_every_route(ctx):
    """34.3: every response carries X-Request-Id (the client's echoed), the
    playground page (GET and HEAD /) included, on every route of the
    table and on the errors beside them."""
    srv = Server(ctx, ctx.models.get("tiny"))
    done = {"model": "gpt2", "prompt": "Hi", "max_tokens": 2}
    asks = [
        ("GET", "/", None, 200), ("HEAD", "/", None, 200), ("GET", "/health", None, 200),
        ("HEAD", "/health", None, 200), ("GET", "/ready", None, 200), ("GET", "/metrics", None, 200),
        ("GET", "/version", None, 200), ("GET", "/v1/models", None, 200), ("GET", "/v1/models/gpt2", None, 200),
        ("OPTIONS", "/v1/completions", None, 204), ("POST", "/tokenize", {"prompt": "Hi"}, 200),
        ("POST", "/detokenize", {"tokens": [17250]}, 200), ("POST", "/v1/completions", done, 200),
        ("POST", "/v1/completions", dict(done, stream=True), 200),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, 200),
        ("POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 2, "store": False}, 200),
        ("GET", "/v1/responses/resp_none", None, 404), ("DELETE", "/v1/responses/resp_none", None, 404),
        ("GET", "/nothing", None, 404), ("PUT", "/health", None, 405), ("POST", "/tokenize", "{bad", 400),
    ]
    for i, (method, path, body, want) in enumerate(asks):
        rid = "every-%d" % i
        st, h, _ = request(srv.port, method, path, body, headers={"X-Request-Id": rid})
        check(st == want, "%s %s: status %d, want %d" % (method, path, st, want))
        check(h.get("x-request-id") == rid, "%s %s (%d): X-Request-Id %r, want %s"
              % (method, path, st, h.get("x-request-id"), rid))
        st, h, _ = request(srv.port, method, path, body)
        check(re.match(r"req-[0-9a-f]+$", h.get("x-request-id") or ""),
              "%s %s (%d) without one of the client's: X-Request-Id %r" % (method, path, st, h.get("x-request-id")))


def case_garbage_request_line(ctx):
    """34.4: what a request line that is not one gets. `GARBAGE` (no space)
    is closed by libmicrohttpd 0.9.75 without a status before any callback
    of gpt2d runs (its request-line parser fails before the URI callback,
    and it shuts the socket's sending side itself: docs/operations.md), so
    the case pins that close, prompt and silent, and fails when a
    libmicrohttpd that answers arrives (then the docs change). A line that
    libmicrohttpd can split, with an unknown method, reaches gpt2d: a 405
    or 404 JSON error with X-Request-Id. The server serves on throughout."""
    srv = Server(ctx, ctx.models.get("tiny"))
    for data in (b"GARBAGE\r\n\r\n", b"GARBAGE\r\nHost: 127.0.0.1\r\n\r\n", b"GARBAGE/1.1\r\n\r\n"):
        s = connect(srv.port)
        try:
            s.sendall(data)
            t0 = time.monotonic()
            got = read_until_close(s, 3)
            took = time.monotonic() - t0
        finally:
            s.close()
        check(got == b"", "%r: libmicrohttpd 0.9.75 closes it without a status; this one sent %r "
              "(update docs/operations.md, \"Protocol errors libmicrohttpd answers itself\")" % (data, got[:120]))
        check(took < 1, "%r: closed after %.1f s" % (data, took))
    # After a request on a kept-alive connection: the answer, then the close.
    s = connect(srv.port)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGARBAGE\r\n\r\n")
        got = read_until_close(s, 3)
    finally:
        s.close()
    check(got.count(b"HTTP/1.1 ") == 1 and got.startswith(b"HTTP/1.1 200"),
          "GET /health then GARBAGE on one connection: %r" % got[:200])
    for path, want in ((b"/health", 405), (b"/nothing", 404)):
        _, st, h, body = raw_exchange(srv.port, b"GARBAGE " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                      b"X-Request-Id: garbage-method\r\nConnection: close\r\n\r\n")
        check(st == want, "GARBAGE %s: status %d, want %d" % (path.decode(), st, want))
        error_envelope(body, "GARBAGE %s" % path.decode())
        check(h.get("x-request-id") == "garbage-method", "GARBAGE %s: X-Request-Id %r" % (path.decode(), h.get("x-request-id")))
    st, _, _ = request(srv.port, "GET", "/health")
    check(st == 200 and srv.proc.poll() is None, "/health after the garbage: %d" % st)


# Each as valid UTF-8 in a request target: line and paragraph separators,
# NEL (C1) and the bidirectional controls.
UNICODE_CONTROLS = {"2028": "\u2028", "2029": "\u2029", "0085": "\u0085", "009b": "\u009b", "202e": "\u202e",
                    "202a": "\u202a", "2066": "\u2066", "2069": "\u2069", "200e": "\u200e", "200f": "\u200f",
                    "061c": "\u061c"}


def case_log_unicode_controls(ctx):
    """34.5: U+2028, U+2029, U+0085 (and C1), U+202E and the other
    bidirectional controls in a request target are written escaped into
    the access line (\\xNN per byte), never raw; other UTF-8 stays text."""
    srv = Server(ctx, ctx.models.get("tiny"))
    for name, ch in UNICODE_CONTROLS.items():
        path = b"/u/a" + ch.encode() + b"b"
        _, st, _, _ = raw_exchange(srv.port, b"GET " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   b"X-Request-Id: uni-" + name.encode() + b"\r\nConnection: close\r\n\r\n")
        check(st == 404, "GET %r: %d" % (path, st))
    raw_exchange(srv.port, "GET /u/caf\u00e9-\u20ac HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: uni-text\r\n"
                 "Connection: close\r\n\r\n".encode())
    time.sleep(0.2)
    log = srv.log_bytes()
    for name, ch in UNICODE_CONTROLS.items():
        raw = ch.encode()
        check(raw not in log, "U+%s is written raw into the log: %r" % (name.upper(), log[log.find(raw) - 40:][:100]))
        esc = "".join("\\x%02x" % b for b in raw)
        line = access_line(srv, "uni-" + name)
        check(" /u/a%sb " % esc in line, "U+%s: the access line %r lacks /u/a%sb" % (name.upper(), line, esc))
    check(" /u/caf\u00e9-\u20ac " in access_line(srv, "uni-text"), "UTF-8 text was escaped: %s" % access_line(srv, "uni-text"))


def case_sighup_at_start(ctx):
    """34.6: a SIGHUP while the server starts (the model loading, the
    warm-up) never kills it (its default action, status 129): from
    srv_main's start until the handlers are in it waits, and is then a
    reload. Sent at several moments after the `loading` line, each server
    comes up and serves; one that serves still reloads on SIGHUP."""
    model = ctx.models.get("long")
    for i, delay in enumerate((0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.3)):
        srv = Server(ctx, model, ready=None, name="hup-%d" % i)
        deadline = time.monotonic() + 10 * SLOW
        while "info loading " not in srv.log():
            check(srv.proc.poll() is None, "exited before loading: %s" % srv.tail(3))
            check(time.monotonic() < deadline, "no loading line in %d s: %s" % (10 * SLOW, srv.tail(3)))
            time.sleep(0.001)
        time.sleep(delay)
        srv.signal(signal.SIGHUP)
        try:
            srv.wait_listening(20)
        except gpt2d_server.StartError as e:
            raise Fail("SIGHUP %.3f s after the loading line: %s (%s)"
                       % (delay, e, describe_exit(srv.proc.poll())))
        st, _, _ = request(srv.port, "GET", "/health")
        check(st == 200, "SIGHUP %.3f s after loading: /health %d" % (delay, st))
        time.sleep(0.1)
        check(srv.proc.poll() is None, "SIGHUP %.3f s after loading: %s" % (delay, describe_exit(srv.proc.poll())))
        srv.stop()
    srv = Server(ctx, model, name="hup-serving")
    srv.signal(signal.SIGHUP)
    check(srv.wait_log(r"SIGHUP: configuration reloaded"), "no reload once serving: %s" % srv.tail(3))
    check(request(srv.port, "GET", "/health")[0] == 200, "no /health after a SIGHUP while serving")


def nofile(soft, hard):
    """A preexec: the child's RLIMIT_NOFILE (`ulimit -n`)."""
    import resource
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def case_fd_limit(ctx):
    """34.7: under `ulimit -n 256` with the default max_connections 1024,
    start-up says so and lowers max_connections to what fits (256 - 64
    past it - 64 of its own = 128), and with 300 idle connections open
    /health still answers at once (past max_connections the idle ones are
    closed to make room, conn.c). A soft limit under a high enough hard
    limit is raised instead."""
    import resource
    srv = Server(ctx, ctx.models.get("tiny"), preexec=nofile(256, 256))
    line = [l for l in srv.log().splitlines() if "descriptor limit" in l]
    check(line and " warn " in line[0] and "is 256 " in line[0] and "max_connections 1024" in line[0]
          and "lowered to 128" in line[0], "no warning naming 256, 1024 and 128: %s" % (line or srv.tail(4)))
    socks = []
    try:
        for _ in range(300):
            socks.append(connect(srv.port, 5))
        time.sleep(0.5)
        t0 = time.monotonic()
        try:
            st, _, _ = request(srv.port, "GET", "/health", timeout=5)
        except OSError as e:
            raise Fail("/health beside 300 idle connections: %s after %.1f s" % (e, time.monotonic() - t0))
        took = time.monotonic() - t0
        check(st == 200 and took < 1.0 * SLOW, "/health beside 300 idle connections: %d in %.2f s" % (st, took))
    finally:
        for s in socks:
            s.close()
    check(srv.proc.poll() is None, "the server exited: %s" % srv.tail(3))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024 + 128:
        return  # this test's own hard limit leaves nothing to raise to
    srv2 = Server(ctx, ctx.models.get("tiny"), preexec=nofile(256, hard), name="raised")
    check(re.search(r" info raised the descriptor limit \(RLIMIT_NOFILE\) from 256 to \d+", srv2.log()),
          "the soft limit was not raised: %s" % srv2.tail(4))
    check("lowered" not in srv2.log(), "max_connections lowered though the limit could be raised: %s" % srv2.tail(4))


# Finding 5 of issue 24: a model update never aborts. 16 streams run while
# the file is replaced, rewritten or touched; the exit status is exactly 3
# (never a signal: no SIGABRT, no core dump), or the server goes on.
MODEL_STREAM = dict(LONG_STREAM, max_tokens=120, stream_options={"include_usage": True})


def model_streams(srv, n=16):
    streams = [Stream(srv.port, dict(MODEL_STREAM, prompt="Model %d" % i)) for i in range(n)]
    srv.wait_metric("gpt2d_running_sequences", n, 10, "%d streams running" % n)
    return streams


def streams_whole(streams, why):
    for i, st in enumerate(streams):
        st.wait(15, "%s: stream %d" % (why, i))
        ev = st.events()
        check(ev[-1] == "[DONE]", "%s: stream %d ends %r" % (why, i, ev[-1:]))
        usage = json.loads(ev[-2]).get("usage") or {}
        check(usage.get("completion_tokens") == MODEL_STREAM["max_tokens"],
              "%s: stream %d was not finished whole: %r" % (why, i, ev[-2][:200]))


def write_in_place(path, data):
    """Writes data over path's bytes: the same inode, never truncated."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def exits_3(srv, why, timeout=20):
    rc = srv.wait(timeout)
    check(rc == 3, "%s: %s, want exit status 3 (last lines: %s)" % (why, describe_exit(rc), srv.tail(3)))
    check("Assertion" not in srv.log(), "%s: an assertion failed: %s" % (why, srv.tail(3)))


def still_serving(srv, streams, path, why):
    streams_whole(streams, why)
    check(srv.proc.poll() is None, "%s: the server exited: %s" % (why, describe_exit(srv.proc.poll())))
    check(request(srv.port, "GET", "/ready")[0] == 200, "%s: /ready is not 200" % why)
    check(request(srv.port, "POST", "/v1/completions", {"model": "gpt2", "prompt": "Hi", "max_tokens": 5})[0]
          == 200, "%s: a completion failed" % why)
    check("draining" not in srv.log(), "%s: the server drained: %s" % (why, srv.tail(3)))
    check(names_file(srv, path), "%s: no log line names %s" % (why, path))


def case_model_rename_exit3(ctx):
    """5: another file renamed over the served one under 16 streams: the
    streams finish whole (the drain), then exit status exactly 3."""
    d, path = model_file(ctx, "renamed")
    srv = Server(ctx, d, "--shutdown-timeout", "20", env=STEP_DELAY)
    streams = model_streams(srv)
    tmp = path + ".new"
    shutil.copyfile(os.path.join(ctx.models.get("long2"), "model.safetensors"), tmp)
    os.rename(tmp, path)
    exits_3(srv, "after a rename over the served file")
    streams_whole(streams, "the drain after a rename")


def case_model_inplace_exit3(ctx):
    """5: other bytes written over the served file in place under 16
    streams: each stream gets its clean ending, then exit status exactly 3."""
    d, path = model_file(ctx, "inplace")
    srv = Server(ctx, d, env=STEP_DELAY)
    streams = model_streams(srv)
    with open(os.path.join(ctx.models.get("long2"), "model.safetensors"), "rb") as f:
        write_in_place(path, f.read())
    exits_3(srv, "after other bytes in place")
    for i, st in enumerate(streams):
        st.wait(5, "stream %d" % i)
        check(st.events()[-1] == "[DONE]", "stream %d has no [DONE]" % i)


def case_model_touch_ignored(ctx):
    """5: `touch` of the served file under 16 streams: no drain, no exit,
    the streams finish whole."""
    d, path = model_file(ctx, "touched")
    srv = Server(ctx, d, env=STEP_DELAY)
    time.sleep(1.5)  # the digest at load
    streams = model_streams(srv)
    os.utime(path)
    time.sleep(2.5)
    still_serving(srv, streams, path, "after a touch")


def case_model_same_bytes_ignored(ctx):
    """5: the same bytes written again, in place and then renamed over it,
    under 16 streams: no drain, no exit, the streams finish whole."""
    d, path = model_file(ctx, "samebytes")
    srv = Server(ctx, d, env=STEP_DELAY)
    time.sleep(1.5)  # the digest at load
    streams = model_streams(srv)
    with open(path, "rb") as f:
        data = f.read()
    time.sleep(0.01)
    write_in_place(path, data)
    time.sleep(2.5)
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, path)
    time.sleep(2.5)
    still_serving(srv, streams, path, "after the same bytes")


# Finding 3 of issue 24: abandoned work stops.
CANCEL_CLIENT = 'gpt2d_requests_cancelled_total{reason="client_closed"}'


def case_abandoned_nonstream_cancelled(ctx):
    """3: a whole-answer request of 16 sequences (4 running, 12 queued)
    whose client closes is cancelled within a second (running and queued
    go to 0), and counted; a pipelined request behind a whole answer, and a
    stream's disconnect, are told apart (the first is no close, the second
    counts too)."""
    srv = Server(ctx, ctx.models.get("long"), "--max-running", "4", env=STEP_DELAY)
    body = {"model": "gpt2", "prompt": ["Gone %d" % i for i in range(4)], "n": 4, "max_tokens": 800,
            "ignore_eos": True}
    payload = json.dumps(body).encode()
    s = connect(srv.port)
    s.sendall(completion_head(len(payload)) + payload)
    srv.wait_metric("gpt2d_running_sequences", 4, 10, "the abandoned request running")
    check(srv.metric("gpt2d_queued_requests") == 12, "12 sequences should wait behind 4")
    time.sleep(0.5)
    s.close()
    t0 = time.monotonic()
    srv.wait_metric("gpt2d_running_sequences", 0, 5, "after the client closed")
    srv.wait_metric("gpt2d_queued_requests", 0, 1, "after the client closed")
    took = time.monotonic() - t0
    # The socket is peeked on the 1 s tick, then a step ends: 0.5 s here
    # under ASan; twice the bound under a sanitizer.
    check(took <= 1.5 * min(SLOW, 2),
          "the abandoned request ran %.2f s after its client closed (want <= 1 s + a step)" % took)
    check(srv.metric(CANCEL_CLIENT) == 1, "%s is %g, want 1" % (CANCEL_CLIENT, srv.metric(CANCEL_CLIENT)))
    srv.wait_metric("gpt2d_kv_blocks_used", 0, 3, "after the cancel")
    # Keep-alive: a second request pipelined behind a whole answer is data, not a close.
    short = json.dumps({"model": "gpt2", "prompt": "Stay", "max_tokens": 80, "ignore_eos": True}).encode()
    s = connect(srv.port, 30)
    s.sendall((completion_head(len(short)) + short) * 2)
    got = b""
    s.settimeout(20)
    deadline = time.monotonic() + 20
    while got.count(b"HTTP/1.1 200") < 2 and time.monotonic() < deadline:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    check(got.count(b"HTTP/1.1 200") == 2, "two pipelined requests: %r" % got[:300])
    check(srv.metric(CANCEL_CLIENT) == 1, "a pipelined request was taken for a close")
    # A stream's disconnect counts under the same reason.
    st = Stream(srv.port, dict(LONG_STREAM, prompt="Leaving"))
    srv.wait_metric("gpt2d_running_sequences", 1, 10, "the stream running")
    st.sock.close()
    srv.wait_metric("gpt2d_running_sequences", 0, 3, "after the stream's client closed")
    check(srv.metric(CANCEL_CLIENT) == 2, "the stream's disconnect is not counted: %g" % srv.metric(CANCEL_CLIENT))


def case_sequences_cap(ctx):
    """3: prompts x max(n, best_of) over max_sequences_per_request (64 by
    default) is a 400 naming the fields; at the cap it is served."""
    srv = Server(ctx, ctx.models.get("tiny"))
    over = {"model": "gpt2", "prompt": ["p%d" % i for i in range(16)], "best_of": 16, "max_tokens": 1}
    st, _, b = request(srv.port, "POST", "/v1/completions", over, timeout=20)
    check(st == 400, "16 prompts x best_of 16 got %d: %r" % (st, b[:200]))
    e = error_envelope(b, "the sequence cap")
    check(e.get("param") == "best_of" and "prompt" in e["message"] and "max_sequences_per_request" in e["message"]
          and "256" in e["message"] and "64" in e["message"], "the 400 does not name the fields and limit: %r" % e)
    st, _, b = request(srv.port, "POST", "/v1/completions", dict(over, prompt=over["prompt"][:4]), timeout=20)
    check(st == 200 and len(json.loads(b)["choices"]) == 4, "4 prompts x best_of 16 (64) got %d: %r" % (st, b[:200]))
    srv2 = Server(ctx, ctx.models.get("tiny"), "--max-sequences-per-request", "4", name="server2")
    st, _, b = request(srv2.port, "POST", "/v1/completions", {"model": "gpt2", "prompt": "x", "n": 5, "max_tokens": 1})
    check(st == 400 and error_envelope(b, "n 5 over 4").get("param") == "n", "n 5 over a cap of 4 got %d: %r" % (st, b[:200]))


def fair_ttft(srv, why, a_headers=b"", b_headers=None, b_src=None):
    """Key (or client) A's 16 prompts x n 16 long generations hold every
    slot and 192 more wait; B's one short request then gets its first token
    within 2x its unloaded time plus a few of the loaded steps (and a
    margin for a noisy machine). FIFO (main) serves B after A's first 64
    sequences, 200 steps (over 4 s)."""
    short = {"model": "gpt2", "prompt": "Brief", "max_tokens": 1}

    def ttft(timeout):
        try:
            st, _, b = request(srv.port, "POST", "/v1/completions", short, headers=b_headers,
                               timeout=timeout, src=b_src)
        except socket.timeout:
            raise Fail("%s: B's one-token request got no answer within %.0f s" % (why, timeout))
        check(st == 200, "%s: B's request got %d: %r" % (why, st, b[:200]))
        return json.loads(b)["usage"]["timings"]["ttft_ms"] / 1e3
    alone = statistics.median(ttft(10) for _ in range(3))
    big = {"model": "gpt2", "prompt": ["Hold %d" % i for i in range(16)], "n": 16, "max_tokens": 200,
           "ignore_eos": True}
    payload = json.dumps(big).encode()
    a = connect(srv.port, 30)
    a.sendall(completion_head(len(payload), a_headers) + payload)
    srv.wait_metric("gpt2d_running_sequences", 64, 10, "%s: A's sequences running" % why)
    check(srv.metric("gpt2d_queued_requests") == 192, "%s: 192 of A's sequences should wait" % why)
    # One loaded step, as this machine runs it now.
    s0, t0 = srv.metric("gpt2d_steps_total"), time.monotonic()
    time.sleep(0.5)
    step = (time.monotonic() - t0) / max(1, srv.metric("gpt2d_steps_total") - s0)
    loaded = statistics.median(ttft(3 * SLOW) for _ in range(3))
    a.close()  # A's whole answer is cancelled within a second
    srv.wait_metric("gpt2d_running_sequences", 0, 5, "%s: after A's client closed" % why)
    bound = 2 * alone + (3 * step + 0.25) * SLOW
    print("note: %s: B's time to first token %.0f ms alone, %.0f ms beside A's 256 sequences "
          "(a loaded step %.0f ms; bound %.0f ms)" % (why, alone * 1e3, loaded * 1e3, step * 1e3, bound * 1e3),
          flush=True)
    check(loaded <= bound, "%s: B's time to first token was %.0f ms beside A's 256 sequences, "
          "%.0f ms alone, a loaded step %.0f ms (want <= %.0f ms)"
          % (why, loaded * 1e3, alone * 1e3, step * 1e3, bound * 1e3))


def case_fair_admission(ctx):
    """24.3: admission is fair across API keys: key A's 256 sequences (64
    running, 192 waiting) do not hold key B's one-sequence request; without
    keys, another client address is another tenant the same way."""
    ka, kb = "tenant-a-key-1111", "tenant-b-key-2222"
    srv = Server(ctx, ctx.models.get("long"), "--api-key", ka, "--api-key", kb,
                 "--max-sequences-per-request", "256", env=STEP_DELAY)
    fair_ttft(srv, "two keys", a_headers=b"Authorization: Bearer %s\r\n" % ka.encode(),
              b_headers={"Authorization": "Bearer " + kb})
    srv.stop()
    srv = Server(ctx, ctx.models.get("long"), "--max-sequences-per-request", "256", env=STEP_DELAY,
                 name="nokeys")
    fair_ttft(srv, "two addresses", b_src="127.0.0.2")


# Finding 4 of issue 24: answers are bounded.
CANCEL_BYTES = 'gpt2d_requests_cancelled_total{reason="response_bytes"}'
BIG_ANSWER = {"model": "gpt2", "prompt": [[(i * 7 + j) % 50000 + 10 for j in range(1000)] for i in range(16)],
              "n": 16, "echo": True, "logprobs": 5, "max_tokens": 1}  # the issue's 82 KB request
BIG_ANSWER_BYTES = json.dumps(BIG_ANSWER).encode()  # encoded once: the test's own CPU is not the server's


def big_answers(srv, why):
    """The 82 KB request once, then 8 at once beside a stream: each a 400;
    RSS rises by 256 MiB at most, the stream's longest gap is 100 ms."""
    st, _, b = request(srv.port, "POST", "/v1/completions", BIG_ANSWER, timeout=30)
    check(st == 400, "%s: the 82 KB request got %d: %r" % (why, st, b[:200]))
    # The same stream alone first: its longest gap is this machine's noise.
    alone = Stream(srv.port, dict(LONG_STREAM, prompt="Beside", max_tokens=60, stream_options=None))
    alone.wait(20, "%s: the stream alone" % why)
    noise = max(alone.token_gaps() or [0])
    rss0, peak, done = srv.rss_kib(), [0], threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], srv.rss_kib())
            except (Fail, OSError):
                pass
            time.sleep(0.05)
    threading.Thread(target=sample, daemon=True).start()
    stream = Stream(srv.port, dict(LONG_STREAM, prompt="Beside", max_tokens=60, stream_options=None))
    statuses = []
    ts = [threading.Thread(target=lambda: statuses.append(
        request(srv.port, "POST", "/v1/completions", BIG_ANSWER_BYTES, timeout=30)[0])) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    stream.wait(20, "%s: the stream beside" % why)
    done.set()
    check(statuses == [400] * 8, "%s: 8 copies got %r" % (why, statuses))
    rise = (peak[0] - rss0) // 1024
    check(rise <= 256, "%s: RSS rose %d MiB" % (why, rise))
    gap = max(stream.token_gaps() or [0])
    check(gap <= max(0.1 + STEP_S, noise + 0.05), "%s: the stream beside stalled %.0f ms (alone: %.0f ms)"
          % (why, gap * 1e3, noise * 1e3))
    return b


def case_response_bytes_cap(ctx):
    """4: an answer's predictable size over max_response_bytes is a 400
    naming the fields, before any work (8 copies of the issue's 82 KB
    request: RSS and a stream beside unaffected); an answer that grows past
    it ends with a clear error (a whole answer: 400; a stream: an error
    event and [DONE]), counted."""
    srv = Server(ctx, ctx.models.get("long"), env=STEP_DELAY)
    big_answers(srv, "by default")  # over max_sequences_per_request as well
    srv2 = Server(ctx, ctx.models.get("long"), "--max-sequences-per-request", "256",
                  "--max-response-bytes", "65536", env=STEP_DELAY, name="server2")
    b = big_answers(srv2, "256 sequences allowed")
    e = error_envelope(b, "the 82 KB request")
    check(e.get("code") == "response_too_large" and "max_response_bytes" in e["message"]
          and all(f in e["message"] for f in ("`prompt`", "`n`", "`echo`", "`logprobs`")),
          "the 400 does not name the fields and the limit: %r" % e)
    grow = {"model": "gpt2", "prompt": "Grow", "n": 4, "logprobs": 5, "max_tokens": 600, "ignore_eos": True}
    st, _, b = request(srv2.port, "POST", "/v1/completions", grow, timeout=30)
    check(st == 400 and error_envelope(b, "grown").get("code") == "response_too_large",
          "a whole answer grown past 64 KiB got %d: %r" % (st, b[:200]))
    stream = Stream(srv2.port, dict(grow, stream=True))
    stream.wait(30, "the stream grown past 64 KiB")
    ev = stream.events()
    check(ev[-1] == "[DONE]" and "max_response_bytes" in ev[-2], "the grown stream ends %r" % ev[-2:])
    check(srv2.metric(CANCEL_BYTES) == 2, "%s is %g, want 2" % (CANCEL_BYTES, srv2.metric(CANCEL_BYTES)))

# Issue 34: every cut stream ends as the docs say.
def sse_whole_events(stream, why):
    """The data payloads of a stream cut by the server, each event whole: a
    complete chunked 200 whose events are all "data: " lines of JSON (or
    [DONE], last), none cut in the middle."""
    status, headers, rest = parse_head(stream.raw)
    check(status == 200, "%s: status %d" % (why, status))
    check(rest.endswith(b"0\r\n\r\n"), "%s: no chunked end; the stream ends %r" % (why, rest[-120:]))
    text = dechunk(rest).decode("utf-8", "replace")
    check(text.endswith("\n\n"), "%s: the body ends inside an event: %r" % (why, text[-120:]))
    out = []
    for e in text[:-2].split("\n\n"):
        if e.startswith(":"):
            continue
        check(e.startswith("data: "), "%s: not a data event: %r" % (why, e[:120]))
        if e != "data: [DONE]":
            try:
                json.loads(e[6:])
            except ValueError:
                raise Fail("%s: an event that is not whole JSON: %r" % (why, e[:120]))
        out.append(e[6:])
    check(out and out[-1] == "[DONE]", "%s: the last event is %r, not [DONE]" % (why, out[-1:]))
    return out


def case_stall_cut_event_boundary(ctx):
    """34: a stream whose client stops reading is cancelled after
    stream_stall_timeout, and a client that reads on (within
    connection_timeout of the cut; the issue's 40-70 s stop with 30 s and
    60 s, scaled to 4 s and 5 s) gets whole events, then the error event
    naming stream_stall_timeout, [DONE] and the chunked end (a Responses
    stream beside it: response.failed and error, numbered on); after the
    cut it gets at most what the kernel held, the rest of one event and
    the ending, not the backlog. Before, libmicrohttpd's idle timeout
    closed the connection with an event half sent."""
    backlog = 65536
    srv = Server(ctx, ctx.models.get("long"), "--stream-stall-timeout", "4", "--stream-backlog-bytes",
                 str(backlog), "--connection-timeout", "5", env=STEP_DELAY)
    st = Stream(srv.port, dict(LONG_STREAM, prompt="Stall", max_tokens=1000, logprobs=5), rcvbuf=4096, read=False)
    # A Responses stream beside it, stalled the same way.
    payload = json.dumps({"input": "Stall", "max_output_tokens": 1000, "ignore_eos": True, "stream": True,
                          "top_logprobs": 5, "include": ["message.output_text.logprobs"]}).encode()
    rs = connect(srv.port, 30, rcvbuf=4096)
    rs.sendall(completion_head(len(payload), b"Connection: close\r\n", b"/v1/responses") + payload)
    # Each client reads on 3 s after its own stream's cancel (they stall at
    # different times).
    cancelled, got = {}, {}

    def read_on(prefix, read):
        cancelled[prefix] = srv.wait_log(r"%s\S*: the client left .*stream_stall_timeout\); cancelled" % prefix,
                                         timeout=20)
        time.sleep(3)
        got[prefix] = read()

    def read_cmpl():
        st.start_reading()
        st.closed.wait(10)
        return st.raw
    readers = [threading.Thread(target=read_on, args=("cmpl-", read_cmpl)),
               threading.Thread(target=read_on, args=("resp_", lambda: read_until_close(rs, 10)))]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    rs.close()
    check("cmpl-" in got and "resp_" in got, "a stalled stream was not read to its end: %r" % sorted(got))
    resp_raw = got["resp_"]
    ev = sse_whole_events(st, "the stalled stream")
    rev = resp_events(resp_raw)  # every block whole: "event: NAME" and its JSON
    check(all(cancelled.values()), "the stalled streams were not both cancelled (%d and %d bytes came): %s"
          % (len(st.raw), len(resp_raw), srv.tail(2)))
    check(len(ev) >= 2 and "stream_stall_timeout" in ev[-2] and '"error"' in ev[-2],
          "the stalled stream's last events: %r" % ev[-2:])
    check([n for n, _ in rev[-2:]] == ["response.failed", "error"]
          and "stream_stall_timeout" in rev[-1][1].get("message", ""),
          "the stalled Responses stream's last events: %r" % rev[-2:])
    check([d["sequence_number"] for _, d in rev] == list(range(len(rev))),
          "the stalled Responses stream's sequence numbers have a gap")
    # What the kernel holds (SO_SNDBUF = backlog, doubled; the client's
    # 4 KiB, doubled), libmicrohttpd's 4 KiB block, the rest of one event
    # and the ending: not the backlog (64 KiB) too.
    sndbuf = socket.socket()
    sndbuf.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, backlog)
    held = sndbuf.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    sndbuf.close()
    for name, after in (("completions", len(st.raw)), ("responses", len(resp_raw))):
        check(after <= held + 8192 + 4096 + 4096, "%s: the client got %d bytes after it stopped, over the "
              "kernel's %d and one event: the backlog was sent too" % (name, after, held))


def model_change_streams(srv, n):
    streams = [Stream(srv.port, dict(LONG_STREAM, prompt="Change %d" % i)) for i in range(n)]
    srv.wait_metric("gpt2d_running_sequences", n, 10, "%d streams running" % n)
    deadline = time.monotonic() + 10
    while not all(b"data: {" in st.raw for st in streams):
        check(time.monotonic() < deadline, "not every stream had a token in 10 s")
        time.sleep(0.05)
    return streams


def case_model_change_clean_endings(ctx):
    """34: `cp` of other bytes over the served file (truncated, then
    written half a second later, as a large file's copy is: the mapped
    pages past the new end raise SIGBUS in the steps) under 8 streams: exit status 3, and every stream gets its clean ending
    first: whole events, an error event naming the model file's change,
    [DONE] and the chunked end. Before, the SIGBUS handler exited at once
    and every stream was cut without an ending."""
    d, path = model_file(ctx, "copied")
    srv = Server(ctx, d, env=STEP_DELAY)
    streams = model_change_streams(srv, 8)
    with open(os.path.join(ctx.models.get("long2"), "model.safetensors"), "rb") as f:
        data = f.read()
    # As cp does (open with O_TRUNC, then write), at the pace of a large
    # file: the steps meanwhile read pages the file no longer has.
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        time.sleep(0.5)
        os.write(fd, data)
    finally:
        os.close(fd)
    exits_3(srv, "after cp over the served file")
    check(names_file(srv, path), "no log line names %s: %s" % (path, srv.tail(2)))
    for i, st in enumerate(streams):
        st.wait(5, "stream %d" % i)
        ev = sse_whole_events(st, "stream %d" % i)
        check(len(ev) >= 2 and "model file" in ev[-2] and '"error"' in ev[-2],
              "stream %d's last events: %r" % (i, ev[-2:]))


def written_until_error(raw, responses):
    """The body bytes before the stream's error ending, and that ending:
    (bytes, [events after them])."""
    status, _, rest = parse_head(raw)
    check(status == 200 and rest.endswith(b"0\r\n\r\n"), "status %d, ends %r" % (status, rest[-80:]))
    body = dechunk(rest)
    mark = b"event: response.failed\n" if responses else b'data: {"error":'
    at = body.rfind(mark)
    check(at >= 0, "no error ending: %r" % body[-300:])
    return at, body[at:].decode()


def case_response_bytes_written_every_route(ctx):
    """34: max_response_bytes counts the bytes a stream writes, on every
    route, with and without logprobs: completions, chat and Responses
    streams that would write far more than 65536 bytes each write at most
    65536 before their ending (an error event naming max_response_bytes and
    [DONE]; Responses: response.failed and error, code response_too_large),
    and each is counted. Before, logprob streams wrote 200-321 KB first and
    a Responses stream without logprobs was never cut."""
    limit = 65536
    srv = Server(ctx, ctx.models.get("long"), "--max-response-bytes", str(limit))
    base = {"model": "gpt2", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    chat = dict(base, messages=[{"role": "user", "content": "Count"}])
    routes = [
        ("completions", "/v1/completions", dict(base, prompt="Count")),
        ("completions logprobs", "/v1/completions", dict(base, prompt="Count", logprobs=5)),
        ("chat", "/v1/chat/completions", chat),
        ("chat logprobs", "/v1/chat/completions", dict(chat, logprobs=True, top_logprobs=5)),
        ("responses", "/v1/responses", {"input": "Count", "max_output_tokens": 1000, "ignore_eos": True,
                                        "stream": True}),
        ("responses logprobs", "/v1/responses", {"input": "Count", "max_output_tokens": 1000, "ignore_eos": True,
                                                 "stream": True, "top_logprobs": 5,
                                                 "include": ["message.output_text.logprobs"]}),
    ]
    for name, path, body in routes:
        payload = json.dumps(body).encode()
        s = connect(srv.port, 60)
        s.sendall(completion_head(len(payload), b"Connection: close\r\n", path.encode()) + payload)
        raw = read_until_close(s, 60)
        s.close()
        responses = path == "/v1/responses"
        try:
            n, ending = written_until_error(raw, responses)
        except Fail as e:
            raise Fail("%s: %s" % (name, e))
        check(n <= limit, "%s: %d bytes written before the error ending, over max_response_bytes %d"
              % (name, n, limit))
        check("max_response_bytes" in ending and "response_too_large" in ending,
              "%s: the ending does not name max_response_bytes: %r" % (name, ending[:300]))
        if responses:
            check(ending.rstrip("\n").split("\n\n")[-1].startswith("event: error\n"),
                  "%s: the ending is not response.failed then error: %r" % (name, ending[-300:]))
            rev = resp_events(raw)
            check([d["sequence_number"] for _, d in rev] == list(range(len(rev))),
                  "%s: the sequence numbers have a gap" % name)
        else:
            check(ending.endswith("data: [DONE]\n\n"), "%s: no [DONE] after the error: %r" % (name, ending[-200:]))
    got = srv.metric(CANCEL_BYTES)
    check(got == len(routes), "%s is %g, want %d" % (CANCEL_BYTES, got, len(routes)))


# ---------------------------------------------------------------- HTTPS

class Skip(Exception):
    """A case that cannot run here (a tool or a build feature missing): a
    skip with its reason outside CI, a failure under CI=1 /
    GPT2D_REQUIRE_ALL=1."""


def tls_certificate(ctx, name="tls"):
    """A self-signed certificate for localhost and 127.0.0.1, made now with
    openssl (never a committed key): (certificate, key) paths in ctx.dir."""
    if shutil.which("openssl") is None:
        raise Skip("openssl is not installed (scripts/setup.sh --test installs it)")
    crt, key = os.path.join(ctx.dir, name + ".crt"), os.path.join(ctx.dir, name + ".key")
    p = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "2", "-subj", "/CN=gpt2d-hostile",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key, "-out", crt],
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 0, "openssl: %s" % p.stderr[-300:])
    return crt, key


def tls_server(ctx, *args, name="server", model="tiny", env=None):
    """A server on HTTPS with a fresh certificate: (server, certificate)."""
    probe = subprocess.run([ctx.gpt2d, "serve", "--model", ctx.dir, "--port", "0", "--tls-cert-file",
                            "/nonexistent", "--tls-key-file", "/nonexistent"], capture_output=True, text=True,
                           timeout=10)
    if "built without GnuTLS" in probe.stderr:
        raise Skip("this gpt2d was built without GnuTLS (meson -Dtls=enabled)")
    crt, key = tls_certificate(ctx)
    return Server(ctx, ctx.models.get(model), "--tls-cert-file", crt, "--tls-key-file", key, *args,
                  name=name, env=env), crt


def tls_health(port, crt, timeout=10):
    """GET /health over HTTPS, the certificate verified against crt: the status."""
    c = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout,
                                    context=ssl.create_default_context(cafile=crt))
    try:
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def client_hello():
    """The bytes of a TLS ClientHello, as Python's ssl writes it first."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    out, inc = ssl.MemoryBIO(), ssl.MemoryBIO()
    t = ctx.wrap_bio(inc, out, server_hostname="localhost")
    try:
        t.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = out.read()
    check(len(hello) > 100 and hello[0] == 0x16, "no ClientHello: %r" % hello[:20])
    return hello


def case_tls_plain_http(ctx):
    """TLS: plain HTTP sent to the HTTPS port (a client that forgot https://)
    is closed promptly, with no plaintext answer and no crash, twenty times
    in a row; HTTPS is served on throughout."""
    srv, crt = tls_server(ctx)
    for i in range(20):
        s = connect(srv.port, 10)
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            t0 = time.monotonic()
            got = read_until_close(s, 5)
            check(time.monotonic() - t0 < 5, "plain HTTP held open")
            check(not got.startswith(b"HTTP/"), "a plaintext answer on the TLS port: %r" % got[:80])
        finally:
            s.close()
        if i % 5 == 0:
            check(tls_health(srv.port, crt) == 200, "HTTPS after plain HTTP #%d" % i)
    check(srv.proc.poll() is None, "the server exited")
    check(tls_health(srv.port, crt) == 200, "HTTPS after twenty plain requests")


def case_plain_tls_hello(ctx):
    """TLS: a TLS ClientHello sent to a plain HTTP port (a client that used
    https:// by mistake) gets a 400 or a close, promptly, not a hang; the
    server answers on."""
    srv = Server(ctx, ctx.models.get("tiny"))
    hello = client_hello()
    for _ in range(10):
        s = connect(srv.port, 10)
        try:
            s.sendall(hello)
            t0 = time.monotonic()
            got = read_until_close(s, 5)
            check(time.monotonic() - t0 < 5, "a ClientHello held the connection open")
            check(got == b"" or got.startswith(b"HTTP/1.1 400") or got.startswith(b"HTTP/1.0 400"),
                  "a ClientHello got %r" % got[:80])
        finally:
            s.close()
    st, _, _ = request(srv.port, "GET", "/health")
    check(st == 200, "/health after ClientHellos got %d" % st)
    check(srv.proc.poll() is None, "the server exited")


def case_tls_handshake_stall(ctx):
    """TLS: handshakes that stall (a connection that sends nothing, or half a
    ClientHello, then waits) hold no slot for ever: each is closed within
    request_header_timeout (2 s here) plus a sweep, while other clients are
    served over HTTPS, a completion included (libmicrohttpd's timer once
    spun on a half ClientHello and starved the loop: server/http/loop.c)."""
    srv, crt = tls_server(ctx, "--request-header-timeout", "2")
    hello = client_hello()
    socks = []
    t0 = time.monotonic()
    for i in range(16):
        s = connect(srv.port, 10)
        if i % 2:
            s.sendall(hello[:len(hello) // 2])
        socks.append(s)
    check(tls_health(srv.port, crt) == 200, "HTTPS beside stalled handshakes")
    # A completion needs the loop's other phases (the engine step's
    # completion): a loop spinning on the stalled handshakes starves it.
    c = http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=10,
                                    context=ssl.create_default_context(cafile=crt))
    t1 = time.monotonic()
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hello", "max_tokens": 8}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    c.close()
    check(r.status == 200 and json.loads(body)["usage"]["completion_tokens"] == 8,
          "a completion beside stalled handshakes: %d %r" % (r.status, body[:200]))
    check(time.monotonic() - t1 < 1.5, "a completion beside stalled handshakes took %.1f s"
          % (time.monotonic() - t1))
    try:
        for s in socks:
            left = t0 + 2 + 2.5 - time.monotonic()
            read_until_close(s, max(left, 0.1))
        took = time.monotonic() - t0
        check(took >= 1.8, "stalled handshakes closed after %.1f s, before request_header_timeout" % took)
    finally:
        for s in socks:
            s.close()
    check(tls_health(srv.port, crt) == 200, "HTTPS after the stalls")
    check(srv.proc.poll() is None, "the server exited")


def tls_metric(port, crt, name):
    """One unlabelled (or exactly labelled) series of /metrics over HTTPS."""
    c = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ssl.create_default_context(cafile=crt))
    try:
        c.request("GET", "/metrics")
        body = c.getresponse().read().decode()
    finally:
        c.close()
    m = re.search(r"^%s (\S+)$" % re.escape(name), body, re.M)
    return float(m.group(1)) if m else 0.0


def case_tls_abandoned_cancelled(ctx):
    """TLS: a whole-answer request whose client leaves the way a TLS client
    does (close_notify, then its FIN) is cancelled within a second or two,
    as over plain HTTP (a peek at the socket saw the close_notify's bytes
    and took the client for present: server/http/req.c)."""
    srv, crt = tls_server(ctx, model="long", env=STEP_DELAY)
    c = http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=10,
                                    context=ssl.create_default_context(cafile=crt))
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hello", "max_tokens": 800, "n": 2,
                                                          "ignore_eos": True}),
              headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + 10
    while tls_metric(srv.port, crt, "gpt2d_running_sequences") < 2:
        check(time.monotonic() < deadline, "the request's two sequences never ran")
        time.sleep(0.05)
    s = c.sock
    s.settimeout(0)
    try:
        s.unwrap()  # sends close_notify; the server's own never comes
    except (ssl.SSLWantReadError, ssl.SSLError, OSError):
        pass
    s.close()
    t0 = time.monotonic()
    while tls_metric(srv.port, crt, "gpt2d_running_sequences") > 0:
        check(time.monotonic() - t0 < 3, "an abandoned whole answer over TLS still runs after 3 s")
        time.sleep(0.1)
    check(tls_metric(srv.port, crt, 'gpt2d_requests_cancelled_total{reason="client_closed"}') == 1,
          "the cancel is not counted as client_closed")



# A large whole answer that max_response_bytes (4 MiB) allows: a prompt of
# 1,000 ids x n 16, echo, logprobs 5, max_tokens 1 (16,016 logprobs
# entries, a 2.9 MB answer; the issue's 82 KB request is 16 of these
# prompts, 16 times over the bound). Once the first answer has computed the
# prompt's echo, the prefix cache holds the logprobs of all its blocks but
# the last, and an answer is a few steps of work: the case's time goes to
# the answers, not to the engine.
ALLOWED_LEN = 1000
ALLOWED_N = 16
ALLOWED = {"model": "gpt2", "prompt": [[(j * 7) % 50000 + 10 for j in range(ALLOWED_LEN)]],
           "n": ALLOWED_N, "echo": True, "logprobs": 5, "max_tokens": 1}
ALLOWED_BYTES = json.dumps(ALLOWED).encode()


def allowed_answer_whole(st, body):
    """'' when body is a whole answer to ALLOWED, else why not."""
    if st != 200:
        return "status %d: %r" % (st, body[:200])
    try:
        d = json.loads(body)
    except ValueError as e:
        return "not JSON (%s), %d bytes, ending %r" % (e, len(body), body[-80:])
    ch = d.get("choices", [])
    if [c["index"] for c in ch] != list(range(ALLOWED_N)) or d["usage"]["prompt_tokens"] != ALLOWED_LEN:
        return "%d choices, usage %r" % (len(ch), d.get("usage"))
    for c in ch:
        lp = c["logprobs"]
        n = ALLOWED_LEN + 1
        if not (len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
                and lp["token_logprobs"][0] is None and all(len(t) == 5 for t in lp["top_logprobs"][1:])
                and c["finish_reason"] == "length" and c["text"].startswith("".join(lp["tokens"][:10]))):
            return "choice %d: %d logprobs entries, %r" % (c["index"], len(lp["tokens"]), c["text"][:40])
    return ""


def case_big_answers_allowed(ctx):
    """24.4: whole answers are written a piece at a time as the connection
    takes them, from logprobs kept as numbers: 8 large answers that
    max_response_bytes allows (2.9 MB each) at once raise RSS by 256 MiB at
    most, the loop thread answers /health and a stream beside them keeps
    its pace throughout (within bounds generous for a busy 2-core
    machine); every answer is whole, valid JSON; a client that leaves in
    the middle of one frees it (the server then exits cleanly: no
    sanitizer report)."""
    srv = Server(ctx, ctx.models.get("long"), "--max-queue", "512")

    def health_s():
        t0 = time.monotonic()
        st, _, _ = request(srv.port, "GET", "/health", timeout=30)
        check(st == 200, "/health got %d" % st)
        return time.monotonic() - t0
    health_alone = max(health_s() for _ in range(20))
    alone = Stream(srv.port, dict(LONG_STREAM, prompt="Beside", max_tokens=60))
    alone.wait(20, "the stream alone")
    noise = max(alone.token_gaps() or [0])
    # The answer once, so that its prompt's echo blocks are cached.
    st, _, b = request(srv.port, "POST", "/v1/completions", ALLOWED_BYTES, timeout=240)
    why = allowed_answer_whole(st, b)
    check(not why, "the largest allowed answer alone: %s" % why)
    rss0, peak, health, done = srv.rss_kib(), [0], [0.0], threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak[0] = max(peak[0], srv.rss_kib())
                health[0] = max(health[0], health_s())
            except (Fail, OSError):
                pass
            time.sleep(0.01)
    threading.Thread(target=sample, daemon=True).start()
    stream = Stream(srv.port, dict(LONG_STREAM, prompt="Beside", max_tokens=1000))
    # A sanitizer build checks the path with two (it is slower, and its
    # quarantine keeps up to 256 MiB of what was freed).
    copies = 8 if SLOW == 1 else 2
    results = []
    ts = [threading.Thread(target=lambda: results.append(
        request(srv.port, "POST", "/v1/completions", ALLOWED_BYTES, timeout=240))) for _ in range(copies)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    t_end = time.monotonic()
    done.set()
    stream.sock.close()
    gaps = [b - a for (a, _), (b, _) in zip(stream.arrivals, stream.arrivals[1:]) if b <= t_end]
    # Checked after the stream: this process's CPU is the stream reader's too.
    for st, _, b in results:
        why = allowed_answer_whole(st, b)
        check(not why, "one of 8 answers at once: %s" % why)
    rise = (peak[0] - rss0) // 1024
    print("note: %d answers of %d bytes: RSS +%d MiB, /health at most %.0f ms (alone %.0f ms), the stream's "
          "longest gap %.0f ms (alone %.0f ms)" % (copies, len(results[0][2]), rise, health[0] * 1e3, health_alone * 1e3,
                                                   max(gaps or [0]) * 1e3, noise * 1e3), flush=True)
    check(rise <= 256 + (256 if SLOW > 1 else 0), "%d allowed answers at once: RSS rose %d MiB" % (copies, rise))
    # Generous bounds: on a 2-core machine the step threads take both cores
    # while the answers' prompts are computed, and the loop thread waits
    # for a core as well (the issue's aim, 100 ms, is docs/benchmarks.md's
    # measure). A whole answer built at once held the loop for about 1 s
    # per 5 MB on such a machine.
    check(health[0] <= max(0.5 * SLOW, 4 * health_alone),
          "the loop thread stalled: /health took %.0f ms beside the answers (alone: %.0f ms)"
          % (health[0] * 1e3, health_alone * 1e3))
    check(max(gaps or [0]) <= max(1.0 * SLOW, 4 * noise), "the stream beside the answers stalled %.0f ms "
          "(alone: %.0f ms)" % (max(gaps) * 1e3, noise * 1e3))
    # A client that leaves after the first piece of its answer.
    s = connect(srv.port, 60, rcvbuf=4096)
    s.sendall(completion_head(len(ALLOWED_BYTES)) + ALLOWED_BYTES)
    got = b""
    while b"\r\n\r\n" not in got or len(got) < 70000:
        chunk = s.recv(65536)
        check(chunk, "the answer ended after %d bytes" % len(got))
        got += chunk
    check(got.startswith(b"HTTP/1.1 200"), "the answer the client leaves: %r" % got[:100])
    s.close()
    srv.wait_metric("gpt2d_running_sequences", 0, 10, "after the client left mid-answer")
    st, _, b = request(srv.port, "POST", "/v1/completions", {"model": "gpt2", "prompt": "After", "max_tokens": 2})
    check(st == 200, "after a client left mid-answer: %d %r" % (st, b[:200]))
    rc = srv.terminate(20)
    log = srv.log()
    check(rc == 0 and "Sanitizer" not in log and "runtime error" not in log,
          "the server's exit: %s; log: %r" % (describe_exit(rc), log[-2000:]))


# The checkpoints a case uses, made before its time limit starts.
CASE_MODELS = {"tokenize_flood": ["slow"], "completion_flood": ["slow"], "responses_flood": ["slow"], "stalled_stream": ["thin"], "never_admissible": ["deep"], "model_overwritten": ["long", "long2"],
               "model_rename_exit3": ["long", "long2"], "model_inplace_exit3": ["long", "long2"],
               "model_change_clean_endings": ["long", "long2"],
               "unseeded_replicas": ["tiny"]}

def case_disconnects(ctx):
    """What held and must keep holding: 40 clients leaving mid-stream leave
    no running sequence and no KV block behind, and are counted."""
    srv = Server(ctx, ctx.models.get("long"), env=STEP_DELAY)
    streams = [Stream(srv.port, dict(LONG_STREAM, prompt="Bye %d" % i, max_tokens=300)) for i in range(40)]
    deadline = time.monotonic() + 10
    while not all(b"data: {" in st.raw for st in streams):
        check(time.monotonic() < deadline, "not every stream had a token in 10 s")
        time.sleep(0.05)
    for st in streams:
        st.sock.close()
    srv.wait_metric("gpt2d_running_sequences", 0, 5, "after 40 disconnects")
    srv.wait_metric("gpt2d_kv_blocks_used", 0, 5, "after 40 disconnects")
    check(srv.metric("gpt2d_requests_aborted_total") == 40, "the disconnects are not all counted")
    check(request(srv.port, "GET", "/health")[0] == 200, "/health after the disconnects")


def case_info_line_live(ctx):
    """Issue 28: the periodic info line counts tokens as they are generated.
    One long stream at 20 ms a step with --info-interval 1: the lines
    written while it still runs report a generation rate above 0 (before,
    every line said 0.0 until the request ended, then all its tokens)."""
    srv = Server(ctx, ctx.models.get("long"), "--info-interval", "1", env=STEP_DELAY)
    st = Stream(srv.port, dict(LONG_STREAM, prompt="Info", max_tokens=400))
    deadline = time.monotonic() + 10
    while b"data: {" not in st.raw:
        check(time.monotonic() < deadline, "no token in 10 s")
        time.sleep(0.05)
    time.sleep(3.5)
    check(not st.closed.is_set(), "the stream ended before the info lines could be read")
    rates = [float(m) for m in re.findall(r"generation ([0-9.]+) tokens/s", srv.log())]
    check(len(rates) >= 2, "fewer than two info lines in 3.5 s of generating: %r" % rates)
    check(all(r > 0 for r in rates[-2:]),
          "info lines during the stream say no generation: %r" % rates)
    # Each rate is of its own interval: a 20 ms step gives at most ~50 tokens/s.
    check(max(rates) < 100, "a rate over what one stream can make in an interval: %r" % rates)
    st.sock.close()


def case_drain_short_streams(ctx):
    """What held and must keep holding: SIGTERM with 16 streams shorter than
    shutdown_timeout lets each finish whole; exit 0."""
    srv = Server(ctx, ctx.models.get("long"), "--shutdown-timeout", "20", env=STEP_DELAY)
    body = dict(LONG_STREAM, max_tokens=40, stream_options={"include_usage": True})
    streams = [Stream(srv.port, dict(body, prompt="Short %d" % i)) for i in range(16)]
    srv.wait_metric("gpt2d_running_sequences", 16, 10, "16 streams running")
    srv.signal(signal.SIGTERM)
    rc = srv.wait(15)
    check(rc == 0, "after SIGTERM with 16 short streams: %s" % describe_exit(rc))
    for i, st in enumerate(streams):
        st.wait(2, "stream %d" % i)
        ev = st.events()
        check(ev[-1] == "[DONE]", "stream %d ends %r" % (i, ev[-1:]))
        usage = json.loads(ev[-2]).get("usage") or {}
        check(usage.get("completion_tokens") == 40, "stream %d was not finished in the drain: %r" % (i, usage))


# ---------------------------------------------------------------- /v1/responses

def resp_events(raw):
    """A Responses stream's events [(name, data)] from its raw bytes: a
    complete chunked 200 of "event: NAME\ndata: JSON" blocks."""
    status, headers, rest = parse_head(raw)
    check(status == 200, "stream status %d: %r" % (status, raw[:300]))
    check(rest.endswith(b"0\r\n\r\n"), "the stream has no chunked end; it ends %r" % rest[-80:])
    out = []
    for block in dechunk(rest).decode("utf-8").split("\n\n"):
        if not block or block.startswith(":"):
            continue
        lines = block.split("\n")
        check(len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "),
              "not an event block: %r" % block[:200])
        data = json.loads(lines[1][6:])
        check(data.get("type") == lines[0][7:], "event %r carries type %r" % (lines[0], data.get("type")))
        out.append((lines[0][7:], data))
    return out


def case_responses_bodies(ctx):
    """26: /v1/responses refuses every malformed or unsupported body with a
    400 in the API's error shape naming the field (tools, reasoning, images,
    files and audio by name; json_schema until structured outputs), never a
    crash; a body over max_body_bytes is 413; an input past the context is
    400 context_length_exceeded naming input, or with truncation auto
    drops the oldest messages (3000 of them, quickly); the store's routes
    answer 404 for odd paths and 400 for odd queries."""
    app = "http://app.example"
    srv = Server(ctx, ctx.models.get("tiny"), "--max-body-bytes", "262144", "--cors-origins", app)
    post = lambda body, **kw: request(srv.port, "POST", "/v1/responses", body, **kw)
    # CORS as on the other routes: a preflight per path, the header on answers.
    for path, methods in (("/v1/responses", ("POST",)), ("/v1/responses/resp_x", ("GET", "DELETE"))):
        st, h, _ = request(srv.port, "OPTIONS", path, headers={"Origin": app, "Access-Control-Request-Method": methods[0]})
        check(st == 204 and h.get("access-control-allow-origin") == app
              and all(m in h.get("access-control-allow-methods", "") for m in methods),
              "preflight %s: %d %r" % (path, st, h))
    st, h, _ = post({"input": "x", "max_output_tokens": 1}, headers={"Origin": app})
    check(st == 200 and h.get("access-control-allow-origin") == app, "POST with Origin: %d %r" % (st, h))
    st, _, _ = post({"input": "x"}, headers={"Origin": "http://evil.example"})
    check(st == 403, "POST from a refused origin: %d" % st)
    msg = lambda *parts: [{"role": "user", "content": list(parts)}]
    bad = [
        ("", b"{"), ("", b"[1]"), ("", b"\"x\""), ("input", {}), ("input", {"input": 5}),
        ("input", {"input": []}), ("input", {"input": [7]}), ("input", {"input": {"role": "user"}}),
        ("input", {"input": [{"role": "wizard", "content": "x"}]}),
        ("input", {"input": [{"role": "us\u0000er", "content": "x"}]}),
        ("input", {"input": [{"role": "user"}]}), ("input", {"input": [{"role": "user", "content": 3}]}),
        ("input", {"input": msg({"type": "input_image", "image_url": "http://x/y.png"})}),
        ("input", {"input": msg({"type": "input_file", "file_id": "f"})}),
        ("input", {"input": msg({"type": "input_audio", "data": "x"})}),
        ("input", {"input": msg({"type": "input_text"})}), ("input", {"input": msg("text")}),
        ("input", {"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}),
        ("input", {"input": [{"type": "reasoning", "summary": []}]}),
        ("input", {"input": [{"type": "item_reference", "id": 1}]}),
        ("tools", {"input": "x", "tools": [{"type": "web_search"}]}),
        ("tool_choice", {"input": "x", "tool_choice": "required"}),
        ("reasoning", {"input": "x", "reasoning": {"effort": "high"}}),
        ("include", {"input": "x", "include": ["file_search_call.results"]}),
        ("include", {"input": "x", "include": "message.output_text.logprobs"}),
        ("top_logprobs", {"input": "x", "top_logprobs": 6}),
        ("background", {"input": "x", "background": True}),
        ("conversation", {"input": "x", "conversation": "conv_1"}),
        ("messages", {"input": "x", "messages": [{"role": "user", "content": "x"}]}),
        ("text.format", {"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}),
        ("text.format.schema", {"input": "x", "text": {"format": {"type": "json_schema", "name": "n",
                                                                   "schema": {"type": "object", "if": {}}}}}),
        ("stop", {"input": "x", "text": {"format": {"type": "json_object"}}, "stop": ["}"]}),
        ("text.format", {"input": "x", "text": {"format": {"type": "yaml"}}}),
        ("text.format", {"input": "x", "text": {"format": "text"}}), ("text", {"input": "x", "text": "plain"}),
        ("truncation", {"input": "x", "truncation": "sometimes"}), ("store", {"input": "x", "store": "yes"}),
        ("stream", {"input": "x", "stream": "true"}), ("n", {"input": "x", "n": 2}),
        ("instructions", {"input": "x", "instructions": ["be nice"]}),
        ("metadata", {"input": "x", "metadata": {"k%d" % i: "v" for i in range(17)}}),
        ("metadata", {"input": "x", "metadata": {"k": 1}}), ("metadata", {"input": "x", "metadata": {"k" * 65: "v"}}),
        ("metadata", {"input": "x", "metadata": ["k"]}),
        ("previous_response_id", {"input": "x", "previous_response_id": 5}),
        ("previous_response_id", {"input": "x", "previous_response_id": ""}),
        ("previous_response_id", {"input": "x", "previous_response_id": "resp_" + "a" * 80}),
        ("max_output_tokens", {"input": "x", "max_output_tokens": -1}),
        ("max_output_tokens", {"input": "x", "max_output_tokens": 10 ** 9}),
        ("max_output_tokens", {"input": "x", "max_output_tokens": "8"}),
        ("temperature", {"input": "x", "temperature": 3}), ("top_p", {"input": "x", "top_p": 0}),
        ("stop", {"input": "x", "stop": ["a"] * 5}), ("logit_bias", {"input": "x", "logit_bias": {"-1": 5}}),
        ("seed", {"input": "x", "seed": "1"}), ("user", {"input": "x", "user": 5}),
        ("model", {"input": "x", "model": 5}),
    ]
    for param, body in bad:
        st, _, b = post(body)
        e = error_envelope(b, "body %r" % (body,))
        check(st == 400 and e["param"] == (param or None) and e["type"] == "invalid_request_error",
              "body %r: %d, param %r (want %r): %s" % (str(body)[:120], st, e["param"], param, e["message"]))
    st, _, b = post({"input": "x", "model": "gpt-4o"})
    check(st == 404 and error_envelope(b, "model")["code"] == "model_not_found", "another model: %d" % st)
    for ref in ("msg_1", "msg_", "msg_1_in", "msg_1_inx", "resp_1", "m" * 64):
        st, _, b = post({"input": [{"type": "item_reference", "id": ref}]})
        e = error_envelope(b, "item_reference %r" % ref)
        check(st == 404 and e["param"] == "input" and e["code"] == "item_not_found",
              "an unknown item_reference %r: %d %r" % (ref, st, e))
    st, _, b = post({"input": "x", "previous_response_id": "resp_nothing"})
    e = error_envelope(b, "unknown previous_response_id")
    check(st == 404 and e["param"] == "previous_response_id" and e["code"] == "previous_response_not_found",
          "an unknown previous_response_id: %d %r" % (st, e))
    st, _, b = post(b'{"input": "' + b"x" * 300000 + b'"}')
    check(st == 413, "a body over max_body_bytes: %d" % st)
    # The context: 128 tokens. Disabled (the default): 400 naming input.
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "turn %d says hello there" % i} for i in range(40)]
    st, _, b = post({"input": turns, "max_output_tokens": 8})
    e = error_envelope(b, "past the context")
    check(st == 400 and e["param"] == "input" and e["code"] == "context_length_exceeded", "past the context: %d %r" % (st, e))
    st, _, b = post({"input": turns, "max_output_tokens": 8, "truncation": "auto", "temperature": 0})
    check(st == 200, "truncation auto: %d %r" % (st, b[:300]))
    d = json.loads(b)
    check(d["truncation"] == "auto" and d["usage"]["input_tokens"] + 8 <= 128, "truncation auto: %r" % d["usage"])
    # The newest message alone is what the dropping keeps: the same answer
    # as the last few turns sent alone.
    for k in range(len(turns), 0, -1):
        st, _, b2 = post({"input": turns[-k:], "max_output_tokens": 8, "temperature": 0})
        if st == 200:
            break
    check(json.loads(b2)["output_text"] == d["output_text"] and json.loads(b2)["usage"]["input_tokens"] == d["usage"]["input_tokens"],
          "truncation auto answered %r, the kept turns alone %r" % (d["output_text"], json.loads(b2)["output_text"]))
    many = [{"role": "user", "content": "m%d" % i} for i in range(3000)]
    t0 = time.monotonic()
    st, _, b = post({"input": many, "max_output_tokens": 4, "truncation": "auto"}, timeout=20)
    check(st == 200 and time.monotonic() - t0 < 5, "3000 messages with truncation auto: %d in %.1f s"
          % (st, time.monotonic() - t0))
    st, _, b = post({"input": [{"role": "user", "content": "w " * 400}], "truncation": "auto"})
    check(st == 400 and error_envelope(b, "one long message")["param"] == "input",
          "one message longer than the context, truncation auto: %d" % st)
    # The store's routes.
    for path, want in (("/v1/responses/", 404), ("/v1/responses/a/b", 404), ("/v1/responses/resp_x", 404),
                       ("/v1/responses/resp_x/input_items", 404), ("/v1/responses/%00", 404)):
        st, _, b = request(srv.port, "GET", path)
        check(st == want, "GET %s: %d" % (path, st))
        error_envelope(b, "GET " + path)
    st, _, b = post({"input": "Hi", "max_output_tokens": 2})
    rid = json.loads(b)["id"]
    for q, param in (("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"), ("order=sideways", "order")):
        st, _, b = request(srv.port, "GET", "/v1/responses/%s/input_items?%s" % (rid, q))
        check(st == 400 and error_envelope(b, q)["param"] == param, "input_items?%s: %d" % (q, st))
    st, h, _ = request(srv.port, "PUT", "/v1/responses", {})
    check(st == 405 and "POST" in h.get("allow", ""), "PUT /v1/responses: %d %r" % (st, h.get("allow")))
    st, _, _ = request(srv.port, "DELETE", "/v1/responses/%s/input_items" % rid)
    check(st == 404, "DELETE .../input_items: %d" % st)
    check(srv.metric('gpt2d_requests_total{route="/v1/responses",status="400"}') >= len(bad),
          "the refusals are not counted under route /v1/responses")
    check(srv.metric('gpt2d_requests_total{route="/v1/responses/{id}",status="404"}') >= 4,
          "GET /v1/responses/{id} is not one route label")
    check(request(srv.port, "GET", "/health")[0] == 200, "/health after the bodies")


def case_responses_store(ctx):
    """26: stored responses are bounded by count (LRU: a read counts as a
    use) and by bytes (one larger than the bound is not kept), are visible
    only to the API key that made them (GET, input_items, DELETE and
    previous_response_id answer another key 404), store false keeps
    nothing, and a stream's disconnect cancels its sequence."""
    ka, kb = "resp-key-aaaa", "resp-key-bbbb"
    srv = Server(ctx, ctx.models.get("long"), "--api-key", ka, "--api-key", kb,
                 "--responses-store-max", "3", "--responses-store-bytes", "20000", env=STEP_DELAY)
    auth = lambda k: {"Authorization": "Bearer " + k}

    def make(key, text="Hi", **kw):
        body = dict({"input": text, "max_output_tokens": 2}, **kw)
        st, _, b = request(srv.port, "POST", "/v1/responses", body, headers=auth(key), timeout=20)
        check(st == 200, "POST with key %s: %d %r" % (key[-4:], st, b[:200]))
        return json.loads(b)["id"]

    def status(key, path, method="GET"):
        return request(srv.port, method, path, headers=auth(key))[0]

    a1 = make(ka)
    check(status(ka, "/v1/responses/" + a1) == 200, "key A cannot read its own response")
    check(request(srv.port, "GET", "/v1/responses/" + a1)[0] == 401, "no key read a stored response")
    for path, method in (("/v1/responses/" + a1, "GET"), ("/v1/responses/%s/input_items" % a1, "GET"),
                         ("/v1/responses/" + a1, "DELETE")):
        check(status(kb, path, method) == 404, "key B: %s %s is not 404" % (method, path))
    st, _, b = request(srv.port, "POST", "/v1/responses", {"input": "x", "previous_response_id": a1},
                       headers=auth(kb))
    check(st == 404, "key B continued key A's response: %d" % st)
    check(status(ka, "/v1/responses/" + a1) == 200, "key B's DELETE removed key A's response")
    # Count: 3 kept; a read makes a1 the most recent, so a2 goes first.
    a2, a3 = make(ka), make(ka)
    check(status(ka, "/v1/responses/" + a1) == 200, "a1 before the fourth")
    a4 = make(ka)
    got = {r: status(ka, "/v1/responses/" + r) for r in (a1, a2, a3, a4)}
    check(got == {a1: 200, a2: 404, a3: 200, a4: 200}, "LRU by count: %r" % got)
    # store false: nothing kept, nothing evicted.
    n = make(ka, store=False)
    check(status(ka, "/v1/responses/" + n) == 404 and status(ka, "/v1/responses/" + a1) == 200,
          "store false was kept, or evicted another")
    # Bytes: one response over 20000 bytes is not kept and evicts nothing.
    turns = lambda n, words: [{"role": "user", "content": "word " * words} for _ in range(n)]
    big = make(ka, text=turns(85, 50), truncation="auto")  # 21,250 bytes of text
    check(status(ka, "/v1/responses/" + big) == 404, "a response over responses_store_bytes was kept")
    check(status(ka, "/v1/responses/" + a1) == 200, "an oversized response evicted others")
    # Several mid-sized ones: the bytes bound evicts before the count would.
    mids = [make(ka, text=turns(20, 70), truncation="auto") for _ in range(3)]
    kept = [status(ka, "/v1/responses/" + r) for r in mids]
    check(kept[-1] == 200 and kept.count(200) < 3, "the bytes bound kept %r of three ~7 KB responses" % kept)
    # A stream's disconnect cancels it, counted.
    body = json.dumps({"input": "Leaving", "max_output_tokens": 800, "ignore_eos": True, "stream": True}).encode()
    s = connect(srv.port, 30)
    s.sendall(completion_head(len(body), b"Authorization: Bearer " + ka.encode() + b"\r\n", b"/v1/responses") + body)
    srv.wait_metric("gpt2d_running_sequences", 1, 10, "the response stream running")
    time.sleep(0.3)
    s.close()
    srv.wait_metric("gpt2d_running_sequences", 0, 3, "after the response stream's client closed")
    check(srv.metric(CANCEL_CLIENT) == 1, "the disconnect is not counted: %g" % srv.metric(CANCEL_CLIENT))
    # A stream that ends: its events in order, numbered, and it is stored.
    body = json.dumps({"input": "Stay", "max_output_tokens": 5, "ignore_eos": True, "stream": True}).encode()
    s = connect(srv.port, 30)
    s.sendall(completion_head(len(body), b"Connection: close\r\nAuthorization: Bearer " + ka.encode() + b"\r\n",
                              b"/v1/responses") + body)
    ev = resp_events(read_until_close(s, 20))
    check([d["sequence_number"] for _, d in ev] == list(range(len(ev))), "sequence numbers %r" % [d["sequence_number"] for _, d in ev])
    check([n for n, _ in ev].count("response.output_text.delta") >= 1 and ev[-1][0] == "response.incomplete",
          "the events: %r" % [n for n, _ in ev])
    check(status(ka, "/v1/responses/" + ev[-1][1]["response"]["id"]) == 200, "a streamed response was not stored")


def case_responses_store_reload(ctx):
    """26: bounds lowered by SIGHUP apply at once: the least recently used
    stored responses go (logged), and responses_store_max = 0 empties the
    store, with no new response needed to trigger it."""
    conf = os.path.join(ctx.dir, "gpt2d-store.conf")
    with open(conf, "w") as f:
        f.write("responses_store_max = 5\n")
    srv = Server(ctx, ctx.models.get("tiny"), "--config", conf)

    def make():
        st, _, b = request(srv.port, "POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 2}, timeout=20)
        check(st == 200, "POST /v1/responses: %d %r" % (st, b[:200]))
        return json.loads(b)["id"]

    def kept(ids):
        return [request(srv.port, "GET", "/v1/responses/" + r)[0] for r in ids]

    ids = [make() for _ in range(3)]
    check(kept(ids) == [200, 200, 200], "three stored under responses_store_max 5: %r" % kept(ids))
    # Reading a stored response makes it the most recently used, so the
    # store is read only once the reload has trimmed it (its log line): a
    # read during the reload could choose which one is kept.
    for reloads, (want, line) in enumerate((([404, 404, 200], "responses_store_max = 1\n"),
                                            ([404, 404, 404], "responses_store_max = 0\n")), 1):
        with open(conf, "w") as f:
            f.write(line)
        srv.signal(signal.SIGHUP)
        check(srv.wait_log(r"SIGHUP: configuration reloaded", reloads), "no reload line: " + srv.tail(3))
        got = kept(ids)
        check(got == want, "after SIGHUP with %s: %r, want %r" % (line.strip(), got, want))
    check(re.search(r"SIGHUP: 2 stored responses dropped", srv.log()), "no log line for the dropped responses: " + srv.tail(3))


def case_responses_cut(ctx):
    """26: a Responses stream cut by the end of a drain (SIGTERM,
    --shutdown-timeout 2) ends with response.failed (status failed, its
    error naming the shutdown) and an error event, numbered on, then the
    chunked end; a whole response gets the 503 JSON; exit 0."""
    srv = Server(ctx, ctx.models.get("long"), "--shutdown-timeout", "2", env=STEP_DELAY)
    body = {"input": "Drain", "max_output_tokens": 800, "ignore_eos": True}
    payload = json.dumps(dict(body, stream=True)).encode()
    s = connect(srv.port, 30)
    s.sendall(completion_head(len(payload), b"Connection: close\r\n", b"/v1/responses") + payload)
    plain = {}
    t = threading.Thread(target=lambda: plain.update(r=request(srv.port, "POST", "/v1/responses", body, timeout=20)),
                         daemon=True)
    t.start()
    srv.wait_metric("gpt2d_running_sequences", 2, 10, "both responses running")
    srv.signal(signal.SIGTERM)
    rc = srv.wait(4 * min(SLOW, 2))
    check(rc == 0, "after SIGTERM: %s" % describe_exit(rc))
    ev = resp_events(read_until_close(s, 5))
    names = [n for n, _ in ev]
    check([d["sequence_number"] for _, d in ev] == list(range(len(ev))), "sequence numbers of the cut stream")
    check(names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added"] and names[-2:] == ["response.failed", "error"],
          "the cut stream's events: %r" % (names[:5] + names[-3:]))
    failed, err = ev[-2][1]["response"], ev[-1][1]
    check(failed["status"] == "failed" and failed["error"]["code"] == "server_shutting_down",
          "response.failed: %r" % failed.get("error"))
    check(err["code"] == "server_shutting_down" and "shutting down" in err["message"], "error event: %r" % err)
    t.join(2)
    check(plain.get("r", (0,))[0] == 503, "the whole response cut by the shutdown: %r" % (plain.get("r"),))
    error_envelope(plain["r"][2], "the 503 at shutdown")
def case_responses_history_amplification(ctx):
    """34: a request naming a long stored history costs what its prompt can
    use, not what the history holds. A chain of eight responses holding 60
    MB of messages; then, side by side with the same load on a one-turn
    history, 16 concurrent small requests naming it while /health is polled
    and a stream runs: RSS grows by at most 256 MiB, and /health and the
    stream's longest gap stay within 100 ms / 150 ms or 3x the short
    history's (the machine is shared). With truncation disabled the answer is
    a 400, as cheaply. (Before: each request copied and rendered the whole
    history on the loop thread: +1.7 GiB, /health over a second.)"""
    srv = Server(ctx, ctx.models.get("long"), "--max-body-bytes", str(8 << 20),
                 "--responses-store-bytes", str(512 << 20), "--responses-store-chain-bytes", str(128 << 20),
                 "--max-queue", "64")
    turn = [{"role": "user", "content": "word " * 400}] * 3750  # 7.5 MB, 400 tokens a message
    prev = None
    for i in range(8):
        body = {"input": turn, "max_output_tokens": 1, "truncation": "auto"}
        if prev:
            body["previous_response_id"] = prev
        st, _, b = request(srv.port, "POST", "/v1/responses", body, timeout=120)
        check(st == 200, "history turn %d: %d %r" % (i, st, b[:300]))
        prev = json.loads(b)["id"]
    stored = srv.metric("gpt2d_responses_store_bytes")
    check(stored >= 60e6, "the history holds %.1f MB, not 60" % (stored / 1e6))
    st, _, b = request(srv.port, "POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 1})
    check(st == 200, "the short history: %d" % st)
    short = json.loads(b)["id"]

    def burst(target, truncation="auto"):
        base = srv.rss_kib()
        stop = threading.Event()
        peak, health = [base], []

        def sample():
            while not stop.is_set():
                peak.append(srv.rss_kib())
                time.sleep(0.005)

        def ping():
            while not stop.is_set():
                t0 = time.monotonic()
                st, _, _ = request(srv.port, "GET", "/health", timeout=10)
                health.append(time.monotonic() - t0)
                check(st == 200, "/health during the burst: %d" % st)
                time.sleep(0.02)

        bg = [threading.Thread(target=sample, daemon=True), threading.Thread(target=ping, daemon=True)]
        for t in bg:
            t.start()
        stream = Stream(srv.port, {"prompt": "Beside", "max_tokens": 400, "ignore_eos": True, "stream": True})
        time.sleep(0.3)
        answers = []
        t_burst = time.monotonic()
        body = {"input": "Hi again", "previous_response_id": target, "max_output_tokens": 4,
                "truncation": truncation}
        workers = [threading.Thread(target=lambda: answers.append(
            request(srv.port, "POST", "/v1/responses", body, timeout=60)[0]), daemon=True) for _ in range(16)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(60)
        t_end = time.monotonic()
        time.sleep(0.1)
        stop.set()
        for t in bg:
            t.join(10)
        stream.wait(60, "the stream beside the burst")
        gaps, last = [], None
        for t, _ in stream.arrivals:  # the gaps between arrivals within the burst
            if last is not None and t_burst <= t <= t_end + 0.2:
                gaps.append(t - last)
            last = t
        return {"answers": answers, "rss_mib": (max(peak) - base) / 1024.0, "health_ms": max(health) * 1e3,
                "gap_ms": max(gaps) * 1e3 if gaps else 0.0, "seconds": t_end - t_burst}

    short_r = burst(short)
    long_r = burst(prev)
    print("  16 requests on a 1-turn history: %r" % short_r)
    print("  16 requests on a %.0f MB history: %r" % (stored / 1e6, long_r))
    check(short_r["answers"] == [200] * 16 and long_r["answers"] == [200] * 16,
          "answers %r / %r" % (short_r["answers"], long_r["answers"]))
    # A sanitizer keeps what was freed in quarantine (256 MiB by default).
    rss_bound = 256 if SANITIZE in ("", "none") else 512
    check(long_r["rss_mib"] <= rss_bound, "RSS grew %.0f MiB with the long history" % long_r["rss_mib"])
    check(long_r["health_ms"] <= max(100, 3 * short_r["health_ms"]),
          "/health took %.0f ms beside the long history (%.0f ms beside the short)"
          % (long_r["health_ms"], short_r["health_ms"]))
    check(long_r["gap_ms"] <= max(150, 3 * short_r["gap_ms"]),
          "the stream's longest gap %.0f ms beside the long history (%.0f ms beside the short)"
          % (long_r["gap_ms"], short_r["gap_ms"]))
    dis = burst(prev, truncation="disabled")
    print("  truncation disabled: %r" % dis)
    check(dis["answers"] == [400] * 16 and dis["rss_mib"] <= rss_bound, "truncation disabled: %r" % dis)


def case_responses_store_counted_bytes(ctx):
    """34: the store's byte count is what it holds. 30 bodies of 0.9 MB
    (30,000 one-character messages each; truncation auto) stored under
    responses_store_bytes 64 MiB: the server's RSS grows within 1.5x of
    gpt2d_responses_store_bytes (the same bodies sent with store false
    first, so the parsing's own high-water mark is in the baseline). (Before:
    RSS grew ten times the counted bytes.)"""
    srv = Server(ctx, ctx.models.get("long"), "--responses-store-bytes", str(64 << 20))
    body = {"input": [{"role": "user", "content": "a"}] * 30000, "max_output_tokens": 1, "truncation": "auto"}
    for _ in range(3):
        st, _, b = request(srv.port, "POST", "/v1/responses", dict(body, store=False), timeout=60)
        check(st == 200, "store false: %d %r" % (st, b[:300]))
    base = srv.rss_kib()
    for i in range(30):
        st, _, b = request(srv.port, "POST", "/v1/responses", body, timeout=60)
        check(st == 200, "body %d: %d %r" % (i, st, b[:300]))
    grew = (srv.rss_kib() - base) * 1024.0
    counted = srv.metric("gpt2d_responses_store_bytes")
    check(srv.metric("gpt2d_responses_stored") == 30, "stored %g of 30" % srv.metric("gpt2d_responses_stored"))
    print("  counted %.1f MB, RSS grew %.1f MB" % (counted / 1e6, grew / 1e6))
    check(counted <= 64 << 20, "counted %d bytes, over the bound" % counted)
    if SANITIZE in ("", "none"):
        check(grew <= 1.5 * counted and counted <= 1.5 * grew,
              "RSS grew %.1f MB for %.1f MB counted" % (grew / 1e6, counted / 1e6))
    else:  # redzones and the freed bodies' quarantine: only a ceiling
        check(grew <= 1.5 * counted + (320 << 20),
              "RSS grew %.1f MB for %.1f MB counted (a sanitizer build)" % (grew / 1e6, counted / 1e6))


def case_responses_store_fair_keys(ctx):
    """34: the keys share the store: with responses_store_max 50, key B
    storing 60 responses evicts its own oldest, and key A's one response
    and a previous_response_id naming it still answer. (Before: one LRU for
    all keys, and A's response was gone.)"""
    ka, kb = "fair-key-aaaa", "fair-key-bbbb"
    srv = Server(ctx, ctx.models.get("long"), "--api-key", ka, "--api-key", kb, "--responses-store-max", "50")
    auth = lambda k: {"Authorization": "Bearer " + k}

    def make(key, **kw):
        st, _, b = request(srv.port, "POST", "/v1/responses", dict({"input": "Hi", "max_output_tokens": 1}, **kw),
                           headers=auth(key), timeout=20)
        check(st == 200, "POST: %d %r" % (st, b[:200]))
        return json.loads(b)["id"]

    a = make(ka)
    bs = [make(kb) for _ in range(60)]
    check(request(srv.port, "GET", "/v1/responses/" + a, headers=auth(ka))[0] == 200,
          "key B's 60 stores evicted key A's response")
    make(ka, previous_response_id=a)
    got = [request(srv.port, "GET", "/v1/responses/" + r, headers=auth(kb))[0] for r in bs]
    check(got[-1] == 200 and got[0] == 404 and srv.metric("gpt2d_responses_stored") == 50,
          "key B's own: %r" % got)


def case_responses_client_cut_not_stored(ctx):
    """34: a Responses stream its client leaves is not stored (it is not a
    response anyone got): GET and previous_response_id answer 404, and the
    log says why. (Before: stored as incomplete / max_output_tokens.)"""
    srv = Server(ctx, ctx.models.get("long"), env=STEP_DELAY)
    payload = json.dumps({"input": "Leaving", "max_output_tokens": 800, "ignore_eos": True,
                          "stream": True}).encode()
    s = connect(srv.port, 30)
    s.sendall(completion_head(len(payload), b"", b"/v1/responses") + payload)
    s.settimeout(10)
    raw = b""
    while b"response.output_text.delta" not in raw:
        chunk = s.recv(65536)
        check(chunk, "the stream ended before its first delta")
        raw += chunk
    rid = re.search(rb'"id": ?"(resp_[0-9a-f]+)"', raw)
    check(rid is not None, "no response id in %r" % raw[:400])
    rid = rid.group(1).decode()
    s.close()
    srv.wait_metric("gpt2d_running_sequences", 0, 5, "after the client left")
    time.sleep(0.2)
    check(request(srv.port, "GET", "/v1/responses/" + rid)[0] == 404, "a response its client left was stored")
    st, _, _ = request(srv.port, "POST", "/v1/responses", {"input": "x", "previous_response_id": rid})
    check(st == 404, "continuing a response its client left: %d" % st)
    check("not stored: its client left" in open(srv.log_path).read(), "the log does not say why")
def case_structured_cache_bytes(ctx):
    """issue 34 part 2: the compiled-format cache is bounded by bytes as
    well as entries: 12 distinct schemas of about 1 MiB of automaton each
    (ten required strings of up to 40 characters), under
    structured_cache_mb 4, each answered 200, and after each
    gpt2d_structured_cache_bytes stays within 4 MiB (the entry count alone,
    64, would have held all 12: 13 MB), with some kept; a SIGHUP that
    lowers structured_cache_mb to 1 evicts at once."""
    limit = 4 << 20
    conf = os.path.join(ctx.dir, "gpt2d.conf")
    with open(conf, "w") as f:
        f.write("structured_cache_mb = 4\n")
    srv = Server(ctx, ctx.models.get("tiny"), "--config", conf)
    for k in range(12):
        names = ["s%d_f%d" % (k, i) for i in range(10)]
        schema = {"type": "object", "properties": {n: {"type": "string", "maxLength": 40} for n in names},
                  "required": names}
        st, _, body = request(srv.port, "POST", "/v1/chat/completions",
                              {"model": "gpt2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                               "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
                              timeout=60)
        check(st == 200, "schema %d: %d %r" % (k, st, body[:200]))
        held = srv.metric("gpt2d_structured_cache_bytes")
        check(0 < held <= limit, "after schema %d the cache holds %d bytes; the bound is %d" % (k, held, limit))
    n = srv.metric("gpt2d_structured_cache_entries")
    check(2 <= n < 12, "%d compiled formats kept of 12 (about 1 MiB each, 4 MiB bound)" % n)
    with open(conf, "w") as f:
        f.write("structured_cache_mb = 1\n")
    srv.signal(signal.SIGHUP)
    check(srv.wait_log(r"SIGHUP: configuration reloaded; changed: .*structured_cache_mb"),
          "no reload line naming structured_cache_mb: " + srv.tail(3))
    held = srv.metric("gpt2d_structured_cache_bytes")
    check(held <= 1 << 20, "after the reload to 1 MiB the cache holds %d bytes" % held)
    check(srv.metric("gpt2d_structured_cache_entries") < n, "the reload evicted nothing")


def case_responses_item_reference_bound(ctx):
    """34: item references cannot multiply a stored message: 1,500
    references to one 900 KB stored input in a 105 KB body are a 400 naming
    `input` (their copies would pass max_body_bytes), answered at once,
    with RSS flat and /health quick. (Before: each reference copied the
    message on the loop thread: +1.3 GB, /health 1.5 s.)"""
    srv = Server(ctx, ctx.models.get("long"))
    st, _, b = request(srv.port, "POST", "/v1/responses",
                       {"input": [{"role": "user", "content": "word " * 180000}, {"role": "user", "content": "hi"}],
                        "truncation": "auto", "max_output_tokens": 1}, timeout=60)
    check(st == 200, "the stored message: %d %r" % (st, b[:200]))
    msg = json.loads(b)["output"][0]["id"]
    base = srv.rss_kib()
    body = {"input": [{"type": "item_reference", "id": msg + "_in0"}] * 1500 + [{"role": "user", "content": "hi"}],
            "truncation": "auto", "max_output_tokens": 1, "store": False}
    t0 = time.monotonic()
    st, _, b = request(srv.port, "POST", "/v1/responses", body, timeout=60)
    dt = time.monotonic() - t0
    e = error_envelope(b, "1,500 references")
    check(st == 400 and e["param"] == "input" and "max_body_bytes" in e["message"], "1,500 references: %d %r" % (st, e))
    grew = (srv.rss_kib() - base) / 1024.0
    check(grew < 64 + RSS_MARGIN_KIB / 1024 and dt < 2 * SLOW,
          "1,500 references: RSS +%.0f MiB, %.2f s" % (grew, dt))
    # One reference is still a message of the conversation.
    st, _, b = request(srv.port, "POST", "/v1/responses",
                       {"input": [{"type": "item_reference", "id": msg + "_in1"}], "max_output_tokens": 1})
    check(st == 200, "one reference: %d %r" % (st, b[:200]))


def case_embeddings_hostile(ctx):
    """38: hostile /v1/embeddings bodies get 400s naming `input` (mixed
    kinds, nested lists, non-integers, over max_embedding_inputs, an input
    past the context) and a giant batch (2,048 inputs) answered whole while
    a stream beside it keeps its pace: its longest gap within 3x (or 150
    ms) of the same stream alone."""
    srv = Server(ctx, ctx.models.get("long"))

    def post(body, timeout=60):
        st, _, b = request(srv.port, "POST", "/v1/embeddings", body, timeout=timeout)
        return st, json.loads(b)

    for bad in (["a", 1], [[1], [2, "x"]], [[[1]]], [1.5], [True], [None], {"a": 1}, [[]], [""],
                ["x"] * 2049, [[7] * 1100]):
        st, d = post({"input": bad})
        check(st == 400 and d["error"]["param"] == "input", "input %r: %d %r" % (json.dumps(bad)[:60], st, d))

    def gaps_of_stream():
        stream = Stream(srv.port, {"prompt": "Beside", "max_tokens": 200, "ignore_eos": True, "stream": True})
        stream.wait(60, "the stream")
        times = [t for t, _ in stream.arrivals]
        return max(b - a for a, b in zip(times, times[1:]))

    alone = gaps_of_stream()
    res = {}
    batch = ["input %d: %s" % (i, "word " * (10 + i % 20)) for i in range(2048)]
    t = threading.Thread(target=lambda: res.update(r=post({"input": batch, "encoding_format": "base64"}, 300)),
                         daemon=True)
    t.start()
    time.sleep(0.3)
    beside = gaps_of_stream()
    t.join(300)
    st, d = res.get("r", (0, {}))
    check(st == 200 and len(d["data"]) == 2048 and [e["index"] for e in d["data"]] == list(range(2048)),
          "the 2,048-input batch: %d %r" % (st, str(d)[:200]))
    print("  a stream's longest gap alone %.0f ms, beside 2,048 embeddings %.0f ms" % (alone * 1e3, beside * 1e3))
    check(beside <= max(0.15, 3 * alone), "the stream's longest gap beside the batch %.0f ms (alone %.0f ms)"
          % (beside * 1e3, alone * 1e3))
    srv.wait_metric("gpt2d_kv_blocks_used", 0, 10, "after the batch")


def case_structured_schemas(ctx):
    """issue 27: hostile structured outputs: huge, deep, self-referential
    and pathological schemas and regexes are a 400 naming the keyword (or
    the body's field), quickly; a regex that backtracks elsewhere runs in
    linear time; while they compile (tokenizer threads), the loop thread
    answers /health at once."""
    srv = Server(ctx, ctx.models.get("tiny"))

    def fmt(schema):
        return {"type": "json_schema", "json_schema": {"name": "h", "schema": schema}}

    deep = {}
    for _ in range(400):  # 800 levels of JSON (Python's encoder stops near 1000)
        deep = {"type": "array", "items": deep}
    huge = {"type": "object", "properties": {"p%d" % i: {"type": "string", "maxLength": 999} for i in range(400)},
            "required": ["p%d" % i for i in range(400)]}
    refused = [
        ({"response_format": fmt(huge)}, "response_format.json_schema.schema"),
        ({"response_format": fmt(deep)}, "response_format.json_schema.schema"),
        ({"response_format": fmt({"$ref": "#"})}, "response_format.json_schema.schema"),
        ({"response_format": fmt({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]})},
         "response_format.json_schema.schema"),
        ({"response_format": fmt({"enum": list(range(5000))})}, "response_format.json_schema.schema"),
        ({"response_format": fmt({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}] * 10 + [{"type": "null"}]}},
                                  "oneOf": [{"$ref": "#/$defs/a"}] * 2000})},
         "response_format.json_schema.schema"),  # oneOf's proof of disjoint branches is bounded
        ({"response_format": fmt({"type": "string", "pattern": "((a{1,999}){1,999}){1,999}"})},
         "response_format.json_schema.schema"),
        ({"guided_regex": "(x|y){1000}(x|y){1000}(x|y){1000}(z{1000}){1000}"}, "guided_regex"),
        ({"guided_regex": "(a)\\1"}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
    ]
    for extra, param in refused:
        t0 = time.monotonic()
        st, _, body = request(srv.port, "POST", "/v1/completions",
                              dict({"model": "gpt2", "prompt": "Hi", "max_tokens": 4}, **extra), timeout=60)
        dt = time.monotonic() - t0
        # A work budget refuses them (1.2-3 s here, on a nice +10 thread);
        # unbounded, they would take minutes.
        check(st == 400 and dt < 30, "%s: %d after %.1f s: %r" % (list(extra)[0], st, dt, body[:200]))
        e = error_envelope(body, list(extra)[0])
        if param is not None:
            check(e["param"] == param, "%s: param %r" % (list(extra)[0], e["param"]))
    # Accepted, bounded: a backtracking regex and a recursive schema.
    for extra in ({"guided_regex": "(a+)+(b+)+$"},
                  {"response_format": fmt({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                                           "$ref": "#/$defs/n"})}):
        t0 = time.monotonic()
        st, _, body = request(srv.port, "POST", "/v1/completions",
                              dict({"model": "gpt2", "prompt": "Hi", "max_tokens": 60}, **extra), timeout=30)
        check(st == 200 and time.monotonic() - t0 < 10, "%s: %d: %r" % (list(extra)[0], st, body[:200]))
    # Compiles in flight (distinct sources: no cache hits) and /health at once.
    done = []

    def flood(k):
        for i in range(3):
            schema = {"type": "object", "properties": {"p%d" % j: {"type": "string", "pattern": "[a-z]{1,300}"}
                                                       for j in range(40 + k * 10 + i)}}
            request(srv.port, "POST", "/v1/completions",
                    {"model": "gpt2", "prompt": "Hi", "max_tokens": 1, "response_format": fmt(schema)}, timeout=60)
        done.append(k)
    threads = [threading.Thread(target=flood, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    worst = 0.0
    while len(done) < 3:
        t0 = time.monotonic()
        st, _, _ = request(srv.port, "GET", "/health", timeout=10)
        worst = max(worst, time.monotonic() - t0)
        check(st == 200, "/health: %d" % st)
        time.sleep(0.05)
    for t in threads:
        t.join()
    check(worst < 0.5 * min(SLOW, 2), "/health took %.2f s while schemas compiled" % worst)


def case_structured_wide_state(ctx):
    """A guided_regex whose states hold thousands of positions, accepted
    (under the 4,096 the compile checks for) but costlier to mask than the
    per-token budget: its sequence ends with a 500 naming the bound, counted
    in /metrics, and a plain completion beside it in the same batch finishes
    promptly. Before the budget, (.?){1000} cost seconds a token and stalled
    every request in the batch (found by review); (.?){1000} itself is now a
    400 at compile."""
    srv = Server(ctx, ctx.models.get("tiny"))
    st, _, body = request(srv.port, "POST", "/v1/completions",
                          {"model": "gpt2", "prompt": "Hi", "max_tokens": 4, "guided_regex": "(.?){1000}"},
                          timeout=30)
    check(st == 400 and b"simultaneous positions" in body, "(.?){1000}: %d %r" % (st, body[:200]))
    check(error_envelope(body, "(.?){1000}")["param"] == "guided_regex", "(.?){1000}: param")
    wide = {}

    def guided(stream):
        t0 = time.monotonic()
        wide[stream] = request(srv.port, "POST", "/v1/completions",
                               {"model": "gpt2", "prompt": "Hi", "max_tokens": 40, "stream": stream,
                                "guided_regex": "(.?){400}"}, timeout=60) + (time.monotonic() - t0,)
    threads = [threading.Thread(target=guided, args=(k,)) for k in (False, True)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    st, _, body = request(srv.port, "POST", "/v1/completions",
                          {"model": "gpt2", "prompt": "Hello there", "max_tokens": 16, "ignore_eos": True},
                          timeout=60)
    plain_s = time.monotonic() - t0
    for t in threads:
        t.join(60)
    check(st == 200 and json.loads(body)["usage"]["completion_tokens"] == 16, "plain: %d %r" % (st, body[:200]))
    check(plain_s < 15, "the plain completion beside the wide regex took %.1f s" % plain_s)
    st, _, body, dt = wide[False]
    check(st == 500 and b"structured outputs" in body and dt < 15,
          "the wide regex: %d after %.1f s: %r" % (st, dt, body[:300]))
    error_envelope(body, "the wide regex")
    st, _, body, dt = wide[True]
    check(b"structured outputs" in body and b"[DONE]" in body and dt < 15,
          "the wide regex, streamed: %d after %.1f s: %r" % (st, dt, body[-300:]))
    check(srv.metric("gpt2d_grammar_bound_errors_total") == 2, "gpt2d_grammar_bound_errors_total")


CASES = [
    ("slow_headers", case_slow_headers),
    ("idle_connections", case_idle_connections),
    ("per_ip_limit", case_per_ip_limit),
    ("per_ip_answered", case_per_ip_answered),
    ("per_ip_default", case_per_ip_default),
    ("refusal_readable_node_fetch", case_refusal_readable_node_fetch),
    ("refusal_readable_auth", case_refusal_readable_auth),
    ("refusal_readable_at_accept", case_refusal_readable_at_accept),
    ("refusal_readable_tls", case_refusal_readable_tls),
    ("trusted_proxy_xff", case_trusted_proxy_xff),
    ("refused_metric", case_refused_metric),
    ("host_allow_list", case_host_allow_list),
    ("query_too_long", case_query_too_long),
    ("header_control_byte", case_header_control_byte),
    ("auth_trailing_ows", case_auth_trailing_ows),
    ("logit_bias_keys", case_logit_bias_keys),
    ("expect_no_body", case_expect_no_body),
    ("slow_body", case_slow_body),
    ("slow_body_rate", case_slow_body_rate),
    ("keepalive_deadlines", case_keepalive_deadlines),
    ("stalled_stream", case_stalled_stream),
    ("tokenize_flood", case_tokenize_flood),
    ("completion_flood", case_completion_flood),
    ("responses_flood", case_responses_flood),
    ("tokenize_queue", case_tokenize_queue),
    ("tokenizer_priority", case_tokenizer_priority),
    ("sigterm_timeout", case_sigterm_timeout),
    ("double_signal", case_double_signal),
    ("drain_unanswered", case_drain_unanswered),
    ("drain_tokenizing", case_drain_tokenizing),
    ("sighup_reload", case_sighup_reload),
    ("model_truncated", case_model_truncated),
    ("model_overwritten", case_model_overwritten),
    ("model_rename_exit3", case_model_rename_exit3),
    ("model_inplace_exit3", case_model_inplace_exit3),
    ("model_touch_ignored", case_model_touch_ignored),
    ("model_same_bytes_ignored", case_model_same_bytes_ignored),
    ("abandoned_nonstream_cancelled", case_abandoned_nonstream_cancelled),
    ("sequences_cap", case_sequences_cap),
    ("fair_admission", case_fair_admission),
    ("response_bytes_cap", case_response_bytes_cap),
    ("stall_cut_event_boundary", case_stall_cut_event_boundary),
    ("model_change_clean_endings", case_model_change_clean_endings),
    ("response_bytes_written_every_route", case_response_bytes_written_every_route),
    ("responses_bodies", case_responses_bodies),
    ("responses_store", case_responses_store),
    ("responses_store_reload", case_responses_store_reload),
    ("responses_cut", case_responses_cut),
    ("responses_item_reference_bound", case_responses_item_reference_bound),
    ("embeddings_hostile", case_embeddings_hostile),
    ("responses_history_amplification", case_responses_history_amplification),
    ("responses_store_counted_bytes", case_responses_store_counted_bytes),
    ("responses_store_fair_keys", case_responses_store_fair_keys),
    ("responses_client_cut_not_stored", case_responses_client_cut_not_stored),
    ("big_answers_allowed", case_big_answers_allowed),
    ("empty_key", case_empty_key),
    ("auth", case_auth),
    ("log_injection", case_log_injection),
    ("smuggling", case_smuggling),
    ("chunked_over_limit", case_chunked_over_limit),
    ("paths", case_paths),
    ("origin", case_origin),
    ("never_admissible", case_never_admissible),
    ("head_allow", case_head_allow),
    ("protocol_errors", case_protocol_errors),
    ("request_id", case_request_id),
    ("disconnects", case_disconnects),
    ("info_line_live", case_info_line_live),
    ("ctrl_c_terminal", case_ctrl_c_terminal),
    ("drain_short_streams", case_drain_short_streams),
    ("cache_cross_key", case_cache_cross_key),
    ("unseeded_replicas", case_unseeded_replicas),
    ("structured_schemas", case_structured_schemas),
    ("structured_cache_bytes", case_structured_cache_bytes),
    ("structured_wide_state", case_structured_wide_state),
    ("tls_plain_http", case_tls_plain_http),
    ("plain_tls_hello", case_plain_tls_hello),
    ("tls_handshake_stall", case_tls_handshake_stall),
    ("tls_abandoned_cancelled", case_tls_abandoned_cancelled),
    ("host_header_strict", case_host_header_strict),
    ("request_id_every_route", case_request_id_every_route),
    ("garbage_request_line", case_garbage_request_line),
    ("log_unicode_controls", case_log_unicode_controls),
    ("sighup_at_start", case_sighup_at_start),
    ("fd_limit", case_fd_limit),
]


# ---------------------------------------------------------------- driver

class Context:
    def __init__(self, gpt2d, root, models, name):
        self.gpt2d, self.models = gpt2d, models
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir)
        self.servers = []


def on_alarm(signum, frame):
    raise Fail("the case ran over its time limit")


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: test_hostile.py GPT2D [--list | CASE...]")
    if "--list" in argv[1:3]:  # `test_hostile.py --list` or `test_hostile.py GPT2D --list`
        print("\n".join(n for n, _ in CASES))
        return 0
    gpt2d = os.path.realpath(argv[1])
    names = argv[2:] or [n for n, _ in CASES]
    known = dict(CASES)
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit("unknown case(s): %s (try --list)" % ", ".join(unknown))
    root = tempfile.mkdtemp(prefix="gpt2d-hostile-")
    if RSS_MARGIN_KIB != 1024:
        print("note: a %s build: the stalled-stream memory bound has a %d KiB margin, not 1024"
              % (SANITIZE, RSS_MARGIN_KIB), flush=True)
    models = Models(gpt2d, root)
    signal.signal(signal.SIGALRM, on_alarm)
    passed = failed = skipped = 0
    try:
        for name in names:
            ctx = Context(gpt2d, root, models, name)
            for m in CASE_MODELS.get(name, ["tiny", "long"]):
                models.get(m)
            t0 = time.monotonic()
            signal.alarm(CASE_LIMITS.get(name, CASE_LIMIT_S) * min(SLOW, 2))
            try:
                known[name](ctx)
                for srv in ctx.servers:
                    if srv.neighbor is not None:
                        srv.neighbor.stopped = True
                        check(not srv.neighbor.problems,
                              "the neighbor checkpoint's client: %s" % "; ".join(srv.neighbor.problems[:3]))
                signal.alarm(0)
                passed += 1
                print("ok %s (%.1f s)" % (name, time.monotonic() - t0), flush=True)
            except Skip as e:
                signal.alarm(0)
                if gpt2d_server.require_all():
                    failed += 1
                    print("FAIL %s: %s (CI: nothing may skip)" % (name, e), flush=True)
                else:
                    skipped += 1
                    print("SKIP %s: %s" % (name, e), flush=True)
            except Exception as e:  # a case's error of any kind is its failure, reported by name
                signal.alarm(0)
                failed += 1
                why = str(e) if isinstance(e, Fail) else "%s: %s" % (e.__class__.__name__, e)
                print("FAIL %s: %s (%.1f s)" % (name, why, time.monotonic() - t0), flush=True)
            finally:
                for srv in ctx.servers:
                    srv.stop()
    finally:
        if os.environ.get("KEEP"):
            print("kept %s" % root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed) + (", %d skipped" % skipped if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
