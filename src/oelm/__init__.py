"""oelm: research toolkit for Orthogonal ELM Transformers (head-wise orthogonal, frozen Q/K)."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "GPTClassifier",
    "GPTConfig",
    "apply_method",
    "audit_model",
    "from_pretrained",
    "get_method",
    "list_methods",
    "load_model",
    "save_pretrained",
    "verify_audit",
]

_LAZY = {
    "GPT": "oelm.models.gpt",
    "GPTClassifier": "oelm.models.gpt",
    "GPTConfig": "oelm.models.gpt",
    "apply_method": "oelm.core.freezing",
    "get_method": "oelm.core.methods",
    "list_methods": "oelm.core.methods",
    "audit_model": "oelm.core.audit",
    "verify_audit": "oelm.core.audit",
    "from_pretrained": "oelm.hf.saving",
    "load_model": "oelm.training.runs",
    "save_pretrained": "oelm.hf.saving",
}


def __getattr__(name: str):
    # Lazy so that `import oelm` stays cheap for the CLI and does not import torch eagerly.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'oelm' has no attribute {name!r}")
