"""PEFT (LoRA) together with OELM: adapters on V/O/FFN only, never on frozen Q/K.

PEFT renames nothing that OELM freezes as long as Q/K are not adapter targets, so an audit taken
before or after `get_peft_model` verifies the same Q/K tensors by name. An adapter on a frozen
Q/K would train the effective Q/K while the frozen weight stays bit-identical; `lora_problems`
reports that case, and `OELMCallback` includes it in every check.

The method travels with the adapter: `get_peft_model` (this module's) makes the PEFT model's
own `save_pretrained` write `oelm_method.json` beside `adapter_config.json`, and `load_adapter`
puts a saved adapter on a stock base model: it re-applies the recorded method (same seed,
options and qk_init, so Q/K are the ones trained with), checks every frozen tensor against the
record, and every other base tensor against the fingerprints the adapter record also holds
(`base_tensors`: an adapter is only right on the base it was trained on), then loads the adapter. A fused Q/K/V projection that OELM split (GPT-2's `c_attn`) takes
no PEFT adapter; `get_peft_model` says so before PEFT does and names the modules to target.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from torch import nn

from oelm.core.audit import fingerprint
from oelm.core.freezing import apply_method
from oelm.core.record import (
    METHOD_RECORD_FILE,
    frozen_mismatches,
    install_save_hook,
    method_frozen,
    read_record,
    write_record,
)
from oelm.core.restore import restore_flags
from oelm.core.state import method_state
from oelm.core.targets import SplitLinear, SplitQKV, find_targets, unwrap
from oelm.hf.wrappers import is_peft, underlying
from oelm.utils.errors import UserError

ROLES = ("q", "k", "v", "o", "ffn")

__all__ = [
    "adapter_record_fields",
    "base_fingerprints",
    "get_peft_model",
    "keep_record",
    "load_adapter",
    "lora_problems",
    "lora_target_modules",
    "split_targets",
    "write_adapter_record",
]

# PEFT's names for the layer a tuner or modules_to_save wraps; the record drops them.
_WRAPPED = ("base_layer", "original_module")


def lora_target_modules(model: nn.Module, roles: tuple[str, ...] = ("v", "o", "ffn")) -> list[str]:
    """Full module names of the given projection roles, for `LoraConfig(target_modules=...)`.

    Roles that are not modules of their own (GPT-2's V inside the fused c_attn) are skipped.
    """
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise UserError(f"unknown roles {unknown}; choose from {ROLES}")
    base = underlying(model)
    modules = dict(base.named_modules())
    names = [
        proj.name
        for layer in find_targets(base).layers
        for role, proj in layer.by_role()
        if role in roles and proj.name in modules
    ]
    if not names:
        raise UserError(f"no modules of roles {roles} found to put adapters on")
    return names


def lora_problems(model: nn.Module) -> list[str]:
    """Adapters (PEFT tuner layers) that sit on a frozen Q/K projection: each one is a problem."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer  # optional dependency: imported on use
    except ImportError:  # without peft there are no adapters
        return []
    base = underlying(model)
    frozen_qk = {
        id(p)
        for layer in find_targets(base).layers
        for proj in (layer.q, layer.k)
        if proj is not None
        for _, p in proj.params()
        if not p.requires_grad
    }
    return [
        f"{name}: a PEFT adapter wraps a frozen Q/K projection, so the effective Q/K trains"
        for name, module in base.named_modules()
        if isinstance(module, BaseTunerLayer) and id(module.get_base_layer().weight) in frozen_qk
    ]


def split_targets(model: nn.Module, config: Any) -> list[str]:
    """Modules a PEFT config would target that are fused Q/K/V projections OELM split (no PEFT adapter fits).

    `config.target_modules` is matched as PEFT matches it (a string is a full-match regex, a list
    matches a name or a name's last dotted parts); None means PEFT's default for the model type.
    """
    from peft.tuners.tuners_utils import check_target_module_exists  # optional dependency: imported on use
    from peft.utils import (  # optional dependency: imported on use
        TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS,
    )

    base = underlying(model)
    if getattr(config, "target_modules", None) is None:
        default = DEFAULTS.get(getattr(getattr(base, "config", None), "model_type", None))
        if default is None:
            return []
        config = copy.copy(config)
        config.target_modules = set(default)
    return [
        name
        for name, module in base.named_modules()
        if isinstance(module, (SplitQKV, SplitLinear)) and check_target_module_exists(config, name)
    ]


def get_peft_model(model: nn.Module, config: Any, **kwargs: Any) -> nn.Module:
    """`peft.get_peft_model` for a model with a method applied: checks the targets, keeps the record.

    Refuses, before PEFT does, targets that are fused Q/K/V projections OELM split into separate
    Q/K/V parameters (GPT-2's `c_attn`), naming the modules to target instead. The returned PEFT
    model's `save_pretrained` (Trainer's checkpoints too) writes `oelm_method.json` beside the adapter.
    """
    import peft  # optional dependency: imported on use

    split = split_targets(model, config)
    if split:
        try:
            instead = f"{lora_target_modules(model)}"
        except UserError as err:
            instead = f"none found ({err})"
        kind = type(underlying(model).get_submodule(split[0])).__name__
        more = " ..." if len(split) > 3 else ""
        raise UserError(
            f"PEFT cannot put an adapter on {split[:3]}{more}: OELM split this fused Q/K/V projection into "
            f"separate Q, K and V parameters ({kind}) so that the frozen Q/K get no gradient, and PEFT supports "
            "no such module. Leave it out of target_modules (the V inside it then takes no adapter) and target "
            "the V/O/FFN modules that are modules of their own: "
            f"LoraConfig(target_modules=oelm.hf.peft.lora_target_modules(model)) = {instead}"
        )
    wrapped = peft.get_peft_model(model, config, **kwargs)
    keep_record(wrapped)
    return wrapped


def base_fingerprints(model: nn.Module) -> dict[str, str]:
    """Fingerprints of the base model's tensors that are neither the method's frozen ones (the
    record's `frozen`) nor an adapter's own (LoRA weights, modules_to_save copies), named as in
    the model without PEFT. For a PEFT model or for a plain base model alike."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer  # optional dependency: imported on use
    except ImportError:
        BaseTunerLayer = ()  # noqa: N806 (without peft there are no tuner layers)
    base = underlying(model)
    owned = {"modules_to_save"}
    for module in base.modules():
        if BaseTunerLayer and isinstance(module, BaseTunerLayer):
            owned.update(module.adapter_layer_names)
    method = set(method_frozen(base)) if method_state(base) is not None else set()
    out = {}
    for name, p in base.named_parameters():
        parts = name.split(".")
        if owned.intersection(parts):
            continue
        plain = ".".join(x for x in parts if x not in _WRAPPED)
        if plain not in method:
            out[plain] = fingerprint(p)
    return out


def adapter_record_fields(peft_model: nn.Module) -> dict[str, Any]:
    """The fields an adapter's method record adds to a model's: its base model's fingerprints."""
    return {"base_tensors": base_fingerprints(peft_model)}


def write_adapter_record(peft_model: nn.Module, folder: str | Path) -> Path:
    """Write `oelm_method.json` for a PEFT model's adapter into `folder`."""
    return write_record(underlying(peft_model), folder, adapter_record_fields(peft_model))


def keep_record(peft_model: nn.Module) -> None:
    """Make a PEFT model's own `save_pretrained` write `oelm_method.json` beside the adapter."""
    if is_peft(peft_model) and method_state(underlying(peft_model)) is not None:
        install_save_hook(unwrap(peft_model), source=underlying(peft_model), extra=adapter_record_fields)


def load_adapter(base: nn.Module, folder: str | Path, **kwargs: Any) -> nn.Module:
    """Put a PEFT adapter saved with its method record on a stock base model; the PEFT model.

    The recorded method is applied to `base` as it was applied before training (same method,
    options, seed and qk_init; a base that already has it applied must have the same), every
    frozen tensor is checked bit for bit against the record (a mismatch is refused naming the
    tensor: the base is not the one the adapter was trained on), then `peft.PeftModel.from_pretrained`
    loads the adapter (extra arguments go to it, e.g. is_trainable=True).
    """
    from peft import PeftModel  # optional dependency: imported on use

    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        raise UserError(f"{str(folder)!r} has no adapter_config.json: not a PEFT adapter folder")
    record = read_record(folder)
    if record is None:
        raise UserError(
            f"{str(folder)!r} has no {METHOD_RECORD_FILE}: the adapter was saved without its method; load it with "
            "peft.PeftModel.from_pretrained onto a base model with the method applied as in training"
        )
    if is_peft(base):
        raise UserError("load_adapter takes the base model, not a PEFT model")
    state = method_state(base)
    if state is None:
        apply_method(base, record["method"], seed=record["method_seed"], **record["method_options"])
    else:
        ours, saved = state.record(), {k: record[k] for k in ("method", "method_options", "method_seed")}
        if _json(ours) != _json(saved):
            raise UserError(
                f"the base model has {ours} applied but the adapter was trained with {saved}; "
                "pass a base model without a method (load_adapter applies the recorded one)"
            )
    restore_flags(base, record)
    changed = frozen_mismatches(base, record)
    kind = "frozen"
    if not changed and record.get("base_tensors") is not None:
        now = base_fingerprints(base)
        changed = sorted(n for n, fp in record["base_tensors"].items() if now.get(n) != fp)
        kind = "other"
    if changed:
        raise UserError(
            f"the base model's {kind} tensors differ from those the adapter in {str(folder)!r} was trained "
            f"with: {changed[:5]}; load it onto the base model it was trained from (same weights: a randomly "
            "initialized base needs the same config and torch seed)"
        )
    wrapped = PeftModel.from_pretrained(base, str(folder), **kwargs)
    keep_record(wrapped)
    return wrapped


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
