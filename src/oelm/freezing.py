"""Apply a method (a record from `oelm.methods`) to any supported model through its targets.

Freezing means `requires_grad=False`: autograd then computes no weight gradient for the tensor,
optimizers built from trainable parameters never hold it (so no state and no weight decay), and
DDP does not all-reduce it. No gradient masks or hooks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from oelm import orthogonal as ortho
from oelm.errors import UserError
from oelm.methods import PRETRAINED_QK, Method, get_method
from oelm.targets import LayerTargets, Proj, find_targets, unwrap

# Attribute on the model recording what was applied, read by the audit.
STATE_ATTR = "_oelm_method_state"


@dataclass
class MethodState:
    """What apply_method did: the method, the seed, and per-parameter init and frozen flags."""

    method: Method
    seed: int
    qk_init: str | None
    family: str
    inits: dict[str, str] = field(default_factory=dict)  # parameter name -> init used
    orthogonal_heads: dict[str, int] = field(default_factory=dict)  # frozen orthogonal weight -> n_heads
    # For weights on the meta device (parameter counting without memory): the orthogonality
    # error of the values that were written, in the parameter's dtype.
    meta_orthogonality: dict[str, float] = field(default_factory=dict)


def _new_qk(method: Method, layer: LayerTargets, role: str, proj: Proj, seed: int, qk_init: str | None) -> tuple[torch.Tensor | None, str]:
    """The new [out, in] weight for Q or K (None = keep) and the name of the init used."""
    n_heads = layer.n_heads if role == "q" else layer.n_kv_heads
    n_rows, d_in = proj.shape_out_in
    if qk_init == "keep":
        return None, "pretrained"
    if qk_init == "orthogonalize":
        if method.qk_init == "global-orthogonal":
            return ortho.orthogonalize_pretrained(proj.get(), 1), "orthogonalized-pretrained-global"
        return ortho.orthogonalize_pretrained(proj.get(), n_heads), "orthogonalized-pretrained"
    gen = ortho.make_generator(seed, layer.index, role, method.qk_init)
    if method.qk_init == "headwise-orthogonal":
        return ortho.headwise_orthogonal(n_heads, n_rows // n_heads, d_in, gen), method.qk_init
    if method.qk_init == "global-orthogonal":
        return ortho.global_orthogonal(n_rows, d_in, gen), method.qk_init
    if method.qk_init == "normal":
        return ortho.normal(n_rows, d_in, gen, method.normal_std), f"normal(std={method.normal_std})"
    return ortho.scaled_random(n_rows, d_in, gen), method.qk_init


def _check_qk_init(method: Method, qk_init: str | None) -> None:
    if qk_init is not None and qk_init not in PRETRAINED_QK:
        raise UserError(f"qk_init must be one of {PRETRAINED_QK}, got {qk_init!r}")
    # Methods that leave Q/K alone (baseline, ffn-only) ignore qk_init, so one sweep config
    # can set it for every arm.
    if qk_init in (None, "reinit") or not method.changes_qk:
        return
    if qk_init == "orthogonalize" and method.qk_init not in ("headwise-orthogonal", "global-orthogonal"):
        raise UserError(
            f"qk_init='orthogonalize' needs an orthogonal method, but {method.name!r} uses "
            f"{method.qk_init!r}; use qk_init='reinit' or 'keep'"
        )


def _freeze(proj: Proj) -> None:
    for _, p in proj.params():
        p.requires_grad_(False)
        p.grad = None


def apply_method(model: nn.Module, method: str | Method, seed: int = 0, qk_init: str | None = None) -> MethodState:
    """Initialize and freeze Q/K (and FFN) of `model` in place as `method` says.

    qk_init (pretrained models): None/"reinit" = the method's own init, "orthogonalize" = QR of
    each pretrained head block (keeps its row space), "keep" = pretrained weights as they are.
    """
    m = get_method(method)
    _check_qk_init(m, qk_init)
    base = unwrap(model)
    if hasattr(base, STATE_ATTR):
        raise UserError("a method was already applied to this model; build a fresh model first")
    targets = find_targets(base)
    state = MethodState(m, seed, qk_init, targets.family)
    for layer in targets.layers:
        if m.changes_qk:
            for role, proj in (("q", layer.q), ("k", layer.k)):
                new, init = _new_qk(m, layer, role, proj, seed, qk_init)
                if new is not None:
                    proj.set(new)
                state.inits[f"{proj.name}.weight"] = init
                if m.freeze_qk and "orthogonal" in init:
                    n_heads = layer.n_heads if role == "q" else layer.n_kv_heads
                    state.orthogonal_heads[proj.name] = n_heads
                    if new is not None and proj.weight.device.type == "meta":
                        err = ortho.orthogonality_error(new.to(proj.weight.dtype), n_heads)
                        state.meta_orthogonality[proj.name] = err
        if m.freeze_qk:
            _freeze(layer.q)
            _freeze(layer.k)
        for i, proj in enumerate(layer.ffn):
            if m.ffn_init == "orthogonal":
                gen = ortho.make_generator(seed, layer.index, "ffn", i)
                proj.set(ortho.global_orthogonal(*proj.shape_out_in, gen))
                state.inits[f"{proj.name}.weight"] = "global-orthogonal"
            if m.freeze_ffn:
                _freeze(proj)
    setattr(base, STATE_ATTR, state)
    _install_save_hook(base)
    return state


def _install_save_hook(model: nn.Module) -> None:
    # A Hugging Face model's own save_pretrained then also writes oelm_method.json (oelm.saving).
    from oelm.saving import install_save_hook

    install_save_hook(model)


def method_state(model: nn.Module) -> MethodState | None:
    """The MethodState recorded by apply_method, if any."""
    return getattr(unwrap(model), STATE_ATTR, None)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer should hold: exactly those with requires_grad."""
    return [p for p in model.parameters() if p.requires_grad]


def optimizer_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on trainable tensors with ndim >= 2, none on the rest; frozen excluded."""
    decay = [p for p in trainable_parameters(model) if p.ndim >= 2]
    no_decay = [p for p in trainable_parameters(model) if p.ndim < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
