"""The layout table: where each model family keeps Q, K, V, O and the FFN, as data.

One `Layout` row per family (keyed by the Hugging Face `config.model_type`, or "oelm-gpt" / "oelm-llama" for ours): the
ModuleList of transformer layers, the module paths of the projections inside a layer, and the
config keys of the head counts. `oelm.core.targets` reads a row to build a model's targets.

Families with separate Q/K/V projections name three modules. Families that fuse Q/K/V into one
weight name that module (`fused`) and its row order (`rows`, see `qkv_rows`): the targets split
it into three parameters that keep the fused layout on disk. Every row with separate projections
is also a naming convention: a model whose `model_type` has no row, but whose layers match one
row's module paths, is handled by that row (`oelm.core.targets.discover_layout`).

An encoder-decoder (`EncoderDecoder`) has a row per stack of layers; the decoder's row also names
each layer's cross attention, which the targets expose as a block of its own (kind "cross"), so a
method can treat it like self attention or leave it alone (`Method.cross_attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

# How the rows of a fused Q/K/V weight are ordered (n heads, n_kv K/V heads, head size d):
#   "blocks": [Q (n*d) | K (n_kv*d) | V (n_kv*d)]            Phi-3, MPT, GPT-2, Falcon-7B (multi-query), StarCoder
#   "groups": per K/V head g: [its n/n_kv Q heads | K_g | V_g] GPT-NeoX, Bloom, Falcon-40B; n_kv = n gives
#             the head-interleaved [n, 3, d] layout.
ROW_ORDERS = ("blocks", "groups")

HeadCount = tuple[str, ...] | Callable[[Any], int]


@dataclass(frozen=True)
class Layout:
    """Where one family keeps its projections. Module paths are relative to a transformer layer."""

    layers: str  # the ModuleList of layers: its qualified name or a dotted suffix of it
    q: str = ""  # separate projections (empty with `fused`)
    k: str = ""
    v: str = ""
    o: str = ""
    # The FFN's paths, or a function of the config giving them; None: the FFN is not [out, in]
    # Linear weights (ffn_note says why).
    ffn: tuple[str, ...] | Callable[[Any], tuple[str, ...]] | None = ()
    heads: HeadCount = ("num_attention_heads",)  # config keys (first present) or a function of the config
    kv_heads: HeadCount = ("num_key_value_heads",)  # none present (or None): as many as `heads`
    fused: str = ""  # one module computing [Q|K|V] in the order `rows` says
    rows: str | Callable[[Any], str] = "blocks"
    ffn_note: str = ""  # why `ffn` is None
    adapter_via: str = "hook"  # how adapters wrap Q/K/V outputs (see oelm.core.targets.Proj)
    cross: tuple[str, str, str, str] = ()  # a decoder layer's cross-attention Q, K, V, O paths
    # Q, K, V biases held as parameters of their own beside a bias-free fused weight ("": none).
    qkv_bias: tuple[str, str, str] = ()
    # Other projections beside Q/K/V that the row knows and deliberately leaves to training; any
    # projection next to Q, K or V that is neither named here nor a role is refused (a method would
    # leave attention scores trainable through it: Longformer's query_global / key_global).
    extra: tuple[str, ...] = ()

    @property
    def separate(self) -> bool:
        """Whether Q, K and V are modules of their own (so the row is also a naming convention)."""
        return not self.fused


@dataclass(frozen=True)
class EncoderDecoder:
    """An encoder-decoder family: one row per stack of layers; the decoder's also names cross attention.

    A model holding one stack only (an encoder-only T5, a causal-LM BART decoder) uses that one.
    """

    encoder: Layout
    decoder: Layout


def stacks(entry: Layout | EncoderDecoder) -> tuple[Layout, ...]:
    """The rows of a family's stacks of layers, in order (encoder first)."""
    return (entry.encoder, entry.decoder) if isinstance(entry, EncoderDecoder) else (entry,)


def ffn_paths(layout: Layout, config: Any) -> tuple[str, ...] | None:
    """The FFN's module paths for this config (None: the FFN is not [out, in] weights)."""
    return layout.ffn(config) if callable(layout.ffn) else layout.ffn


def count(spec: HeadCount, config: Any) -> int | None:
    """A head count from the config: the first present key's value, or the function's result."""
    if callable(spec):
        return spec(config)
    for key in spec:
        value = getattr(config, key, None)
        if value is not None:
            return int(value)
    return None


def row_order(layout: Layout, config: Any) -> str:
    """The fused weight's row order for this config (one of ROW_ORDERS)."""
    order = layout.rows(config) if callable(layout.rows) else layout.rows
    if order not in ROW_ORDERS:
        raise ValueError(f"unknown row order {order!r}; one of {ROW_ORDERS}")
    return order


def qkv_rows(order: str, n_heads: int, n_kv: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Indices of the Q, K and V rows inside a fused weight, each in head order.

    Q's rows come out as [n_heads * head_dim] with head h at rows h*d..(h+1)*d, K's and V's as
    [n_kv * head_dim]: the layout separate projections have, so head-wise code reads them alike.
    """
    d, n, g = head_dim, n_heads, n_kv
    if order == "blocks":
        idx = torch.arange((n + 2 * g) * d)
        return idx[: n * d], idx[n * d : (n + g) * d], idx[(n + g) * d :]
    if order == "groups":
        per = n // g  # query heads per K/V head
        grid = torch.arange((n + 2 * g) * d).view(g, per + 2, d)
        return grid[:, :per].reshape(-1), grid[:, per].reshape(-1), grid[:, per + 1].reshape(-1)
    raise ValueError(f"unknown row order {order!r}; one of {ROW_ORDERS}")


# ---- rows shared by several families ----

_BERT = Layout(
    "encoder.layer",
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    ("intermediate.dense", "output.dense"),
)
_LLAMA = Layout(
    "layers",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
)


_BART_ENCODER = Layout(
    "encoder.layers",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    ("fc1", "fc2"),
    heads=("encoder_attention_heads",),
)
_BART = EncoderDecoder(
    _BART_ENCODER,
    replace(
        _BART_ENCODER,
        layers="decoder.layers",
        heads=("decoder_attention_heads",),
        cross=("encoder_attn.q_proj", "encoder_attn.k_proj", "encoder_attn.v_proj", "encoder_attn.out_proj"),
    ),
)


def _t5_ffn(sublayer: int) -> Callable[[Any], tuple[str, ...]]:
    """T5's FFN paths in a block whose FFN is sub-layer `sublayer` (gated GELU: wi_0, wi_1, wo)."""

    def paths(config: Any) -> tuple[str, ...]:
        names = ("wi_0", "wi_1", "wo") if config.is_gated_act else ("wi", "wo")
        return tuple(f"layer.{sublayer}.DenseReluDense.{n}" for n in names)

    return paths


_T5_SELF = tuple(f"layer.0.SelfAttention.{x}" for x in "qkvo")
_T5 = EncoderDecoder(
    Layout("encoder.block", *_T5_SELF, ffn=_t5_ffn(1)),
    Layout("decoder.block", *_T5_SELF, ffn=_t5_ffn(2), cross=tuple(f"layer.1.EncDecAttention.{x}" for x in "qkvo")),
)


def _falcon_kv(config: Any) -> int:
    if config.new_decoder_architecture or not config.multi_query:
        return config.num_kv_heads or config.num_attention_heads
    return 1


def _falcon_rows(config: Any) -> str:
    # Falcon-7B (multi-query, old layout): [Q | K | V]; Falcon-40B/180B and the multi-head old
    # layout: per K/V group [Q heads | K | V] (one Q head per group when multi-head).
    return "blocks" if config.multi_query and not config.new_decoder_architecture else "groups"


def _bigcode_kv(config: Any) -> int:
    return 1 if config.multi_query else config.num_attention_heads


LAYOUTS: dict[str, Layout | EncoderDecoder] = {
    "oelm-gpt": Layout(
        "transformer.h",
        "attn.q_proj",
        "attn.k_proj",
        "attn.v_proj",
        "attn.o_proj",
        ("mlp.fc_in", "mlp.fc_out"),
        heads=("n_head",),
        kv_heads=("n_head",),
        adapter_via="native",
    ),
    # Our Llama-style decoder (oelm.models.llama): Hugging Face Llama's module names under `model`.
    "oelm-llama": replace(
        _LLAMA, layers="model.layers", heads=("n_head",), kv_heads=("n_kv_head",), adapter_via="native"
    ),
    # Encoders.
    "bert": _BERT,
    "roberta": _BERT,
    "xlm-roberta": _BERT,
    "electra": _BERT,
    # DeBERTa (v1): per-head [q, k, v] rows in a bias-free in_proj, Q and V biases beside it.
    "deberta": replace(
        _BERT,
        q="",
        k="",
        v="",
        fused="attention.self.in_proj",
        rows="groups",
        qkv_bias=("attention.self.q_bias", "", "attention.self.v_bias"),
    ),
    "deberta-v2": replace(
        _BERT, q="attention.self.query_proj", k="attention.self.key_proj", v="attention.self.value_proj"
    ),
    "distilbert": Layout(
        "transformer.layer",
        "attention.q_lin",
        "attention.k_lin",
        "attention.v_lin",
        "attention.out_lin",
        ("ffn.lin1", "ffn.lin2"),
    ),
    # Decoders with separate projections.
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _LLAMA,
    "gemma2": _LLAMA,
    "gemma3_text": _LLAMA,
    "stablelm": _LLAMA,
    "mixtral": replace(
        _LLAMA,
        ffn=None,
        ffn_note="Mixtral's experts are fused 3-D tensors (mlp.experts.gate_up_proj / down_proj), "
        "not [out, in] Linear weights",
    ),
    "phi": replace(_LLAMA, o="self_attn.dense", ffn=("mlp.fc1", "mlp.fc2")),
    "opt": replace(_LLAMA, layers="decoder.layers", o="self_attn.out_proj", ffn=("fc1", "fc2")),
    "gptj": Layout("h", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj", ("mlp.fc_in", "mlp.fc_out")),
    "gpt_neo": Layout(
        "h",
        "attn.attention.q_proj",
        "attn.attention.k_proj",
        "attn.attention.v_proj",
        "attn.attention.out_proj",
        ("mlp.c_fc", "mlp.c_proj"),
    ),
    # Decoders with a fused Q/K/V weight.
    "gpt2": Layout("h", o="attn.c_proj", ffn=("mlp.c_fc", "mlp.c_proj"), fused="attn.c_attn"),
    "gpt_neox": Layout(
        "layers",
        o="attention.dense",
        ffn=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
        fused="attention.query_key_value",
        rows="groups",
    ),
    "phi3": Layout(
        "layers", o="self_attn.o_proj", ffn=("mlp.gate_up_proj", "mlp.down_proj"), fused="self_attn.qkv_proj"
    ),
    "falcon": Layout(
        "h",
        o="self_attention.dense",
        ffn=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
        kv_heads=_falcon_kv,
        fused="self_attention.query_key_value",
        rows=_falcon_rows,
    ),
    "bloom": Layout(
        "h",
        o="self_attention.dense",
        ffn=("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
        fused="self_attention.query_key_value",
        rows="groups",
    ),
    "gpt_bigcode": Layout(
        "h",
        o="attn.c_proj",
        ffn=("mlp.c_fc", "mlp.c_proj"),
        kv_heads=_bigcode_kv,
        fused="attn.c_attn",
        rows=lambda config: "blocks" if config.multi_query else "groups",
    ),
    "mpt": Layout("blocks", o="attn.out_proj", ffn=("ffn.up_proj", "ffn.down_proj"), fused="attn.Wqkv"),
    # Encoder-decoders: self attention in both stacks, cross attention in the decoder's layers.
    "bart": _BART,
    "mbart": _BART,
    "marian": _BART,
    "pegasus": _BART,
    "t5": _T5,
    "mt5": _T5,
}

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(LAYOUTS)
# Our own models (oelm.models): built from their config, so an architecture change (thin keys) is theirs to make.
OWN_FAMILIES: tuple[str, ...] = ("oelm-gpt", "oelm-llama")


def conventions() -> list[tuple[str, Layout]]:
    """(family, row) of each distinct separate-projection row: the naming conventions to discover."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for family, layout in LAYOUTS.items():
        if isinstance(layout, EncoderDecoder) or not layout.separate or family.startswith("oelm-"):
            continue
        key = (layout.q, layout.k, layout.v, layout.o)
        if key not in seen:
            seen.add(key)
            out.append((family, layout))
    return out
