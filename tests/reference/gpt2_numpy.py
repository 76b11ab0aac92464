#!/usr/bin/python3
"""tests/reference/gpt2_numpy.py: an independent GPT-2 forward pass in numpy
(float64), written from Hugging Face's GPT2LMHeadModel, sharing no code with
the engine. It reads model.safetensors itself (8-byte length, JSON header,
raw little-endian data) and config.json for the heads.

  gpt2_numpy.py logits DIR ID...        logits at every position, float32 (n, V), stdout
  gpt2_numpy.py greedy DIR N ID...      N greedy tokens as JSON (full recompute each step)
  gpt2_numpy.py embed DIR ID...         the mean of ln_f's output rows, scaled to length 1 (JSON)
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def load(model_dir):
    path = os.path.join(model_dir, "model.safetensors")
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        if e["dtype"] == "BF16":
            u16 = np.frombuffer(data[b:end], dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32)
        else:
            arr = np.frombuffer(data[b:end], dtype=np.dtype(DTYPES[e["dtype"]]).newbyteorder("<"))
        tensors[name.removeprefix("transformer.")] = arr.reshape(e["shape"]).astype(np.float64)
    C = tensors["wte.weight"].shape[1]
    n_head = C // 64 if C % 64 == 0 else 1
    cfg_path = os.path.join(model_dir, "config.json")
    if os.path.exists(cfg_path):
        n_head = json.load(open(cfg_path)).get("n_head", n_head)
    n_layer = 0
    while f"h.{n_layer}.ln_1.weight" in tensors:
        n_layer += 1
    return tensors, n_layer, n_head


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(model, ids, hidden=False):
    w, n_layer, n_head = model
    T = len(ids)
    x = w["wte.weight"][ids] + w["wpe.weight"][np.arange(T)]
    C = x.shape[1]
    hs = C // n_head
    mask = np.tril(np.ones((T, T), dtype=bool))
    for i in range(n_layer):
        p = f"h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D: x @ W + b
        q, k, v = np.split(qkv, 3, axis=1)
        q = q.reshape(T, n_head, hs).transpose(1, 0, 2)
        k = k.reshape(T, n_head, hs).transpose(1, 0, 2)
        v = v.reshape(T, n_head, hs).transpose(1, 0, 2)
        att = q @ k.transpose(0, 2, 1) / np.sqrt(hs)
        att = np.where(mask, att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        h = gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"])
    return x if hidden else x @ w["wte.weight"].T


def main():
    mode, model_dir = sys.argv[1], sys.argv[2]
    model = load(model_dir)
    if mode == "logits":
        ids = [int(a) for a in sys.argv[3:]]
        sys.stdout.buffer.write(forward(model, ids).astype("<f4").tobytes())
    elif mode == "greedy":
        n, ids = int(sys.argv[3]), [int(a) for a in sys.argv[4:]]
        out = []
        for _ in range(n):
            nxt = int(np.argmax(forward(model, ids + out)[-1]))
            out.append(nxt)
        print(json.dumps(out))
    elif mode == "embed":  # gpt2d's embedding: the mean of ln_f's rows, length 1
        ids = [int(a) for a in sys.argv[3:]]
        e = forward(model, ids, hidden=True).mean(axis=0)
        print(json.dumps((e / np.linalg.norm(e)).tolist()))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
