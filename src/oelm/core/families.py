"""The layout table: where each model family keeps Q, K, V, O and the FFN, as data.

One `Layout` row per family (keyed by the Hugging Face `config.model_type`, or "oelm-gpt"): the
ModuleList of transformer layers, the module paths of the projections inside a layer, and the
config keys of the head counts. `oelm.core.targets` reads a row to build a model's targets.

Families with separate Q/K/V projections name three modules. Families that fuse Q/K/V into one
weight name that module (`fused`) and its row order (`rows`, see `qkv_rows`): the targets split
it into three parameters that keep the fused layout on disk. Every row with separate projections
is also a naming convention: a model whose `model_type` has no row, but whose layers match one
row's module paths, is handled by that row (`oelm.core.targets.discover_layout`).
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
    ffn: tuple[str, ...] | None = ()  # None: the FFN is not [out, in] Linear weights (see ffn_note)
    heads: HeadCount = ("num_attention_heads",)  # config keys (first present) or a function of the config
    kv_heads: HeadCount = ("num_key_value_heads",)  # none present (or None): as many as `heads`
    fused: str = ""  # one module computing [Q|K|V] in the order `rows` says
    rows: str | Callable[[Any], str] = "blocks"
    ffn_note: str = ""  # why `ffn` is None
    adapter_via: str = "hook"  # how adapters wrap Q/K/V outputs (see oelm.core.targets.Proj)

    @property
    def separate(self) -> bool:
        """Whether Q, K and V are modules of their own (so the row is also a naming convention)."""
        return not self.fused


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


LAYOUTS: dict[str, Layout] = {
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
    # Encoders.
    "bert": _BERT,
    "roberta": _BERT,
    "xlm-roberta": _BERT,
    "electra": _BERT,
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
}

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(LAYOUTS)


def conventions() -> list[tuple[str, Layout]]:
    """(family, row) of each distinct separate-projection row: the naming conventions to discover."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for family, layout in LAYOUTS.items():
        key = (layout.q, layout.k, layout.v, layout.o)
        if layout.separate and family != "oelm-gpt" and key not in seen:
            seen.add(key)
            out.append((family, layout))
    return out
