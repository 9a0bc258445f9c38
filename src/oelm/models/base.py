"""What the two decoder families share, written once: the config's derived sizes and dict reads,
the preset lookup, and the causal LM's forward, head check, vocabulary padding, reconfiguration and
generation (one KV-cache behaviour).

Only what differs stays in `gpt.py` and `llama.py`: positions (learned table / RoPE), norms
(LayerNorm / RMSNorm), the MLP (GELU / SwiGLU), the attention layout and the module names each
family's checkpoints and exports use. A family's LM implements `_hidden` (the backbone's final
hidden states, flattened) and `_attentions` (its attention modules); the rest is here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oelm.models import sampling, vocab
from oelm.models.loss import linear_cross_entropy
from oelm.utils.errors import UserError

# What a method switches on a built model, in place (every other field needs a rebuild).
RECONFIGURABLE = frozenset({"q_identity", "attn_scale"})


class FamilyConfig:
    """Derived sizes and Hugging Face-style reads of a family's frozen config dataclass."""

    vocab_size: int
    vocab_multiple: int
    d_model: int
    n_head: int
    qk_dim: int | None

    @property
    def qk_width(self) -> int:
        """Width of Q (all query heads): qk_dim, or d_model when it is not set."""
        return self.qk_dim or self.d_model

    @property
    def head_dim(self) -> int:
        """Per-head width of values (and of queries and keys without thin keys)."""
        return self.d_model // self.n_head

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding and LM head: vocab_size rounded up to vocab_multiple."""
        return vocab.padded_size(self.vocab_size, self.vocab_multiple)

    def get(self, key: str, default: Any = None) -> Any:
        """dict-style read, as Hugging Face code (e.g. PEFT) reads a model's config."""
        return getattr(self, key, default)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict, as Hugging Face configs offer (PEFT reads configs through it)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def from_preset(
    presets: dict[str, Any], family: str, preset: str, overrides: dict[str, Any], follow_width: bool
) -> Any:
    """A preset's config with fields overridden (None values ignored). With `follow_width` a changed
    width without a d_ff of its own lets d_ff follow it (the Llama family's rule); without it the
    preset's d_ff stays (our GPT's, kept so every stored run rebuilds the same model)."""
    if preset not in presets:
        raise UserError(f"unknown {family} preset {preset!r}; choose one of: {', '.join(presets)}")
    base = presets[preset]
    fields = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise UserError(f"unknown {type(base).__name__} field(s) {unknown}; valid fields: {sorted(fields)}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    if follow_width and "d_model" in changes and "d_ff" not in changes:
        changes["d_ff"] = None
    return dataclasses.replace(base, **changes)


def reconfigure(model: nn.Module, attentions: Iterable[nn.Module], **changes: Any) -> None:
    """Change a built model's q_identity / attn_scale in place (what a method switches on).

    q_identity=True drops every Q projection (its weights are gone, not kept unused), attn_scale
    sets the logit scale. The other weights keep their values, so a method applied after building
    starts from the same init as the baseline.
    """
    if set(changes) - RECONFIGURABLE:
        raise UserError(
            f"only {sorted(RECONFIGURABLE)} change on a built {type(model).__name__}, "
            f"not {sorted(set(changes) - RECONFIGURABLE)}"
        )
    cfg = dataclasses.replace(model.config, **changes)
    for attn in attentions:
        attn.configure(cfg)
    model.config = cfg


class CausalLM(nn.Module):
    """A decoder-only language model: backbone, LM head (`self.lm_head`), `config`."""

    config: Any
    lm_head: nn.Linear

    def _hidden(self, idx: torch.Tensor, caches: list[list] | None = None, start: int = 0) -> torch.Tensor:
        """Final hidden states [B*T, D] of token ids [B, T] at positions start..start+T-1; with
        caches (one list per block) the blocks keep and read past keys and values."""
        raise NotImplementedError

    def _attentions(self) -> list[nn.Module]:
        """The attention module of every block, in order."""
        raise NotImplementedError

    def _vocab_weights(self) -> tuple[torch.Tensor, ...]:
        """The weights whose rows are the vocabulary (embedding; the head when untied)."""
        raise NotImplementedError

    def reconfigure(self, **changes: Any) -> None:
        """q_identity / attn_scale changed in place (`base.reconfigure`)."""
        reconfigure(self, self._attentions(), **changes)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        return_logits: bool = True,
        reduction: str = "mean",
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits [B, T, V] and, given targets, the mean token cross-entropy (-100 is ignored;
        reduction="none": the [B, T] per-token losses, 0 where ignored).

        With targets and return_logits=False (what training and evaluation use) the logits are
        never materialized: the loss comes from `linear_cross_entropy` (same values and
        gradients, far less memory and memory traffic) and the logits returned are None. A head
        that is not a plain Linear (e.g. wrapped by an adapter, or with forward hooks) takes the
        plain path.
        """
        h = self._hidden(idx)  # [B*T, d]
        logits = loss = None
        v = self.config.vocab_size
        if targets is not None and not return_logits and self._plain_head():
            loss = linear_cross_entropy(h, self.lm_head.weight, targets.flatten(), reduction=reduction, classes=v)
        else:
            logits = vocab.real_logits(self.lm_head(h), v)  # [B*T, V], padding columns cut off
            if targets is not None:
                loss = F.cross_entropy(logits.float(), targets.flatten(), ignore_index=-100, reduction=reduction)
        if loss is not None and reduction == "none":
            loss = loss.view(idx.shape)
        return (logits.view(*idx.shape, -1) if logits is not None else None), loss

    def _plain_head(self) -> bool:
        head = self.lm_head
        return type(head) is nn.Linear and head.bias is None and not (head._forward_hooks or head._forward_pre_hooks)

    def vocab_padding(self) -> dict[int, int]:
        """id(weight) -> its padding parameters (rows past vocab_size), empty with vocab_multiple = 1."""
        return vocab.padding(self.config.vocab_size, *self._vocab_weights())

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        context: int | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Sample continuations of idx [B, T]; temperature 0 means greedy.

        Each new token sees the last `context` tokens only (default the block size; pass the length
        the model was trained at): past it the window slides, older tokens are dropped, and no
        position beyond `context` is ever read (positions a shorter training never trained).
        With use_cache, keys and values of past positions are kept while the sequence fits the
        window (one position per step after the prompt); past it each step re-reads the window
        from position 0, as use_cache=False does at every step.
        """
        window = sampling.window(context, self.config.block_size)
        caches: list[list] | None = None
        start = 0
        for _ in range(max_new_tokens):
            if use_cache and idx.shape[1] <= window:
                caches = caches if caches is not None else [[] for _ in self._attentions()]
                feed = idx[:, start:]
                h = self._hidden(feed, caches, start)
                start = idx.shape[1]
            else:
                feed = idx[:, -window:]
                h = self._hidden(feed)
            last = h.view(idx.shape[0], feed.shape[1], -1)[:, -1, :]
            logits = vocab.real_logits(self.lm_head(last), self.config.vocab_size).float()
            idx = torch.cat([idx, sampling.pick_next(logits, temperature, top_k, generator)], dim=1)
        return idx
