#!/usr/bin/env python3
"""tests/hub_server.py ROOT PORTFILE LOG: a stand-in for the Hugging Face hub
on loopback, for tests/test_download.sh.

Serves ROOT/OWNER/NAME/FILE as /OWNER/NAME/resolve/REV/FILE, with byte
ranges ("Range: bytes=N-", 206) as the hub's CDN does, and
/api/models/OWNER/NAME/tree/REV as the hub's JSON file list (each file with
an "lfs" entry holding its sha256, or the contents of FILE.lfs-oid when that
exists). A file with a FILE.cut-after companion holding N is cut after N
bytes the first time it is asked for without a range: the connection closes
mid-body. Writes the port it listens on to PORTFILE and appends one line per
request to LOG: "METHOD PATH RANGE STATUS".
"""
import hashlib
import http.server
import json
import os
import sys

root, portfile, logfile = sys.argv[1], sys.argv[2], sys.argv[3]
cut_done = set()


class Hub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self, status):
        with open(logfile, "a") as f:
            f.write(f"{self.command} {self.path} {self.headers.get('Range', '-')} {status}\n")

    def reply(self, status, body, ctype="application/octet-stream", extra=()):
        self.record(status)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        parts = self.path.split("/")
        # /api/models/OWNER/NAME/tree/REV
        if len(parts) == 7 and parts[1:3] == ["api", "models"] and parts[5] == "tree":
            repo = os.path.join(root, parts[3], parts[4])
            if not os.path.isdir(repo):
                return self.reply(404, b'{"error":"Repository not found"}', "application/json")
            tree = []
            for name in sorted(os.listdir(repo)):
                if "." in name and name.rsplit(".", 1)[1] in ("cut-after", "lfs-oid"):
                    continue
                data = open(os.path.join(repo, name), "rb").read()
                oid = os.path.join(repo, name + ".lfs-oid")
                sha = open(oid).read().strip() if os.path.exists(oid) else hashlib.sha256(data).hexdigest()
                tree.append({"type": "file", "path": name, "size": len(data),
                             "lfs": {"oid": sha, "size": len(data)}})
            return self.reply(200, json.dumps(tree).encode(), "application/json")
        # /OWNER/NAME/resolve/REV/FILE
        if len(parts) != 6 or parts[3] != "resolve":
            return self.reply(404, b"Entry not found", "text/plain")
        path = os.path.join(root, parts[1], parts[2], parts[5])
        if not os.path.isfile(path):
            return self.reply(404, b"Entry not found", "text/plain")
        data = open(path, "rb").read()
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
            if start >= len(data):
                return self.reply(416, b"", "text/plain",
                                  [("Content-Range", f"bytes */{len(data)}")])
            return self.reply(206, data[start:], extra=[
                ("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")])
        cut = path + ".cut-after"
        if os.path.exists(cut) and path not in cut_done:
            cut_done.add(path)
            n = int(open(cut).read())
            self.record("200-cut")
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[:n])
            self.wfile.flush()
            self.close_connection = True
            return
        self.reply(200, data)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
with open(portfile + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(portfile + ".tmp", portfile)
server.serve_forever()
