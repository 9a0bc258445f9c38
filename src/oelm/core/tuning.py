"""Parameter-efficient fine-tuning methods as arms: LoRA, (IA)^3, BitFit and LayerNorm tuning.

A method record with `tune` set turns a pretrained model into that fine-tuning method, so the
field's methods sit on one board beside oelm's (same budget, LR grid, seeds, audit and records).
Every method trains the task head (the parameters outside the pretrained backbone: BERT's
`classifier`, our GPT classifier's `score`), as PEFT's sequence-classification task does.

- `lora`, `ia3`: built on the `peft` package (`inject_adapter_in_model`: the adapter modules are
  put into the model in place, so the training loop, audit and checkpoints see one plain module).
- `bitfit` (only the biases train) and `ln` (only the norms' gains and biases train) add no
  module: they are a choice of trainable tensors, made here by `requires_grad` (PEFT has no BitFit;
  its LN tuning trains a copy of each norm, which is the same arithmetic with more memory).

Everything outside the trainable set is frozen with `requires_grad=False`, so the freeze audit
checks it stays bit-identical like any frozen Q/K.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from oelm.core.methods import TUNES
from oelm.core.targets import ModelTargets
from oelm.utils.errors import UserError

ROLE_NAMES = ("q", "k", "v", "o", "ffn", "ffn-down")


def head_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The task head: modules outside the pretrained backbone (name, module).

    Hugging Face models name their backbone by `base_model_prefix`; our GPT models hold it in
    `transformer`. A model with neither (a bare backbone) is refused. A head tied to the backbone
    (a language model's output embedding) has no tensors of its own and is not trained.
    """
    prefix = getattr(model, "base_model_prefix", "") or ""
    backbone = getattr(model, prefix, None) if prefix else None
    if not isinstance(backbone, nn.Module):
        backbone = getattr(model, "transformer", None)
    if not isinstance(backbone, nn.Module) or backbone is model:
        raise UserError(
            f"a fine-tuning method needs a model with a task head on a pretrained backbone, but "
            f"{type(model).__name__} is a bare backbone; load it with its head (e.g. "
            "AutoModelForSequenceClassification, or --task classification)"
        )
    return [(name, child) for name, child in model.named_children() if child is not backbone]


def role_module_names(model: nn.Module, targets: ModelTargets, roles: tuple[str, ...]) -> list[str]:
    """Full module names of the projections of the given roles ("ffn-down": the FFN's last map).

    PEFT puts its layers on modules that the model calls; a projection that is not one (GPT-2's
    split c_attn, oelm's own models whose Q/K/V run as one fused GEMM) is refused by name.
    """
    unknown = sorted(set(roles) - set(ROLE_NAMES))
    if unknown:
        raise UserError(f"unknown roles {unknown}; choose from {list(ROLE_NAMES)}")
    if targets.family.startswith("oelm-"):
        raise UserError(
            f"PEFT adapters need projections the model calls as modules, but oelm's own {targets.family} "
            "computes Q/K/V in one fused GEMM; use a Hugging Face model, or oelm-lowrank on ours"
        )
    modules = dict(model.named_modules())
    names: list[str] = []
    for layer in targets.layers:
        for role, proj in layer.by_role():
            if role in roles or (role == "ffn" and "ffn-down" in roles and proj is layer.ffn[-1]):
                module = modules.get(proj.name)
                if not (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"):
                    raise UserError(
                        f"{proj.name} ({role}) is not a linear module of its own (a fused projection?), "
                        "so PEFT cannot adapt it; choose other roles in method_options.targets"
                    )
                names.append(proj.name)
    if not names:
        raise UserError(f"no projections of roles {list(roles)} found in this model")
    return names


def _parse_roles(value: str, option: str) -> tuple[str, ...]:
    roles = tuple(r.strip() for r in value.split(",") if r.strip())
    unknown = sorted(set(roles) - set(ROLE_NAMES))
    if not roles or unknown:
        raise UserError(f"method_options.{option} must be a comma-separated list of {list(ROLE_NAMES)}, got {value!r}")
    return roles


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or "norm" in type(module).__name__.lower()


def _peft_config(kind: str, model: nn.Module, targets: ModelTargets, options: dict[str, Any]) -> Any:
    import peft  # heavy optional dependency: imported on use

    if kind == "lora":
        names = role_module_names(model, targets, _parse_roles(options["targets"], "targets"))
        return peft.LoraConfig(
            r=options["rank"],
            lora_alpha=options["alpha"],
            lora_dropout=options["dropout"],
            target_modules=names,
            bias="none",
        )
    roles = _parse_roles(options["targets"], "targets")
    ffn_roles = tuple(r for r in roles if r.startswith("ffn"))
    # (IA)^3 scales a feed-forward map's input, every other map's output.
    ffn = role_module_names(model, targets, ffn_roles) if ffn_roles else []
    return peft.IA3Config(target_modules=role_module_names(model, targets, roles), feedforward_modules=ffn)


def apply_tuning(model: nn.Module, kind: str, targets: ModelTargets, options: dict[str, Any]) -> dict[str, Any]:
    """Make `model` the fine-tuning method `kind` in place; returns what was done (for the record).

    Trainable afterwards: the method's own tensors plus the task head; everything else is frozen.
    """
    if kind not in TUNES:
        raise UserError(f"unknown fine-tuning kind {kind!r}; choose from {list(TUNES)}")
    heads = head_modules(model)  # refuses a model without a head before anything changes
    if kind in ("lora", "ia3"):
        try:
            import peft  # heavy optional dependency: imported on use
        except ImportError:
            raise UserError(f"method {kind!r} needs the peft package: pip install 'oelm[peft]'") from None
        config = _peft_config(kind, model, targets, options)
        peft.inject_adapter_in_model(config, model)
        marker = "lora_" if kind == "lora" else "ia3_"
        for name, p in model.named_parameters():
            p.requires_grad_(marker in name)
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        for module in model.modules():
            if kind == "ln" and not _is_norm(module):
                continue
            for leaf, p in module.named_parameters(recurse=False):
                if kind == "ln" or leaf == "bias":
                    p.requires_grad_(True)
    names = {name for name, _ in heads}
    backbone_ids = {id(p) for name, child in model.named_children() if name not in names for p in child.parameters()}
    for _, head in heads:
        for p in head.parameters():
            if id(p) not in backbone_ids:  # a tied output embedding stays with the backbone
                p.requires_grad_(True)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        raise UserError(f"fine-tuning method {kind!r} found nothing to train in {type(model).__name__}")
    return {"kind": kind, "head": [name for name, _ in heads], "trainable_tensors": len(trainable)}


def tuning_flops_per_token(model: nn.Module) -> float:
    """Forward matmul FLOPs per token that PEFT's LoRA layers add (2 * r * (in + out) each)."""
    total = 0.0
    for module in model.modules():
        lora_a = getattr(module, "lora_A", None)
        lora_b = getattr(module, "lora_B", None)
        if isinstance(lora_a, nn.ModuleDict) and isinstance(lora_b, nn.ModuleDict):
            for key, a in lora_a.items():
                if isinstance(a, nn.Linear) and key in lora_b:
                    total += 2 * a.weight.numel() + 2 * lora_b[key].weight.numel()
    return total
