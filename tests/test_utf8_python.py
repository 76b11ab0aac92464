#!/usr/bin/env python3
"""tests/test_utf8_python.py FILTER: the streaming UTF-8 decoder against
CPython's bytes.decode("utf-8", errors="replace") on 50,000 seeded random
byte strings, each cut into feeds at random points."""
import random
import subprocess
import sys

rng = random.Random(20261202)
interesting = [0x41, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1,
               0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xF8, 0xFF]
cases, lines = [], []
for _ in range(50000):
    n = rng.randrange(0, 48)
    data = bytes(rng.choice(interesting) if rng.random() < 0.7 else rng.randrange(256)
                 for _ in range(n))
    if rng.random() < 0.2:  # some valid text too
        data += "é日😀€".encode()[: rng.randrange(0, 14)]
    cuts = sorted(rng.randrange(0, len(data) + 1) for _ in range(rng.randrange(0, 5)))
    cases.append(data)
    lines.append(data.hex() + "".join(f" {c}" for c in cuts))
out = subprocess.run([sys.argv[1]], input="\n".join(lines) + "\n", capture_output=True,
                     text=True, check=True).stdout.split("\n")
bad = 0
for i, data in enumerate(cases):
    want = data.decode("utf-8", errors="replace").encode("utf-8").hex()
    if out[i] != want:
        bad += 1
        if bad <= 5:
            print(f"mismatch on {lines[i]}: got {out[i]} want {want}", file=sys.stderr)
print(f"utf8 stream vs CPython replace: {len(cases)} strings, {bad} mismatches")
sys.exit(1 if bad else 0)
