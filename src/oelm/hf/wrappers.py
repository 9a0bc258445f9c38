"""Seeing through wrappers: the model under DDP, torch.compile and PEFT."""

from __future__ import annotations

from torch import nn

from oelm.core.targets import unwrap


def _is_peft_wrapper(model: nn.Module) -> bool:
    return type(model).__module__.startswith("peft.") and callable(getattr(model, "get_base_model", None))


def underlying(model: nn.Module) -> nn.Module:
    """The model under DDP / torch.compile / PEFT wrappers (PEFT's injected layers stay in it)."""
    while True:
        model = unwrap(model)
        if _is_peft_wrapper(model):
            model = model.get_base_model()
            continue
        return model


def is_peft(model: nn.Module) -> bool:
    """Whether the model (under DDP / torch.compile) is a PEFT model wrapping another."""
    return _is_peft_wrapper(unwrap(model))
