#!/usr/bin/env python3
"""check_modules.py fails where it must: on small trees made here, a call
cycle (two .c files calling each other, in a static library), an include
cycle (two headers including each other), an include upward (A calls B,
B includes A's header), a cycle between two libraries of one module and one
in a meson executable's object folder exit 1 and print the edge with its
symbol or header; the same trees made one-way exit 0; an input that is not
built exits 2.

  test_check_modules.py CHECK_MODULES.PY CC [CC_ARG...]

(the C compiler as meson runs it: cc.cmd_array(), a ccache wrapper
included)
"""
import os
import subprocess
import sys
import tempfile


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(text)


def compile_c(cc, root, rel, obj):
    """rel compiled to obj (under root), as meson would name it."""
    os.makedirs(os.path.dirname(os.path.join(root, obj)), exist_ok=True)
    subprocess.run(cc + ['-c', '-o', os.path.join(root, obj), os.path.join(root, rel)], check=True)
    return os.path.join(root, obj)


def archive(root, name, objs):
    path = os.path.join(root, name)
    subprocess.run(['ar', 'rcs', path] + objs, check=True)
    return path


class Case:
    def __init__(self, check, cc):
        self.check, self.cc, self.failed = check, cc, 0

    def run(self, name, specs, rc, want=(), unwanted=()):
        res = subprocess.run([sys.executable, self.check] + specs, capture_output=True, text=True)
        out = res.stdout + res.stderr
        missing = [w for w in want if w not in out]
        present = [u for u in unwanted if u in out]
        if res.returncode != rc or missing or present:
            self.failed += 1
            print(f'FAIL {name}: exit {res.returncode} (want {rc}); missing {missing}; '
                  f'unexpected {present}\n{out}')
        else:
            print(f'ok {name}')


def tree_calls(cc, root, cyclic):
    """a.c calls b.c; b.c calls a.c back where cyclic."""
    src = os.path.join(root, 'src')
    write(src, 'a.h', '#ifndef A_H\n#define A_H\nint a_top(void);\nint a_again(void);\n#endif\n')
    write(src, 'b.h', '#ifndef B_H\n#define B_H\nint b_low(void);\n#endif\n')
    write(src, 'a.c', '#include "a.h"\n#include "b.h"\nint a_top(void) { return b_low(); }\n'
          'int a_again(void) { return 1; }\n')
    back = 'return a_again();' if cyclic else 'return 2;'
    write(src, 'b.c', f'#include "b.h"\nint a_again(void);\nint b_low(void) {{ {back} }}\n')
    objs = [compile_c(cc, root, 'src/' + f, f'build/libm.a.p/{f}.o') for f in ('a.c', 'b.c')]
    return src, archive(root, 'build/libm.a', objs)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    t = Case(argv[1], argv[2:])
    with tempfile.TemporaryDirectory() as tmp:
        # A call cycle in a static library: the edge both ways, with its symbol.
        src, lib = tree_calls(t.cc, os.path.join(tmp, 'calls'), True)
        t.run('call cycle', [f'm={src}:{lib}'], 1,
              want=['cycle among 2 files of m/ (calls alone)', 'a -> b: calls b_low',
                    'b -> a: calls a_again', 'e.g. a -> b -> a', 'FAIL: 1 cycle'])
        src, lib = tree_calls(t.cc, os.path.join(tmp, 'calls-ok'), False)
        t.run('one-way calls', [f'm={src}:{lib}'], 0, want=['ok m: 2 files, 1 call'],
              unwanted=['cycle among'])

        # Two headers including each other (no object calls anything).
        inc = os.path.join(tmp, 'includes')
        write(inc, 'src/x.h', '#ifndef X_H\n#define X_H\n#include "y.h"\n#endif\n')
        write(inc, 'src/y.h', '#ifndef Y_H\n#define Y_H\n#include "x.h"\n#endif\n')
        write(inc, 'src/main.c', '#include "x.h"\nint m_main(void);\nint m_main(void) { return 0; }\n')
        obj = compile_c(t.cc, inc, 'src/main.c', 'build/prog.p/main.c.o')
        t.run('include cycle', [f'm={inc}/src:{inc}/build/prog'], 1,
              want=['(includes alone)', 'x.h -> y.h: x.h includes y.h', 'y.h -> x.h: y.h includes x.h'])
        write(inc, 'src/y.h', '/* includes nothing */\n')
        t.run('one-way includes', [f'm={inc}/src:{obj}'], 0, want=['ok m: 3 files'])

        # An include upward: top.c calls low.c, and low.c includes top.h (for
        # a type, say). top.c and top.h are one node, so the includes close
        # the cycle (top.c includes low.h) with the call edge beside them.
        up = os.path.join(tmp, 'upward')
        write(up, 'src/top.h', 'typedef int top_kind;\nint top_run(void);\n')
        write(up, 'src/low.h', 'int low_work(void);\n')
        write(up, 'src/top.c', '#include "top.h"\n#include "low.h"\n'
              'int top_run(void) { return low_work(); }\n')
        write(up, 'src/low.c', '#include "low.h"\n#include "top.h"\n'
              'int low_work(void) { top_kind k = 1; return k; }\n')
        objs = [compile_c(t.cc, up, f'src/{f}', f'build/libu.a.p/{f}.o') for f in ('top.c', 'low.c')]
        lib = archive(up, 'build/libu.a', objs)
        t.run('include upward', [f'u={up}/src:{lib}'], 1,
              want=['cycle among 2 files of u/', 'top -> low: calls low_work; top.c includes low.h',
                    'low -> top: low.c includes top.h'])
        write(up, 'src/low.c', '#include "low.h"\nint low_work(void) { return 1; }\n')
        t.run('no include upward', [f'u={up}/src:{lib}'], 0, want=['ok u:'])

        # A layer's shared header: layer.h declares layer.c's and peer.c's
        # functions, layer.c calls peer.c and both include layer.h. The
        # header is a node of its own (it is not layer.c's alone), so no
        # cycle; when it declares only layer.c's, it is layer.c's, and the
        # same include from peer.c is upward.
        sh = os.path.join(tmp, 'shared')
        write(sh, 'src/layer.h', 'int layer_run(void);\nint peer_work(void);\n')
        write(sh, 'src/layer.c', '#include "layer.h"\nint layer_run(void) { return peer_work(); }\n')
        write(sh, 'src/peer.c', '#include "layer.h"\nint peer_work(void) { return 2; }\n')
        objs = [compile_c(t.cc, sh, f'src/{f}', f'build/libs.a.p/{f}.o') for f in ('layer.c', 'peer.c')]
        lib = archive(sh, 'build/libs.a', objs)
        t.run('shared header', [f's={sh}/src:{lib}'], 0, want=['ok s:'])
        write(sh, 'src/layer.h', 'int layer_run(void);\n')
        write(sh, 'src/layer.c', '#include "layer.h"\nint peer_work(void);\n'
              'int layer_run(void) { return peer_work(); }\n')
        write(sh, 'src/peer.c', '#include "layer.h"\nint peer_work(void);\nint peer_work(void) { return 2; }\n')
        objs = [compile_c(t.cc, sh, f'src/{f}', f'build/libs.a.p/{f}.o') for f in ('layer.c', 'peer.c')]
        lib = archive(sh, 'build/libs.a', objs)
        t.run('own header included upward', [f's={sh}/src:{lib}'], 1,
              want=['layer -> peer: calls peer_work', 'peer -> layer: peer.c includes layer.h'])

        # A cycle across two libraries of one module (server's http and oai
        # link together), the objects named as meson names them in a
        # subfolder (api/p.c -> api_p.c.o).
        two = os.path.join(tmp, 'two')
        write(two, 'src/api/p.c', 'int q_go(void);\nint p_back(void);\n'
              'int p_go(void) { return q_go(); }\nint p_back(void) { return 0; }\n')
        write(two, 'src/http/q.c', 'int p_back(void);\nint q_go(void);\n'
              'int q_go(void) { return p_back(); }\n')
        lp = archive(two, 'build/libp.a', [compile_c(t.cc, two, 'src/api/p.c', 'build/libp.a.p/api_p.c.o')])
        lq = archive(two, 'build/libq.a', [compile_c(t.cc, two, 'src/http/q.c', 'build/libq.a.p/http_q.c.o')])
        t.run('cycle across libraries', [f's={two}/src:{lp},{lq}'], 1,
              want=['api/p -> http/q: calls q_go', 'http/q -> api/p: calls p_back'])

        # Several modules at once: one bad one fails the run, the good one
        # still has its ok line.
        src_ok, lib_ok = tree_calls(t.cc, os.path.join(tmp, 'calls-ok2'), False)
        src_bad, lib_bad = tree_calls(t.cc, os.path.join(tmp, 'calls2'), True)
        t.run('one module of two', [f'good={src_ok}:{lib_ok}', f'bad={src_bad}:{lib_bad}'], 1,
              want=['ok good:', 'bad: cycle among 2 files of bad/'])

        # Not built: exit 2, never a pass.
        t.run('missing input', [f'm={src_ok}:{tmp}/nowhere/libz.a'], 2, want=['no object files'])
        t.run('bad spec', ['m'], 2, want=['not NAME=SRCDIR:INPUT'])
    if t.failed:
        print(f'FAIL: {t.failed} case(s)')
        return 1
    print('ok: check_modules.py fails on each planted cycle and passes the one-way trees')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
