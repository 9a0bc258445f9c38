"""Encode classification examples for BERT-family (HF) or our GPT tokenizers; pad per batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from oelm.data.cls_sources import Example
from oelm.utils.errors import UserError

# Name of the dedicated separator appended to our GPT tokenizers' vocabularies. Only its id is
# ever inserted between the two texts; the literal string is never tokenized.
SEP_TOKEN = "<|sep|>"

Feature = dict[str, Any]  # {"input_ids": list[int], ["token_type_ids": list[int]], "labels": int}


def is_hf_tokenizer(tokenizer: Any) -> bool:
    """True for a transformers tokenizer, False for an oelm Tokenizer (which has `eot_id`)."""
    return not hasattr(tokenizer, "eot_id")


def gpt_separator_id(tokenizer: Any) -> int:
    """Id of the dedicated pair separator of an oelm Tokenizer (added to its vocabulary if new)."""
    return int(tokenizer.add_special_token(SEP_TOKEN))


def encode_pairs(
    examples: Sequence[Example],
    tokenizer: Any,
    max_length: int,
    sep_id: int | None = None,
) -> list[Feature]:
    """Tokenize examples (single texts or pairs) truncated to max_length, without padding."""
    if not examples:
        return []
    pairs = examples[0].text_pair is not None
    if max_length < (3 if pairs else 1):
        raise UserError(f"max_length={max_length} is too small; use at least {3 if pairs else 1}")
    if is_hf_tokenizer(tokenizer):
        return _encode_hf(examples, tokenizer, max_length, pairs)
    return _encode_gpt(examples, tokenizer, max_length, pairs, sep_id)


def _encode_hf(examples: Sequence[Example], tokenizer: Any, max_length: int, pairs: bool) -> list[Feature]:
    # The tokenizer's own pair template ([CLS] a [SEP] b [SEP]) and token_type_ids; longest_first
    # truncation matches how BERT-family models were fine-tuned on GLUE.
    texts = [ex.text for ex in examples]
    second = [ex.text_pair or "" for ex in examples] if pairs else None
    enc = tokenizer(texts, second, truncation=True, max_length=max_length)
    types = enc.get("token_type_ids")
    out = []
    for i, ex in enumerate(examples):
        feat: Feature = {"input_ids": list(enc["input_ids"][i]), "labels": ex.label}
        if types is not None:
            feat["token_type_ids"] = list(types[i])
        out.append(feat)
    return out


def _encode_gpt(
    examples: Sequence[Example], tokenizer: Any, max_length: int, pairs: bool, sep_id: int | None
) -> list[Feature]:
    first = tokenizer.encode_batch([ex.text for ex in examples])
    if not pairs:
        return [{"input_ids": list(a[:max_length]), "labels": ex.label} for a, ex in zip(first, examples)]
    sep = gpt_separator_id(tokenizer) if sep_id is None else int(sep_id)
    second = tokenizer.encode_batch([ex.text_pair or "" for ex in examples])
    out = []
    for a, b, ex in zip(first, second, examples, strict=True):
        a, b = truncate_pair(list(a), list(b), max_length - 1)
        out.append({"input_ids": a + [sep] + b, "labels": ex.label})
    return out


def truncate_pair(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Cut the longer sequence first so that len(a) + len(b) <= budget (tails are dropped)."""
    if len(a) + len(b) <= budget:
        return a, b
    short = min(len(a), len(b))
    if 2 * short >= budget:  # both must shrink: split the budget, the first text gets the odd token
        na, nb = (budget + 1) // 2, budget // 2
    elif len(a) >= len(b):
        na, nb = budget - len(b), len(b)
    else:
        na, nb = len(a), budget - len(a)
    return a[:na], b[:nb]


@dataclass(frozen=True)
class PadCollator:
    """Collate features into tensors padded to the longest sequence of the batch."""

    pad_id: int
    padding_side: str = "right"

    def __post_init__(self) -> None:
        if self.padding_side not in ("right", "left"):
            raise UserError(f"padding_side must be 'right' or 'left', got {self.padding_side!r}")

    def __call__(self, features: Sequence[Feature]) -> dict[str, torch.Tensor]:
        """Pad input_ids (pad_id), attention_mask (0) and token_type_ids (0); stack labels."""
        longest = max(len(f["input_ids"]) for f in features)
        batch = {
            "input_ids": self._pad([f["input_ids"] for f in features], longest, self.pad_id),
            "attention_mask": self._pad([[1] * len(f["input_ids"]) for f in features], longest, 0),
        }
        if "token_type_ids" in features[0]:
            batch["token_type_ids"] = self._pad([f["token_type_ids"] for f in features], longest, 0)
        batch["labels"] = torch.tensor([int(f["labels"]) for f in features], dtype=torch.long)
        return batch

    def _pad(self, rows: list[list[int]], length: int, value: int) -> torch.Tensor:
        out = torch.full((len(rows), length), value, dtype=torch.long)
        for i, row in enumerate(rows):
            if self.padding_side == "right":
                out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            elif row:
                out[i, length - len(row) :] = torch.tensor(row, dtype=torch.long)
        return out
