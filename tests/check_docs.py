#!/usr/bin/env python3
"""tests/check_docs.py [SRCDIR]: the documentation stands alone. In
README.md, docs/*.md, tests/README.md, tools/**/README.md and
models/*/README.md:

- every markdown link that is not a URL names a file or folder of the
  repository (relative to the page, as a browser reads it) and stays
  inside it, and its #anchor, if any, is a heading of that page (GitHub's
  anchors: lower case, punctuation dropped, spaces as hyphens);
- every backquoted path that starts with one of the repository's top-level
  folders or files (`server/http/access.c`, `deploy/gpt2d.service`,
  `docs/api.md`) exists, unless git ignores it (what a build or a
  download writes: `build-run/`, `models/gpt2`); the dated log,
  docs/benchmarks-history.md, names files as they were then and is not
  held to this;
- nothing points outside: no `../shared`, no absolute /work path, no
  STYLE.md (the house style lives beside the repository, not in it), no
  issue number ("issue 24", "issues 23, 24"): a reader has the
  repository, not the tracker.

Prints one line per finding (FILE:LINE: what) and exits 1 if there is any.
"""
import os
import re
import subprocess
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))


def tracked():
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        # A source tree without git (a release tarball): what is on disk.
        files = []
        for d, subdirs, names in os.walk(root):
            subdirs[:] = [s for s in subdirs if not s.startswith((".", "build"))]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return files


files = tracked()
paths = set(files)
for f in files:  # every folder of a tracked file
    parts = f.split("/")
    for i in range(1, len(parts)):
        paths.add("/".join(parts[:i]))
top = {f.split("/")[0] for f in files}
pages = sorted(f for f in files if f == "README.md" or f == "tests/README.md"
               or re.fullmatch(r"docs/[^/]+\.md", f) or re.fullmatch(r"tools/.+/README\.md", f)
               or re.fullmatch(r"models/[^/]+/README\.md", f))


HISTORY = {"docs/benchmarks-history.md"}


def anchors(page):
    """GitHub's anchors for the headings of PAGE (a repository path)."""
    seen, out = {}, set()
    fence = False
    for line in open(os.path.join(root, page), encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"#{1,6} +(.*?)\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def ignored(path):
    """Whether git ignores PATH (.gitignore); without git, the same rules by
    hand: build folders and downloaded models."""
    try:
        r = subprocess.run(["git", "-C", root, "check-ignore", "-q", "--no-index", path],
                           capture_output=True)
        if r.returncode in (0, 1):
            return r.returncode == 0
    except OSError:
        pass
    return path.startswith("build") or (path.startswith("models/")
                                        and not path.startswith("models/gpt2d-tiny"))


LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"`([^`\n]+)`")
# A repository path: folders and a name, no spaces or placeholders.
PATHLIKE = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.@-]+)*/?")
OUTSIDE = [
    (re.compile(r"\.\./shared"), "points at ../shared, outside the repository"),
    (re.compile(r"(?<![\w.])/work(?:/|\b)"), "an absolute /work path, outside the repository"),
    (re.compile(r"\bissues?[ -]#?\d+", re.I), "an issue number: say what it is instead"),
    (re.compile(r"\bissues? \d+(?:, \d+)+", re.I), "issue numbers: say what they are instead"),
    (re.compile(r"\bSTYLE\.md\b"), "the house style guide is not in the repository: say the rule itself"),
]

findings = []
for page in pages:
    here = os.path.dirname(page)
    text = open(os.path.join(root, page), encoding="utf-8").read()
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{page}:{n}"
        for pattern, what in OUTSIDE:
            if pattern.search(line):
                findings.append(f"{where}: {what}: {line.strip()[:120]}")
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # a URL (https:, mailto:)
            target, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(here, target)) if target else page
            if full.startswith("..") or os.path.isabs(full):
                findings.append(f"{where}: the link {target} leads outside the repository")
            elif full not in paths and full != ".":
                findings.append(f"{where}: the link {target} names no file of the repository")
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                findings.append(f"{where}: the link {target}#{anchor}: {full} has no such heading")
        for code in CODE.findall(line):
            code = code.strip()
            if not PATHLIKE.fullmatch(code) or "/" not in code.rstrip("/"):
                continue  # not a path (a command, an option, a placeholder)
            first = code.split("/")[0]
            if first not in top:
                continue  # a path elsewhere (/etc/gpt2d, an installed one) or a module-relative one
            path = code.rstrip("/")
            if page in HISTORY or path in paths or ignored(path):
                continue
            findings.append(f"{where}: `{code}` is no file or folder of the repository")

for f in findings:
    print(f)
print(f"docs: {len(pages)} pages, {len(findings)} findings", file=sys.stderr)
sys.exit(1 if findings else 0)
