"""PEFT (LoRA) together with OELM: adapters on V/O/FFN only, never on frozen Q/K.

PEFT renames nothing that OELM freezes as long as Q/K are not adapter targets, so an audit taken
before or after `get_peft_model` verifies the same Q/K tensors by name. An adapter on a frozen
Q/K would train the effective Q/K while the frozen weight stays bit-identical; `lora_problems`
reports that case, and `OELMCallback` includes it in every check.
"""

from __future__ import annotations

from torch import nn

from oelm.core.targets import find_targets
from oelm.hf.wrappers import underlying
from oelm.utils.errors import UserError

ROLES = ("q", "k", "v", "o", "ffn")


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
        for _, p in proj.params()
        if not p.requires_grad
    }
    return [
        f"{name}: a PEFT adapter wraps a frozen Q/K projection, so the effective Q/K trains"
        for name, module in base.named_modules()
        if isinstance(module, BaseTunerLayer) and id(module.get_base_layer().weight) in frozen_qk
    ]
