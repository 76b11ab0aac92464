#!/usr/bin/python3
"""tests/test_engine_reference.py GPT2D ENGINE_LOGITS SIZE: the engine against
the numpy reference (tests/reference/gpt2_numpy.py) on a `gpt2d synth`
checkpoint. SIZE "tiny" (2 layers, width 64; tolerance 1e-4) or "small"
(GPT-2 small's shape; tolerance 1e-3). Checks the logits at every position
of a prompt, both in one prefill step and one token at a time through the
KV cache, and that greedy `gpt2d generate --ids` continues exactly as the
reference does. Needs Debian's python3-numpy (/usr/bin/python3)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # a missing package skips (exit 77), except in CI (GPT2D_REQUIRE_ALL=1)
    print("SKIP: python3-numpy is not installed (scripts/setup.sh --test installs it)", file=sys.stderr)
    sys.exit(1 if os.environ.get("GPT2D_REQUIRE_ALL") == "1" or os.environ.get("CI") else 77)

here = os.path.dirname(os.path.abspath(__file__))
gpt2d, engine_logits, size = sys.argv[1], sys.argv[2], sys.argv[3]
ref = os.path.join(here, "reference", "gpt2_numpy.py")
vocab = os.path.join(here, "..", "tokenizer", "data")
shapes = {"tiny": (["--layers", "2", "--embd", "64", "--heads", "4", "--ctx", "128", "--seed", "3"], 1e-4, 12),
          "small": (["--seed", "11"], 1e-3, 8)}
args, tol, ngen = shapes[size]
V = 50257
prompt = "Hello, my name is GPT-2 and I like 日本 and café"

with tempfile.TemporaryDirectory(prefix="gpt2d-ref-") as d:
    subprocess.run([gpt2d, "synth", os.path.join(d, "model.safetensors"), "--misaligned",
                    "--mask-buffers"] + args, check=True)
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(vocab, f), d)
    ids = json.loads(subprocess.run([gpt2d, "tokenize", "--model", d], input=prompt.encode(),
                                    capture_output=True, check=True).stdout)
    sids = [str(i) for i in ids]
    want = np.frombuffer(subprocess.run([ref, "logits", d] + sids, capture_output=True,
                                        check=True).stdout, dtype="<f4").reshape(len(ids), V)
    ok = True
    for mode in ("all", "incremental"):
        got = np.frombuffer(subprocess.run([engine_logits, mode, d] + sids, capture_output=True,
                                           check=True).stdout, dtype="<f4").reshape(len(ids), V)
        err = np.abs(got - want).max(axis=1)
        print(f"{size} {mode}: {len(ids)} positions, max abs error per position "
              f"{' '.join(f'{e:.2e}' for e in err)}; logit spread {want.std():.2f}")
        if not (err.max() < tol):
            print(f"FAIL: max abs error {err.max():.3e} >= {tol}")
            ok = False
    # The portable C kernels and the AVX2-only kernels must give the very
    # bits of the default (widest) ones: every path has one reduction order.
    # 60 tokens take the packed matmul tiles (more than 48 rows, the most
    # k-blocked ones take at any kernel level), 19 the k-blocked ones; a second model has GPT-2's head size of 64, which has
    # its own attention kernel (seven heads: a decode row's heads go four at
    # a time, then three).
    d64 = os.path.join(d, "hs64")
    os.mkdir(d64)
    subprocess.run([gpt2d, "synth", os.path.join(d64, "model.safetensors"), "--layers", "2",
                    "--embd", "448", "--heads", "7", "--ctx", "128", "--vocab", "700"],
                   check=True)
    probes = [(d, sids), (d, (sids * 4)[:60]),
              (d64, [str(int(i) % 700) for i in (sids * 4)[:60]])]
    # The head-64 model also goes one token at a time (decode rows, whose
    # heads the kernel takes together), and so does each weight format of
    # it (`gpt2d convert --dtype`), whose kernels widen in registers.
    probes = [(m, p, "all") for m, p in probes] + [(d64, probes[-1][1], "incremental")]
    for dt in ("f16", "bf16", "q8"):
        dd = os.path.join(d, "hs64_" + dt)
        os.mkdir(dd)
        shutil.copy(os.path.join(d64, "config.json"), dd)
        subprocess.run([gpt2d, "convert", os.path.join(d64, "model.safetensors"),
                        os.path.join(dd, "model.safetensors"), "--dtype", dt],
                       check=True, capture_output=True)
        probes += [(dd, probes[2][1], "all"), (dd, probes[2][1][:19], "incremental")]
    for model_dir, probe, mode in probes:
        # BF16 on a CPU with AVX512_BF16 takes the level avx512-bf16, and
        # q8 on one with AVX512_VNNI the level avx512-vnni, each with its
        # own contract (inputs rounded to BF16, or quantized per block of
        # 32; engine/kernels.h): the widening levels are compared with
        # GPT2D_KERNELS=avx512, and the default path is held within a bound
        # of them.
        own = model_dir.endswith("_bf16") or model_dir.endswith("_q8")
        base = subprocess.run([engine_logits, mode, model_dir] + probe, capture_output=True,
                              check=True,
                              env=dict(os.environ, GPT2D_KERNELS="avx512") if own else None).stdout
        if own:
            dflt = subprocess.run([engine_logits, mode, model_dir] + probe, capture_output=True,
                                  check=True).stdout
            a, b = np.frombuffer(base, dtype="<f4"), np.frombuffer(dflt, dtype="<f4")
            dev = float(np.abs(a.astype(np.float64) - b).max())
            print(f"{os.path.basename(model_dir)} {len(probe)} tokens ({mode}), default kernels "
                  f"against GPT2D_KERNELS=avx512: max abs difference {dev:.2e} "
                  f"(logit spread {a.std():.2f})")
            if not dev <= 0.02 * float(np.abs(a).max()):
                print(f"FAIL: the default {model_dir.rsplit('_', 1)[1]} path is too far from "
                      "the widening kernels")
                ok = False
        for level in ("avx2", "portable"):
            other = subprocess.run([engine_logits, mode, model_dir] + probe,
                                   capture_output=True, check=True,
                                   env=dict(os.environ, GPT2D_KERNELS=level)).stdout
            same = other == base
            print(f"{os.path.basename(model_dir)} {len(probe)} tokens ({mode}), "
                  f"GPT2D_KERNELS={level}: {'bitwise identical' if same else 'DIFFERENT'}")
            ok = ok and same
    greedy_ref = json.loads(subprocess.run([ref, "greedy", d, str(ngen)] + sids,
                                           capture_output=True, check=True).stdout)
    out = json.loads(subprocess.run([gpt2d, "generate", "--model", d, "--prompt", prompt,
                                     "--tokens", str(ngen), "--temperature", "0", "--ids",
                                     "--ignore-eos"], capture_output=True, check=True).stdout)
    print(f"greedy: reference {greedy_ref}\n        gpt2d     {out['generated']}")
    if out["prompt"] != ids or out["generated"] != greedy_ref:
        print("FAIL: greedy continuation differs")
        ok = False
    # Random GPT-2-small-shaped weights fall into repeating one token under
    # greedy decoding whatever the seed; the tiny model's seed is chosen so
    # that its continuation moves, which makes the greedy check meaningful.
    if size == "tiny" and len(set(greedy_ref)) < 2:
        print("FAIL: the continuation is one repeated token, too weak a check")
        ok = False
sys.exit(0 if ok else 1)
