#!/usr/bin/env python3
"""tests/lib/gpt2d_server.py: the one way the tests start `gpt2d serve`.

Every test that starts a server goes through here: test_hostile.py,
test_server_threads.py and test_systemd.py import it; test_server.sh,
test_api.sh and test_nginx.sh call its command line through the functions of
tests/lib/server.sh. No Node test starts a server (they are given a URL).

As a module:

    import gpt2d_server as gs
    gs.make_model(gpt2d, directory, gs.SHAPES["tiny"])   # a synth checkpoint
    srv = gs.Server(gpt2d, directory, ["--max-running", "1"], log_path=log)
    srv.port, srv.base, srv.pid, srv.log(), srv.tail(3)
    srv.signal(signal.SIGHUP); srv.terminate(30); srv.wait(5); srv.stop()

The server's environment is the caller's without the variables that systemd
sets (JOURNAL_STREAM, LISTEN_*, NOTIFY_SOCKET, WATCHDOG_*), plus `env`; its
stdout and stderr go to log_path. By default the command is `GPT2D serve
--model DIR --port 0 ARGS...` and the server is ready once its log says
"... on http://127.0.0.1:PORT" (https:// with tls_cert_file). For
systemd's protocols (test_systemd.py): `launcher` puts a program before
GPT2D (systemd-socket-activate -l ADDR), `port0=False` leaves --port out, `ready="health"` waits for GET /health on a
known `port`, `ready=None` returns at once (the caller waits its own way:
`wait_listening`). `preexec` runs in the child before the exec (a
resource limit: `ulimit -n` as a test wants it).

As a command (for the shell suites, through tests/lib/server.sh):

    gpt2d_server.py model GPT2D DIR SHAPE
        make a synth checkpoint of SHAPE with the real tokenizer in DIR (once)
    gpt2d_server.py exec LOG GPT2D MODEL [SERVE_OPTIONS...]
        become `GPT2D serve --model MODEL --port 0 OPTIONS` with its output
        in LOG and the environment above (run it in the background: $! is
        then the server's own pid, for kill and wait)
    gpt2d_server.py wait-port LOG PID [SECONDS]
        print the port once LOG says the server listens; exit 1 with the
        log's tail when PID exits first or SECONDS (30) pass
    gpt2d_server.py free-port
        print a loopback port that was free a moment ago
    gpt2d_server.py skip REASON
        stand in for a test whose program is missing at configure time:
        skip (exit 77) with the reason, or fail where nothing may skip
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "..", "..", "tokenizer", "data")

# The checkpoints the tests use (`gpt2d synth` options).
SHAPES = {
    # 2 layers, width 64, context 128: the server tests' default.
    "tiny": ["--layers", "2", "--embd", "64", "--heads", "4", "--ctx", "128", "--seed", "3"],
    # The same with a context of 1024, for long and wide streams.
    "long": ["--layers", "2", "--embd", "64", "--heads", "4", "--ctx", "1024", "--seed", "3"],
    "long2": ["--layers", "2", "--embd", "64", "--heads", "4", "--ctx", "1024", "--seed", "5"],
    # GPT-2-small width, 4 layers: real compute per token.
    "slow": ["--layers", "4", "--seed", "4"],
    # 16 layers, width 64: 8 KiB of KV cache a position.
    "deep": ["--layers", "16", "--embd", "64", "--heads", "4", "--ctx", "1024", "--seed", "7"],
    # 1 layer, width 32, context 1024: little KV cache per token.
    "thin": ["--layers", "1", "--embd", "32", "--heads", "2", "--ctx", "1024", "--seed", "6"],
    # test_server_threads.py's: context 256.
    "threads": ["--layers", "2", "--embd", "64", "--heads", "4", "--ctx", "256", "--seed", "9"],
}

# What systemd passes a service; a test server gets none of it unless asked.
SYSTEMD_VARS = ("JOURNAL_STREAM", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "NOTIFY_SOCKET",
                "WATCHDOG_USEC", "WATCHDOG_PID")
LISTENING = re.compile(r" on https?://127\.0\.0\.1:(\d+)$", re.M)


class StartError(Exception):
    """The server exited or stayed silent during start-up; the message says which, with its log's tail."""


def require_all():
    """True in CI (GPT2D_REQUIRE_ALL=1, as scripts/test.sh sets, or CI): nothing may skip."""
    return os.environ.get("GPT2D_REQUIRE_ALL", "0") == "1" or bool(os.environ.get("CI"))


def skip(reason):
    """Ends a test whose tools are missing: exit 77 (meson's SKIP) with the
    reason, or exit 1 where nothing may skip."""
    print("SKIP: " + reason, file=sys.stderr)
    if require_all():
        print("FAIL: GPT2D_REQUIRE_ALL=1: nothing may skip", file=sys.stderr)
        sys.exit(1)
    sys.exit(77)


def make_model(gpt2d, directory, synth_args):
    """A `gpt2d synth` checkpoint with the real GPT-2 tokenizer in directory,
    made once (an existing model.safetensors is kept). Returns directory."""
    if not os.path.exists(os.path.join(directory, "model.safetensors")):
        os.makedirs(directory, exist_ok=True)
        subprocess.run([gpt2d, "synth", os.path.join(directory, "model.safetensors")] + list(synth_args),
                       check=True, stdout=subprocess.DEVNULL)
        for f in ("vocab.json", "merges.txt"):
            shutil.copy(os.path.join(TOKENIZER, f), directory)
    return directory


def server_env(env=None):
    e = {k: v for k, v in os.environ.items() if k not in SYSTEMD_VARS}
    e.update(env or {})
    return e


def serve_argv(gpt2d, model, args=(), port0=True, launcher=()):
    return list(launcher) + [gpt2d, "serve", "--model", model] + (["--port", "0"] if port0 else []) + list(args)


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def log_port(path):
    """The port the log at path says the server listens on, or None."""
    m = LISTENING.search(read_text(path))
    return int(m.group(1)) if m else None


def tail_of(path, n):
    return " | ".join(read_text(path).strip().splitlines()[-n:])


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    """One `gpt2d serve`, its log in log_path; ready when the constructor returns."""

    def __init__(self, gpt2d, model, args=(), *, log_path, env=None, port0=True, launcher=(), nice=0,
                 ready="listen", port=None, timeout=30, preexec=None):
        self.log_path, self.args, self.port = log_path, list(args), port
        self.argv = serve_argv(gpt2d, model, args, port0, launcher)

        def child():  # in the child before exec: its niceness, then the caller's (an rlimit)
            if nice:
                os.nice(nice)
            if preexec is not None:
                preexec()
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=server_env(env),
                                         preexec_fn=child if nice or preexec is not None else None)
        self.pid = self.proc.pid
        if ready == "listen":
            self._wait(timeout, lambda: log_port(self.log_path))
            self.port = log_port(self.log_path)
        elif ready == "health":
            self._wait(timeout, self.healthy)

    def _wait(self, timeout, ready):
        deadline = time.monotonic() + timeout
        while not ready():
            rc = self.proc.poll()
            if rc is not None:
                raise StartError("gpt2d serve %s exited during start-up (status %d): %s"
                                 % (" ".join(self.args), rc, self.tail(3)))
            if time.monotonic() >= deadline:
                self.stop()
                raise StartError("the server did not start in %g s: %s" % (timeout, self.tail(3)))
            time.sleep(0.05)

    def wait_listening(self, timeout):
        """For ready=None: waits until the log names the port (StartError
        when the server exits first or timeout seconds pass); sets port."""
        self._wait(timeout, lambda: log_port(self.log_path))
        self.port = log_port(self.log_path)

    def healthy(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    @property
    def base(self):
        return "http://127.0.0.1:%d" % self.port

    def log(self):
        return read_text(self.log_path)

    def log_bytes(self):
        with open(self.log_path, "rb") as f:
            return f.read()

    def tail(self, n):
        return tail_of(self.log_path, n)

    def wait_log(self, pattern, count=1, timeout=10):
        """True once the log holds count matches of the regex pattern, False
        after timeout seconds: what a test waits on after an asynchronous
        action (a signal's reload) before it looks at the outcome."""
        deadline = time.monotonic() + timeout
        while len(re.findall(pattern, self.log())) < count:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        """The exit status, or None when still running after timeout seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, timeout=30):
        """SIGTERM, then the exit status (None when still running after timeout seconds)."""
        self.proc.terminate()
        return self.wait(timeout)

    def stop(self):
        """SIGKILL when still running; always reaps it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def main(argv):
    usage = __doc__[__doc__.index("As a command"):]
    if len(argv) < 2:
        sys.exit(usage)
    cmd, rest = argv[1], argv[2:]
    if cmd == "model" and len(rest) == 3:
        make_model(rest[0], rest[1], SHAPES[rest[2]])
        return 0
    if cmd == "skip" and len(rest) == 1:
        skip(rest[0])
    if cmd == "exec" and len(rest) >= 3:
        log, gpt2d, model = rest[:3]
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        argv = serve_argv(gpt2d, model, rest[3:])
        os.execve(argv[0], argv, server_env())
    if cmd == "wait-port" and len(rest) in (2, 3):
        log, pid = rest[0], int(rest[1])
        deadline = time.monotonic() + (float(rest[2]) if len(rest) == 3 else 30)
        while True:
            port = log_port(log)
            if port is not None:
                print(port)
                return 0
            try:
                os.kill(pid, 0)
                alive = not open("/proc/%d/stat" % pid).read().split(") ", 1)[1].startswith("Z")
            except (OSError, IndexError):
                alive = False
            if not alive:
                print("exited during start-up: " + tail_of(log, 3), file=sys.stderr)
                return 1
            if time.monotonic() >= deadline:
                print("did not start: " + tail_of(log, 3), file=sys.stderr)
                return 1
            time.sleep(0.05)
    if cmd == "free-port" and not rest:
        print(free_port())
        return 0
    sys.exit(usage)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
