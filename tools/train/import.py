#!/usr/bin/python3
"""tools/train/import.py MODEL_DIR GPT2D OUT_DIR [--seed N]: a training
checkpoint of a shipped model, to fine-tune it (train.py --resume), the
inverse of export.sh.

MODEL_DIR/model.safetensors (BF16, panel64, what gpt2d serves) is converted
back to F32 in the Hugging Face layout with `gpt2d convert` (BF16 widens to
F32 exactly), loaded into tools/train/model.py's GPT2 (its config.json gives
the shape), and written as OUT_DIR/ckpt-0.pt with a fresh AdamW state and
the generators seeded with --seed: train.py --resume OUT_DIR/ckpt-0.pt then
trains from step 0 with its own schedule (warmup, constant rate, decay)."""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT2  # noqa: E402


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            if v["dtype"] != "F32":
                sys.exit(f"import: {k} is {v['dtype']}, expected F32")
            a, b = v["data_offsets"]
            f.seek(base + a)
            out[k] = torch.from_numpy(np.frombuffer(f.read(b - a), dtype="<f4").copy().reshape(v["shape"]))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model"), p.add_argument("gpt2d"), p.add_argument("out")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3, help="the optimizer's initial rate (train.py sets it each step)")
    p.add_argument("--wd", type=float, default=0.1)
    a = p.parse_args()
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.safetensors")
        subprocess.run([a.gpt2d, "convert", os.path.join(a.model, "model.safetensors"), f32,
                        "--dtype", "f32", "--layout", "hf"], check=True, capture_output=True)
        t = read_safetensors(f32)
    torch.manual_seed(a.seed)
    model = GPT2(cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["n_positions"])
    names = model.hf_tensors().keys()
    missing = [k for k in names if k not in t and "transformer." + k not in t]
    if missing:
        sys.exit(f"import: missing tensors {missing[:5]}")
    # hf_tensors() names every parameter once (the LM head is wte): copy into
    # the parameters it was read from, matched by identity.
    with torch.no_grad():
        src = {k: t.get(k, t.get("transformer." + k)) for k in names}
        params = dict(model.named_parameters())
        for k, p_ in _hf_params(model).items():
            if tuple(src[k].shape) != tuple(p_.shape):
                sys.exit(f"import: {k} has shape {tuple(src[k].shape)}, the model {tuple(p_.shape)}")
            p_.copy_(src[k])
        assert len(params) == len(_hf_params(model)), "every parameter has one name"
    decay = [p_ for n, p_ in model.named_parameters() if p_.dim() == 2 and "wpe" not in n]
    rest = [p_ for n, p_ in model.named_parameters() if not (p_.dim() == 2 and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(a.seed)
    ck = {"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
          "rng": torch.get_rng_state(), "step": 0, "args": {"imported_from": a.model}}
    torch.save(ck, os.path.join(a.out, "ckpt-0.pt"))
    print(f"import: {sum(p_.numel() for p_ in model.parameters()) / 1e6:.2f} M parameters -> "
          f"{os.path.join(a.out, 'ckpt-0.pt')}", file=sys.stderr)


def _hf_params(model):
    """The Hugging Face name of each parameter (hf_tensors' names, without
    the detach and copy it makes)."""
    t = {"wte.weight": model.wte, "wpe.weight": model.wpe,
         "ln_f.weight": model.ln_f.weight, "ln_f.bias": model.ln_f.bias}
    for i, b in enumerate(model.h):
        p = f"h.{i}."
        t.update({p + "ln_1.weight": b.ln_1.weight, p + "ln_1.bias": b.ln_1.bias,
                  p + "attn.c_attn.weight": b.c_attn.weight, p + "attn.c_attn.bias": b.c_attn.bias,
                  p + "attn.c_proj.weight": b.attn_proj.weight, p + "attn.c_proj.bias": b.attn_proj.bias,
                  p + "ln_2.weight": b.ln_2.weight, p + "ln_2.bias": b.ln_2.bias,
                  p + "mlp.c_fc.weight": b.c_fc.weight, p + "mlp.c_fc.bias": b.c_fc.bias,
                  p + "mlp.c_proj.weight": b.mlp_proj.weight, p + "mlp.c_proj.bias": b.mlp_proj.bias})
    return t


if __name__ == "__main__":
    main()
