#!/usr/bin/python3
"""bench/to_gguf.py DIR OUT.gguf [--dtype f32|f16]: writes a gpt2d checkpoint
directory (model.safetensors in the Hugging Face GPT-2 layout, F32, F16 or
BF16 tensors, as `gpt2d synth` writes it; vocab.json, merges.txt and an
optional config.json) as a GGUF file (version 3) that llama.cpp's `gpt2`
architecture loads, so that bench/peer.sh can run the peer on the very
weights gpt2d runs. stdlib + numpy only; a benchmark helper, not a product.

The mapping follows what llama.cpp's gpt2 loader asks for (read from its
source, around b4747):
  wte -> token_embd (and again as output: GPT-2 ties the LM head),
  wpe -> position_embd, ln_f -> output_norm, and for block N
  h.N.ln_1 -> blk.N.attn_norm, h.N.attn.c_attn -> blk.N.attn_qkv,
  h.N.attn.c_proj -> blk.N.attn_output, h.N.ln_2 -> blk.N.ffn_norm,
  h.N.mlp.c_fc -> blk.N.ffn_up, h.N.mlp.c_proj -> blk.N.ffn_down,
each with .weight and .bias. Hugging Face's Conv1D weights are [in, out];
ggml_mul_mat wants [out, in] row-major (GGUF dims [in, out], innermost
first), so the four projection weights are transposed. The causal-mask
buffers (h.N.attn.bias, h.N.attn.masked_bias) and lm_head.weight are
dropped. With --dtype f16 the 2-D tensors are F16 and the 1-D ones
(norms, biases) stay F32, as llama.cpp's own converter writes them."""
import argparse
import json
import os
import re
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# GGUF metadata value types.
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
# ggml tensor types.
GGML_F32, GGML_F16 = 0, 1
# llama.cpp's token types.
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5

PROJECTIONS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
BLOCK_NAMES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
               "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


class Error(Exception):
    pass


def read_safetensors(path):
    """The tensors of a .safetensors file as {name: numpy array} (F32 views
    into a read-only mapping, or F32 copies of F16/BF16 data)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise Error(f"{path}: shorter than a safetensors header")
        hlen = struct.unpack("<Q", raw)[0]
        if hlen > size - 8:
            raise Error(f"{path}: header length {hlen} runs past the file ({size} bytes)")
        try:
            header = json.loads(f.read(hlen))
        except ValueError as e:
            raise Error(f"{path}: header is not JSON: {e}")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + hlen)
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        shape = tuple(t["shape"])
        n = int(np.prod(shape)) if shape else 1
        width = {"F32": 4, "F16": 2, "BF16": 2}.get(t["dtype"])
        if width is None:
            raise Error(f"{path}: tensor {name} has dtype {t['dtype']}; only F32, F16 and BF16 are read")
        if end - begin != n * width or end > len(data):
            raise Error(f"{path}: tensor {name} has {end - begin} bytes for shape {list(shape)}")
        b = data[begin:end]
        if t["dtype"] == "F32":
            a = b.view(np.float32)
        elif t["dtype"] == "F16":
            a = b.view(np.float16).astype(np.float32)
        else:
            a = (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        out[name] = a.reshape(shape)
    return out


def gguf_tensors(st, dtype):
    """[(gguf name, numpy array in GGUF row-major order, ggml type)] and the
    hyperparameters read off the shapes."""
    st = {re.sub(r"^transformer\.", "", k): v for k, v in st.items()}
    for need in ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"):
        if need not in st:
            raise Error(f"model.safetensors has no {need}: not the Hugging Face GPT-2 layout")
    n_vocab, n_embd = st["wte.weight"].shape
    n_ctx = st["wpe.weight"].shape[0]
    n_layer = 0
    while f"h.{n_layer}.ln_1.weight" in st:
        n_layer += 1
    if n_layer == 0:
        raise Error("model.safetensors has no h.0.ln_1.weight: no blocks")
    n_ff = st["h.0.mlp.c_fc.weight"].shape[1]
    out = []

    def add(name, a):
        a = np.ascontiguousarray(a)
        t = GGML_F16 if dtype == "f16" and a.ndim == 2 else GGML_F32
        out.append((name, a, t))

    add("token_embd.weight", st["wte.weight"])
    add("position_embd.weight", st["wpe.weight"])
    for i in range(n_layer):
        for hf, gg in BLOCK_NAMES.items():
            for part in ("weight", "bias"):
                key = f"h.{i}.{hf}.{part}"
                if key not in st:
                    raise Error(f"model.safetensors has no {key}")
                a = st[key]
                if part == "weight" and hf in PROJECTIONS:
                    a = a.T  # Conv1D [in, out] -> [out, in]
                add(f"blk.{i}.{gg}.{part}", a)
    add("output_norm.weight", st["ln_f.weight"])
    add("output_norm.bias", st["ln_f.bias"])
    add("output.weight", st["wte.weight"])
    return out, dict(n_vocab=n_vocab, n_embd=n_embd, n_ctx=n_ctx, n_layer=n_layer, n_ff=n_ff)


def vocabulary(model_dir, n_vocab):
    """(tokens by id, token types, merges, end-of-text id or None)."""
    with open(os.path.join(model_dir, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    if max(vocab.values()) >= n_vocab:
        raise Error(f"vocab.json has id {max(vocab.values())}, past the {n_vocab} rows of wte")
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(n_vocab):
        t = by_id.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
        else:
            tokens.append(t)
            special = t.startswith("<|") and t.endswith("|>")
            types.append(TOKEN_CONTROL if special else TOKEN_NORMAL)
    merges = []
    with open(os.path.join(model_dir, "merges.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line and not line.startswith("#version"):
                merges.append(line)
    return tokens, types, merges, vocab.get("<|endoftext|>")


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_kv(key, vtype, value):
    out = gguf_string(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        return out + struct.pack("<I", value)
    if vtype == T_FLOAT32:
        return out + struct.pack("<f", value)
    if vtype == T_BOOL:
        return out + struct.pack("<?", value)
    if vtype == T_STRING:
        return out + gguf_string(value)
    etype, items = value  # T_ARRAY
    out += struct.pack("<IQ", etype, len(items))
    if etype == T_STRING:
        return out + b"".join(gguf_string(s) for s in items)
    return out + np.asarray(items, dtype="<i4").tobytes()


def pad(n):
    return (ALIGNMENT - n % ALIGNMENT) % ALIGNMENT


def write_gguf(path, kvs, tensors):
    infos, offset = [], 0
    for name, a, t in tensors:
        dims = list(reversed(a.shape))  # ne[0] is the innermost
        infos.append(gguf_string(name) + struct.pack("<I", len(dims)) +
                     struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", t, offset))
        nbytes = a.size * (2 if t == GGML_F16 else 4)
        offset += nbytes + pad(nbytes)
    head = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(kvs))
    head += b"".join(kvs) + b"".join(infos)
    head += b"\0" * pad(len(head))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        for name, a, t in tensors:
            b = a.astype("<f2" if t == GGML_F16 else "<f4").tobytes()
            f.write(b)
            f.write(b"\0" * pad(len(b)))
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    args = p.parse_args()
    try:
        st = read_safetensors(os.path.join(args.model_dir, "model.safetensors"))
        tensors, hp = gguf_tensors(st, args.dtype)
        cfg = {}
        cfg_path = os.path.join(args.model_dir, "config.json")
        if os.path.exists(cfg_path):
            with open(cfg_path, encoding="utf-8") as f:
                cfg = json.load(f)
        n_head = int(cfg.get("n_head", 12))
        if hp["n_embd"] % n_head:
            raise Error(f"n_embd {hp['n_embd']} is not a multiple of n_head {n_head}")
        tokens, types, merges, eot = vocabulary(args.model_dir, hp["n_vocab"])
        bos = cfg.get("bos_token_id", eot)
        eos = cfg.get("eos_token_id", eot)
        kvs = [
            gguf_kv("general.architecture", T_STRING, "gpt2"),
            gguf_kv("general.name", T_STRING, os.path.basename(os.path.abspath(args.model_dir))),
            gguf_kv("general.file_type", T_UINT32, 1 if args.dtype == "f16" else 0),
            gguf_kv("general.alignment", T_UINT32, ALIGNMENT),
            gguf_kv("gpt2.context_length", T_UINT32, hp["n_ctx"]),
            gguf_kv("gpt2.embedding_length", T_UINT32, hp["n_embd"]),
            gguf_kv("gpt2.feed_forward_length", T_UINT32, hp["n_ff"]),
            gguf_kv("gpt2.block_count", T_UINT32, hp["n_layer"]),
            gguf_kv("gpt2.attention.head_count", T_UINT32, n_head),
            gguf_kv("gpt2.attention.layer_norm_epsilon", T_FLOAT32,
                    float(cfg.get("layer_norm_epsilon", 1e-5))),
            gguf_kv("tokenizer.ggml.model", T_STRING, "gpt2"),
            gguf_kv("tokenizer.ggml.pre", T_STRING, "gpt-2"),
            gguf_kv("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, tokens)),
            gguf_kv("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, types)),
            gguf_kv("tokenizer.ggml.merges", T_ARRAY, (T_STRING, merges)),
            gguf_kv("tokenizer.ggml.add_bos_token", T_BOOL, False),
        ]
        if bos is not None:
            kvs.append(gguf_kv("tokenizer.ggml.bos_token_id", T_UINT32, int(bos)))
        if eos is not None:
            kvs.append(gguf_kv("tokenizer.ggml.eos_token_id", T_UINT32, int(eos)))
        write_gguf(args.out, kvs, tensors)
    except (Error, OSError, ValueError, KeyError) as e:
        print(f"to_gguf: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
