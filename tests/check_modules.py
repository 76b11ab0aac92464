#!/usr/bin/env python3
"""The structure check of every module (issue 33, STYLE.md Part 3): no file
of a module calls or includes, directly or round about, a file that calls
or includes it. The files of a module read one way, top-down.

For each module, two graphs between its files:
  - calls: A -> B when A's object needs a symbol B's object defines (nm: A's
    undefined symbols against the defined ones), over the objects given;
  - includes: A -> B when A (a .c or .h under the module's folder) has
    #include "B" that resolves to a file of the module (beside A, from the
    module's folder, or by a name only one of its files has).
A node is a file without its extension: X.c and the X.h beside it are one
when X.h is X.c's own header, declaring nothing that another file of the
module defines. A header that declares several files' functions (a layer's
shared header, such as server/http/http.h, or a public header under
include/) is a node of its own: including it says nothing about which of
those files one depends on. Any strongly
connected component of more than one node in the two graphs together is a
failure: calls alone (A calls B, B calls A), includes alone (two headers
including each other), or both (A calls B and B includes A's header: an
include upward). There is no exemption for a group of files X_*.c beside
X.c: such a group is ordered one way too. Calls through a function pointer
are no edge: that is how news comes back up.

  check_modules.py NAME=SRCDIR:INPUT[,INPUT...] ...

An INPUT is a static library (.a), an object (.o), a folder (its .o files,
recursively), or an executable or library whose objects meson put in the
folder beside it named after it plus .p (build/bench/bench_dnnl.p/*.o).
Each INPUT is one link unit: a symbol resolves within its own unit first,
then in the module's other units (server's libraries link together).

Prints every cycle (one per strongly connected component: a path through
it, then each of its edges with the symbols or the header that make it)
and exits 1; or prints one ok line per module and exits 0. A missing input,
or one with no objects, is exit 2: a module that is not read is not checked.

The functions are importable (sccs, cycle_in, call_graph, include_graph,
check_module) for another check of the same graphs.
"""
import os
import re
import subprocess
import sys


def sccs(graph):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def cycle_in(graph, comp):
    """One shortest cycle through comp's first node, as a list of nodes."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def sources(root):
    """The module's .c and .h files, relative to root."""
    out = []
    for dirpath, dirs, names in os.walk(root):
        dirs.sort()
        for n in sorted(names):
            if n.endswith(('.c', '.h')):
                out.append(os.path.relpath(os.path.join(dirpath, n), root))
    return out


def node_namer(files, own=None):
    """A function from a file (relative path) to its node: the path without
    its extension, so that X.c and the X.h beside it are one, when own
    (the set of such headers that are X.c's own, below) holds X.h or own is
    None. A header in another folder (include/X.h, the module's public API)
    is a node of its own: it declares the whole module's functions."""
    def node(rel):
        stem = os.path.splitext(rel)[0]
        if rel.endswith('.h') and own is not None and rel not in own:
            return rel
        return stem
    return node


COMMENT = re.compile(r'/\*.*?\*/|//[^\n]*', re.S)
IDENT = re.compile(r'\b[A-Za-z_]\w*\b')


def own_headers(root, files, defined):
    """The headers X.h beside an X.c that are X.c's own: of the symbols the
    module's objects define (defined: {source .c: symbols}), X.h names
    (outside comments) only X.c's."""
    everywhere = set().union(*defined.values()) if defined else set()
    present = set(files)
    out = set()
    for rel in files:
        if not rel.endswith('.h'):
            continue
        c = os.path.splitext(rel)[0] + '.c'
        if c not in present:
            continue
        with open(os.path.join(root, rel), encoding='utf-8', errors='replace') as f:
            names = set(IDENT.findall(COMMENT.sub(' ', f.read()))) & everywhere
        if names <= defined.get(c, set()):
            out.add(rel)
    return out


def defined_by_source(inputs, files):
    """{source .c: the symbols its objects define}, over every input."""
    source = object_namer(files)
    out = {}
    for inp in inputs:
        for archive, obj in expand(inp):
            for member, (defined, _) in nm_symbols(archive, obj).items():
                out.setdefault(source(member), set()).update(defined)
    return out


def expand(inp):
    """An input's objects: [(archive or None, object path)]."""
    if inp.endswith('.a') and os.path.isfile(inp):
        return [(inp, None)]
    if inp.endswith('.o') and os.path.isfile(inp):
        return [(None, inp)]
    folder = inp if os.path.isdir(inp) else inp + '.p'
    if not os.path.isdir(folder):
        return []
    out = []
    for dirpath, dirs, names in os.walk(folder):
        dirs.sort()
        out.extend((None, os.path.join(dirpath, n)) for n in sorted(names) if n.endswith('.o'))
    return out


NM_REST = re.compile(r'^\s*(?:[0-9a-fA-F]+\s+)?(?P<type>[A-Za-z?-])\s+(?P<sym>\S+)$')


def nm_symbols(archive, obj):
    """{object name: (defined, undefined)} from nm -A, the object named by
    its member name in an archive, or by its file name."""
    path = archive or obj
    res = subprocess.run(['nm', '-A', path], capture_output=True, text=True, check=True)
    out = {}
    for line in res.stdout.splitlines():
        if not line.startswith(path + ':'):
            continue
        rest = line[len(path) + 1:]
        member = os.path.basename(obj) if obj else None
        if archive:
            member, _, rest = rest.partition(':')
        m = NM_REST.match(rest)
        if not m:
            continue
        defined, undefined = out.setdefault(member, (set(), set()))
        typ, sym = m.group('type'), m.group('sym')
        if typ in 'Uw':
            undefined.add(sym)
        elif typ.isupper():
            defined.add(sym)
    return out


def object_namer(files):
    """A function from an object's name to its source file: meson names it
    after the source's path below the target's folder, '/' as '_', plus .o
    ("http_req.c.o" is http/req.c); cc -c names it X.o."""
    by_obj = {}
    for f in files:
        if f.endswith('.c'):
            flat = f.replace(os.sep, '_')
            by_obj.setdefault(os.path.splitext(flat)[0] + '.o', f)
    for f in files:
        if f.endswith('.c'):
            by_obj[f.replace(os.sep, '_') + '.o'] = f

    def source(obj):
        base = os.path.basename(obj)
        if base in by_obj:
            return by_obj[base]
        # Not a file of the module (a generated source: meson's
        # "meson-generated_ui_assets.c.o"): a node of its own.
        return re.sub(r'^meson-generated_', '', re.sub(r'\.o$', '', base)) + ' (generated)'
    return source


def call_graph(inputs, files, node):
    """Edges between nodes from the objects' symbol tables, and the symbols
    that make each edge. Each input is a link unit (see the docstring).
    Raises ValueError for an input with no objects."""
    source = object_namer(files)
    units = []
    for inp in inputs:
        objs = {}
        for archive, obj in expand(inp):
            for member, syms in nm_symbols(archive, obj).items():
                objs[(inp, archive or obj, member)] = syms
        if not objs:
            raise ValueError(f'{inp}: no object files (not built, or not a .a, .o, folder or '
                             'meson target)')
        units.append(objs)
    graph, why = {}, {}
    for objs in units:
        for key in objs:
            graph.setdefault(node(source(key[2])), set())
    for u, objs in enumerate(units):
        own = {}
        for key, (defined, _) in objs.items():
            for sym in defined:
                own.setdefault(sym, key[2])
        other = {}
        for v, theirs in enumerate(units):
            if v == u:
                continue
            for key, (defined, _) in theirs.items():
                for sym in defined:
                    other.setdefault(sym, set()).add(key[2])
        for key, (_, undefined) in objs.items():
            a = node(source(key[2]))
            for sym in undefined:
                targets = [own[sym]] if sym in own else sorted(other.get(sym, ()))
                for t in targets:
                    b = node(source(t))
                    if a != b:
                        graph[a].add(b)
                        why.setdefault((a, b), set()).add(sym)
    return graph, why


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def include_graph(root, files, node):
    """Edges between nodes from #include "...", and the header that makes
    each edge."""
    present = set(files)
    by_base = {}
    for rel in files:
        by_base.setdefault(os.path.basename(rel), []).append(rel)
    graph, why = {}, {}
    for rel in files:
        a = node(rel)
        graph.setdefault(a, set())
        with open(os.path.join(root, rel), encoding='utf-8', errors='replace') as f:
            text = f.read()
        for target in INCLUDE.findall(text):
            beside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
            if beside in present:
                hit = beside
            elif os.path.normpath(target) in present:
                hit = os.path.normpath(target)
            elif len(by_base.get(os.path.basename(target), ())) == 1:
                hit = by_base[os.path.basename(target)][0]
            else:
                continue
            b = node(hit)
            if a != b:
                graph[a].add(b)
                why.setdefault((a, b), set()).add(f'{rel} includes {hit}')
    return graph, why


def check_module(name, root, inputs, out=print):
    """Prints the module's cycles (or its ok line) with out; returns the
    number of cycles. Raises ValueError for an input with no objects."""
    files = sources(root)
    node = node_namer(files, own_headers(root, files, defined_by_source(inputs, files)))
    calls, call_why = call_graph(inputs, files, node)
    includes, inc_why = include_graph(root, files, node)
    both = {}
    for g in (calls, includes):
        for a, bs in g.items():
            both.setdefault(a, set()).update(bs)
    bad = [c for c in sccs(both) if len(c) > 1]
    for comp in bad:
        members = set(comp)
        alone = [kind for kind, g in (('calls', calls), ('includes', includes))
                 if any(len(c) > 1 for c in sccs({a: g.get(a, set()) & members for a in comp}))]
        how = f'{" and ".join(alone)} alone' if alone else 'calls and includes together'
        out(f'{name}: cycle among {len(comp)} files of {name}/ ({how}): {", ".join(comp)}')
        out('  e.g. ' + ' -> '.join(cycle_in(both, comp)))
        out('  its edges:')
        for a in comp:
            for b in sorted(both[a] & members):
                what = []
                if b in calls.get(a, ()):
                    what.append('calls ' + ', '.join(sorted(call_why[(a, b)])))
                if b in includes.get(a, ()):
                    what.append('; '.join(sorted(inc_why[(a, b)])))
                out(f'    {a} -> {b}: {"; ".join(what)}')
    if not bad:
        ncall = sum(len(bs) for bs in calls.values())
        ninc = sum(len(bs) for bs in includes.values())
        out(f'ok {name}: {len(both)} files, {ncall} call and {ninc} include edges, no cycle')
    return len(bad)


def parse_spec(spec):
    """NAME=SRCDIR:INPUT[,INPUT...] -> (name, srcdir, [input])."""
    name, eq, rest = spec.partition('=')
    root, colon, inputs = rest.partition(':')
    if not (eq and colon and name and root and inputs):
        raise ValueError(f'{spec}: not NAME=SRCDIR:INPUT[,INPUT...]')
    return name, root, inputs.split(',')


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    bad = 0
    try:
        specs = [parse_spec(s) for s in argv[1:]]
        for name, root, _ in specs:
            if not os.path.isdir(root):
                raise ValueError(f'{name}: {root}: no such folder')
        for name, root, inputs in specs:
            bad += check_module(name, root, inputs)
    except (ValueError, subprocess.CalledProcessError) as e:
        print(f'check_modules: {e}', file=sys.stderr)
        return 2
    if bad:
        print(f'FAIL: {bad} cycle(s); a file that calls into, or includes, a file that calls it '
              'shows a concern in the wrong file (STYLE.md Part 3, issue 33)')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
