"""Vocabulary padding, shared by both language-model families (`vocab_multiple` in their configs).

At GPT-2's 50,257 tokens the LM head's GEMMs have an odd dimension and run on slow unaligned
kernels on GPUs; padding the embedding / head rows to a multiple of 64 (50,304, as nanoGPT does)
gives aligned shapes. The padded rows never matter: they start at zero, every logit they make is
cut off (sliced, or set to -inf inside the chunked loss) before a softmax, a loss, an argmax or a
sample sees it, so they get exactly zero gradient and keep their zeros under AdamW, and exports
and parameter counts leave them out. With `vocab_multiple = 1` (the default) nothing changes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from oelm.utils.errors import UserError


def check_multiple(owner: str, value: object) -> None:
    """Raise unless `value` is an integer >= 1 (1 = no padding)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(
            f"{owner}.vocab_multiple must be an integer >= 1 (1 = no padding, 64 pads GPT-2's 50,257 "
            f"tokens to 50,304), got {value!r}"
        )


def padded_size(vocab_size: int, multiple: int) -> int:
    """`vocab_size` rounded up to a multiple of `multiple`: the rows of the embedding and LM head."""
    return multiple * math.ceil(vocab_size / multiple)


@torch.no_grad()
def pad_rows(module: nn.Embedding | nn.Linear, rows: int) -> None:
    """Give `module` (built with the real vocabulary's rows) `rows` weight rows, the new ones zero.

    Built this way the model draws the same random numbers as the unpadded one while its modules
    are constructed, so a padded model built from the same seed holds the same real weights.
    """
    w = module.weight
    if rows == w.shape[0]:
        return
    padded = torch.zeros(rows, w.shape[1], dtype=w.dtype, device=w.device)
    padded[: w.shape[0]] = w
    module.weight = nn.Parameter(padded, requires_grad=w.requires_grad)
    if isinstance(module, nn.Embedding):
        module.num_embeddings = rows
    else:
        module.out_features = rows


@torch.no_grad()
def init_rows(weight: torch.Tensor, rows: int, std: float) -> None:
    """Normal(0, std) init of the first `rows` rows (the real tokens), zeros in the rest: the
    random numbers an unpadded weight draws, in the same order."""
    nn.init.normal_(weight[:rows], mean=0.0, std=std)
    weight[rows:].zero_()


def real_logits(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The logits of the real tokens: the last dim cut to `vocab_size` (a view; as is when unpadded)."""
    return logits if logits.shape[-1] == vocab_size else logits[..., :vocab_size]


def padding(vocab_size: int, *weights: torch.Tensor) -> dict[int, int]:
    """id(weight) -> its padding parameters (rows past `vocab_size` times width), for padded weights only."""
    out: dict[int, int] = {}
    for w in weights:
        if w is not None and w.ndim == 2 and w.shape[0] > vocab_size:
            out[id(w)] = (w.shape[0] - vocab_size) * w.shape[1]
    return out
