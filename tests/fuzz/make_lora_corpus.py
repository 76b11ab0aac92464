#!/usr/bin/env python3
"""tests/fuzz/make_lora_corpus.py [OUT_DIR]: the seed inputs of fuzz_lora
(default tests/fuzz/corpus/lora): small PEFT LoRA adapters for a base of 2
layers of width 8, each packed as fuzz_lora.c reads an input (a 4-byte
little-endian length, adapter_config.json, adapter_model.safetensors):
good ones in F32, F16 and BF16 (all modules, a subset, rslora) and a few
the reader refuses. Deterministic: the same bytes every run."""
import json
import os
import struct
import sys

MODULES = {"attn.c_attn": (1, 3), "attn.c_proj": (1, 1), "mlp.c_fc": (1, 4), "mlp.c_proj": (4, 1)}


def encode(dtype, values):
    if dtype == "F32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "F16":
        return struct.pack(f"<{len(values)}e", *values)
    # BF16: the upper half of the F32 bits (the values here are exact in BF16)
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def safetensors(tensors):
    """tensors: name -> (dtype, shape, bytes); header padded to 8 bytes."""
    hdr, off, data = {"__metadata__": {"format": "pt"}}, 0, b""
    for k in sorted(tensors):
        dt, shape, b = tensors[k]
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        data += b
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def adapter(r=2, layers=2, C=8, dtype="F32", modules=MODULES, drop=None, **conf):
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 16,
              "target_modules": ["c_attn", "c_proj", "c_fc"], "bias": "none", "fan_in_fan_out": True,
              "modules_to_save": None, "use_rslora": False, "use_dora": False, "rank_pattern": {},
              "alpha_pattern": {}, "lora_dropout": 0.0, "base_model_name_or_path": "gpt2"}
    config.update(conf)
    tensors = {}
    for l in range(layers):
        for m in modules:
            i, o = MODULES[m][0] * C, MODULES[m][1] * C
            for f, shape in (("A", [r, i]), ("B", [o, r])):
                name = f"base_model.model.transformer.h.{l}.{m}.lora_{f}.weight"
                if name == drop:
                    continue
                n = shape[0] * shape[1]
                vals = [((l * 7 + k * 13) % 17 - 8) / 16 for k in range(n)]
                tensors[name] = (dtype, shape, encode(dtype, vals))
    c = json.dumps(config, sort_keys=True).encode()
    return struct.pack("<I", len(c)) + c + safetensors(tensors)


SEEDS = {
    "good-f32": adapter(),
    "good-f16-subset": adapter(dtype="F16", modules={"attn.c_attn": MODULES["attn.c_attn"]},
                               target_modules=["c_attn"]),
    "good-bf16-rslora": adapter(r=1, dtype="BF16", use_rslora=True, target_modules="all-linear"),
    "good-regex": adapter(modules={"mlp.c_fc": MODULES["mlp.c_fc"]}, target_modules=".*mlp[.]c_fc"),
    "good-python-regex": adapter(modules={"mlp.c_fc": MODULES["mlp.c_fc"]},
                                 target_modules=r"transformer\.h\.\d+\.mlp\.c_fc"),
    "refused-dora": adapter(use_dora=True),
    "refused-wte": adapter(target_modules=["c_attn", "wte"]),
    "refused-missing": adapter(drop="base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight"),
    "one-layer-r3": adapter(r=3, layers=1),  # refused against 2 layers, read off the tensors
}

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "corpus", "lora")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
