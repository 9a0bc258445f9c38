"""Our Llama-style decoder: RoPE, RMSNorm, SwiGLU, optional QK-norm, grouped-query attention.

Bias-free Q/K/V/O as separate parameters computed in one GEMM (`oelm.models.fused.fused_qkv`,
weight gradients only for the row blocks that train; with grouped-query attention the K and V
blocks are narrower than Q). Module and state-dict names are Hugging Face's `LlamaForCausalLM`
ones (`model.layers.N.self_attn.q_proj`, ...) and RoPE uses its convention (rotate_half on the
two halves of each head, cos/sin in float32), so the export (`oelm.hf.export`) copies tensors
without permuting rows. The targets read the model through the `oelm-llama` row of
`oelm.core.families` (Q per query head, K per key/value head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from packaging.version import Version
from torch import nn
from torch.utils.checkpoint import checkpoint

from oelm.models import vocab
from oelm.models.base import CausalLM, FamilyConfig, from_preset
from oelm.models.fused import fused_qkv, identity_qkv
from oelm.utils.errors import UserError

FAMILY = "oelm-llama"
# Scaled-dot-product attention shares K/V heads itself from torch 2.5; before, K/V are repeated.
_SDPA_GQA = Version(torch.__version__.split("+")[0]) >= Version("2.5")


def swiglu_width(d_model: int, multiple_of: int = 32) -> int:
    """SwiGLU hidden width of about 8/3 d (the 4d GELU MLP's parameters), rounded up to `multiple_of`."""
    return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)


@dataclass(frozen=True)
class LlamaConfig(FamilyConfig):
    """Architecture of our Llama-style decoder; `d_ff` defaults to `swiglu_width(d_model)`.

    n_kv_head: key/value heads (grouped-query attention; None = n_head). qk_dim: width of Q (all
    query heads; K is qk_dim * n_kv_head / n_head), None = d_model; smaller = thin keys.
    q_identity: W_Q = I with no Q projection (q is the normed residual split into heads; needs
    qk_dim = d_model). attn_scale multiplies the attention scale 1/sqrt(head_dim).
    grad_checkpoint: recompute each block in backward (activation checkpointing) while training.
    vocab_multiple: pad the embedding / LM-head rows to a multiple of it (64: GPT-2's 50,257 ->
    50,304, aligned GPU GEMMs); 1 = no padding. Exact, as GPTConfig's: padded rows start at zero,
    their logits never reach a loss, softmax or sample (zero gradient), exports drop them, and
    parameter counts (`oelm params`, audits, trainable %) count the real rows only; FLOP counts
    include them (they are computed).
    """

    vocab_size: int = 50257
    block_size: int = 512
    n_layer: int = 6
    n_head: int = 8
    n_kv_head: int | None = None
    d_model: int = 512
    d_ff: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qk_norm: bool = False
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02
    qk_dim: int | None = None
    q_identity: bool = False
    attn_scale: float = 1.0
    grad_checkpoint: bool = False
    vocab_multiple: int = 1

    def __post_init__(self) -> None:
        vocab.check_multiple("LlamaConfig", self.vocab_multiple)
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)
        if self.d_ff is None and isinstance(self.d_model, int):
            object.__setattr__(self, "d_ff", swiglu_width(self.d_model))
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UserError(f"LlamaConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head or self.n_head % self.n_kv_head:
            raise UserError(
                f"LlamaConfig: d_model={self.d_model} must divide into n_head={self.n_head} heads and n_head "
                f"into n_kv_head={self.n_kv_head} groups; pick head counts that divide"
            )
        qk = self.qk_width
        if not isinstance(qk, int) or isinstance(qk, bool) or qk <= 0 or qk > self.d_model or qk % self.n_head:
            raise UserError(
                f"LlamaConfig.qk_dim={qk!r} must be a positive multiple of n_head={self.n_head}, at most d_model={self.d_model}"
            )
        if (qk // self.n_head) % 2:
            raise UserError(f"LlamaConfig: RoPE needs an even head size, got qk_dim / n_head = {qk // self.n_head}")
        for name in ("qk_norm", "tie_embeddings", "q_identity", "grad_checkpoint"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"LlamaConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.q_identity and qk != self.d_model:
            raise UserError(
                f"LlamaConfig.q_identity needs Q as wide as the model, but qk_dim={qk} < d_model={self.d_model}; "
                "drop qk_dim (thin keys) or q_identity"
            )
        for name, low in (("rope_theta", 1.0), ("norm_eps", 0.0), ("init_std", 0.0), ("attn_scale", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and low < value < float("inf")):
                raise UserError(f"LlamaConfig.{name} must be a finite number above {low:g}, got {value!r}")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise UserError(f"LlamaConfig.dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def model_type(self) -> str:
        """The family key the targets look up (`oelm.core.families.LAYOUTS`)."""
        return FAMILY

    @property
    def qk_head_dim(self) -> int:
        """Per-head width of queries and keys (the width RoPE rotates)."""
        return self.qk_width // self.n_head


PRESETS: dict[str, LlamaConfig] = {
    # CPU sizes: llama-tiny and llama-narrow are gpt-tiny and gpt-narrow's shapes; tiny and small
    # use grouped-query attention (2 query heads per key/value head).
    "llama-tiny": LlamaConfig(n_layer=2, d_model=128, n_head=4, n_kv_head=2),
    "llama-narrow": LlamaConfig(n_layer=2, d_model=64, n_head=4),
    "llama-small": LlamaConfig(n_layer=4, d_model=256, n_head=4, n_kv_head=2),
    # GPT-2 small's shape (12 x 768, 12 heads, context 1024): the identity-Q paper's model size.
    "llama-gpt2s": LlamaConfig(n_layer=12, d_model=768, n_head=12, block_size=1024),
    # GPT-2 medium's shape (24 x 1024, 16 heads): about 350M parameters with the GPT-2 vocabulary.
    "llama-350m": LlamaConfig(n_layer=24, d_model=1024, n_head=16, block_size=1024),
}


def llama_config(preset: str, **overrides: Any) -> LlamaConfig:
    """A preset's config with fields (e.g. vocab_size, block_size) overridden (None values ignored);
    a new d_model without its own d_ff gets the SwiGLU width of the new model."""
    return from_preset(PRESETS, "Llama", preset, overrides, follow_width=True)


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return F.dropout(x, p) if p and training else x


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dim's halves (Hugging Face Llama's RoPE convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(inv_freq: torch.Tensor, start: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(cos, sin) [length, head_dim] for positions start..start+length-1, computed in float32."""
    pos = torch.arange(start, start + length, device=inv_freq.device, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, H, Dh] by the position tables [T, Dh]."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    return x * cos + rotate_half(x) * sin


class LlamaAttention(nn.Module):
    """Grouped-query self attention: bias-free Q/K/V/O, optional per-head QK RMSNorm, then RoPE.

    Takes the flattened residual stream [B*T, D]. Order per head: projection, the method's
    adapters (`oelm_adapter` on q_proj / k_proj, as our GPT), QK-norm, RoPE, attention.
    """

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        d, dq, dh = cfg.d_model, cfg.qk_head_dim, cfg.head_dim
        self.n_head, self.n_kv_head = cfg.n_head, cfg.n_kv_head
        self.q_proj: nn.Linear | None = nn.Linear(d, cfg.n_head * dq, bias=False)
        self.k_proj = nn.Linear(d, cfg.n_kv_head * dq, bias=False)
        self.v_proj = nn.Linear(d, cfg.n_kv_head * dh, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.q_norm = nn.RMSNorm(dq, eps=cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = nn.RMSNorm(dq, eps=cfg.norm_eps) if cfg.qk_norm else None
        self.dropout = cfg.dropout
        self.fused = True
        self.scale: float | None = None
        self.configure(cfg)

    def configure(self, cfg: LlamaConfig) -> None:
        """Take the config's q_identity and attn_scale: drop the Q projection, set the logit scale."""
        if cfg.q_identity and self.q_proj is not None:
            self.q_proj = None  # no parameter, no matmul: q is the block's normed input
        elif not cfg.q_identity and self.q_proj is None:
            raise ValueError("a Q projection removed by q_identity cannot be restored; build a new model")
        # None: SDPA's own 1/sqrt(head_dim), bit-identical to a model without the option.
        self.scale = None if cfg.attn_scale == 1.0 else cfg.attn_scale / math.sqrt(cfg.qk_head_dim)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [N, Dq], k [N, Dk], v [N, Dv] from one GEMM (K/V only under q_identity)."""
        wk, wv = self.k_proj.weight, self.v_proj.weight
        sizes = (wk.shape[0], wv.shape[0])
        if self.q_proj is None:
            if self.fused:
                q, kv = identity_qkv(x, wk, wv)
            else:
                kv = torch.cat([self.k_proj(x), self.v_proj(x)], -1)
                q = x.to(kv.dtype)
            k, v = kv.split(sizes, dim=-1)
            return q, k, v
        wq = self.q_proj.weight
        if self.fused:
            qkv = fused_qkv(x, wq, wk, wv)
        else:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        return qkv.split((wq.shape[0], *sizes), dim=-1)

    def _adapt(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A method's adapters on q, k [B, T, H, Dh] (see our GPT's SelfAttention._adapt)."""
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

    def forward(
        self,
        x: torch.Tensor,
        batch: int,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attention output [B*T, D]; `cache` (a list, [] at first) holds this layer's past K/V [B, Hkv, S, Dh]."""
        n, d = x.shape
        t = n // batch
        q, k, v = self._project(x)
        q = q.reshape(batch, t, self.n_head, -1)
        k = k.reshape(batch, t, self.n_kv_head, -1)
        v = v.reshape(batch, t, self.n_kv_head, -1)
        q, k = self._adapt(x, q, k)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rope(q, cos.to(q.dtype), sin.to(q.dtype)), apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        past = 0
        if cache is not None:
            if cache:
                past = cache[0].shape[2]
                k, v = torch.cat((cache[0], k), dim=2), torch.cat((cache[1], v), dim=2)
            cache[:] = [k, v]
        y = self._attend(q, k, v, past)
        return _dropout(self.o_proj(y.transpose(1, 2).reshape(n, d)), self.dropout, self.training)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
        """SDPA of q [B, H, T, Dh] over k, v [B, Hkv, past+T, Dh], causal in absolute positions."""
        t = q.shape[2]
        mask = None
        if past and t > 1:  # queries past+i see keys 0..past+i
            mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(past)
        extra: dict[str, Any] = {}
        if self.n_kv_head != self.n_head:
            if _SDPA_GQA:
                extra["enable_gqa"] = True
            else:
                rep = self.n_head // self.n_kv_head
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=not past and t > 1,
            scale=self.scale,
            **extra,
        )


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), bias-free."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _dropout(self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), self.dropout, self.training)


class LlamaBlock(nn.Module):
    """Pre-RMSNorm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(
        self, x: torch.Tensor, batch: int, cos: torch.Tensor, sin: torch.Tensor, cache: list | None = None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), batch, (cos, sin), cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBackbone(nn.Module):
    """Token embedding, blocks on the flattened residual stream [B*T, D], final RMSNorm."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        vocab.pad_rows(self.embed_tokens, cfg.padded_vocab)  # after the real rows' draws
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        dq = cfg.qk_head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dq, 2, dtype=torch.int64).float() / dq))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.dropout, self.block_size, self.grad_checkpoint = cfg.dropout, cfg.block_size, cfg.grad_checkpoint

    def forward(self, idx: torch.Tensor, caches: list[list] | None = None, start: int = 0) -> torch.Tensor:
        """Final hidden states [B*T, D] of token ids [B, T] at positions start..start+T-1."""
        b, t = idx.shape
        if start + t > self.block_size:
            raise ValueError(f"sequence length {start + t} exceeds the model context {self.block_size}")
        x = _dropout(self.embed_tokens(idx).view(b * t, -1), self.dropout, self.training)
        cos, sin = rope_tables(self.inv_freq, start, t, torch.float32)
        for i, block in enumerate(self.layers):
            if self.grad_checkpoint and self.training and torch.is_grad_enabled() and caches is None:
                x = checkpoint(block, x, b, cos, sin, use_reentrant=False)
            else:
                x = block(x, b, cos, sin, caches[i] if caches is not None else None)
        return self.norm(x)


class Llama(CausalLM):
    """Causal language model (LlamaForCausalLM's layout): `model` backbone, `lm_head` tied or not."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBackbone(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
            self.lm_head.out_features = config.padded_vocab
        else:
            vocab.pad_rows(self.lm_head, config.padded_vocab)
        padded = config.padded_vocab > config.vocab_size
        vocab_weights = (self.model.embed_tokens.weight, self.lm_head.weight)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                if padded and any(module.weight is w for w in vocab_weights):  # real rows drawn, padding zero
                    vocab.init_rows(module.weight, config.vocab_size, config.init_std)
                else:
                    nn.init.normal_(module.weight, mean=0.0, std=config.init_std)

    def _hidden(self, idx: torch.Tensor, caches: list[list] | None = None, start: int = 0) -> torch.Tensor:
        return self.model(idx, caches, start)

    def _attentions(self) -> list[nn.Module]:
        return [block.self_attn for block in self.model.layers]

    def _vocab_weights(self) -> tuple[torch.Tensor, ...]:
        return (self.model.embed_tokens.weight, self.lm_head.weight)
