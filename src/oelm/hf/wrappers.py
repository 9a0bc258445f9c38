"""Seeing through wrappers: the model under DDP, torch.compile and PEFT."""

from __future__ import annotations

from torch import nn

from oelm.core.targets import unwrap


def underlying(model: nn.Module) -> nn.Module:
    """The model under DDP / torch.compile / PEFT wrappers (PEFT's injected layers stay in it)."""
    while True:
        model = unwrap(model)
        if type(model).__module__.startswith("peft.") and callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
            continue
        return model
