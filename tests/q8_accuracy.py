#!/usr/bin/python3
"""tests/q8_accuracy.py GPT2D ENGINE_LOGITS MODEL [POSITIONS] [--check] [--dtype q8|bf16]:
a changed weight format (q8 by default, or bf16) against the F32 file it was
converted from, on the same weights, through the kernels this CPU takes for
it (bf16: avx512-bf16, inputs rounded to BF16, where the CPU has
AVX512_BF16; q8: avx512-vnni, inputs quantized per block of 32, where it
has AVX512_VNNI; the widening kernels elsewhere, GPT2D_KERNELS caps them).

MODEL is one of
  tiny-random        `gpt2d synth`, 2 layers, width 64 (CI)
  tiny-structured    the structured construction below, 2 layers, width 128 (CI)
  small-random       `gpt2d synth` at GPT-2 small's shape
  small-structured   the structured construction at GPT-2 small's shape
  DIR                a model folder (model.safetensors and config.json in any
                     format gpt2d reads, e.g. a trained checkpoint such as
                     models/gpt2d-tiny): converted to F32 and to the format

Structured weights (not random i.i.d.): real checkpoints have heavy tails,
low-rank structure and a few outlier channels (GPT-2 small's residual stream
has dimensions tens of times larger than the rest), which is what per-block
scales have to cope with. Every matrix here is a low-rank product (rank 16)
plus Student-t noise (5 degrees of freedom), with 4 outlier channels (wte's
columns x3, the projections' input rows x5, the layer-norm gains x3); wpe is a set of smooth sinusoids plus noise. Seeded, so the numbers
are reproducible.

Text: the project's own documentation (README.md and docs/*.md), tokenized
with GPT-2's tokenizer, in windows of the context length less one.

Measures, over every position: max and mean |logit difference|, the KL
divergence KL(p_f32 || p_q8) of the next-token distributions (mean and max),
greedy agreement (the argmax is the same) and the perplexity of the text
under each (its ratio). --check asserts the bounds of the CI models (a
regression in the format or its kernels fails) and, for every model, the
issue's bounds on the perplexity ratio and top-1 agreement: bf16 x1.005 and
>= 97 %, q8 x1.01 and >= 95 % (meaningful on a trained checkpoint; the
constructed models are held to them too)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # a missing package skips (exit 77), except in CI (GPT2D_REQUIRE_ALL=1)
    print("SKIP: python3-numpy is not installed (scripts/setup.sh --test installs it)", file=sys.stderr)
    sys.exit(1 if os.environ.get("GPT2D_REQUIRE_ALL") == "1" or os.environ.get("CI") else 77)

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..")
args = sys.argv[1:]
dtype = "q8"
if "--dtype" in args:
    i = args.index("--dtype")
    dtype = args[i + 1]
    del args[i:i + 2]
    if dtype not in ("q8", "bf16"):
        sys.exit(f"--dtype {dtype}: q8 or bf16")
check = "--check" in args
args = [a for a in args if a != "--check"]
gpt2d, engine_logits, model = args[0], args[1], args[2]
positions = int(args[3]) if len(args) > 3 else 1000

SHAPES = {"tiny": dict(L=2, C=64, H=4, N=128), "tiny-structured": dict(L=2, C=128, H=2, N=128),
          "small": dict(L=12, C=768, H=12, N=1024)}
# Bounds for --check: measured on 1000 positions (tiny-random: max 0.250,
# mean 0.026, mean KL 5.7e-4, agreement 0.964; tiny-structured: max 0.735,
# mean 0.016, mean KL 3.1e-4, agreement 0.974), with room for other numpy
# versions of the construction, no more.
BOUNDS = {"tiny-random": dict(max=0.5, mean=0.05, kl=2e-3, agree=0.93),
          "tiny-structured": dict(max=1.5, mean=0.04, kl=1e-3, agree=0.94)}
# The issue's bounds (25), every model: perplexity ratio and top-1 agreement.
ISSUE_BOUNDS = {"bf16": dict(ppl_ratio=1.005, agree=0.97), "q8": dict(ppl_ratio=1.01, agree=0.95)}


def save(path, tensors):
    hdr, blobs, pos = {"__metadata__": {"format": "pt"}}, [], 0
    for k in sorted(tensors):
        a = np.ascontiguousarray(tensors[k], dtype="<f4")
        hdr[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [pos, pos + a.nbytes]}
        blobs.append(a.tobytes())
        pos += a.nbytes
    j = json.dumps(hdr).encode()
    j += b" " * (-(8 + len(j)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(j)) + j + b"".join(blobs))


def structured(d, L, C, H, N, V=50257, seed=1):
    rng = np.random.default_rng(seed)
    out = rng.choice(C, 4, replace=False)

    def mat(rows, cols, std, outlier_rows=False):
        lr = rng.standard_normal((rows, 16)) @ rng.standard_normal((16, cols)) / 4.0
        w = (lr + rng.standard_t(5, (rows, cols))) * (std / 1.4)
        if outlier_rows and rows == C:
            w[out, :] *= 5.0
        return w.astype(np.float32)

    t = {}
    wte = mat(V, C, 0.1)
    wte[:, out] *= 3.0
    t["wte.weight"] = wte
    p = np.arange(N)[:, None] / np.power(1e4, np.arange(C)[None, :] / C)
    t["wpe.weight"] = (0.02 * np.sin(p + (np.arange(C) % 2) * np.pi / 2)
                       + 0.005 * rng.standard_normal((N, C))).astype(np.float32)
    for i in range(L):
        g = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        b = lambda n: (0.02 * rng.standard_normal(n)).astype(np.float32)
        pre = f"h.{i}."
        t[pre + "ln_1.weight"], t[pre + "ln_1.bias"] = g(C), b(C)
        t[pre + "ln_1.weight"][out] *= 3.0
        t[pre + "attn.c_attn.weight"], t[pre + "attn.c_attn.bias"] = mat(C, 3 * C, 0.05, True), b(3 * C)
        t[pre + "attn.c_proj.weight"], t[pre + "attn.c_proj.bias"] = mat(C, C, 0.02), b(C)
        t[pre + "ln_2.weight"], t[pre + "ln_2.bias"] = g(C), b(C)
        t[pre + "mlp.c_fc.weight"], t[pre + "mlp.c_fc.bias"] = mat(C, 4 * C, 0.05, True), b(4 * C)
        t[pre + "mlp.c_proj.weight"], t[pre + "mlp.c_proj.bias"] = mat(4 * C, C, 0.02), b(C)
    t["ln_f.weight"], t["ln_f.bias"] = np.ones(C, np.float32), np.zeros(C, np.float32)
    save(os.path.join(d, "model.safetensors"), t)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"n_layer": L, "n_embd": C, "n_head": H, "n_positions": N, "vocab_size": V}, f)


def logits(d, ids):
    raw = subprocess.run([engine_logits, "all", d] + [str(i) for i in ids], capture_output=True,
                         check=True).stdout
    return np.frombuffer(raw, dtype="<f4").reshape(len(ids), -1)


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


with tempfile.TemporaryDirectory(prefix="gpt2d-q8acc-") as tmp:
    f32, q8 = os.path.join(tmp, "f32"), os.path.join(tmp, dtype)
    os.mkdir(f32)
    os.mkdir(q8)
    if os.path.isdir(model):
        size, kind = None, "folder"
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        shape = dict(N=cfg.get("n_positions", cfg.get("n_ctx", 1024)))
    else:
        size, kind = model.split("-")
        shape = SHAPES["tiny-structured" if model == "tiny-structured" else size]
    if kind == "folder":
        subprocess.run([gpt2d, "convert", os.path.join(model, "model.safetensors"),
                        os.path.join(f32, "model.safetensors"), "--dtype", "f32", "--layout", "hf"],
                       check=True, capture_output=True)
        shutil.copy(os.path.join(model, "config.json"), f32)
    elif kind == "random":
        args = ["--seed", "11"] if size == "small" else [
            "--layers", str(shape["L"]), "--embd", str(shape["C"]), "--heads", str(shape["H"]),
            "--ctx", str(shape["N"]), "--seed", "3"]
        subprocess.run([gpt2d, "synth", os.path.join(f32, "model.safetensors")] + args,
                       check=True, capture_output=True)
    else:
        structured(f32, **shape)
    subprocess.run([gpt2d, "convert", os.path.join(f32, "model.safetensors"),
                    os.path.join(q8, "model.safetensors"), "--dtype", dtype],
                   check=True, capture_output=True)
    shutil.copy(os.path.join(f32, "config.json"), q8)
    text = ""
    for p in ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs"))):
        if p.endswith(".md"):
            text += open(os.path.join(root, p), encoding="utf-8").read()
    vocab = os.path.join(root, "tokenizer", "data")
    ids = json.loads(subprocess.run([gpt2d, "tokenize", "--model", vocab], input=text.encode(),
                                    capture_output=True, check=True).stdout)
    if len(ids) < positions:
        sys.exit(f"only {len(ids)} tokens of text for {positions} positions")
    ids = ids[:positions]
    win = shape["N"] - 1
    maxd, sumd, n, kls, agree, spread = 0.0, 0.0, 0, [], 0, []
    nll_a, nll_b, npred = 0.0, 0.0, 0
    for s in range(0, len(ids), win):
        w = ids[s:s + win]
        a, b = logits(f32, w), logits(q8, w)
        diff = np.abs(a.astype(np.float64) - b)
        spread.append(float(a.std(axis=1).mean()))
        maxd, sumd, n = max(maxd, diff.max()), sumd + diff.sum(), n + diff.size
        for r in range(0, len(w), 128):
            la, lb = log_softmax(a[r:r + 128]), log_softmax(b[r:r + 128])
            kls.extend((np.exp(la) * (la - lb)).sum(axis=1))
            nxt = np.array(w[r + 1:r + 129])  # the next token of each row but the last
            k = len(nxt)
            nll_a -= float(la[np.arange(k), nxt].sum())
            nll_b -= float(lb[np.arange(k), nxt].sum())
            npred += k
        agree += int((a.argmax(axis=1) == b.argmax(axis=1)).sum())
    kls = np.array(kls)
    ppl_a, ppl_b = float(np.exp(nll_a / npred)), float(np.exp(nll_b / npred))
    res = dict(model=model, dtype=dtype, positions=len(ids), ppl_f32=ppl_a, ppl=ppl_b,
               ppl_ratio=ppl_b / ppl_a, max_abs_diff=maxd, mean_abs_diff=sumd / n,
               logit_std=float(np.mean(spread)), kl_mean=float(kls.mean()), kl_max=float(kls.max()), greedy_agreement=agree / len(ids),
               f32_bytes=os.path.getsize(os.path.join(f32, "model.safetensors")),
               format_bytes=os.path.getsize(os.path.join(q8, "model.safetensors")))
    print(json.dumps(res))
    if check:
        ok = True
        bnd = BOUNDS.get(model) if dtype == "q8" else None
        if bnd is not None and not (
                res["max_abs_diff"] < bnd["max"] and res["mean_abs_diff"] < bnd["mean"]
                and res["kl_mean"] < bnd["kl"] and res["greedy_agreement"] > bnd["agree"]):
            print(f"FAIL: outside the bounds {bnd}")
            ok = False
        ib = ISSUE_BOUNDS[dtype]
        if not (res["ppl_ratio"] <= ib["ppl_ratio"] and res["greedy_agreement"] >= ib["agree"]):
            print(f"FAIL: outside the {dtype} bounds {ib}")
            ok = False
        sys.exit(0 if ok else 1)
