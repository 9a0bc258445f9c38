"""Training: one loop core (loop.py) with task plug-ins (lm.py, classification.py)."""

from __future__ import annotations

import importlib

__all__ = ["TrainConfig", "make_config", "train"]

_LAZY = {"TrainConfig": "oelm.training.config", "make_config": "oelm.training.config", "train": "oelm.training.loop"}


def __getattr__(name: str):
    # Lazy so that importing a sibling module (e.g. training.metrics) does not pull in the loop.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'oelm.training' has no attribute {name!r}")
