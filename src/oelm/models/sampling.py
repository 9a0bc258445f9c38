"""What both language-model families' `generate` share: the context window check and the next-token pick."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from oelm.utils.errors import UserError


def window(context: int | None, block_size: int) -> int:
    """The tokens each new token sees: `context` (default the block size), checked against the block size."""
    w = block_size if context is None else context
    if not 0 < w <= block_size:
        raise UserError(f"context {context} must be in 1..{block_size} (the block size)")
    return w


def pick_next(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """The next token [B, 1] from last-position logits: argmax at temperature 0, else a top-k sample."""
    if not math.isfinite(temperature):  # NaN is neither <= 0 nor a divisor: torch would fail deep inside
        raise UserError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, -1), 1, generator=generator)
