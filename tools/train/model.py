"""tools/train/model.py: a GPT-2 (Hugging Face GPT2LMHeadModel's architecture,
parameter for parameter) in plain PyTorch, written for gpt2d's training
script. The names and shapes of the exported tensors are the Hugging Face
layout that gpt2d reads: wte, wpe, h.{i}.ln_1, attn.c_attn (a Conv1D: weight
[in, out]), attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, ln_f; the LM head is wte
(tied); GELU is the tanh approximation ("gelu_new"); layer norm eps 1e-5."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Conv1D(nn.Module):
    """y = x @ W + b with W stored [in, out], as GPT-2's checkpoints store it."""

    def __init__(self, n_in, n_out, std):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * std)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class Block(nn.Module):
    def __init__(self, C, H, n_layer):
        super().__init__()
        std, proj_std = 0.02, 0.02 / math.sqrt(2 * n_layer)  # GPT-2's scaled residual init
        self.H = H
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = Conv1D(C, 3 * C, std)
        self.attn_proj = Conv1D(C, C, proj_std)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = Conv1D(C, 4 * C, std)
        self.mlp_proj = Conv1D(4 * C, C, proj_std)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(
            F, "scaled_dot_product_attention") else _attention(q, k, v)
        x = x + self.attn_proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def _attention(q, k, v):
    T = q.shape[2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return s.masked_fill(mask, float("-inf")).softmax(-1) @ v


class GPT2(nn.Module):
    def __init__(self, n_layer, C, H, n_ctx, vocab=50257):
        super().__init__()
        self.n_layer, self.C, self.H, self.n_ctx, self.vocab = n_layer, C, H, n_ctx, vocab
        self.wte = nn.Parameter(torch.randn(vocab, C) * 0.02)
        self.wpe = nn.Parameter(torch.randn(n_ctx, C) * 0.01)
        self.h = nn.ModuleList([Block(C, H, n_layer) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def hidden(self, idx):
        """The final layer norm's output, [B, T, C]."""
        T = idx.shape[1]
        x = F.embedding(idx, self.wte) + self.wpe[:T]
        for b in self.h:
            x = b(x)
        return self.ln_f(x)

    def forward(self, idx, targets=None):
        logits = self.hidden(idx) @ self.wte.t()
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))

    def loss_backward(self, idx, targets, rows=128):
        """The mean cross-entropy of targets, with its gradients accumulated
        into the parameters, computing the LM head in slices of `rows`
        positions so that no [B*T, vocab] tensor exists: the same gradients
        as forward() + backward() (summed in a different order), a small
        fraction of the memory, and no page faults from a 100s-of-MB
        allocation made and freed every step."""
        h = self.hidden(idx).reshape(-1, self.C)
        hd = h.detach().requires_grad_()
        y = targets.reshape(-1)
        n, total = y.numel(), 0.0
        for i in range(0, n, rows):
            lg = hd[i:i + rows] @ self.wte.t()
            part = F.cross_entropy(lg, y[i:i + rows], reduction="sum") / n
            part.backward()
            total += part.item()
        h.backward(hd.grad)
        return total

    def hf_tensors(self):
        """The Hugging Face GPT2Model names and shapes, float32, contiguous."""
        t = {"wte.weight": self.wte, "wpe.weight": self.wpe,
             "ln_f.weight": self.ln_f.weight, "ln_f.bias": self.ln_f.bias}
        for i, b in enumerate(self.h):
            p = f"h.{i}."
            t.update({p + "ln_1.weight": b.ln_1.weight, p + "ln_1.bias": b.ln_1.bias,
                      p + "attn.c_attn.weight": b.c_attn.weight, p + "attn.c_attn.bias": b.c_attn.bias,
                      p + "attn.c_proj.weight": b.attn_proj.weight, p + "attn.c_proj.bias": b.attn_proj.bias,
                      p + "ln_2.weight": b.ln_2.weight, p + "ln_2.bias": b.ln_2.bias,
                      p + "mlp.c_fc.weight": b.c_fc.weight, p + "mlp.c_fc.bias": b.c_fc.bias,
                      p + "mlp.c_proj.weight": b.mlp_proj.weight, p + "mlp.c_proj.bias": b.mlp_proj.bias})
        return {k: v.detach().float().contiguous() for k, v in t.items()}
