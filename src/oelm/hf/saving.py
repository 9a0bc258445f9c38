"""Save and load models with their method: weights + architecture + `oelm_method.json`.

`save_pretrained` writes a folder that `from_pretrained` restores with the same tensors frozen and
every frozen tensor's bytes checked against the record (`oelm.core.record`). A PEFT model saves
its adapter with the record; `oelm.hf.peft.load_adapter` puts it back on a base model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_model
from torch import nn

from oelm.core.record import ADDED, METHOD_RECORD_FILE, check_frozen, read_record, write_record
from oelm.core.restore import reapply
from oelm.core.state import method_state
from oelm.core.targets import unwrap
from oelm.hf.peft import write_adapter_record
from oelm.hf.wrappers import is_peft, underlying
from oelm.models.catalog import build_lm, config_from_meta, config_meta
from oelm.models.gpt import GPT, GPTClassifier
from oelm.models.llama import Llama
from oelm.training.checkpoint import load_weights
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_text, file_times, follow_umask, read_json_object, write_error

GPT_FILE = "oelm_model.json"  # our GPT's or Llama's architecture (HF models keep theirs in config.json)
WEIGHTS_FILE = "model.safetensors"

__all__ = ["from_pretrained", "save_pretrained"]


def save_pretrained(model: nn.Module, folder: str | Path, **kwargs: Any) -> Path:
    """Save weights + architecture + method record to `folder` (HF models via their save_pretrained).

    A PEFT model saves its adapter (its own save_pretrained) and the method record of the model
    under it: load it with `oelm.hf.peft.load_adapter(base_model, folder)`.
    """

    base = unwrap(model)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    before = file_times(folder)  # files written from here on follow the umask; others keep their modes
    if is_peft(base):
        base.save_pretrained(folder, **kwargs)
        follow_umask(folder, before=before)
        if method_state(underlying(base)) is not None:
            write_adapter_record(base, folder)
        return folder
    if isinstance(base, (GPT, GPTClassifier, Llama)):
        _save_gpt(base, folder)
    elif callable(getattr(base, "save_pretrained", None)):
        base.save_pretrained(folder, **kwargs)
        follow_umask(folder, before=before)
    else:
        raise UserError(f"cannot save a {type(base).__name__}: neither our GPT / Llama nor a Hugging Face model")
    if method_state(base) is not None:
        write_record(base, folder)
    return folder


def _save_gpt(model: nn.Module, folder: Path) -> None:

    arch: dict[str, Any] = {"class": type(model).__name__, **config_meta(model.config)}
    if isinstance(model, GPTClassifier):
        arch.update(num_labels=model.num_labels, causal=model.causal)
    tmp = folder / f".{WEIGHTS_FILE}.tmp{os.getpid()}"
    try:
        save_model(model, str(tmp))  # de-duplicates the tied LM head
        follow_umask(tmp)
        os.replace(tmp, folder / WEIGHTS_FILE)  # a kill never leaves a half-written weights file
    except (OSError, SafetensorError) as err:  # a full disk: no temp file left, the old weights kept
        tmp.unlink(missing_ok=True)
        raise write_error(folder / WEIGHTS_FILE, err) from None
    atomic_write_text(folder / GPT_FILE, json.dumps(arch, indent=2) + "\n")


def _build_gpt(folder: Path) -> nn.Module:

    fix = "re-save the model with oelm.save_pretrained"
    arch = read_json_object(folder / GPT_FILE, fix)
    try:
        cfg = config_from_meta(arch)
        if cfg is None:
            raise KeyError("no model config")
        return (
            GPTClassifier(cfg, arch["num_labels"], arch["causal"])
            if arch["class"] == "GPTClassifier"
            else build_lm(cfg)
        )
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(
            f"{str(folder / GPT_FILE)!r} does not describe a model ({type(err).__name__}: {err}); {fix}"
        ) from None


def _load_added(model: nn.Module, folder: Path) -> None:
    """Load the saved values of tensors the method added (Hugging Face from_pretrained skips them)."""

    wanted = {k for k in model.state_dict() if ADDED in k}
    if not wanted:
        return
    found: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            found.update({k: fh.get_tensor(k) for k in fh.keys() if k in wanted})  # noqa: SIM118  (safe_open is not a dict)
    missing = sorted(wanted - set(found))
    if missing:
        raise UserError(f"the method's added tensors are not in {str(folder)!r}: {missing[:4]}; re-save the model")
    model.load_state_dict(found, strict=False)


def from_pretrained(
    folder: str | Path, *args: Any, model_class: Any = None, verify: bool = True, **kwargs: Any
) -> nn.Module:
    """Load a folder written with a method applied and restore the method (same tensors frozen).

    Extra arguments go to the Hugging Face class's from_pretrained; verify=False skips the byte
    check of frozen tensors against the saved fingerprints.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{str(folder)!r} is not a folder; pass a folder written by save_pretrained")
    record = read_record(folder)
    if record is None:
        raise UserError(
            f"{str(folder)!r} has no {METHOD_RECORD_FILE}: it was saved without a method. Load it with "
            "transformers' from_pretrained and call oelm.apply_method"
        )
    if (folder / "adapter_config.json").is_file():
        raise UserError(
            f"{str(folder)!r} holds a PEFT adapter, not a whole model: put it on its base model with "
            "oelm.hf.peft.load_adapter(base_model, folder)"
        )
    if (folder / GPT_FILE).is_file():
        model = _build_gpt(folder)
        reapply(model, record)  # first, so the tensors it adds exist to load
        load_weights(model, folder / WEIGHTS_FILE)
    else:
        model = _hf_class(folder, model_class).from_pretrained(folder, *args, **kwargs)
        reapply(model, record)
        _load_added(model, folder)
    if verify:
        check_frozen(model, record)
    return model


def _hf_class(folder: Path, model_class: Any) -> Any:
    """The class named in config.json's `architectures` (or `model_class` when given)."""
    import transformers  # heavy optional dependency: imported on use

    if model_class is not None:
        return model_class
    if not (folder / "config.json").is_file():
        raise UserError(f"{str(folder)!r} has neither config.json nor {GPT_FILE}; not a saved model folder")
    config = transformers.AutoConfig.from_pretrained(folder)
    for name in config.architectures or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    raise UserError(f"config.json in {str(folder)!r} names no known architecture; pass model_class=...")
