#!/usr/bin/env python3
"""The structure check of server/ (STYLE.md Part 3): no file calls back into
one that called it, and no header includes one that includes it.

Two graphs between server/ files, each must be acyclic:
  - calls: A.c -> B.c when A's object file needs a symbol B's defines
    (nm: A's undefined symbols against B's defined ones), for every object
    in the static libraries given on the command line;
  - includes: A -> B when A (a .c or .h under server/) has #include "B"
    that resolves to a file under server/ (by name, beside A, or under the
    server folder's include paths).
Calls through a function pointer (the route table, the hooks registered on
the way down) are no edge: that is how news comes back up.

  check_server_layers.py SERVER_DIR LIB.a...

Besides, the layers' order: a file of a lower layer (http/ below api/
below daemon/) neither calls nor includes one in a higher layer's folder,
so the layers read top-down (daemon -> api -> http) with no edge upward,
even one that closes no cycle, and even to a leaf (a file that calls and
includes no other server/ file): what a lower layer uses lives in its
folder or below it (the JSON error body is http/error_json.c, the HTTP
layer's counters http/counters.c), so that a header's folder says which
layers may include it (issue 33).

Prints every cycle and upward edge found (one per strongly connected component, as a path)
and exits 1, or prints how many objects and files it read and exits 0.
"""
import os
import re
import subprocess
import sys


# The graph algorithms are the module check's (tests/check_modules.py, the
# same folder): one Tarjan and one cycle finder for both checks.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_modules import cycle_in, sccs  # noqa: E402


NM_LINE = re.compile(r'^(?P<lib>.*?\.a):(?P<obj>[^:]+):\s*(?:[0-9a-fA-F]+\s+)?(?P<type>\w)\s+(?P<sym>\S+)$')


def call_graph(libs):
    """Edges between source files from the objects' symbol tables, and the
    symbols that make each edge."""
    defined, undefined, objs = {}, {}, set()
    for lib in libs:
        res = subprocess.run(['nm', '-A', lib], capture_output=True, text=True, check=True)
        for line in res.stdout.splitlines():
            m = NM_LINE.match(line)
            if not m:
                continue
            obj, typ, sym = m.group('obj'), m.group('type'), m.group('sym')
            objs.add(obj)
            if typ == 'U':
                undefined.setdefault(obj, set()).add(sym)
            elif typ.isupper():
                defined.setdefault(sym, obj)
    graph, why = {}, {}
    for obj in objs:
        graph.setdefault(src_of(obj), set())
    for obj, syms in undefined.items():
        a = src_of(obj)
        for sym in syms:
            if sym in defined:
                b = src_of(defined[sym])
                if a != b:
                    graph[a].add(b)
                    why.setdefault((a, b), set()).add(sym)
    return graph, why


FOLDERS = []  # server/'s subfolders, longest first (main() fills it)


def src_of(obj):
    """meson names an object after its source path below the target's
    folder with '/' as '_' ("http_req.c.o" is server/http/req.c)."""
    base = re.sub(r'\.o$', '', os.path.basename(obj))
    for folder in FOLDERS:
        if base.startswith(folder + '_'):
            return folder + '/' + base[len(folder) + 1:]
    return base


def include_graph(root):
    files = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            if n.endswith(('.c', '.h')):
                p = os.path.join(dirpath, n)
                files[os.path.relpath(p, root)] = p
    by_base = {}
    for rel in files:
        by_base.setdefault(os.path.basename(rel), []).append(rel)
    graph = {rel: set() for rel in files}
    inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    for rel, p in files.items():
        with open(p, encoding='utf-8', errors='replace') as f:
            text = f.read()
        for target in inc.findall(text):
            beside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
            if beside in files:
                graph[rel].add(beside)
            elif target in files:
                graph[rel].add(target)
            elif os.path.basename(target) in by_base and len(by_base[os.path.basename(target)]) == 1:
                graph[rel].add(by_base[os.path.basename(target)][0])
    return graph


def report(kind, graph, why=None):
    bad = [c for c in sccs(graph) if len(c) > 1]
    for comp in bad:
        cyc = cycle_in(graph, comp)
        print(f'{kind} cycle among {len(comp)} server/ files: {", ".join(comp)}')
        print('  e.g. ' + ' -> '.join(cyc))
        members = set(comp)
        print('  its edges:')
        for a in comp:
            for b in sorted(graph[a] & members):
                what = f': {", ".join(sorted(why.get((a, b), ())))}' if why else ''
                print(f'    {a} -> {b}{what}')
    return len(bad)


# Top to bottom: a file may call and include files of its own layer and of
# the layers below it.
LAYERS = {'daemon': 0, 'api': 1, 'http': 2}


def layer_of(rel):
    top = rel.split('/', 1)[0]
    return LAYERS.get(top) if '/' in rel else None


def report_upward(kind, graph, why=None):
    bad = 0
    for a in sorted(graph):
        for b in sorted(graph[a]):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb < la:
                what = f': {", ".join(sorted(why.get((a, b), ())))}' if why else ''
                print(f'{kind} edge upward, from the {a.split("/")[0]} layer to the '
                      f'{b.split("/")[0]} layer: {a} -> {b}{what}')
                bad += 1
    return bad


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    root, libs = argv[1], argv[2:]
    FOLDERS.extend(sorted((d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))),
                          key=len, reverse=True))
    calls, why = call_graph(libs)
    includes = include_graph(root)
    n = report('call', calls, why) + report('include', includes)
    n += report_upward('call', calls, why) + report_upward('include', includes)
    if n:
        print(f'FAIL: {n} cycle(s) or upward edge(s); a file that calls into a file that called it shows a concern in '
              'the wrong file (STYLE.md Part 3)')
        return 1
    print(f'ok: {len(calls)} objects and {len(includes)} source files, no cycle')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
