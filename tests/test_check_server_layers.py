#!/usr/bin/env python3
"""The server-layers check checked: check_server_layers.py run on small
server/ trees planted in a temporary folder, each compiled into a static
library the way meson names its objects (http_low.c.o is http/low.c).

  test_check_server_layers.py CHECKER

A clean tree passes; an upward include or an upward call fails, even when
what it reaches is a leaf (a file that calls and includes nothing else).
The compiler is $CC (default cc), the archiver $AR (default ar).
"""
import os
import shlex
import subprocess
import sys
import tempfile
import unittest

CHECKER = None

# Three layers, top to bottom: daemon/top.c calls api/mid.c, which calls
# http/low.c. api/leaf.c is a leaf in the API layer's folder.
CLEAN = {
    'http/low.h': 'int low(void);\n',
    'http/low.c': '#include "http/low.h"\nint low(void) { return 1; }\n',
    'api/mid.h': 'int mid(void);\n',
    'api/mid.c': '#include "api/mid.h"\n#include "http/low.h"\nint mid(void) { return low(); }\n',
    'api/leaf.h': '#define LEAF_MAX 4\nint leaf(void);\n',
    'api/leaf.c': '#include "api/leaf.h"\nint leaf(void) { return LEAF_MAX; }\n',
    'daemon/top.c': '#include "api/mid.h"\nint top(void);\nint top(void) { return mid(); }\n',
}


def run_checker(files):
    """Plants files under a server/ folder, builds its library and runs the
    checker on both: (exit status, output)."""
    with tempfile.TemporaryDirectory(prefix='gpt2d-layers-') as tmp:
        root = os.path.join(tmp, 'server')
        objs = os.path.join(tmp, 'objs')
        os.makedirs(objs)
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'w', encoding='utf-8') as f:
                f.write(text)
        cc = shlex.split(os.environ.get('CC', 'cc'))
        names = []
        for rel in sorted(files):
            if not rel.endswith('.c'):
                continue
            obj = os.path.join(objs, rel.replace('/', '_') + '.o')
            subprocess.run(cc + ['-c', '-I', root, os.path.join(root, rel), '-o', obj], check=True)
            names.append(obj)
        lib = os.path.join(tmp, 'libplanted.a')
        subprocess.run([os.environ.get('AR', 'ar'), 'rcs', lib] + names, check=True)
        res = subprocess.run([sys.executable, CHECKER, root, lib], capture_output=True, text=True)
        return res.returncode, res.stdout + res.stderr


class CheckServerLayers(unittest.TestCase):
    def test_clean_tree_passes(self):
        rc, out = run_checker(CLEAN)
        self.assertEqual(rc, 0, out)
        self.assertIn('no cycle', out)

    def test_include_of_a_higher_layers_leaf_header_fails(self):
        files = dict(CLEAN)
        files['http/low.c'] = ('#include "http/low.h"\n#include "api/leaf.h"\n'
                               'int low(void) { return LEAF_MAX; }\n')
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn('include edge upward, from the http layer to the api layer: '
                      'http/low.c -> api/leaf.h', out)

    def test_include_from_a_lower_layers_header_fails(self):
        files = dict(CLEAN)
        files['http/low.h'] = '#include "api/leaf.h"\nint low(void);\n'
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn('http/low.h -> api/leaf.h', out)

    def test_call_into_a_higher_layers_leaf_fails(self):
        files = dict(CLEAN)
        files['http/low.c'] = ('#include "http/low.h"\nint leaf(void);\n'
                               'int low(void) { return leaf(); }\n')
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn('call edge upward, from the http layer to the api layer: '
                      'http/low.c -> api/leaf.c: leaf', out)

    def test_call_cycle_fails(self):
        files = dict(CLEAN)
        files['http/low.c'] = ('#include "http/low.h"\nint mid(void);\n'
                               'int low(void) { return mid(); }\n')
        rc, out = run_checker(files)
        self.assertEqual(rc, 1, out)
        self.assertIn('call cycle among 2 server/ files: api/mid.c, http/low.c', out)


if __name__ == '__main__':
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    CHECKER = sys.argv.pop(1)
    unittest.main(verbosity=2)
