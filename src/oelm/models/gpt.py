"""The study's GPT: pre-LayerNorm blocks, learned positions, tied LM head, separate Q/K/V/O (fused QKV GEMM)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from oelm.models import vocab
from oelm.models.base import CausalLM, FamilyConfig, from_preset, reconfigure
from oelm.models.fused import fused_qkv, identity_qkv
from oelm.utils.errors import UserError


@dataclass(frozen=True)
class GPTConfig(FamilyConfig):
    """Architecture of a GPT; `d_ff` defaults to 4 * d_model.

    `bias=False` drops the LayerNorm and MLP biases (nanoGPT's bias-free shape); Q/K/V/O never
    have biases.
    """

    vocab_size: int = 50257
    block_size: int = 512
    n_layer: int = 6
    n_head: int = 8
    d_model: int = 512
    d_ff: int | None = None
    dropout: float = 0.0
    init_std: float = 0.02
    bias: bool = True
    # Width of Q and K (all heads together); None = d_model. Smaller = "thin keys": scores are
    # computed in qk_dim / n_head dimensions per head while V and O keep d_model.
    qk_dim: int | None = None
    # W_Q = I with the Q projection removed (Karbevski & Mijoski 2025): q is the normed residual
    # input split into heads; no Q weight, no Q matmul, no Q gradient. Needs Q as wide as d_model.
    q_identity: bool = False
    # Multiplier on the attention scale 1/sqrt(head_dim) (the identity-Q paper halves it: 0.5).
    attn_scale: float = 1.0
    # Activation checkpointing: recompute each block in backward while training (memory for compute).
    grad_checkpoint: bool = False
    # Pad the embedding / LM-head rows to a multiple of this (64: GPT-2's 50,257 -> 50,304, aligned
    # GPU GEMMs); 1 = no padding. Exact: padded rows start at zero, their logits never reach a
    # loss, softmax or sample (zero gradient), exports drop them, and parameter counts (`oelm
    # params`, audits, trainable %) count the real rows only; FLOP counts include them (computed).
    vocab_multiple: int = 1

    def __post_init__(self) -> None:
        vocab.check_multiple("GPTConfig", self.vocab_multiple)
        if self.d_model % self.n_head:
            raise UserError(
                f"d_model={self.d_model} is not divisible by n_head={self.n_head}; "
                "pick a head count that divides the model width"
            )
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        for field in ("vocab_size", "block_size", "n_layer", "n_head", "d_model", "d_ff", "qk_width"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                name = "qk_dim" if field == "qk_width" else field
                raise UserError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.qk_width % self.n_head or self.qk_width > self.d_model:
            raise UserError(
                f"GPTConfig.qk_dim={self.qk_width} must be a multiple of n_head={self.n_head} and at most "
                f"d_model={self.d_model}"
            )
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise UserError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not (isinstance(self.init_std, (int, float)) and 0.0 < self.init_std < float("inf")):
            raise UserError(f"GPTConfig.init_std must be a positive finite number, got {self.init_std!r}")
        for flag in ("q_identity", "grad_checkpoint"):
            if not isinstance(getattr(self, flag), bool):
                raise UserError(f"GPTConfig.{flag} must be true or false, got {getattr(self, flag)!r}")
        if self.q_identity and self.qk_width != self.d_model:
            raise UserError(
                f"GPTConfig.q_identity needs Q as wide as the model, but qk_dim={self.qk_width} < "
                f"d_model={self.d_model}; drop qk_dim (thin keys) or q_identity"
            )
        scale = self.attn_scale
        if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and 0.0 < scale < float("inf")):
            raise UserError(f"GPTConfig.attn_scale must be a positive finite number, got {scale!r}")


PRESETS: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(n_layer=2, d_model=128, n_head=4),
    # gpt-tiny at half the width: head dim 16, where frozen Q/K constrain attention most (the
    # quickstart's model: its cost shows within minutes on 2 CPU cores).
    "gpt-narrow": GPTConfig(n_layer=2, d_model=64, n_head=4),
    "gpt-small": GPTConfig(n_layer=4, d_model=256, n_head=4),
    "gpt-medium-512": GPTConfig(n_layer=6, d_model=512, n_head=8, d_ff=2048, block_size=512),
    "gpt-large": GPTConfig(n_layer=8, d_model=768, n_head=12),
    # GPT-2 small's shape (12 layers, 768, 12 heads, context 1024): where the published
    # identity-Q result was measured, and the GPU benchmarks' second shape.
    "gpt-gpt2s": GPTConfig(n_layer=12, d_model=768, n_head=12, block_size=1024),
}


def gpt_config(preset: str, **overrides) -> GPTConfig:
    """A preset's config with fields (e.g. vocab_size, block_size) overridden (None values ignored)."""
    return from_preset(PRESETS, "GPT", preset, overrides, follow_width=False)


class SelfAttention(nn.Module):
    """Multi-head attention with separate bias-free Q/K/V/O parameters (so Q/K can be frozen alone).

    Q, K and V are computed in one GEMM (`oelm.models.fused.fused_qkv`) that spends weight-gradient
    FLOPs only on the blocks that require grad; `fused = False` runs three separate projections.
    Takes and returns the flattened residual stream [B*T, D] (see `Backbone`).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d, dqk = cfg.d_model, cfg.qk_width
        self.n_head = cfg.n_head
        self.q_proj = nn.Linear(d, dqk, bias=False)
        self.k_proj = nn.Linear(d, dqk, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.dropout = cfg.dropout  # attention weights and the residual branch
        self.fused = True
        self.scale: float | None = None
        self.configure(cfg)

    def configure(self, cfg: GPTConfig) -> None:
        """Take the config's q_identity and attn_scale: drop the Q projection, set the logit scale."""
        if cfg.q_identity and self.q_proj is not None:
            self.q_proj = None  # no parameter, no matmul: q is the block's (normed) input
        elif not cfg.q_identity and self.q_proj is None:
            raise ValueError("a Q projection removed by q_identity cannot be restored; build a new model")
        # None: SDPA's own 1/sqrt(head_dim), bit-identical to a model without the option.
        self.scale = None if cfg.attn_scale == 1.0 else cfg.attn_scale / math.sqrt(cfg.qk_width // cfg.n_head)

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        """[B*T, 3D]: Q, K and V side by side."""
        if not self.fused:
            return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        return fused_qkv(x, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)

    def _identity_qkv(self, x: torch.Tensor, batch: int, t: int) -> tuple[torch.Tensor, ...]:
        """W_Q = I: q is x itself (a view, no matmul), K and V come from one GEMM; [B, T, H, Dh] each."""
        if self.fused:
            q, kv = identity_qkv(x, self.k_proj.weight, self.v_proj.weight)
        else:
            kv = torch.cat([self.k_proj(x), self.v_proj(x)], dim=-1)
            q = x.to(kv.dtype)
        k, v = kv.view(batch, t, 2, self.n_head, -1).unbind(2)
        return q.view(batch, t, self.n_head, -1), k, v

    def forward(
        self,
        x: torch.Tensor,
        batch: int,
        causal: bool,
        attn_mask: torch.Tensor | None = None,
        cache: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attention output [B*T, D]; `cache` (a list, [] at first: generation) holds past K/V [B, H, S, Dh]."""
        n, d = x.shape
        t = n // batch
        # [B, T, H, Dh] views: head h owns rows h*Dh:(h+1)*Dh of each projection's weight. One
        # view + unbind (backward: one stack) dispatches fewer ops than split + a view per tensor.
        dqk = self.k_proj.weight.shape[0]
        if self.q_proj is None:
            q, k, v = self._identity_qkv(x, batch, t)
        elif dqk == d:
            q, k, v = self._qkv(x).view(batch, t, 3, self.n_head, d // self.n_head).unbind(2)
        else:  # thin keys: Q and K narrower than V
            q, k, v = self._qkv(x).split((dqk, dqk, d), dim=-1)
            q, k = q.view(batch, t, self.n_head, -1), k.view(batch, t, self.n_head, -1)
            v = v.view(batch, t, self.n_head, -1)
        q, k = self._adapt(x, q, k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        past = 0
        if cache is not None:  # causal decoding: queries at past..past+t-1 see keys 0..their own
            if cache:
                past = cache[0].shape[2]
                k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
            cache[:] = [k, v]
            if past and t > 1:
                attn_mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(past)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal and attn_mask is None and not past,
            scale=self.scale,
        )
        return _dropout(self.o_proj(y.transpose(1, 2).reshape(n, d)), self.dropout, self.training)

    def _adapt(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply a method's adapters (`oelm_adapter` on q_proj / k_proj, see oelm.core.adapters) to q, k [B, T, H, Dh].

        An adapter sees the projection's input and output as [B, T, D] views, the shapes it has on
        any model (a reduction over the leading dims, e.g. a gain's gradient, then sums in the same order).
        """
        # Dict lookups: no cost without adapters (and no Q to adapt under q_identity).
        aq = self.q_proj._modules.get("oelm_adapter") if self.q_proj is not None else None
        ak = self.k_proj._modules.get("oelm_adapter")
        if aq is None and ak is None:
            return q, k
        x = x.view(*q.shape[:2], -1)
        if aq is not None:
            q = aq(x, q.flatten(2)).reshape(q.shape)
        if ak is not None:
            k = ak(x, k.flatten(2)).reshape(k.shape)
        return q, k


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, called only when it changes something (a p = 0 call still costs a dispatch)."""
    return F.dropout(x, p) if p and training else x


class MLP(nn.Module):
    """Feed-forward d -> d_ff -> d with GELU (and biases unless cfg.bias is False)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.fc_out = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _dropout(self.fc_out(F.gelu(self.fc_in(x))), self.dropout, self.training)


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = SelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        batch: int,
        causal: bool,
        attn_mask: torch.Tensor | None = None,
        cache: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), batch, causal, attn_mask, cache)
        return x + self.mlp(self.ln_2(x))


class Backbone(nn.Module):
    """Embeddings, blocks and the final LayerNorm, shared by the LM and the classifier.

    The blocks run on the residual stream flattened to [B*T, D]: every projection is then one 2-D
    GEMM with no reshape around it and its backward none either (the same GEMMs on the same
    memory as [B, T, D]; fewer dispatched ops where eager steps are launch-bound).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        vocab.pad_rows(self.wte, cfg.padded_vocab)  # after the real rows' draws
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.dropout = cfg.dropout
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.block_size = cfg.block_size
        self.grad_checkpoint = cfg.grad_checkpoint

    def forward(
        self,
        idx: torch.Tensor,
        causal: bool,
        attn_mask: torch.Tensor | None = None,
        flat: bool = False,
        caches: list[list] | None = None,
        start: int = 0,
    ) -> torch.Tensor:
        """Final hidden states [B, T, D] of token ids [B, T], or [B*T, D] with flat=True.

        caches (generation): one list per block for its past K/V; idx then sits at positions
        start..start+T-1.
        """
        b, t = idx.shape
        if start + t > self.block_size:
            raise ValueError(f"sequence length {start + t} exceeds the model context {self.block_size}")
        # Positions are consecutive rows: a slice, not an arange + embedding gather (whose
        # backward is a scatter); same values and gradient.
        x = _dropout((self.wte(idx) + self.wpe.weight[start : start + t]).view(b * t, -1), self.dropout, self.training)
        for i, block in enumerate(self.h):
            if self.grad_checkpoint and self.training and torch.is_grad_enabled() and caches is None:
                x = checkpoint(block, x, b, causal, attn_mask, use_reentrant=False)
            else:
                x = block(x, b, causal, attn_mask, caches[i] if caches is not None else None)
        x = self.ln_f(x)
        return x if flat else x.view(b, t, -1)


def _init_weights(module: nn.Module, cfg: GPTConfig, vocab_weight: torch.Tensor) -> None:
    """Normal(0, init_std) weights, zero biases; the token embedding (= the tied head) draws its
    real rows only and zeros its padding rows (`vocab.init_rows`: the unpadded model's draws)."""
    std = cfg.init_std
    if isinstance(module, (nn.Linear, nn.Embedding)):
        if module.weight is vocab_weight and cfg.padded_vocab > cfg.vocab_size:
            vocab.init_rows(module.weight, cfg.vocab_size, std)
        else:
            nn.init.normal_(module.weight, mean=0.0, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class GPT(CausalLM):
    """Causal language model; the LM head shares its weight with the token embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = Backbone(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight
        self.lm_head.out_features = config.padded_vocab
        self.apply(lambda m: _init_weights(m, config, self.transformer.wte.weight))

    def _hidden(self, idx: torch.Tensor, caches: list[list] | None = None, start: int = 0) -> torch.Tensor:
        return self.transformer(idx, causal=True, flat=True, caches=caches, start=start)

    def _attentions(self) -> list[nn.Module]:
        return [block.attn for block in self.transformer.h]

    def _vocab_weights(self) -> tuple[torch.Tensor, ...]:
        return (self.transformer.wte.weight,)


class GPTClassifier(nn.Module):
    """Sequence classifier on the GPT backbone: bidirectional by default, last-token pooling."""

    # For transformers.Trainer: the loss is a batch mean that takes no num_items_in_batch, so the
    # Trainer must not scale it by the number of processes (it doubled loss and gradients at 2).
    accepts_loss_kwargs = False

    def __init__(self, config: GPTConfig, num_labels: int, causal: bool = False) -> None:
        super().__init__()
        if num_labels < 2:
            raise UserError(f"num_labels must be at least 2, got {num_labels}")
        self.config = config
        self.num_labels = num_labels
        self.causal = causal
        self.transformer = Backbone(config)
        self.score = nn.Linear(config.d_model, num_labels)
        self.apply(lambda m: _init_weights(m, config, self.transformer.wte.weight))

    def reconfigure(self, **changes: Any) -> None:
        """q_identity / attn_scale changed in place (`oelm.models.base.reconfigure`)."""
        reconfigure(self, [block.attn for block in self.transformer.h], **changes)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Class logits [B, num_labels] and, given labels, the mean cross-entropy."""
        b, t = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        keep = attention_mask.bool()
        mask = attention_bias(keep, self.causal)
        hidden = self.transformer(input_ids, causal=self.causal, attn_mask=mask)
        # Index of the last kept position per row: works for left and right padding alike.
        positions = torch.arange(t, device=input_ids.device).expand(b, t)
        last = torch.where(keep, positions, torch.full_like(positions, -1)).max(dim=1).values.clamp(min=0)
        pooled = hidden[torch.arange(b, device=input_ids.device), last]
        logits = self.score(pooled)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return logits, loss

    def vocab_padding(self) -> dict[int, int]:
        """id(weight) -> its padding parameters (rows past vocab_size), empty with vocab_multiple = 1."""
        return vocab.padding(self.config.vocab_size, self.transformer.wte.weight)


def attention_bias(keep: torch.Tensor, causal: bool) -> torch.Tensor:
    """Boolean [B, 1, T, T] mask (True = attend) from a key-padding mask, optionally causal."""
    b, t = keep.shape
    allowed = keep[:, None, None, :].expand(b, 1, t, t)
    if causal:
        allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=keep.device).tril()
    # A padded query row with nothing to attend to would give NaN; let it see itself.
    eye = torch.eye(t, dtype=torch.bool, device=keep.device)
    return allowed | eye


def count_parameters(model: nn.Module) -> int:
    """Unique parameters of a model (tied weights counted once; a padded vocabulary's padding rows not)."""
    pad = model.vocab_padding() if callable(getattr(model, "vocab_padding", None)) else {}
    return sum(p.numel() for p in model.parameters()) - sum(pad.values())
