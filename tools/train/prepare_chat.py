#!/usr/bin/python3
"""tools/train/prepare_chat.py OUT_DIR GPT2D: the fine-tuning text that taught
gpt2d-tiny to answer a chat turn (issue 35).

Three parts, tokenized with `gpt2d tokenize` like prepare.py's, written as
uint16 token files with <|endoftext|> (50256) between documents:

- dialogues in the built-in chat template's exact format (server/api/
  chat_template.c: "User: {q}\\n\\nAssistant: {a}\\n\\n" per turn), two to
  four turns each, from question/answer text that Debian packages ship:
  perlfaq1-9 (perl-doc; perlfaq8 is one of the card's held-out documents
  and is left out), the Python FAQ (python3.11-doc, faq/*.rst), the Debian
  FAQ (debian-faq) and the everyday exchanges of tools/train/chat_pairs.txt
  (written by the project). An answer is its section's first prose
  paragraphs (code dropped), cut at a sentence end after 400 characters.
  Questions that are prompts of models/gpt2d-tiny/chat_prompts.txt (the
  evaluation) are left out. The pairs are drawn into dialogues DIALOGUE_ROUNDS
  times, each time in another seeded order;
- broader English: the Jargon File 4.4.7 (jargon-text, public domain),
  paragraphs of 80 characters or more;
- a third of prepare.py's training documents (chosen by a hash of each
  name), so that the card's held-out perplexity does not drift far.

Also the held-out text of another source, never trained on:
OUT_DIR/other.u16, doc-debian's documents (the Debian constitution, social
contract and manifesto, the bug-tracking system's guides, the mailing lists'
description) and the first prose of the Debian Reference
(debian-reference-en); and prepare.py's held-out set, OUT_DIR/heldout.u16,
the card's (byte for byte the file in models/gpt2d-tiny).

OUT_DIR/train.u16 is the mix, OUT_DIR/DATA.json what it holds. Deterministic:
the same packages give the same files."""
import glob
import gzip
import hashlib
import html
import json
import os
import random
import re
import subprocess
import sys
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import prepare  # noqa: E402

PACKAGES = {"perl-doc": "GPL-1+ or Artistic", "python3.11-doc": "PSF License",
            "debian-faq": "verbatim and modified copying permitted under the same notice (Software in the Public Interest)",
            "jargon-text": "public domain", "doc-debian": "GPL (the bug-tracking system guides) and Open Publication License (the web pages)",
            "debian-reference-en": "GPL-2+"}
DIALOGUE_ROUNDS = 10


def norm(q):
    return re.sub(r"[^a-z0-9]+", " ", q.lower()).strip()


def answer(paras, limit=400):
    """The first prose paragraphs, cut at a sentence end after limit chars."""
    out = ""
    for p in paras:
        p = re.sub(r"\s+", " ", p).strip()
        if len(p) < 2:
            continue
        out = (out + " " + p).strip() if out else p
        if len(out) >= limit:
            break
    if len(out) > limit:
        m = re.search(r"[.!?](?=\s)", out[limit:])
        cut = limit + m.end() if m else len(out)
        out = out[:cut]
    out = re.sub(r"^\((?:contributed|answer) by [^)]*\)\s*", "", out.strip(), flags=re.I)
    if not re.search(r"[.!?]$", out):  # an introduction to code that was dropped
        m = list(re.finditer(r"[.!?](?=\s|$)", out))
        out = out[:m[-1].end()] if m else ""
    return out.strip()


def perlfaq():
    pairs = []
    for path in sorted(glob.glob("/usr/share/perl/5.36/pod/perlfaq[1-9].pod")):
        if path.endswith("perlfaq8.pod"):
            continue  # a held-out document of the card's figure
        q, paras, cur, skip = None, [], [], False
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines() + ["=head2 END"]
        for ln in lines:
            if ln.startswith("=begin"):
                skip = True
            if ln.startswith("=end"):
                skip = False
                continue
            if skip:
                continue
            if ln.startswith("="):
                if cur:
                    paras.append(" ".join(cur))
                    cur = []
                if ln.startswith("=head"):
                    if q and q.endswith("?"):
                        a = answer(paras)
                        if len(a) >= 40:
                            pairs.append(("perlfaq", q, a))
                    q, paras = prepare.pod_text(ln.partition(" ")[2]).strip(), []
                continue
            if ln[:1] in (" ", "\t") or not ln.strip():
                if cur:
                    paras.append(" ".join(cur))
                    cur = []
                continue
            cur.append(prepare.pod_text(re.sub(r"X<+[^<>]*>+", "", ln.strip())))
    return pairs


def python_faq():
    pairs = []
    for path in sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/faq/*.rst.txt")):
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines() + ["END", "==="]
        q, paras, cur = None, [], []
        for i, ln in enumerate(lines):
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if re.match(r"^([=\-~^*#+\"'])\1{2,}\s*$", ln):
                continue
            if ln.strip() and re.match(r"^([=\-~^*#+\"'])\1{2,}\s*$", nxt):
                if cur:
                    paras.append(" ".join(cur))
                    cur = []
                if q and q.endswith("?"):
                    a = answer(paras)
                    if len(a) >= 40:
                        pairs.append(("python-faq", q, a))
                q, paras = prepare.rst_text(ln.strip()), []
                continue
            if ln[:1] in (" ", "\t") or ln.startswith("..") or not ln.strip():
                if cur:
                    paras.append(" ".join(cur))
                    cur = []
                continue
            cur.append(prepare.rst_text(ln.strip().rstrip(":") if ln.rstrip().endswith("::") else ln.strip()))
    return pairs


def debian_faq():
    text = gzip.open("/usr/share/doc/debian/FAQ/debian-faq.en.txt.gz", "rt", encoding="utf-8").read()
    text = text.replace("\u00a0", " ")
    lines = text.splitlines()
    start = max(i for i, ln in enumerate(lines) if ln.startswith("1. ")) if lines else 0  # after the contents
    pairs, q, paras, cur, inq = [], None, [], [], False
    for ln in lines[start:] + ["99.99. END", ""]:
        m = re.match(r"^\d+\.\d+(?:\.\d+)?\.\s+(.*)$", ln)
        if m or re.match(r"^\d+\.\s", ln):
            if cur:
                paras.append(" ".join(cur))
                cur = []
            if q and q.endswith("?"):
                a = answer(paras)
                if len(a) >= 40:
                    pairs.append(("debian-faq", q, a))
            q, paras, inq = (m.group(1).strip() if m else None), [], bool(m)
            continue
        if inq:  # a question wrapped over lines
            if ln.strip() and not ln.startswith("    "):
                q += " " + ln.strip()
                continue
            inq = False
        if ln.startswith("    ") and not ln.startswith("     ") and ln.strip():
            cur.append(ln.strip())
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    return pairs


def chat_pairs():
    pairs = []
    for ln in open(os.path.join(HERE, "chat_pairs.txt"), encoding="utf-8"):
        if ln.startswith("#") or "\t" not in ln:
            continue
        q, a = ln.rstrip("\n").split("\t", 1)
        pairs.append(("chat", q.strip(), a.strip()))
    return pairs


def dialogues(pairs, rounds, seed=35):
    """Documents of 2-4 turns in the chat template's format; an everyday
    exchange opens about half of them."""
    rng = random.Random(seed)
    chat = [p for p in pairs if p[0] == "chat"]
    faq = [p for p in pairs if p[0] != "chat"]
    docs = []
    for r in range(rounds):
        order = faq[:]
        rng.shuffle(order)
        extra = chat[:] * 3
        rng.shuffle(extra)
        i = 0
        while i < len(order) or extra:
            turns = []
            if extra and (rng.random() < 0.5 or i >= len(order)):
                turns.append(extra.pop())
            for _ in range(rng.randint(1, 3)):
                if i < len(order):
                    turns.append(order[i])
                    i += 1
                elif extra:
                    turns.append(extra.pop())
            text = "".join(f"User: {q}\n\nAssistant: {a}\n\n" for _, q, a in turns)
            docs.append((f"dialogue/{r}/{len(docs)}", text))
    return docs


def jargon():
    text = gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8", errors="replace").read()
    paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
    paras = [p for p in paras if len(p) >= 80]
    return [(f"jargon/{i // 40}", "\n\n".join(paras[i:i + 40])) for i in range(0, len(paras), 40)]


def other_source():
    docs = []
    for name in ["constitution.txt.gz", "social-contract.txt.gz", "debian-manifesto.gz", "bug-reporting.txt.gz",
                 "bug-log-access.txt", "bug-log-mailserver.txt.gz", "bug-mailserver-refcard.txt",
                 "bug-maint-info.txt.gz", "bug-maint-mailcontrol.txt.gz", "mailing-lists.txt.gz", "source-unpack.txt"]:
        path = "/usr/share/doc/debian/" + name
        op = gzip.open if name.endswith(".gz") else open
        s = op(path, "rt", encoding="utf-8", errors="replace").read()
        docs.append(("doc-debian/" + name, prepare.paragraphs(s.splitlines())))
    text = gzip.open("/usr/share/debian-reference/debian-reference.en.txt.gz", "rt", encoding="utf-8").read()
    paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text.replace("\u00a0", " "))]
    paras = [p for p in paras if len(p) >= 80 and not re.match(r"^[\d.]+ ", p) and "|" not in p]
    size, keep = 0, []
    for p in paras:
        if size > 160000:
            break
        keep.append(p)
        size += len(p)
    for i in range(0, len(keep), 30):
        docs.append((f"debian-reference/{i // 30}", "\n\n".join(keep[i:i + 30])))
    return docs


def tokenize(gpt2d, docs, path):
    js = "".join(json.dumps(t) + "\n" for _, t in docs)
    r = subprocess.run([gpt2d, "tokenize", "--model", os.path.join(ROOT, "tokenizer", "data"), "--jsonl"],
                       input=js, capture_output=True, text=True, check=True)
    ids = array("H")
    for ln in r.stdout.splitlines():
        ids.extend(json.loads(ln))
        ids.append(50256)
    with open(path, "wb") as f:
        ids.tofile(f)
    return len(ids)


def main():
    out_dir, gpt2d = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    evalq = {norm(ln) for ln in open(os.path.join(ROOT, "models", "gpt2d-tiny", "chat_prompts.txt"))
             if ln.strip() and not ln.startswith("#")}
    pairs = [p for p in perlfaq() + python_faq() + debian_faq() + chat_pairs() if norm(p[1]) not in evalq]
    by = {}
    for src, _, _ in pairs:
        by[src] = by.get(src, 0) + 1
    print("prepare_chat: pairs", by, file=sys.stderr)
    dia = dialogues(pairs, DIALOGUE_ROUNDS)
    jar = jargon()
    orig = [d for d in prepare.kjv() + prepare.perl() + prepare.python_docs() + prepare.handbook() if len(d[1]) >= 200]
    held = lambda name: hashlib.sha256(name.encode()).digest()[0] < 256 // 25  # noqa: E731
    orig_held = [d for d in orig if held(d[0])]
    orig_third = [d for d in orig if not held(d[0]) and hashlib.sha256(name_key(d[0])).digest()[1] % 3 == 0]
    other = other_source()
    mix = dia + jar + orig_third
    random.Random(1).shuffle(mix)
    info = {"packages": {p: {"version": prepare.subprocess.run(["dpkg-query", "-W", "-f=${Version}", p],
                                                               capture_output=True, text=True).stdout.strip(),
                             "licence": lic} for p, lic in PACKAGES.items()},
            "pairs": by, "dialogue_rounds": DIALOGUE_ROUNDS, "parts": {}}
    for name, docs in [("dialogue", dia), ("jargon", jar), ("original_third", orig_third)]:
        info["parts"][name] = {"documents": len(docs), "bytes": sum(len(t.encode()) for _, t in docs),
                               "tokens": tokenize(gpt2d, docs, os.path.join(out_dir, name + ".u16"))}
    info["parts"]["train_mix"] = {"documents": len(mix), "tokens": tokenize(gpt2d, mix, os.path.join(out_dir, "train.u16"))}
    info["heldout"] = {"documents": len(orig_held), "tokens": tokenize(gpt2d, orig_held, os.path.join(out_dir, "heldout.u16"))}
    info["other_source_heldout"] = {"documents": len(other), "names": [n for n, _ in other],
                                    "bytes": sum(len(t.encode()) for _, t in other),
                                    "tokens": tokenize(gpt2d, other, os.path.join(out_dir, "other.u16"))}
    with open(os.path.join(out_dir, "dialogue_sample.txt"), "w") as f:
        f.write("\n<|endoftext|>\n".join(t for _, t in dia[:30]))
    with open(os.path.join(out_dir, "DATA.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info["parts"]), file=sys.stderr)


def name_key(name):
    return ("third:" + name).encode()


if __name__ == "__main__":
    main()
