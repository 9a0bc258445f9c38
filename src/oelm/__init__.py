"""oelm: research toolkit for Orthogonal ELM Transformers (head-wise orthogonal, frozen Q/K).

The public API is the names in `__all__`, each defined in one module (`_LAZY` says which) and
loaded on first use, so `import oelm` stays cheap and does not import torch. The subpackages
(`oelm.core`, `oelm.hf`, ...) load on first attribute access too. docs/architecture.md lists them.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Public name -> the one module that defines it.
_LAZY = {
    # Methods: apply one, the registry, a new record.
    "apply_method": "oelm.core.freezing",
    "optimizer_groups": "oelm.core.freezing",
    "trainable_parameters": "oelm.core.freezing",
    "Method": "oelm.core.methods",
    "get_method": "oelm.core.methods",
    "list_methods": "oelm.core.methods",
    "register_method": "oelm.core.methods",
    # Frozen means frozen: the audit and its check.
    "audit_model": "oelm.core.audit",
    "verify_audit": "oelm.core.audit",
    # Our GPT and classifier.
    "GPT": "oelm.models.gpt",
    "GPTClassifier": "oelm.models.gpt",
    "GPTConfig": "oelm.models.gpt",
    "gpt_config": "oelm.models.gpt",
    # Our Llama-style decoder (RoPE, RMSNorm, SwiGLU, grouped-query attention).
    "Llama": "oelm.models.llama",
    "LlamaConfig": "oelm.models.llama",
    "llama_config": "oelm.models.llama",
    # Save and load with the method.
    "from_pretrained": "oelm.hf.saving",
    "save_pretrained": "oelm.hf.saving",
    "load_model": "oelm.training.runs",
    # One run (`oelm train`), a sweep (`oelm sweep`), a report (`oelm report`).
    "TrainConfig": "oelm.training.config",
    "train": "oelm.training.loop",
    "load_spec": "oelm.experiments.sweep",
    "run_sweep": "oelm.experiments.runner",
    "write_report": "oelm.reports.report",
}

_SUBPACKAGES = ("cli", "core", "data", "experiments", "hf", "models", "records", "reports", "training", "utils")

__all__ = sorted(_LAZY, key=str.lower)


def __getattr__(name: str):
    # Lazy so that `import oelm` stays cheap for the CLI and does not import torch eagerly.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBPACKAGES:  # `oelm.core.freezing.optimizer_groups` after a bare `import oelm`
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'oelm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
