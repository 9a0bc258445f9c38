"""Where Q, K, V, O and the FFN live in each supported model family.

The layout of each family is a row of data in `oelm.core.families`; this module reads a row to
find a model's projections. Every projection is exposed as a `Proj` whose weight is read and
written in the [out, in] layout, whatever the storage (nn.Linear stores [out, in]; GPT-2's Conv1D
stores [in, out]).

A fused Q/K/V weight (GPT-2's Conv1D `c_attn`, GPT-NeoX's head-interleaved `query_key_value`,
Phi-3's `qkv_proj`, ...) is split in place into separate Q/K/V parameters (`SplitQKV`,
`SplitLinear`: still one GEMM through `oelm.models.fused`), so that a frozen Q/K gets no weight
gradient at all; each keeps the fused layout in its state_dict, so `save_pretrained` /
`from_pretrained` still round-trip.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from oelm.core.families import (
    LAYOUTS,
    SUPPORTED_FAMILIES,
    Layout,
    conventions,
    count,
    ffn_paths,
    qkv_rows,
    row_order,
    stacks,
)
from oelm.models.fused import fused_qkv
from oelm.models.gpt import GPT, GPTClassifier
from oelm.utils.errors import UserError

__all__ = [
    "SUPPORTED_FAMILIES",
    "LayerTargets",
    "ModelTargets",
    "Proj",
    "SplitLinear",
    "SplitQKV",
    "attach_adapter",
    "discover_layout",
    "find_targets",
    "layer_depths",
    "model_family",
    "model_layout",
    "unwrap",
]


@dataclass
class Proj:
    """One projection: weight (+ optional bias), readable/writable as [out, in]."""

    name: str
    weight: nn.Parameter
    bias: nn.Parameter | None = None
    transposed: bool = False  # stored [in, out] (Conv1D)
    module: nn.Module | None = None  # the module computing this projection's output
    # How an adapter wraps the output: "hook" (forward hook on module), "native" (our GPT's
    # SelfAttention._adapt reads module.oelm_adapter) or "split" (SplitQKV/SplitLinear apply their part's).
    adapter_via: str = "hook"
    part: str | None = None  # q, k or v inside a split fused projection

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
    """The projections of one attention block: a layer's self attention and FFN, or its cross attention.

    An encoder-decoder's decoder layer gives two: its self attention (with the FFN), then its
    cross attention (kind "cross"). `index` counts blocks over the whole model, in order.
    """

    index: int
    q: Proj | None  # None: W_Q = I with no Q projection (a model built or switched to q_identity)
    k: Proj
    v: Proj
    o: Proj
    ffn: list[Proj]
    n_heads: int
    n_kv_heads: int
    ffn_note: str | None = None  # set when the FFN is not [out, in] weights: why (ffn is then empty)
    kind: str = "self"  # "cross": a decoder layer's cross attention (no FFN of its own)

    def by_role(self) -> Iterator[tuple[str, Proj]]:
        """(role, projection) pairs: q (unless W_Q = I), k, v, o, ffn."""
        if self.q is not None:
            yield "q", self.q
        yield from (("k", self.k), ("v", self.v), ("o", self.o))
        yield from (("ffn", p) for p in self.ffn)

    @property
    def q_shape(self) -> tuple[int, int]:
        """[out, in] of Q; with W_Q = I (no Q projection) the identity's: d_in x d_in."""
        if self.q is not None:
            return self.q.shape_out_in
        d_in = self.k.shape_out_in[1]
        return d_in, d_in


@dataclass
class ModelTargets:
    """All layers of a model and the family they were found with."""

    family: str
    layers: list[LayerTargets] = field(default_factory=list)


class _Split(nn.Module):
    """A fused Q/K/V projection held as three parameters: the adapter plumbing both splits share."""

    def add_adapter(self, part: str, adapter: nn.Module) -> None:
        """Apply `adapter` to the q, k or v part's output (state keys `oelm_adapter.<part>.*`)."""
        if "oelm_adapter" not in self._modules:
            self.oelm_adapter = nn.ModuleDict()
        self.oelm_adapter[part] = adapter

    def _adapt(self, x: torch.Tensor, y: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """y = [q | k | v] with each part's adapter (if any) applied to that part."""
        adapters = self._modules.get("oelm_adapter")
        if adapters is None:
            return y
        parts = y.split(sizes, dim=-1)
        parts = [adapters[p](x, z) if p in adapters else z for p, z in zip("qkv", parts)]
        return torch.cat(parts, dim=-1)


class SplitQKV(_Split):
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
        return self._adapt(x, y, [w.shape[0] for w in ws])

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx} (split into q/k/v)"


class SplitLinear(_Split):
    """A fused Q/K/V nn.Linear as three parameters in one fused GEMM; same output, same state_dict.

    `rows` gives the indices of the Q, K and V rows inside the fused [out, in] weight, each in head
    order (`oelm.core.families.qkv_rows`). The GEMM runs on [Q | K | V] and, unless that already
    is the fused order, the output columns are permuted back (`order`), so the module computes
    exactly what the fused Linear did. The state_dict holds the fused `weight` / `bias` under the
    original keys.
    """

    def __init__(self, linear: nn.Module, rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        super().__init__()
        w, b = linear.weight, getattr(linear, "bias", None)
        self.out_features, self.in_features = w.shape
        perm = torch.cat(rows)
        if sorted(perm.tolist()) != list(range(self.out_features)):
            raise ValueError(f"the Q/K/V rows do not partition the {self.out_features} rows of the fused weight")
        with torch.no_grad():
            for part, idx in zip("qkv", rows):
                idx = idx.to(w.device)
                setattr(self, f"{part}_weight", nn.Parameter(w[idx].detach().clone(), w.requires_grad))
                bias = None if b is None else nn.Parameter(b[idx].detach().clone(), b.requires_grad)
                setattr(self, f"{part}_bias", bias)
                self.register_buffer(f"{part}_rows", idx, persistent=False)
        identity = torch.equal(perm, torch.arange(self.out_features))
        self.register_buffer("order", None if identity else torch.argsort(perm).to(w.device), persistent=False)
        self.register_state_dict_post_hook(_fuse_rows)
        self.register_load_state_dict_pre_hook(_split_rows)

    @property
    def weight(self) -> torch.Tensor:
        """The fused [out, in] weight, rebuilt from the parts, for model code that reads it (not a parameter)."""
        w = torch.cat((self.q_weight, self.k_weight, self.v_weight))
        return w if self.order is None else w.index_select(0, self.order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ws = (self.q_weight, self.k_weight, self.v_weight)
        y = fused_qkv(x, *ws, self.q_bias, self.k_bias, self.v_bias)
        y = self._adapt(x, y, [w.shape[0] for w in ws])
        return y if self.order is None else y.index_select(-1, self.order)

    def extra_repr(self) -> str:
        sizes = "/".join(str(getattr(self, f"{p}_weight").shape[0]) for p in "qkv")
        how = "blocks" if self.order is None else "interleaved rows"
        return f"in_features={self.in_features}, out_features={self.out_features} (split into q/k/v {sizes}, {how})"


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


def _fuse_rows(module: SplitLinear, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    for kind in ("weight", "bias"):
        keys = [f"{prefix}{p}_{kind}" for p in "qkv"]
        if keys[0] not in state_dict:
            continue  # no bias
        fused = torch.cat([state_dict.pop(k) for k in keys])
        state_dict[f"{prefix}{kind}"] = fused if module.order is None else fused[module.order.to(fused.device)]


def _split_rows(module: SplitLinear, state_dict: dict, prefix: str, *args) -> None:
    for kind in ("weight", "bias"):
        key = f"{prefix}{kind}"
        if key in state_dict:
            fused = state_dict.pop(key)
            for p in "qkv":
                state_dict[f"{prefix}{p}_{kind}"] = fused[getattr(module, f"{p}_rows").to(fused.device)]


# ---- reading a layout row ----


def _module_at(layer: nn.Module, path: str) -> nn.Module | None:
    """The submodule at a dotted path, or None."""
    try:
        return layer.get_submodule(path)
    except AttributeError:
        return None


def _has_weight(module: nn.Module | None) -> bool:
    """Whether a module holds a 2-D weight parameter (an nn.Linear, a Conv1D, ...)."""
    w = getattr(module, "weight", None)
    return isinstance(w, nn.Parameter) and w.ndim == 2


def _is_conv1d(module: nn.Module) -> bool:
    """Transformers' Conv1D (GPT-2 style): weight stored [in, out]."""
    return type(module).__name__ == "Conv1D"


def _proj(name: str, module: nn.Module, via: str = "hook") -> Proj:
    """A Proj over an nn.Linear (weight [out, in]) or a Conv1D (weight [in, out])."""
    return Proj(name, module.weight, getattr(module, "bias", None), _is_conv1d(module), module, via)


def _need(layer: nn.Module, name: str, path: str, family: str) -> nn.Module:
    module = _module_at(layer, path)
    if not _has_weight(module):
        raise UserError(f"{name}: this {family} model has no projection at '{path}' (its layout changed?)")
    return module


def _split_fused(layout: Layout, family: str, name: str, layer: nn.Module, config, n_heads: int, n_kv: int):
    """(q, k, v) Projs of the split fused module (split in place on first use)."""
    path = layout.fused
    if not isinstance(_module_at(layer, path), _Split):
        module = _need(layer, name, path, family)
        order = row_order(layout, config)
        if _is_conv1d(module):
            if order != "blocks" or n_kv != n_heads:
                raise UserError(f"{name}.{path}: a Conv1D fused Q/K/V is split as [Q | K | V] thirds only")
            split = SplitQKV(module)
        else:
            rows = module.weight.shape[0]
            head_dim, rest = divmod(rows, n_heads + 2 * n_kv)
            if rest or head_dim == 0 or n_heads % n_kv:
                raise UserError(
                    f"{name}.{path}: {rows} fused rows do not fit {n_heads} query and {n_kv} key/value heads"
                )
            split = SplitLinear(module, qkv_rows(order, n_heads, n_kv, head_dim))
        parent_path, _, attr = path.rpartition(".")
        setattr(layer.get_submodule(parent_path) if parent_path else layer, attr, split)
    split = layer.get_submodule(path)
    transposed = isinstance(split, SplitQKV)
    return tuple(
        Proj(
            f"{name}.{path}.{p}",
            getattr(split, f"{p}_weight"),
            getattr(split, f"{p}_bias"),
            transposed,
            split,
            "split",
            p,
        )
        for p in "qkv"
    )


def _heads(layout: Layout, family: str, config) -> tuple[int, int]:
    n_heads = count(layout.heads, config)
    if not n_heads:
        raise UserError(f"the {family} config gives no head count (looked for {layout.heads})")
    return n_heads, count(layout.kv_heads, config) or n_heads


def _check_heads(name: str, q: Proj | None, k: Proj, n_heads: int, n_kv: int) -> None:
    k_rows, d_in = k.shape_out_in
    q_rows = q.shape_out_in[0] if q is not None else d_in
    if q_rows % n_heads or k_rows % n_kv or n_heads % n_kv:
        raise UserError(
            f"{name}: Q has {q_rows} rows and K {k_rows}, which do not split into {n_heads} query "
            f"and {n_kv} key/value heads"
        )


def _check_covered(layout: Layout, family: str, name: str, layer: nn.Module, config) -> None:
    """Refuse a layer whose attention holds projections the row does not name.

    Every Linear/Conv1D beside Q, K, V (the fused module, cross attention's) must be a role or in the
    row's `extra`: Longformer's query_global / key_global (global attention) compute attention scores
    too, and a method that froze Q/K but left them trainable would not be the method it says.
    """
    known = {layout.q, layout.k, layout.v, layout.o, layout.fused, *layout.cross, *layout.extra}
    known |= set(ffn_paths(layout, config) or ())
    parents = {p.rpartition(".")[0] for p in (layout.q, layout.k, layout.v, layout.fused, *layout.cross[:3]) if p}
    for parent in sorted(parents):
        module = _module_at(layer, parent) if parent else layer
        for child, sub in module.named_children() if module is not None else ():
            path = f"{parent}.{child}" if parent else child
            if path in known or not (isinstance(sub, nn.Linear) or _is_conv1d(sub)):
                continue
            raise UserError(
                f"{name}.{path}: this {family} model has an attention projection its layout does not cover "
                f"(beside {layout.q or layout.fused} and {layout.k or layout.fused}), e.g. a global-attention "
                "query/key; a method would leave it trainable, so the model is refused. Add a row for it to "
                "oelm/core/families.py (with the projection as a role or in `extra`)"
            )


def _extract(layout: Layout, family: str, name: str, layer: nn.Module, config) -> list[LayerTargets]:
    """The blocks of one layer as its family's layout row says: self attention (+ cross attention)."""
    _check_covered(layout, family, name, layer, config)
    n_heads, n_kv = _heads(layout, family, config)
    if getattr(config, "q_identity", False) is True:  # W_Q = I: the model has no Q projection
        if layout.fused:
            raise UserError(f"{name}: q_identity on a fused Q/K/V layout ({layout.fused}) is not supported")
        q = None
        k, v = (
            _proj(f"{name}.{path}", _need(layer, name, path, family), layout.adapter_via)
            for path in (layout.k, layout.v)
        )
    elif layout.fused:
        q, k, v = _split_fused(layout, family, name, layer, config, n_heads, n_kv)
    else:
        q, k, v = (
            _proj(f"{name}.{path}", _need(layer, name, path, family), layout.adapter_via)
            for path in (layout.q, layout.k, layout.v)
        )
    if layout.qkv_bias:
        q, k, v = (
            replace(proj, bias=layer.get_parameter(path)) if path and proj is not None else proj
            for proj, path in zip((q, k, v), layout.qkv_bias)
        )
    _check_heads(name, q, k, n_heads, n_kv)
    o = _proj(f"{name}.{layout.o}", _need(layer, name, layout.o, family))
    paths = ffn_paths(layout, config)
    ffn = [] if paths is None else [_proj(f"{name}.{p}", _need(layer, name, p, family)) for p in paths]
    blocks = [LayerTargets(0, q, k, v, o, ffn, n_heads, n_kv, layout.ffn_note or None)]
    if layout.cross:
        xq, xk, xv, xo = (_proj(f"{name}.{p}", _need(layer, name, p, family)) for p in layout.cross)
        _check_heads(name, xq, xk, n_heads, n_kv)
        blocks.append(LayerTargets(0, xq, xk, xv, xo, [], n_heads, n_kv, kind="cross"))
    return blocks


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP (`.module`) or torch.compile (`._orig_mod`) wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _matches(layer: nn.Module, layout: Layout) -> bool:
    return all(_has_weight(_module_at(layer, p)) for p in (layout.q, layout.k, layout.v, layout.o))


def discover_layout(model: nn.Module) -> tuple[Layout | None, str]:
    """(layout, "") for a model with no row whose layers follow a known row's names, else (None, why).

    The model must have exactly one stack of layers (a ModuleList) whose first layer has Q/K/V/O
    modules at a known row's paths. Its FFN is the first known set of FFN paths that all exist;
    with none, the FFN is left out (methods acting on it then refuse the model).
    """
    stacks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module):
            found = next((lay for _, lay in conventions() if _matches(module[0], lay)), None)
            if found is not None:
                stacks.append((name, module, found))
    if not stacks:
        return None, "none of its layers has separate Q/K/V/O projections named as in a known family"
    if len(stacks) > 1:
        names = ", ".join(s[0] for s in stacks)
        return None, f"it has several layer stacks ({names}), so no single layout is guessed"
    name, layers, layout = stacks[0]
    first = layers[0]
    known_ffns = [layout.ffn] + [lay.ffn for lay in LAYOUTS.values() if isinstance(lay, Layout) and lay.ffn]
    ffn = next(
        (f for f in known_ffns if isinstance(f, tuple) and f and all(_has_weight(_module_at(first, p)) for p in f)),
        None,
    )
    note = "" if ffn is not None else "no FFN found as [out, in] Linear weights at a known family's paths"
    return replace(layout, layers=name, ffn=ffn, ffn_note=note), ""


def model_layout(model: nn.Module) -> tuple[str, tuple[Layout, ...]]:
    """(family, layout rows of its stacks of layers) of a model: its own row, else one discovered
    from its module names. A UserError lists the supported families when there is neither.
    """
    model = unwrap(model)
    if isinstance(model, (GPT, GPTClassifier)):
        return "oelm-gpt", stacks(LAYOUTS["oelm-gpt"])
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in LAYOUTS:
        return model_type, stacks(LAYOUTS[model_type])
    why = "it is not a Hugging Face model (no config.model_type)"
    if model_type is not None:
        layout, why = discover_layout(model)
        if layout is not None:
            return model_type, (layout,)
    raise UserError(
        f"no known Q/K layout for model {type(model).__name__} (model_type={model_type!r}): {why}; "
        f"supported families: {', '.join(SUPPORTED_FAMILIES)}; a model of another type is supported "
        "when its one stack of layers names its Q/K/V/O modules as one of these does. "
        "For any other layout, add a row to oelm/core/families.py."
    )


def model_family(model: nn.Module) -> str:
    """The family key of a model, or a UserError listing the supported ones."""
    return model_layout(model)[0]


def _stack(model: nn.Module, family: str, layout: Layout) -> tuple[str, nn.ModuleList] | None:
    """(qualified name, ModuleList) of one stack of layers, or None when the model has none such."""
    suffix = layout.layers
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and len(module) and (name == suffix or name.endswith("." + suffix))
    ]
    if len(found) > 1:
        names = ", ".join(n for n, _ in found)
        raise UserError(f"several layer stacks named '*{suffix}' in this {family} model ({names}); which is meant?")
    return found[0] if found else None


def _layer_stacks(model: nn.Module) -> tuple[str, list[tuple[str, nn.ModuleList, Layout]]]:
    """(family, [(name, layers, layout row)]) for every stack of layers the model holds."""
    family, rows = model_layout(model)
    found = [(*hit, layout) for layout in rows if (hit := _stack(model, family, layout)) is not None]
    if not found:
        names = " or ".join(f"'*{layout.layers}'" for layout in rows)
        raise UserError(f"found no transformer layers named {names} in this {family} model")
    return family, found


def find_targets(model: nn.Module) -> ModelTargets:
    """Locate every layer's Q/K/V/O/FFN projections (splits a fused Q/K/V in place).

    A model with a method applied answers from the targets apply_method found (its MethodState).
    """
    model = unwrap(model)
    cached = getattr(getattr(model, "_oelm_method_state", None), "targets", None)
    if cached is not None:
        return cached
    family, found = _layer_stacks(model)
    targets = ModelTargets(family)
    for name, layers, layout in found:
        for i, layer in enumerate(layers):
            for block in _extract(layout, family, f"{name}.{i}", layer, model.config):
                block.index = len(targets.layers)
                targets.layers.append(block)
    _check_all_qk_covered(model, targets)
    return targets


# Module names that hold a query or key projection in the families we know of.
_QK_NAME = re.compile(r"query|key|^(q|k|wq|wk)$|^(q|k)_(proj|lin)$")


def _check_all_qk_covered(model: nn.Module, targets: ModelTargets) -> None:
    """Refuse a model holding a query/key-named projection outside every stack the targets cover
    (an encoder-decoder whose encoder is laid out otherwise, e.g. LED's Longformer encoder)."""
    covered = {p.name.rpartition(".")[0] if p.part else p.name for layer in targets.layers for _, p in layer.by_role()}
    for name, module in model.named_modules():
        last = name.rpartition(".")[2].lower()
        if name in covered or not (isinstance(module, nn.Linear) or _is_conv1d(module)) or not _QK_NAME.search(last):
            continue
        if any(name.startswith(c + ".") for c in covered):  # inside a covered projection (PEFT's base_layer)
            continue
        raise UserError(
            f"{name}: this {targets.family} model has a query/key projection outside the layers its layout "
            "covers; a method would leave it trainable, so the model is refused. Add a row for it to "
            "oelm/core/families.py"
        )


def layer_depths(model: nn.Module) -> tuple[dict[int, int], int]:
    """(parameter id -> depth, n_layers): embeddings 0, layer i at i + 1, the rest n_layers + 1.

    An encoder-decoder counts its encoder's layers, then its decoder's.
    """
    model = unwrap(model)
    _, found = _layer_stacks(model)
    layers = [layer for _, stack, _ in found for layer in stack]
    n = len(layers)
    depth = {id(p): n + 1 for p in model.parameters()}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            depth.update({id(p): 0 for p in module.parameters()})
    for i, layer in enumerate(layers):
        depth.update({id(p): i + 1 for p in layer.parameters()})
    return depth, n
