#!/usr/bin/python3
"""tools/train/lora.py MODEL_DIR GPT2D TEXT OUT_DIR [options]: fine-tunes a
LoRA adapter on a gpt2d model (models/gpt2d-tiny) and writes it in the
layout Hugging Face PEFT's save_pretrained writes for GPT2LMHeadModel, so
that gpt2d, PEFT and anything else that reads PEFT adapters read it:

  OUT_DIR/adapter_config.json        peft_type LORA, r, lora_alpha, the
                                     target modules, fan_in_fan_out true
  OUT_DIR/adapter_model.safetensors  for every layer N and target module M
                                     (attn.c_attn, attn.c_proj, mlp.c_fc,
                                     mlp.c_proj): F32 tensors
      base_model.model.transformer.h.N.M.lora_A.weight   [r, in]
      base_model.model.transformer.h.N.M.lora_B.weight   [out, r]

A module's output becomes W x + b + scaling * B (A x), scaling = alpha / r
(alpha / sqrt(r) with --rslora): GPT-2's Conv1D stores W as [in, out], and
the adapter's product is the same whatever the base's orientation. A
starts uniform in +-1/sqrt(in) (the bound of PyTorch's default Linear
initialisation), B at zero, so training starts from the base model exactly.
Only A and B train; the base's weights are frozen.

Deterministic: a fixed seed, one thread (torch.set_num_threads(1)), windows
drawn from a seeded generator. TEXT is tokenized by `gpt2d tokenize` (each
line a document, <|endoftext|> between them). A development tool: it needs
PyTorch from Debian (python3-torch); the server never runs it."""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT2  # noqa: E402

# PEFT's module names within a block, and the attribute model.py gives each.
MODULES = [("attn.c_attn", "c_attn"), ("attn.c_proj", "attn_proj"),
           ("mlp.c_fc", "c_fc"), ("mlp.c_proj", "mlp_proj")]
EOT = 50256


def read_safetensors(path):
    """The F32 tensors of a safetensors file, by name."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        out = {}
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            if v["dtype"] != "F32":
                sys.exit(f"lora.py: {k} is {v['dtype']}, expected F32")
            a, b = v["data_offsets"]
            f.seek(8 + n + a)
            out[k] = torch.from_numpy(np.frombuffer(f.read(b - a), dtype="<f4").copy().reshape(v["shape"]))
    return out


def write_safetensors(path, tensors, metadata):
    """tensors: name -> F32 numpy array. The header padded with spaces to a
    multiple of 8 bytes, data in name order; written to a temporary file and
    renamed."""
    hdr, off, blobs = {"__metadata__": metadata}, 0, []
    for k in sorted(tensors):
        b = np.ascontiguousarray(tensors[k], dtype="<f4").tobytes()
        hdr[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


class LoRAConv1D(nn.Module):
    """A frozen Conv1D (y = x W + b, W [in, out]) plus scaling * (x A^T) B^T."""

    def __init__(self, base, r, scaling, gen):
        super().__init__()
        self.base = base
        n_in, n_out = base.weight.shape
        bound = 1.0 / math.sqrt(n_in)
        self.lora_A = nn.Parameter((torch.rand(r, n_in, generator=gen) * 2 - 1) * bound)
        self.lora_B = nn.Parameter(torch.zeros(n_out, r))
        self.scaling = scaling

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scaling


def load_base(model_dir, gpt2d):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.safetensors")
        subprocess.run([gpt2d, "convert", os.path.join(model_dir, "model.safetensors"), f32,
                        "--dtype", "f32", "--layout", "hf"], check=True, capture_output=True)
        t = read_safetensors(f32)
    t = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in t.items()}
    model = GPT2(cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["n_positions"])
    with torch.no_grad():
        model.wte.copy_(t["wte.weight"]), model.wpe.copy_(t["wpe.weight"])
        model.ln_f.weight.copy_(t["ln_f.weight"]), model.ln_f.bias.copy_(t["ln_f.bias"])
        for i, b in enumerate(model.h):
            p = f"h.{i}."
            for mod, name in [(b.ln_1, "ln_1"), (b.ln_2, "ln_2")] + [(getattr(b, a), m) for m, a in MODULES]:
                mod.weight.copy_(t[p + name + ".weight"]), mod.bias.copy_(t[p + name + ".bias"])
    for q in model.parameters():
        q.requires_grad_(False)
    return model, cfg


def tokenize(text_path, model_dir, gpt2d):
    ids = []
    for line in open(text_path, encoding="utf-8"):
        line = line.strip()
        if not line:
            continue
        ids += json.loads(subprocess.run([gpt2d, "tokenize", "--model", model_dir], input=line.encode(),
                                         capture_output=True, check=True).stdout) + [EOT]
    return torch.tensor(ids, dtype=torch.long)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model"), p.add_argument("gpt2d"), p.add_argument("text"), p.add_argument("out")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16)
    p.add_argument("--rslora", action="store_true", help="scaling alpha / sqrt(r) (rank-stabilised)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--name", default=None, help="base_model_name_or_path (default: MODEL_DIR's name)")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)
    model, cfg = load_base(a.model, a.gpt2d)
    scaling = a.alpha / (math.sqrt(a.rank) if a.rslora else a.rank)
    gen = torch.Generator().manual_seed(a.seed)
    for b in model.h:
        for _, attr in MODULES:
            setattr(b, attr, LoRAConv1D(getattr(b, attr), a.rank, scaling, gen))
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    data = tokenize(a.text, a.model, a.gpt2d)
    seq = min(a.seq, len(data) - 1)
    print(f"lora.py: {len(data)} tokens, {sum(q.numel() for q in params)} trainable parameters, "
          f"rank {a.rank}, scaling {scaling:g}", flush=True)
    for step in range(a.steps):
        starts = torch.randint(0, len(data) - seq, (a.batch,), generator=gen)
        x = torch.stack([data[s:s + seq] for s in starts])
        y = torch.stack([data[s + 1:s + 1 + seq] for s in starts])
        lr = a.lr * min(1.0, (step + 1) / 10)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss = model.loss_backward(x, y)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss:.3f}", flush=True)
    os.makedirs(a.out, exist_ok=True)
    tensors = {}
    for i, b in enumerate(model.h):
        for mod, attr in MODULES:
            m = getattr(b, attr)
            k = f"base_model.model.transformer.h.{i}.{mod}."
            tensors[k + "lora_A.weight"] = m.lora_A.detach().numpy()
            tensors[k + "lora_B.weight"] = m.lora_B.detach().numpy()
    write_safetensors(os.path.join(a.out, "adapter_model.safetensors"), tensors, {"format": "pt"})
    # The keys of PEFT's LoraConfig as save_pretrained writes them; the
    # target names are matched as PEFT matches them (a module whose name is
    # the entry or ends with "." + the entry): "c_proj" is both attn.c_proj
    # and mlp.c_proj.
    conf = {
        "alpha_pattern": {}, "auto_mapping": None,
        "base_model_name_or_path": a.name or os.path.basename(os.path.normpath(a.model)),
        "bias": "none", "fan_in_fan_out": True, "inference_mode": True, "init_lora_weights": True,
        "layer_replication": None, "layers_pattern": None, "layers_to_transform": None,
        "loftq_config": {}, "lora_alpha": a.alpha if a.alpha != int(a.alpha) else int(a.alpha),
        "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core",
        "modules_to_save": None, "peft_type": "LORA", "r": a.rank, "rank_pattern": {},
        "revision": None, "target_modules": ["c_attn", "c_fc", "c_proj"], "task_type": "CAUSAL_LM",
        "use_dora": False, "use_rslora": a.rslora,
    }
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"lora.py: wrote {a.out}")


if __name__ == "__main__":
    main()
