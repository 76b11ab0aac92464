#!/usr/bin/env python3
"""tests/api_examples.py DOC BASE: runs every curl example of docs/api.md
against a live server at BASE (in place of http://127.0.0.1:8080).

An example is an indented block whose first line starts with "curl" (lines
ending in a backslash continue it). Each must exit 0 and print JSON, or, for
a stream, SSE events ending with "data: [DONE]" (a Responses stream: named
events numbered from 0, ending with its final response). The lines of the block after
the command, if any, are the documented answer: the output must be exactly
that JSON, byte for byte (the compact JSON the server writes).

A block that starts with `{"id":` is the shape of an answer, shown without
the command: it must be compact JSON (broken over lines only), with `{...}`
standing for any object, and have the keys, in the server's order, of the
answer of the curl example before it.
"""
import json
import subprocess
import sys

doc, base = sys.argv[1], sys.argv[2]
blocks, cur = [], None
for line in open(doc).read().splitlines():
    if line.startswith("    "):
        if cur is None:
            cur = []
        cur.append(line[4:])
    else:
        if cur:
            blocks.append(cur)
        cur = None
if cur:
    blocks.append(cur)

ANY = "\u0000any object"


def shape(doc, got, path):
    if doc == ANY:
        return
    if isinstance(doc, dict):
        if not isinstance(got, dict) or list(doc) != list(got):
            sys.exit(f"FAIL: the answer's shape at {path}: documented {list(doc)}, "
                     f"the server writes {list(got) if isinstance(got, dict) else got!r}")
        for k in doc:
            shape(doc[k], got[k], f"{path}.{k}")
    elif isinstance(doc, list) and doc:
        if not isinstance(got, list) or not got:
            sys.exit(f"FAIL: the answer's shape at {path}: documented a list, the server writes {got!r}")
        shape(doc[0], got[0], f"{path}[0]")


ran = shapes = 0
last = None  # the answer of the last curl example
for b in blocks:
    if b[0].startswith('{"id":'):
        text = "".join(line.strip() for line in b).replace("{...}", json.dumps(ANY))
        doc_answer = json.loads(text)
        if json.dumps(doc_answer, separators=(",", ":"), ensure_ascii=False) != text:
            sys.exit(f"FAIL: a documented answer is not compact JSON: {text}")
        if last is None:
            sys.exit(f"FAIL: a documented answer with no curl example before it: {text}")
        shape(doc_answer, last, "answer")
        shapes += 1
        continue
    if not b[0].startswith("curl "):
        continue
    cmd = [b[0]]
    i = 1
    while cmd[-1].endswith("\\"):
        cmd[-1] = cmd[-1][:-1]
        cmd.append(b[i])
        i += 1
    expected = "\n".join(b[i:]).strip()
    shell = " ".join(c.strip() for c in cmd).replace("http://127.0.0.1:8080", base)
    r = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        sys.exit(f"FAIL: `{shell}` exited {r.returncode}: {r.stderr}")
    out = r.stdout
    # A stream may open with SSE comments (": waiting" while the request is
    # queued, when the machine is busy): not events, so not the answer.
    while out.startswith(":"):
        out = out.split("\n\n", 1)[1] if "\n\n" in out else ""
    if out.startswith("event: "):
        # The Responses API's named events: "event: TYPE" and its data, each
        # data's type the event's, sequence_number 0, 1, ..., ending with the
        # final response (no [DONE]).
        events = [e.split("\n") for e in out.split("\n\n") if e.strip() and not e.startswith(":")]
        for n, e in enumerate(events):
            data = json.loads(e[1][len("data: "):]) if len(e) == 2 and e[1].startswith("data: ") else None
            if data is None or data.get("type") != e[0][len("event: "):] or data.get("sequence_number") != n:
                sys.exit(f"FAIL: `{shell}`: event {n} is {e!r}")
        if events[-1][0] not in ("event: response.completed", "event: response.incomplete"):
            sys.exit(f"FAIL: `{shell}`: the stream ends with {events[-1][0]!r}")
    elif out.startswith("data: "):
        events = [e for e in out.split("\n\n") if e.strip()]
        if events[-1] != "data: [DONE]":
            sys.exit(f"FAIL: `{shell}`: the stream does not end with [DONE]: {out[-200:]!r}")
        for e in events[:-1]:
            if not e.startswith(":"):
                json.loads(e[len("data: "):])
    else:
        try:
            got = last = json.loads(out)
        except ValueError:
            sys.exit(f"FAIL: `{shell}` did not print JSON: {out[:200]!r}")
        if isinstance(got.get("error"), dict) and not expected:  # (a response object has "error": null)
            sys.exit(f"FAIL: `{shell}` answered an error: {out}")
        # The documented answer is what the server writes, byte for byte
        # (compact JSON, keys in the server's order); an answer that holds a
        # time, an id or random text is shown without its output.
        if expected and out.strip() != expected:
            sys.exit(f"FAIL: `{shell}`\n  documented: {expected}\n  got:        {out}")
    ran += 1
if ran < 8:
    sys.exit(f"FAIL: only {ran} curl examples found in {doc}")
if shapes < 2:
    sys.exit(f"FAIL: only {shapes} documented answer shapes found in {doc}")
print(f"api.md: {ran} curl examples ran as documented, {shapes} answer shapes match")
