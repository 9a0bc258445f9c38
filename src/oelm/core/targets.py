"""Where Q, K, V, O and the FFN live in each supported model family.

Every projection is exposed as a `Proj` whose weight is read and written in the [out, in]
layout, whatever the storage (nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out]).
GPT-2's fused `c_attn` is split in place into separate Q/K/V parameters (`SplitQKV`, still one
GEMM through `oelm.models.fused`) so that a frozen Q/K gets no weight gradient at all; its state_dict
keeps the fused layout, so `save_pretrained`/`from_pretrained` still round-trip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from oelm.models.fused import fused_qkv
from oelm.models.gpt import GPT, GPTClassifier
from oelm.utils.errors import UserError


@dataclass
class Proj:
    """One projection: weight (+ optional bias), readable/writable as [out, in]."""

    name: str
    weight: nn.Parameter
    bias: nn.Parameter | None = None
    transposed: bool = False  # stored [in, out] (Conv1D)
    module: nn.Module | None = None  # the module computing this projection's output
    # How an adapter wraps the output: "hook" (forward hook on module), "native" (our GPT's
    # SelfAttention._adapt reads module.oelm_adapter) or "split" (SplitQKV applies its part's).
    adapter_via: str = "hook"
    part: str | None = None  # q, k or v inside a SplitQKV

    def get(self) -> torch.Tensor:
        """The weight as [out, in] (a view)."""
        return self.weight.T if self.transposed else self.weight

    @torch.no_grad()
    def set(self, w_out_in: torch.Tensor) -> None:
        """Overwrite the weight from an [out, in] tensor (cast to the parameter's dtype/device)."""
        self.get().copy_(w_out_in)

    def params(self) -> list[tuple[str, nn.Parameter]]:
        """(suffix, parameter) pairs of this projection."""
        out = [("weight", self.weight)]
        if self.bias is not None:
            out.append(("bias", self.bias))
        return out

    @property
    def shape_out_in(self) -> tuple[int, int]:
        return tuple(self.get().shape)  # type: ignore[return-value]


@dataclass
class LayerTargets:
    """The projections of one transformer layer."""

    index: int
    q: Proj
    k: Proj
    v: Proj
    o: Proj
    ffn: list[Proj]
    n_heads: int
    n_kv_heads: int

    def by_role(self) -> Iterator[tuple[str, Proj]]:
        """(role, projection) pairs: q, k, v, o, ffn."""
        yield from (("q", self.q), ("k", self.k), ("v", self.v), ("o", self.o))
        yield from (("ffn", p) for p in self.ffn)


@dataclass
class ModelTargets:
    """All layers of a model and the family they were found with."""

    family: str
    layers: list[LayerTargets] = field(default_factory=list)


class SplitQKV(nn.Module):
    """GPT-2's fused Conv1D `c_attn` as three parameters in one fused GEMM; same output."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        nx, nf = conv.weight.shape
        d = nf // 3
        self.nx, self.nf = nx, nf
        with torch.no_grad():
            for i, part in enumerate("qkv"):
                w = conv.weight[:, i * d : (i + 1) * d].detach().clone()
                b = conv.bias[i * d : (i + 1) * d].detach().clone()
                setattr(self, f"{part}_weight", nn.Parameter(w, conv.weight.requires_grad))
                setattr(self, f"{part}_bias", nn.Parameter(b, conv.bias.requires_grad))
        # Keep the fused layout on disk so the Hugging Face model saves and reloads unchanged.
        self.register_state_dict_post_hook(_fuse_state_dict)
        self.register_load_state_dict_pre_hook(_split_state_dict)

    def forward(self, x: torch.Tensor) -> torch.Tensor:

        # One GEMM; weight gradients only for the blocks that require grad. Conv1D weights are
        # [in, out], so pass their [out, in] transposed views.
        ws = [getattr(self, f"{p}_weight").t() for p in "qkv"]
        y = fused_qkv(x, *ws, *(getattr(self, f"{p}_bias") for p in "qkv"))
        adapters = self._modules.get("oelm_adapter")
        if adapters is None:
            return y
        parts = y.split([w.shape[0] for w in ws], dim=-1)
        parts = [adapters[p](x, z) if p in adapters else z for p, z in zip("qkv", parts)]
        return torch.cat(parts, dim=-1)

    def add_adapter(self, part: str, adapter: nn.Module) -> None:
        """Apply `adapter` to the q, k or v part's output (state keys `oelm_adapter.<part>.*`)."""
        if "oelm_adapter" not in self._modules:
            self.oelm_adapter = nn.ModuleDict()
        self.oelm_adapter[part] = adapter

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx} (split into q/k/v)"


def attach_adapter(proj: Proj, adapter: nn.Module) -> None:
    """Make `adapter(x, y)` wrap the output y of a projection, as submodule `oelm_adapter`.

    The original weights keep their state-dict keys; the adapter's appear beside them.
    """
    module = proj.module
    if module is None:
        raise UserError(f"{proj.name}: this family's extractor gives no module to attach an adapter to")
    if proj.adapter_via == "split":
        module.add_adapter(proj.part, adapter)
        return
    if "oelm_adapter" in module._modules:
        raise UserError(f"{proj.name} already has an adapter")
    module.oelm_adapter = adapter
    if proj.adapter_via == "hook":
        module.register_forward_hook(_adapter_hook)


def _adapter_hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return module.oelm_adapter(args[0], output)


def _fuse_state_dict(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    for kind in ("weight", "bias"):
        parts = [state_dict.pop(f"{prefix}{p}_{kind}") for p in "qkv"]
        state_dict[f"{prefix}{kind}"] = torch.cat(parts, dim=-1)


def _split_state_dict(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    for kind in ("weight", "bias"):
        key = f"{prefix}{kind}"
        if key in state_dict:
            fused = state_dict.pop(key)
            for p, chunk in zip("qkv", fused.chunk(3, dim=-1)):
                state_dict[f"{prefix}{p}_{kind}"] = chunk


def _lin(name: str, module: nn.Module, via: str = "hook") -> Proj:
    """A Proj over an nn.Linear (or any module with [out, in] weight and optional bias)."""
    return Proj(name, module.weight, getattr(module, "bias", None), module=module, adapter_via=via)


def _conv(name: str, module: nn.Module) -> Proj:
    """A Proj over a GPT-2 Conv1D ([in, out] weight)."""
    return Proj(name, module.weight, module.bias, transposed=True, module=module)


# ---- one extractor per family: (layer name, layer module, model config) -> LayerTargets ----


def _oelm_gpt(name: str, layer: nn.Module, cfg) -> LayerTargets:
    a, m = layer.attn, layer.mlp
    p = f"{name}.attn"
    return LayerTargets(
        0,
        _lin(f"{p}.q_proj", a.q_proj, "native"),
        _lin(f"{p}.k_proj", a.k_proj, "native"),
        _lin(f"{p}.v_proj", a.v_proj, "native"),
        _lin(f"{p}.o_proj", a.o_proj),
        [_lin(f"{name}.mlp.fc_in", m.fc_in), _lin(f"{name}.mlp.fc_out", m.fc_out)],
        cfg.n_head,
        cfg.n_head,
    )


def _bert(name: str, layer: nn.Module, cfg) -> LayerTargets:
    s, p = layer.attention.self, f"{name}.attention"
    return LayerTargets(
        0,
        _lin(f"{p}.self.query", s.query),
        _lin(f"{p}.self.key", s.key),
        _lin(f"{p}.self.value", s.value),
        _lin(f"{p}.output.dense", layer.attention.output.dense),
        [
            _lin(f"{name}.intermediate.dense", layer.intermediate.dense),
            _lin(f"{name}.output.dense", layer.output.dense),
        ],
        cfg.num_attention_heads,
        cfg.num_attention_heads,
    )


def _distilbert(name: str, layer: nn.Module, cfg) -> LayerTargets:
    a, p = layer.attention, f"{name}.attention"
    return LayerTargets(
        0,
        _lin(f"{p}.q_lin", a.q_lin),
        _lin(f"{p}.k_lin", a.k_lin),
        _lin(f"{p}.v_lin", a.v_lin),
        _lin(f"{p}.out_lin", a.out_lin),
        [_lin(f"{name}.ffn.lin1", layer.ffn.lin1), _lin(f"{name}.ffn.lin2", layer.ffn.lin2)],
        cfg.n_heads,
        cfg.n_heads,
    )


def _gpt2(name: str, layer: nn.Module, cfg) -> LayerTargets:
    attn, p = layer.attn, f"{name}.attn"
    if not isinstance(attn.c_attn, SplitQKV):
        attn.c_attn = SplitQKV(attn.c_attn)
    c = attn.c_attn
    q, k, v = (
        Proj(f"{p}.c_attn.{x}", getattr(c, f"{x}_weight"), getattr(c, f"{x}_bias"), True, c, "split", x) for x in "qkv"
    )
    mlp = [_conv(f"{name}.mlp.c_fc", layer.mlp.c_fc), _conv(f"{name}.mlp.c_proj", layer.mlp.c_proj)]
    return LayerTargets(0, q, k, v, _conv(f"{p}.c_proj", attn.c_proj), mlp, cfg.n_head, cfg.n_head)


def _llama(name: str, layer: nn.Module, cfg) -> LayerTargets:
    a, m, p = layer.self_attn, layer.mlp, f"{name}.self_attn"
    n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return LayerTargets(
        0,
        _lin(f"{p}.q_proj", a.q_proj),
        _lin(f"{p}.k_proj", a.k_proj),
        _lin(f"{p}.v_proj", a.v_proj),
        _lin(f"{p}.o_proj", a.o_proj),
        [_lin(f"{name}.mlp.{x}", getattr(m, x)) for x in ("gate_proj", "up_proj", "down_proj")],
        cfg.num_attention_heads,
        n_kv,
    )


# family -> (pattern a layer's qualified name ends with, extractor)
_FAMILIES: dict[str, tuple[str, Callable[[str, nn.Module, object], LayerTargets]]] = {
    "oelm-gpt": ("transformer.h", _oelm_gpt),
    "bert": ("encoder.layer", _bert),
    "roberta": ("encoder.layer", _bert),
    "xlm-roberta": ("encoder.layer", _bert),
    "distilbert": ("transformer.layer", _distilbert),
    "gpt2": ("h", _gpt2),
    "llama": ("layers", _llama),
    "mistral": ("layers", _llama),
    "qwen2": ("layers", _llama),
}

SUPPORTED_FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP (`.module`) or torch.compile (`._orig_mod`) wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def model_family(model: nn.Module) -> str:
    """The family key of a model, or a UserError listing the supported ones."""

    model = unwrap(model)
    if isinstance(model, (GPT, GPTClassifier)):
        return "oelm-gpt"
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in _FAMILIES:
        return model_type
    raise UserError(
        f"no known Q/K layout for model {type(model).__name__} (model_type={model_type!r}); "
        f"supported families: {', '.join(SUPPORTED_FAMILIES)}. Add an extractor in oelm/core/targets.py."
    )


def _layer_list(model: nn.Module, family: str) -> tuple[str, nn.ModuleList]:
    """(qualified name, ModuleList) of the transformer layers of a model of `family`."""
    suffix = _FAMILIES[family][0]
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and (name == suffix or name.endswith("." + suffix)):
            return name, module
    raise UserError(f"found no transformer layers named '*{suffix}' in this {family} model")


def find_targets(model: nn.Module) -> ModelTargets:
    """Locate every layer's Q/K/V/O/FFN projections (splits GPT-2's fused c_attn in place).

    A model with a method applied answers from the targets apply_method found (its MethodState).
    """
    model = unwrap(model)
    cached = getattr(getattr(model, "_oelm_method_state", None), "targets", None)
    if cached is not None:
        return cached
    family = model_family(model)
    extract = _FAMILIES[family][1]
    targets = ModelTargets(family)
    name, layers = _layer_list(model, family)
    for i, layer in enumerate(layers):
        lt = extract(f"{name}.{i}", layer, model.config)
        lt.index = i
        targets.layers.append(lt)
    return targets


def layer_depths(model: nn.Module) -> tuple[dict[int, int], int]:
    """(parameter id -> depth, n_layers): embeddings 0, layer i at i + 1, the rest n_layers + 1."""
    model = unwrap(model)
    _, layers = _layer_list(model, model_family(model))
    n = len(layers)
    depth = {id(p): n + 1 for p in model.parameters()}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            depth.update({id(p): 0 for p in module.parameters()})
    for i, layer in enumerate(layers):
        depth.update({id(p): i + 1 for p in layer.parameters()})
    return depth, n
