"""Apply a method (a record from `oelm.core.methods`) to any supported model through its targets.

Freezing means `requires_grad=False`: autograd then computes no weight gradient for the tensor,
optimizers built from trainable parameters never hold it (so no state and no weight decay), and
DDP does not all-reduce it. No gradient masks or hooks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from oelm.core import orthogonal as ortho
from oelm.core.adapters import adapter_class, iter_adapters, make_adapter
from oelm.core.families import OWN_FAMILIES
from oelm.core.methods import PRETRAINED_QK, Method, get_method, select_layers, validate_method_options
from oelm.core.record import install_save_hook
from oelm.core.state import STATE_ATTR, MethodState
from oelm.core.targets import (
    LayerTargets,
    ModelTargets,
    Proj,
    attach_adapter,
    find_targets,
    layer_depths,
    unwrap,
)
from oelm.core.tuning import apply_tuning
from oelm.utils.errors import UserError


def _new_qk(
    method: Method,
    layer: LayerTargets,
    role: str,
    proj: Proj,
    seed: int,
    qk_init: str | None,
    options: dict[str, Any] | None = None,
) -> tuple[torch.Tensor | None, str]:
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
    if method.qk_init == "torch-default":
        return ortho.torch_default(n_rows, d_in, gen), method.qk_init
    if method.qk_init == "identity":
        return ortho.identity(n_rows, d_in), method.qk_init
    if method.qk_init == "mimetic":
        if layer.n_heads != layer.n_kv_heads:
            raise UserError(
                f"the mimetic init pairs each query head with its own key head, but this model has "
                f"{layer.n_heads} query and {layer.n_kv_heads} key/value heads; use oelm-freeze"
            )
        # One generator for the pair (keyed without the role): Q and K of a head come from one SVD.
        pair_gen = ortho.make_generator(seed, layer.index, "qk", method.qk_init)
        q, k = ortho.mimetic_pair(n_heads, n_rows // n_heads, d_in, pair_gen)
        return (q if role == "q" else k), method.qk_init
    if method.qk_init == "fan-in-normal":  # width-scaled: N(0, 1/d_in) unless qk_std says otherwise
        std = (options or {}).get("qk_std") or d_in**-0.5
        return ortho.normal(n_rows, d_in, gen, std), f"normal(std={std:.4g})"
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


def freeze_projection(proj: Proj, bias: bool = True) -> None:
    """Take a projection's weight (and, unless bias=False, its bias) out of the optimization."""
    for name, p in proj.params():
        if not bias and name.endswith("bias"):
            continue
        p.requires_grad_(False)
        p.grad = None


def unfreeze_projection(proj: Proj) -> None:
    """Put a projection's weight and bias back into the optimization."""
    for _, p in proj.params():
        p.requires_grad_(True)


def _init_qk(m: Method, layer: LayerTargets, state: MethodState, seed: int, qk_init: str | None) -> None:
    for role, proj in (("q", layer.q), ("k", layer.k)):
        if role not in m.init:
            continue
        new, init = _new_qk(m, layer, role, proj, seed, qk_init, state.options)
        if new is not None:
            proj.set(new)
        state.inits[f"{proj.name}.weight"] = init
        # A late-freeze schedule trains them first: no orthogonality claim at the start.
        if role in m.freeze and "orthogonal" in init and m.schedule != "late-freeze":
            n_heads = layer.n_heads if role == "q" else layer.n_kv_heads
            state.orthogonal_heads[proj.name] = n_heads
            if new is not None and proj.weight.device.type == "meta":
                err = ortho.orthogonality_error(new.to(proj.weight.dtype), n_heads)
                state.meta_orthogonality[proj.name] = err


def _attach_adapters(m: Method, layer: LayerTargets, state: MethodState, seed: int) -> None:

    roles = adapter_class(m.adapter).roles
    extra = {k: v for k, v in state.options.items() if k not in ("qk_init", "layers")}
    for role, proj in (("q", layer.q), ("k", layer.k)):
        if role not in roles:
            continue
        n_heads = layer.n_heads if role == "q" else layer.n_kv_heads
        n_rows, d_in = proj.shape_out_in
        gen = ortho.make_generator(seed, layer.index, role, m.adapter)
        adapter = make_adapter(m.adapter, n_heads, n_rows // n_heads, d_in, proj.weight, gen, extra)
        attach_adapter(proj, adapter)


def _apply_to_layer(m: Method, layer: LayerTargets, state: MethodState, seed: int, qk_init: str | None) -> None:
    if layer.kind == "cross" and not m.cross_attention:
        return  # the method leaves cross attention alone
    if m.changes_qk:
        _init_qk(m, layer, state, seed, qk_init)
    for i, proj in enumerate(layer.ffn):
        if m.ffn_init == "orthogonal":
            gen = ortho.make_generator(seed, layer.index, "ffn", i)
            proj.set(ortho.global_orthogonal(*proj.shape_out_in, gen))
            state.inits[f"{proj.name}.weight"] = "global-orthogonal"
    for role, proj in layer.by_role():
        if role not in m.freeze:
            continue
        if m.schedule is not None:
            state.scheduled.append(proj.name)
        if m.schedule != "late-freeze":  # late-freeze starts trainable
            freeze_projection(proj, bias=not m.bias_trainable)
    if m.adapter is not None:
        _attach_adapters(m, layer, state, seed)


def _check_ffn(m: Method, targets: ModelTargets, layers: list[int]) -> None:
    """A method acting on the FFN refuses a family whose FFN is not [out, in] weights (never freezes nothing)."""
    if not (m.freeze_ffn or m.ffn_init != "default"):
        return
    note = next((layer.ffn_note for layer in targets.layers if layer.index in layers and layer.ffn_note), None)
    if note:
        raise UserError(
            f"method {m.name!r} initializes or freezes the FFN, but in this {targets.family} model {note}; "
            "use a method that acts on Q/K only (e.g. oelm-freeze)"
        )


def _check_qk_width(m: Method, targets: ModelTargets) -> None:
    """A thin-keys method needs a model built with Q/K at its ratio of the value width."""
    if m.qk_ratio == 1.0:
        return  # a model built thin (model_overrides.qk_dim) may still run any full-width method
    if targets.family not in OWN_FAMILIES:
        raise UserError(
            f"method {m.name!r} narrows Q/K (thin keys), which changes the architecture; only oelm's own "
            f"GPT and Llama can be built that way, not a {targets.family} model"
        )
    for layer in targets.layers:
        qk, v = layer.q_shape[0], layer.v.shape_out_in[0] * layer.n_heads // layer.n_kv_heads
        if qk != round(v * m.qk_ratio):
            raise UserError(
                f"method {m.name!r} needs Q/K at {m.qk_ratio:g} x the value width ({v}), but this model's Q "
                f"has {qk} rows; build our model with model_overrides.qk_dim={round(v * m.qk_ratio)} "
                "(`oelm train` sets it for the method by itself)"
            )


def _switch_q_identity(m: Method, base: nn.Module, opts: dict[str, Any]) -> None:
    """A method with W_Q = I switches the model's `q_identity` (and `attn_scale`) on through its config.

    The generic path for any family whose config has the flag (our GPT, our Llama): a model built
    with it is taken as it is; one built without it is switched in place by its `reconfigure(...)`,
    which drops the Q projections (the other weights keep the values they were built with, so the
    arm starts where the baseline does). Refused, before any change, where the model has no flag.
    """
    if not m.q_identity:
        return
    config, name = getattr(base, "config", None), type(base).__name__
    if not hasattr(config, "q_identity"):
        raise UserError(
            f"method {m.name!r} removes the Q projection (W_Q = I), which changes the architecture; a {name} "
            "has no q_identity flag in its config: use oelm's own GPT (or a family whose config has q_identity)"
        )
    if opts["layers"] != "all":
        raise UserError(
            f"method {m.name!r} removes Q in every layer (the model's q_identity); drop method_options.layers"
        )
    wanted = {"q_identity": True, "attn_scale": opts.get("attn_scale", 1.0)}
    if not hasattr(config, "attn_scale"):
        if wanted["attn_scale"] != 1.0:
            raise UserError(
                f"method {m.name!r}: this {name}'s config has no attn_scale to scale the attention logits by "
                f"{wanted['attn_scale']}; set method_options.attn_scale=1.0"
            )
        del wanted["attn_scale"]
    todo = {k: v for k, v in wanted.items() if getattr(config, k) != v}
    if not todo:
        return
    if not callable(getattr(base, "reconfigure", None)):
        fields = ", ".join(f"{k}={v}" for k, v in todo.items())
        raise UserError(f"method {m.name!r}: build this {name} with {fields} in its config (it cannot switch in place)")
    base.reconfigure(**todo)


def _check_no_q(m: Method, targets: ModelTargets) -> None:
    """A model without a Q projection (W_Q = I) refuses a method that initializes, freezes or adapts Q."""
    if all(layer.q is not None for layer in targets.layers):
        return
    adapts = m.adapter is not None and "q" in adapter_class(m.adapter).roles
    if "q" in m.freeze or (m.changes_qk and "q" in m.init) or adapts:
        raise UserError(
            f"this model has no Q projection (q_identity: W_Q = I), and method {m.name!r} initializes, freezes or "
            "adapts Q; build the model without q_identity, or use a method that leaves Q alone (e.g. baseline)"
        )


def apply_method(
    model: nn.Module, method: str | Method, seed: int = 0, qk_init: str | None = None, **options: Any
) -> MethodState:
    """Initialize, freeze and extend `model` in place as `method` says (options: method_options).

    qk_init (pretrained models): None/"reinit" = the method's own init, "orthogonalize" = QR of
    each pretrained head block (keeps its row space), "keep" = pretrained weights as they are.
    """
    m = get_method(method)
    if qk_init is not None:
        options["qk_init"] = qk_init
    return apply_validated_method(model, m, seed, validate_method_options(m, options))


def apply_validated_method(model: nn.Module, method: str | Method, seed: int, opts: dict[str, Any]) -> MethodState:
    """apply_method with options that validate_method_options already returned for this method (a
    TrainConfig's method_settings()): the training loop applies what the config's validation checked."""
    m = get_method(method)
    qk_init = opts["qk_init"]
    _check_qk_init(m, qk_init)
    base = unwrap(model)
    if hasattr(base, STATE_ATTR):
        raise UserError("a method was already applied to this model; build a fresh model first")
    _switch_q_identity(m, base, opts)  # before the targets: they then have no Q
    targets = find_targets(base)
    _check_no_q(m, targets)
    layers = select_layers(opts["layers"], len(targets.layers))
    _check_ffn(m, targets, layers)
    _check_qk_width(m, targets)
    state = MethodState(m, seed, qk_init, targets.family, opts, layers)
    if m.schedule is not None:
        f = opts["f"]
        state.scheduled_frozen_fraction = 1.0 - f if m.schedule == "late-freeze" else f
    for layer in targets.layers:
        if layer.index in layers:
            _apply_to_layer(m, layer, state, seed, qk_init)
    # Key inits by the real parameter names (GPT-2's split Q is `c_attn.q_weight`, not `c_attn.q.weight`).
    names = {id(p): n for n, p in base.named_parameters()}
    real = {f"{proj.name}.weight": names[id(proj.weight)] for layer in targets.layers for _, proj in layer.by_role()}
    state.inits = {real.get(k, k): v for k, v in state.inits.items()}
    state.targets = targets
    if m.tune is not None:
        tune_opts = {k: v for k, v in opts.items() if k not in ("qk_init", "layers")}
        state.tuning = apply_tuning(base, m.tune, targets, tune_opts)
    setattr(base, STATE_ATTR, state)
    install_save_hook(base)  # HF save_pretrained then writes oelm_method.json too
    return state


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters an optimizer should hold: exactly those with requires_grad."""
    return [p for p in model.parameters() if p.requires_grad]


def _owners(model: nn.Module) -> dict[str, nn.Module]:
    """Parameter name -> the module that holds it directly (tied tensors under their first name)."""
    out: dict[str, nn.Module] = {}
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for leaf, p in module.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                out[f"{mod_name}.{leaf}" if mod_name else leaf] = module
    return out


def decays(name: str, module: nn.Module, adapter: bool = False) -> bool:
    """Whether AdamW weight decay applies to parameter `name` (held directly by `module`), by role.

    Decayed: the weights of linear maps and embeddings (Linear, Conv1D, split fused Q/K/V parts
    such as GPT-2's `q_weight`, a low-rank adapter's `lora_*` factors). Not decayed: biases, norm
    gains, adapter scales and gains, and any other tensor. The decision reads names and module
    types, never shapes, so a flattened or sharded parameter (FSDP) keeps its decay.
    """
    leaf = name.rsplit(".", 1)[-1]
    if "bias" in leaf:
        return False
    if adapter:
        return leaf.startswith("lora_")
    if isinstance(module, nn.LayerNorm) or "norm" in type(module).__name__.lower():
        return False
    if isinstance(module, nn.Embedding):
        return True
    return leaf.endswith("weight")


def decay_by_id(model: nn.Module) -> dict[int, bool]:
    """Parameter id -> `decays` for every parameter of the model."""
    base = unwrap(model)
    inside = {id(p) for _, a in iter_adapters(base) for p in a.parameters()}  # nested modules included
    params = dict(base.named_parameters())
    return {
        id(params[name]): decays(name, module, adapter=id(params[name]) in inside)
        for name, module in _owners(base).items()
    }


def method_weight_decay(model: nn.Module, weight_decay: float) -> float:
    """The AdamW weight decay of a model's arm: its method's `weight_decay` option (identity-q: the
    published 0.03) in place of the run's, else the run's."""
    state = getattr(unwrap(model), STATE_ATTR, None)
    if state is not None and state.options.get("weight_decay") is not None:
        return float(state.options["weight_decay"])
    return weight_decay


def optimizer_groups(model: nn.Module, weight_decay: float, layer_lr_decay: float = 1.0) -> list[dict]:
    """AdamW groups: decay on trainable tensors whose role decays (`decays`), none on the rest;
    frozen tensors excluded (never given to the optimizer). A method with a `weight_decay` option
    (`method_weight_decay`) sets the decay in place of the weight_decay given here.

    layer_lr_decay < 1 scales the learning rate by decay**(n_layers + 1 - depth) (embeddings at
    depth 0, layer i at i + 1, head and final norm at full LR), one group pair per depth (key
    "lr_scale"). The group structure depends on all parameters, not on which are trainable, so
    a schedule can refill the same groups (`sync_optimizer`).
    """
    decay = decay_by_id(model)
    weight_decay = method_weight_decay(model, weight_decay)
    if layer_lr_decay == 1.0:
        return [
            {
                "params": [p for p in model.parameters() if p.requires_grad and decay[id(p)]],
                "weight_decay": weight_decay,
            },
            {"params": [p for p in model.parameters() if p.requires_grad and not decay[id(p)]], "weight_decay": 0.0},
        ]
    depths, n = layer_depths(model)
    groups: dict[tuple[int, bool], dict] = {}
    for p in model.parameters():
        key = (depths[id(p)], decay[id(p)])
        g = groups.setdefault(
            key,
            {
                "params": [],
                "weight_decay": weight_decay if key[1] else 0.0,
                "lr_scale": layer_lr_decay ** (n + 1 - key[0]),
            },
        )
        if p.requires_grad:
            g["params"].append(p)
    return [groups[k] for k in sorted(groups)]


def rebind_targets(model: nn.Module, names: dict[int, str]) -> None:
    """Point the method's cached targets at the model's current parameters, by name.

    A wrapper that replaces parameter objects (FSDP2's `fully_shard` swaps each for a DTensor
    parameter) leaves the targets `apply_method` found holding the old ones; `names` maps the old
    parameters' ids to their names (taken before wrapping).
    """
    base = unwrap(model)
    state = getattr(base, STATE_ATTR, None)
    if state is None or state.targets is None:
        return
    now = dict(base.named_parameters(remove_duplicate=False))
    for layer in state.targets.layers:
        for _, proj in layer.by_role():
            proj.weight = now[names[id(proj.weight)]]
            if proj.bias is not None:
                proj.bias = now[names[id(proj.bias)]]


def scale_group_lrs(groups: list[dict], lr: float) -> list[dict]:
    """Set each group's lr to lr * its lr_scale (groups without a scale keep the optimizer's lr)."""
    for g in groups:
        if "lr_scale" in g:
            g["lr"] = lr * g["lr_scale"]
    return groups


def sync_optimizer(
    optimizer: torch.optim.Optimizer, model: nn.Module, weight_decay: float, layer_lr_decay: float = 1.0
) -> None:
    """Refill the optimizer's groups with the currently trainable parameters; drop others' state."""
    fresh = optimizer_groups(model, weight_decay, layer_lr_decay)
    if len(fresh) != len(optimizer.param_groups):
        raise RuntimeError("optimizer groups changed structure; build them with optimizer_groups")
    for group, new in zip(optimizer.param_groups, fresh):
        group["params"] = new["params"]
    held = {id(p) for g in fresh for p in g["params"]}
    for p in [p for p in optimizer.state if id(p) not in held]:
        del optimizer.state[p]
