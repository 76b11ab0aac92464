#!/usr/bin/env python3
"""tests/test_systemd.py GPT2D UNITDIR: gpt2d under systemd's protocols, with
systemd's own tools where they exist:

- the unit files (as meson configures them for installation) pass
  `systemd-analyze verify` with no warning at all, the template
  gpt2d@.service as the instance gpt2d@8081.service too, and
  `systemd-analyze security` rates both services' exposure at most 2.0;
- gpt2d@.service is gpt2d.service line for line but for its Description
  and the instance's port on ExecStart (`--port %i`), and that ExecStart,
  run as systemd runs it for an instance (%i the port) with a
  configuration that names another port, serves on the instance's port;
- a fake NOTIFY_SOCKET receives STATUS=loading, READY=1 (only once the model
  is loaded and the socket listens), STATUS=serving, WATCHDOG=1 at half
  WATCHDOG_USEC, STOPPING=1 and STATUS=draining on SIGTERM, in that order;
- a wedged engine step (GPT2D_TEST_STEP_DELAY_MS) stops the watchdog pings
  while the loop thread is still alive, and they resume after it;
- socket activation with systemd-socket-activate: gpt2d serves on the
  inherited socket, ignoring host and port; a descriptor that is not a
  listening socket stops start-up with one clear line;
- with JOURNAL_STREAM naming stderr, every log line carries a syslog
  priority prefix, and a start-up failure is at priority 3.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "lib"))
import gpt2d_server  # noqa: E402 (tests/lib: the harness every server test uses)

gpt2d, unitdir = os.path.abspath(sys.argv[1]), sys.argv[2]
for tool in ("systemd-analyze", "systemd-socket-activate"):
    if shutil.which(tool) is None:
        gpt2d_server.skip(tool + " is not installed (scripts/setup.sh --test installs systemd)")
tmp = tempfile.mkdtemp(prefix="gpt2d-systemd-")
procs = []


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    for name in sorted(os.listdir(tmp)):
        if name.endswith(".log"):
            print("==", name, file=sys.stderr)
            print(open(os.path.join(tmp, name), errors="replace").read()[-3000:], file=sys.stderr)
    sys.exit(1)


def cleanup():
    for p in procs:
        p.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    fail("timed out waiting for " + what)


def http(port, path, body=None, timeout=30):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def complete(port, max_tokens=4):
    st, body = http(port, "/v1/completions",
                    {"model": "gpt2", "prompt": "Hello", "max_tokens": max_tokens,
                     "temperature": 0, "ignore_eos": True})
    d = json.loads(body)
    if st != 200 or d["usage"]["completion_tokens"] != max_tokens:
        fail(f"completion: {st} {body!r}")


class Notify:
    """A fake systemd notification socket: records (time, message)."""

    def __init__(self, name):
        self.path = os.path.join(tmp, name + ".sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.msgs = []
        self.lock = threading.Lock()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            data = self.sock.recv(4096)
            with self.lock:
                for line in data.decode().split("\n"):
                    if line:
                        self.msgs.append((time.monotonic(), line))

    def lines(self):
        with self.lock:
            return [m for _, m in self.msgs]

    def times(self, msg):
        with self.lock:
            return [t for t, m in self.msgs if m == msg]


def start(name, args, env=None, port0=True):
    """A server (tests/lib/gpt2d_server.py: none of systemd's variables but
    env's), not waited for: each part waits for what it tests."""
    p = gpt2d_server.Server(gpt2d, model, args, log_path=os.path.join(tmp, name + ".log"), env=env,
                            port0=port0, ready=None)
    procs.append(p)
    return p, p.log_path


def log_port(name):
    text = open(os.path.join(tmp, name + ".log")).read()
    for line in text.splitlines():
        if " on http://127.0.0.1:" in line:
            return int(line.rsplit(":", 1)[1])
    return None


def stop(p, what):
    rc = p.terminate(30)
    if rc is None:
        fail(what + ": did not exit after SIGTERM")
    if rc != 0:
        fail(f"{what}: exit status {rc} after SIGTERM")


try:
    # ---- the unit files ----------------------------------------------------
    units = os.path.join(tmp, "units")
    os.mkdir(units)
    for u in ("gpt2d.service", "gpt2d@.service", "gpt2d.socket"):
        text = open(os.path.join(unitdir, u)).read()
        exec_start = [l for l in text.splitlines() if l.startswith("ExecStart=")]
        if u.endswith(".service"):
            if len(exec_start) != 1 or not exec_start[0].split("=", 1)[1].split()[0].endswith("/gpt2d"):
                fail("gpt2d.service: ExecStart= is not the gpt2d binary: %r" % exec_start)
            # The installed path does not exist on a build machine: point it
            # at the binary just built, the rest of the file unchanged.
            text = text.replace(exec_start[0].split("=", 1)[1].split()[0], gpt2d)
        open(os.path.join(units, u), "w").write(text)
    # An instance, as `systemctl enable gpt2d@8081` names it: a link to the
    # template, whose %i is then 8081.
    os.symlink("gpt2d@.service", os.path.join(units, "gpt2d@8081.service"))
    r = subprocess.run(["systemd-analyze", "verify", os.path.join(units, "gpt2d.service"),
                        os.path.join(units, "gpt2d@8081.service"), os.path.join(units, "gpt2d.socket")],
                       capture_output=True, text=True)
    if r.returncode != 0 or r.stdout.strip() or r.stderr.strip():
        fail("systemd-analyze verify: %d %s %s" % (r.returncode, r.stdout, r.stderr))
    for u in ("gpt2d.service", "gpt2d@8081.service"):
        r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=20",
                            os.path.join(units, u)], capture_output=True, text=True)
        if r.returncode != 0 or f"Overall exposure level for {u}: 1." not in r.stdout:
            fail(f"systemd-analyze security {u}: exposure above 2.0: " + r.stdout[-300:] + r.stderr)
    service = open(os.path.join(units, "gpt2d.service")).read()
    template = open(os.path.join(units, "gpt2d@.service")).read()

    def directives(text):  # the lines systemd reads, but the Description
        return [l for l in text.splitlines() if l and not l.startswith(("#", "Description="))]
    want = [l + " --port %i" if l.startswith("ExecStart=") else l for l in directives(service)]
    if directives(template) != want:
        diff = [l for l in directives(template) if l not in want] + ["!" + l for l in want if l not in directives(template)]
        fail("gpt2d@.service is not gpt2d.service with --port %%i: %r" % diff)
    for directive in ("Type=notify", "WatchdogSec=", "DynamicUser=yes", "ProtectSystem=strict",
                      "ProtectHome=yes", "PrivateTmp=yes", "NoNewPrivileges=yes",
                      "RestrictAddressFamilies=", "SystemCallFilter=@system-service",
                      "LimitNOFILE=", "Restart=on-failure", "ExecReload=/bin/kill -HUP $MAINPID"):
        if "\n" + directive not in service:
            fail("gpt2d.service lacks " + directive)
    print("units: verify clean, security", r.stdout.strip().splitlines()[-1])

    model = gpt2d_server.make_model(gpt2d, os.path.join(tmp, "model"), gpt2d_server.SHAPES["tiny"])

    # ---- a template instance, as systemd runs it --------------------------------
    # ExecStart with %i the instance's port (systemd's expansion) and the
    # configuration file replaced by one naming the test model and another
    # port: the instance's port wins.
    port = gpt2d_server.free_port()
    conf = os.path.join(tmp, "instance.conf")
    with open(conf, "w") as f:
        f.write(f"model = {model}\nport = 1\nkv_cache_mb = 64\n")
    line = [l for l in template.splitlines() if l.startswith("ExecStart=")][0].split("=", 1)[1]
    argv = [conf if a == "/etc/gpt2d/gpt2d.conf" or a.endswith("/gpt2d/gpt2d.conf") else a.replace("%i", str(port))
            for a in line.split()]
    if argv[-2:] != ["--port", str(port)] or conf not in argv:
        fail("could not make the instance's command line from %r: %r" % (line, argv))
    with open(os.path.join(tmp, "instance.log"), "wb") as log:
        inst = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=gpt2d_server.server_env())
    try:
        def up():
            if inst.poll() is not None:
                fail("the instance exited: %s" % open(os.path.join(tmp, "instance.log")).read()[-500:])
            return log_port("instance")
        if wait_for(up, 30, "the instance gpt2d@%d" % port) != port:
            fail("the instance serves on %s, not its port %d" % (log_port("instance"), port))
        complete(port)
        inst.terminate()
        if inst.wait(30) != 0:
            fail("the instance: exit status %s after SIGTERM" % inst.returncode)
    finally:
        if inst.poll() is None:
            inst.kill()
            inst.wait()
    print("template: gpt2d@%d served on its port, past the file's port = 1" % port)

    # ---- notifications, in order ---------------------------------------------
    n = Notify("notify")
    p, _ = start("notify", [], {"NOTIFY_SOCKET": n.path, "WATCHDOG_USEC": "400000"})
    wait_for(lambda: "READY=1" in n.lines(), 30, "READY=1")
    port = log_port("notify")
    if port is None:
        fail("READY=1 came before the server said it listens")
    # READY means ready: a request right now succeeds.
    complete(port)
    wait_for(lambda: len(n.times("WATCHDOG=1")) >= 4, 10, "four WATCHDOG=1")
    stop(p, "notify")
    # The messages are read off the socket by another thread: the last may
    # not be in yet when the process has exited.
    wait_for(lambda: any(m.startswith("STATUS=draining") for m in n.lines()), 5, "STATUS=draining")
    msgs = n.lines()

    def first(prefix):
        for i, m in enumerate(msgs):
            if m.startswith(prefix):
                return i
        fail(f"no {prefix} among {msgs}")

    order = [first(x) for x in ("STATUS=loading", "READY=1", "STATUS=serving", "WATCHDOG=1",
                                "STOPPING=1", "STATUS=draining")]
    if order != sorted(order):
        fail(f"notifications out of order: {msgs}")
    if msgs.count("READY=1") != 1:
        fail("READY=1 sent more than once")
    pings = n.times("WATCHDOG=1")
    gaps = sorted(b - a for a, b in zip(pings, pings[1:]))
    if not 0.1 < gaps[len(gaps) // 2] < 0.35:
        fail(f"WATCHDOG=1 every {gaps[len(gaps) // 2]:.2f} s, not half of 0.4 s")
    print("notify: %d messages in order, watchdog median gap %.2f s" % (len(msgs), gaps[len(gaps) // 2]))

    # ---- a wedged step stops the pings ---------------------------------------
    n = Notify("wedge")
    p, _ = start("wedge", [], {"NOTIFY_SOCKET": n.path, "WATCHDOG_USEC": "400000",
                               "GPT2D_TEST_STEP_DELAY_MS": "1500"})
    wait_for(lambda: "READY=1" in n.lines(), 30, "READY=1 (wedge)")
    port = log_port("wedge")
    wait_for(lambda: len(n.times("WATCHDOG=1")) >= 3, 10, "pings before the wedge")
    t0 = time.monotonic()
    complete(port, max_tokens=1)  # one step: 1.5 s
    t1 = time.monotonic()
    wait_for(lambda: any(t > t1 for t in n.times("WATCHDOG=1")), 5, "pings after the wedge")
    pings = n.times("WATCHDOG=1")
    during = [b - a for a, b in zip(pings, pings[1:]) if b > t0 and a < t1]
    if not during or max(during) < 1.0:
        fail(f"the pings went on during a 1.5 s step: gaps {during}")
    stop(p, "wedge")
    if "watchdog: a step has run" not in open(os.path.join(tmp, "wedge.log")).read():
        fail("the skipped ping was not logged")
    print("watchdog: the longest gap during a wedged step %.2f s" % max(during))

    # ---- socket activation -----------------------------------------------------
    port = gpt2d_server.free_port()
    # host and port point nowhere: the inherited socket must be what serves.
    try:
        p = gpt2d_server.Server(gpt2d, model, ["--host", "192.0.2.1", "--port", "1"],
                                log_path=os.path.join(tmp, "activate.log"), port0=False,
                                launcher=["systemd-socket-activate", "-l", f"127.0.0.1:{port}"],
                                ready="health", port=port, timeout=30)
    except gpt2d_server.StartError as e:
        fail("timed out waiting for the socket-activated server: %s" % e)
    procs.append(p)
    complete(port)
    text = open(os.path.join(tmp, "activate.log")).read()
    if "on the socket systemd passed" not in text:
        fail("socket activation: not served on the inherited socket")
    stop(p, "socket-activated server")
    print("socket activation: served on 127.0.0.1:%d" % port)

    # A descriptor 3 that is not a listening socket: one clear line, exit 1.
    r = subprocess.run(["bash", "-c", 'exec 3</dev/null; LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" serve --model "$1"',
                        gpt2d, model], capture_output=True, text=True, timeout=60)
    if r.returncode != 1 or "not a listening stream socket" not in r.stderr:
        fail("a bad LISTEN_FDS: %d %s" % (r.returncode, r.stderr))

    # ---- the journal's priority prefixes ---------------------------------------
    path = os.path.join(tmp, "journal.log")
    with open(path, "w") as f:
        st = os.fstat(f.fileno())
        p, log = start("journal", [], {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    # start() opened journal.log again (the same inode): stderr is that file.
    def jport():
        for line in open(path).read().splitlines():
            if " on http://127.0.0.1:" in line:
                return int(line.rsplit(":", 1)[1])
        return None
    port = wait_for(jport, 30, "the journal server")
    complete(port)
    stop(p, "journal")
    lines = open(path).read().splitlines()
    if not lines or any(not (l.startswith("<6>") or l.startswith("<4>") or l.startswith("<3>"))
                        for l in lines):
        fail("journal: a line without a priority prefix: %r" % lines)
    if not any(l.startswith("<6>") and "/v1/completions status=200" in l for l in lines):
        fail("journal: no access line at priority 6: %r" % lines)
    with open(os.path.join(tmp, "journal-fail.log"), "w") as f:
        st = os.fstat(f.fileno())
        e = dict(os.environ, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
        r = subprocess.run([gpt2d, "serve", "--model", os.path.join(tmp, "nothing")],
                           stderr=f, env=e, timeout=30)
    text = open(os.path.join(tmp, "journal-fail.log")).read()
    if r.returncode == 0 or "\n<3>gpt2d serve: " not in "\n" + text:
        fail("journal: a start-up failure is not at priority 3: %r" % text)
    print("journal: %d lines, all with a priority prefix" % len(lines))
    print("systemd: all checks passed")
finally:
    cleanup()
