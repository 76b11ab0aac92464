#!/usr/bin/python3
"""tools/train/prepare.py OUT_DIR GPT2D: the training text of gpt2d-tiny.

English prose that Debian 12 packages ship (tools/train/README.md names the
packages, their versions and licences; DATA.json records what was read), made
into plain paragraphs, split by whole documents into training and held-out
text (a document is held out when a hash of its name says so, about 1 in
25), tokenized with GPT-2's tokenizer (`gpt2d tokenize`, which matches
tiktoken's gpt2 encoding id for id) and written as uint16 token files with
<|endoftext|> (50256) between documents:

  OUT_DIR/train.u16, OUT_DIR/heldout.u16, OUT_DIR/heldout.txt (the held-out
  documents' text, for measuring perplexity through the server's API),
  OUT_DIR/DATA.json (packages, versions, documents, bytes and tokens).

Deterministic: the same packages give the same files."""
import glob
import hashlib
import html
import json
import os
import re
import subprocess
import sys
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PACKAGES = ["bible-kjv", "bible-kjv-text", "perl-doc", "python3.11-doc", "debian-handbook"]


def paragraphs(lines):
    """Joins wrapped lines into paragraphs; blank lines separate them."""
    out, cur = [], []
    for ln in lines:
        ln = ln.strip()
        if ln:
            cur.append(ln)
        elif cur:
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return "\n\n".join(p for p in out if len(p) > 1)


def kjv():
    """The King James Bible (public domain), one document per book."""
    text = subprocess.run(["bible", "-l0", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                          text=True).stdout
    books, name, verses = {}, None, []
    for ln in text.splitlines():
        m = re.match(r"^(\S.*?) (\d+)$", ln)
        if m:
            if name is not None and verses:
                books.setdefault(name, []).append(" ".join(verses))
            name, verses = m.group(1), []
            continue
        m = re.match(r"^\s+\d+ (.*)$", ln)
        if m:
            verses.append(m.group(1).strip())
    if name is not None and verses:
        books.setdefault(name, []).append(" ".join(verses))
    return [("kjv/" + b, "\n\n".join(ch)) for b, ch in books.items()]


POD_CODE = re.compile(r"[A-Z]<+\s*([^<>]*?)\s*>+")


def pod_text(s):
    for _ in range(4):
        s = POD_CODE.sub(lambda m: m.group(1).split("|")[0], s)
    return s


def perl():
    """perl-doc's manual pages (.pod), prose paragraphs only (no code)."""
    docs = []
    for path in sorted(glob.glob("/usr/share/perl/5.36/pod/*.pod")):
        lines, skip = [], False
        for ln in open(path, encoding="utf-8", errors="replace"):
            if ln.startswith("=begin") or ln.startswith("=for"):
                skip = ln.startswith("=begin")
                lines.append("")
                continue
            if ln.startswith("=end"):
                skip = False
                continue
            if skip:
                continue
            if ln.startswith("="):
                cmd, _, rest = ln.partition(" ")
                lines += ["", pod_text(rest) if cmd in ("=head1", "=head2", "=head3", "=head4", "=item") else "", ""]
                continue
            if ln[:1] in (" ", "\t"):
                lines.append("")  # verbatim (code)
                continue
            lines.append(pod_text(ln))
        docs.append(("perl/" + os.path.basename(path), paragraphs(lines)))
    return docs


RST_ROLE = re.compile(r":[a-z:]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")
RST_LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`_+")


def rst_text(s):
    s = RST_ROLE.sub(r"\1", s)
    s = RST_LINK.sub(r"\1", s)
    s = re.sub(r"``([^`]*)``", r"\1", s)
    s = re.sub(r"`([^`]*)`_*", r"\1", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"\1", s)
    s = re.sub(r"\|([^|\s]+)\|", r"\1", s)
    return s


def python_docs():
    """Python 3.11's documentation (reStructuredText sources), prose only."""
    docs = []
    base = "/usr/share/doc/python3.11/html/_sources/"
    for path in sorted(glob.glob(base + "**/*.txt", recursive=True)):
        lines = []
        for ln in open(path, encoding="utf-8", errors="replace"):
            if ln[:1] in (" ", "\t") or ln.startswith(".."):
                lines.append("")  # code, directives, their bodies
            elif re.match(r"^([=\-~^*#+\"'])\1{2,}\s*$", ln):
                lines.append("")  # heading underlines
            else:
                lines.append(rst_text(ln.rstrip("\n").rstrip(":")) if ln.rstrip().endswith("::")
                             else rst_text(ln))
        docs.append(("python/" + os.path.relpath(path, base), paragraphs(lines)))
    return docs


def handbook():
    """The Debian Administrator's Handbook (English HTML), text outside <pre>."""
    docs = []
    for path in sorted(glob.glob("/usr/share/doc/debian-handbook/html/en-US/*.html")):
        s = open(path, encoding="utf-8", errors="replace").read()
        s = re.sub(r"(?is)<(script|style|pre|head)\b.*?</\1>", "\n\n", s)
        s = re.sub(r"(?i)</?(p|div|h\d|li|dt|dd|tr|table|br|title)\b[^>]*>", "\n\n", s)
        s = html.unescape(re.sub(r"<[^>]+>", "", s))
        docs.append(("handbook/" + os.path.basename(path), paragraphs(s.splitlines())))
    return docs


def versions():
    out = {}
    for p in PACKAGES:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", p], capture_output=True, text=True)
        out[p] = r.stdout.strip() or None
    return out


def main():
    out_dir, gpt2d = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    docs = [d for d in kjv() + perl() + python_docs() + handbook() if len(d[1]) >= 200]
    held = lambda name: hashlib.sha256(name.encode()).digest()[0] < 256 // 25  # noqa: E731
    split = {"train": [d for d in docs if not held(d[0])], "heldout": [d for d in docs if held(d[0])]}
    info = {"packages": versions(), "documents": {}}
    for part, ds in split.items():
        js = "".join(json.dumps(t) + "\n" for _, t in ds)
        r = subprocess.run([gpt2d, "tokenize", "--model", os.path.join(ROOT, "tokenizer", "data"), "--jsonl"],
                           input=js, capture_output=True, text=True, check=True)
        ids = array("H")
        for ln in r.stdout.splitlines():
            ids.extend(json.loads(ln))
            ids.append(50256)
        with open(os.path.join(out_dir, part + ".u16"), "wb") as f:
            ids.tofile(f)
        if part == "heldout":
            with open(os.path.join(out_dir, "heldout.txt"), "w") as f:
                f.write("\n<|endoftext|>\n".join(t for _, t in ds))
        info["documents"][part] = {"count": len(ds), "bytes": sum(len(t.encode()) for _, t in ds),
                                   "tokens": len(ids), "names": [n for n, _ in ds] if part == "heldout" else None}
        print(f"prepare: {part}: {len(ds)} documents, {len(ids)} tokens", file=sys.stderr)
    with open(os.path.join(out_dir, "DATA.json"), "w") as f:
        json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
