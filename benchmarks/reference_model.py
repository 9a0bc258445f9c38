"""The reference implementation oelm's GPT is timed against: a minimal nanoGPT-style model.

Fused QKV nn.Linear, SDPA, pre-LayerNorm blocks with a GELU MLP, no biases, learned position
embeddings, the head tied to the token embedding, N(0, 0.02) init; the loss through materialized
logits and F.cross_entropy. No toolkit code: it is what a plain PyTorch GPT of the study's shape
costs. `GPTConfig(bias=False)` gives oelm's GPT exactly its parameters (the `baseline-nobias` arm).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RefAttention(nn.Module):
    """Causal self-attention: one fused QKV linear, SDPA, output projection; no biases."""

    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class RefBlock(nn.Module):
    """Pre-LayerNorm block with a GELU MLP; no biases."""

    def __init__(self, d: int, n_head: int, d_ff: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, bias=False)
        self.attn = RefAttention(d, n_head)
        self.ln_2 = nn.LayerNorm(d, bias=False)
        self.fc = nn.Linear(d, d_ff, bias=False)
        self.proj = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class RefGPT(nn.Module):
    """Token + learned position embeddings, blocks, final LayerNorm, head tied to the embedding."""

    def __init__(self, vocab: int, block: int, n_layer: int, n_head: int, d: int, d_ff: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.h = nn.ModuleList(RefBlock(d, n_head, d_ff) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())
