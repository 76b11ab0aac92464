#!/usr/bin/python3
"""tools/train/train.py DATA_DIR OUT_DIR [options]: trains gpt2d-tiny, a small
model with GPT-2's exact architecture and tokenizer, on the token files of
prepare.py (tools/train/README.md has the whole recipe).

Deterministic: a fixed seed, a fixed thread count (--threads), deterministic
kernels, batches drawn from a seeded generator; the learning rate depends on
the step alone (linear warmup, then constant, then a linear decay over the
last --decay steps), so a run stopped and resumed from a checkpoint
(OUT_DIR/ckpt-STEP.pt, every --save-every steps) continues bit for bit, and
`--steps N --decay D` reproduces a shipped model exactly.

Writes OUT_DIR/model.safetensors (F32, the Hugging Face GPT-2 layout and
names) and OUT_DIR/config.json; tools/train/export.sh converts them to the
served file."""
import argparse
import json
import math
import os
import struct
import sys
import time

import ctypes

# The thread count of the BLAS under PyTorch is read when it loads, and a
# BLAS that spins in threads of its own beside PyTorch's is slower on a busy
# 2-core machine: one thread count for both, set before torch is imported.
_threads = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--threads"), "1")
os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = _threads
# Keep freed blocks of up to 32 MiB in the heap (M_MMAP_THRESHOLD = -3):
# the LM head's slices are allocated and freed every step.
ctypes.CDLL("libc.so.6").mallopt(-3, 32 << 20)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT2  # noqa: E402


def args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data"), p.add_argument("out")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ctx", type=int, default=512, help="context length (n_positions)")
    p.add_argument("--seq", type=int, default=256, help="training sequence length (<= ctx)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--long-from", type=int, default=None, metavar="STEP",
                   help="from this step on, windows of --ctx tokens (the same tokens a step: "
                        "batch * seq / ctx of them), so that every position is trained")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--decay", type=int, default=400, help="steps of linear decay to 10%% at the end")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--save-every", type=int, default=250)
    p.add_argument("--resume", help="a checkpoint of this run to continue from")
    p.add_argument("--eval-tokens", type=int, default=65536)
    return p.parse_args()


def shape_at(a, step):
    """(sequences, length) of the step's batch: a function of the step alone."""
    if a.long_from is not None and step >= a.long_from:
        return a.batch * a.seq // a.ctx, a.ctx
    return a.batch, a.seq


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    d0 = a.steps - a.decay
    if step < d0:
        return a.lr
    return a.lr * (1.0 - 0.9 * (step - d0 + 1) / a.decay)


def load(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


@torch.no_grad()
def evaluate(model, data, seq, limit):
    model.eval()
    n = min(limit, (len(data) - 1) // seq * seq)
    tot, cnt = 0.0, 0
    for i in range(0, n, seq * 8):
        xs = [data[j:j + seq] for j in range(i, min(i + seq * 8, n), seq)]
        ys = [data[j + 1:j + 1 + seq] for j in range(i, min(i + seq * 8, n), seq)]
        x, y = torch.stack(xs), torch.stack(ys)
        tot += model(x, y).item() * y.numel()
        cnt += y.numel()
    model.train()
    return tot / cnt


def save_safetensors(path, tensors, metadata):
    hdr, pos = {"__metadata__": metadata}, 0
    for k in sorted(tensors):
        n = tensors[k].numel() * 4
        hdr[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [pos, pos + n]}
        pos += n
    j = json.dumps(hdr, separators=(",", ":")).encode()
    j += b" " * (-(8 + len(j)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(j)) + j)
        for k in sorted(tensors):
            f.write(tensors[k].numpy().astype("<f4").tobytes())
    os.replace(tmp, path)


def main():
    a = args()
    if a.long_from is not None and (a.batch * a.seq) % a.ctx:
        sys.exit("train: --long-from needs batch * seq to be a multiple of --ctx")
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed)
    train, held = load(os.path.join(a.data, "train.u16")), load(os.path.join(a.data, "heldout.u16"))
    model = GPT2(a.layers, a.embd, a.heads, a.ctx)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wpe" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(a.seed)
    step = 0
    if a.resume:
        ck = torch.load(a.resume)
        model.load_state_dict(ck["model"]), opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"]), torch.set_rng_state(ck["rng"])
        step = ck["step"]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train: {n_params / 1e6:.2f} M parameters, {len(train) / 1e6:.2f} M training tokens, "
          f"{a.batch * a.seq} tokens a step, from step {step} to {a.steps}", file=sys.stderr, flush=True)
    t0, ema = time.time(), None
    while step < a.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(a, step)
        nb, seq = shape_at(a, step)
        starts = torch.randint(0, len(train) - seq - 1, (nb,), generator=gen)
        x = torch.stack([train[s:s + seq] for s in starts.tolist()])
        y = torch.stack([train[s + 1:s + 1 + seq] for s in starts.tolist()])
        opt.zero_grad(set_to_none=True)
        loss = model.loss_backward(x, y)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        if step % 5 == 0:
            el = time.time() - t0
            print(f"step {step} loss {ema:.3f} lr {lr_at(a, step - 1):.2e} {el:.0f} s", file=sys.stderr, flush=True)
        if step % a.save_every == 0 or step == a.steps:
            ck = {"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                  "rng": torch.get_rng_state(), "step": step, "args": vars(a)}
            torch.save(ck, os.path.join(a.out, f"ckpt-{step}.pt.tmp"))
            os.replace(os.path.join(a.out, f"ckpt-{step}.pt.tmp"), os.path.join(a.out, f"ckpt-{step}.pt"))
    seq = shape_at(a, a.steps - 1)[1]
    hl = evaluate(model, held, seq, a.eval_tokens)
    print(f"train: held-out loss {hl:.4f}, perplexity {math.exp(hl):.1f} (windows of {seq})", file=sys.stderr)
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 50257,
           "n_positions": a.ctx, "n_ctx": a.ctx, "n_embd": a.embd, "n_layer": a.layers, "n_head": a.heads,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "bos_token_id": 50256,
           "eos_token_id": 50256, "tie_word_embeddings": True}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    save_safetensors(os.path.join(a.out, "model.safetensors"), model.hf_tensors(), {"format": "pt"})
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump({"args": vars(a), "heldout_window": seq, "heldout_loss": hl, "heldout_ppl": math.exp(hl), "seconds": time.time() - t0},
                  f, indent=1)


if __name__ == "__main__":
    main()
