"""Build models by name for counting and benchmarking: our presets, Hugging Face names or config files."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from oelm.core.audit import audit_model
from oelm.core.freezing import apply_method
from oelm.models.catalog import PRESETS, build_lm, is_llama_preset, preset_config
from oelm.models.gpt import GPTClassifier
from oelm.models.hf_cls import MINILM_ALIASES, ensure_pad_token_id, resolve_hf_source
from oelm.utils.errors import UserError
from oelm.utils.hub import require_hub


def _builtin_hf_config(name: str):
    """Configs known offline: they equal transformers' class defaults."""
    import transformers  # heavy optional dependency: imported on use

    known = {  # class names, looked up only when matched (each lookup imports a model module)
        "bert-base-uncased": "BertConfig",
        "google-bert/bert-base-uncased": "BertConfig",
        "gpt2": "GPT2Config",
        "openai-community/gpt2": "GPT2Config",
    }
    factory = known.get(name)
    return getattr(transformers, factory)() if factory else None


def resolve_hf_config(model: str):
    """A transformers config from a known name, a config.json (or its folder), or the hub."""
    import transformers  # heavy optional dependency: imported on use

    cfg = _builtin_hf_config(model)
    if cfg is not None:
        return cfg
    if model.lower() in MINILM_ALIASES:
        model = resolve_hf_source(model)
    path = Path(model)
    if path.is_file() and path.suffix == ".json":
        return (
            transformers.AutoConfig.from_pretrained(str(path.parent))
            if path.name == "config.json"
            else transformers.AutoConfig.from_json_file(str(path))
        )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"{path} has no config.json; point to a Hugging Face model folder")
        return transformers.AutoConfig.from_pretrained(str(path))

    require_hub(model, "model", f"pass a preset ({', '.join(PRESETS)}) or a local config.json or model folder")
    try:
        return transformers.AutoConfig.from_pretrained(model)
    except OSError as err:
        raise UserError(
            f"cannot resolve model {model!r}: not a preset ({', '.join(PRESETS)}), not a local "
            f"config.json or folder, and the Hugging Face hub did not answer ({err.__class__.__name__}). "
            "Pass a path to the model's config.json to work offline."
        ) from None


def build_model(
    model: str, num_labels: int | None = None, causal_classifier: bool = False, vocab_size: int | None = None
) -> nn.Module:
    """A freshly initialized model: our preset (GPT LM or classifier with num_labels, Llama LM) or HF architecture.

    `vocab_size` replaces the preset's or the config's vocabulary (None: keep it)."""
    if vocab_size is not None and vocab_size < 1:
        raise UserError(f"--vocab-size must be a positive number of tokens, got {vocab_size}")
    if model in PRESETS:
        if num_labels and is_llama_preset(model):
            raise UserError(f"{model} is a language model (our Llama family has no classifier); drop --num-labels")
        cfg = preset_config(model, vocab_size=vocab_size)
        return GPTClassifier(cfg, num_labels, causal=causal_classifier) if num_labels else build_lm(cfg)
    import transformers  # heavy optional dependency: imported on use

    cfg = resolve_hf_config(model)
    if vocab_size is not None:
        cfg.vocab_size = vocab_size
    if num_labels:
        cfg.num_labels = num_labels
        ensure_pad_token_id(cfg)
        return transformers.AutoModelForSequenceClassification.from_config(cfg)
    if getattr(cfg, "is_decoder", False) or cfg.model_type in ("gpt2", "llama", "mistral", "qwen2"):
        return transformers.AutoModelForCausalLM.from_config(cfg)
    return transformers.AutoModel.from_config(cfg)


def param_summary(
    model_name: str,
    method: str = "baseline",
    num_labels: int | None = None,
    seed: int = 0,
    vocab_size: int | None = None,
    vocab_from: str | None = None,
) -> dict:
    """Parameter counts of a model under a method, as `oelm params` prints them.

    `vocab_size` replaces the model's vocabulary; `vocab_from` says where it came from (e.g. a
    tokenizer), for the `vocab_source` the summary reports."""

    torch.manual_seed(seed)
    # Counting needs shapes, not values: build on the meta device (no memory, no init cost).
    with torch.device("meta"):
        model = build_model(model_name, num_labels, vocab_size=vocab_size)
    state = apply_method(model, method, seed=seed)
    audit = audit_model(model)
    t = audit.totals
    return {
        "model": model_name,
        "family": state.family,
        "method": state.method.name,
        "num_labels": num_labels,
        "vocab_size": _vocab_size(model),
        "vocab_source": vocab_from or ("given" if vocab_size is not None else _default_vocab(model_name)),
        "total": t["total"],
        "trainable": t["trainable"],
        "frozen": t["frozen"],
        "frozen_fraction": t["frozen_fraction"],
        "max_orthogonality_error": t["max_orthogonality_error"],
        "by_role": t["by_role"],
    }


def _vocab_size(model: nn.Module) -> int | None:
    """The vocabulary of a built model (its input embedding's rows), or None without one."""
    config = getattr(model, "config", None) or getattr(model, "cfg", None)
    size = getattr(config, "vocab_size", None)
    return int(size) if size is not None else None


def _default_vocab(model_name: str) -> str:
    """Where a model's vocabulary comes from when none is given."""
    return "the preset's default, GPT-2 BPE's" if model_name in PRESETS else "the model's config"
