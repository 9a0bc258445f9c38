"""Save and load models with their method: `oelm_method.json` beside the weights, and run loading.

The method record is written and read through two functions only, `method_record` and
`reapply`; everything else here goes through them, so a change of `MethodState` is one edit.
Re-applying never re-initializes weights: it restores the freeze flags and the method state on
the saved tensors and checks that the frozen ones are bit-identical to what was saved.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oelm.errors import UserError
from oelm.freezing import MethodState, apply_method, method_state
from oelm.methods import Method, get_method
from oelm.targets import unwrap

RECORD_FILE = "oelm_method.json"
GPT_FILE = "oelm_model.json"  # our GPT's architecture (HF models keep theirs in config.json)
WEIGHTS_FILE = "model.safetensors"
RECORD_FORMAT = 1


# ---- the one place that knows MethodState's fields ----------------------------------------------


def method_record(model: nn.Module) -> dict[str, Any]:
    """What was applied to `model`: method record, seed, qk_init, inits, and frozen tensors' fingerprints."""
    from oelm import __version__
    from oelm.audit import fingerprint

    state = method_state(model)
    if state is None:
        raise UserError("no method was applied to this model (call oelm.apply_method first)")
    frozen = {n: fingerprint(p) for n, p in unwrap(model).named_parameters() if not p.requires_grad}
    return {
        "format": RECORD_FORMAT,
        "oelm_version": __version__,
        "method": state.method.to_dict(),
        "seed": state.seed,
        "qk_init": state.qk_init,
        "family": state.family,
        "inits": dict(state.inits),
        "orthogonal_heads": dict(state.orthogonal_heads),
        "frozen": frozen,
    }


def reapply(model: nn.Module, record: dict[str, Any], verify: bool = True) -> MethodState:
    """Restore a recorded method on saved weights: same tensors frozen, no re-initialization.

    verify=False skips the byte check of frozen tensors (needed when loading in another dtype).
    """
    if record.get("format") != RECORD_FORMAT:
        raise UserError(f"method record format {record.get('format')!r} is not {RECORD_FORMAT}; upgrade oelm")
    method = _method_from(record["method"])
    # Freeze flags and targets from the method, but keep every saved weight as it is.
    structural = dataclasses.replace(method, ffn_init="default")
    state = apply_method(model, structural, seed=record["seed"], qk_init="keep" if method.changes_qk else None)
    state.method, state.qk_init = method, record["qk_init"]
    state.inits = dict(record["inits"])
    state.orthogonal_heads = {k: int(v) for k, v in record["orthogonal_heads"].items()}
    _restore_frozen(unwrap(model), record["frozen"], verify)
    return state


def carry_method(src: nn.Module, dst: nn.Module) -> MethodState:
    """Put src's method on dst, a converted copy (same layers, other family): flags only, no re-init."""
    from oelm.targets import find_targets

    s = method_state(src)
    if s is None:
        raise UserError("the source model has no method applied")
    structural = dataclasses.replace(s.method, ffn_init="default")
    d = apply_method(dst, structural, seed=s.seed, qk_init="keep" if s.method.changes_qk else None)
    d.method, d.qk_init = s.method, s.qk_init
    # Projection names differ between families; layer index and role do not.
    names = {
        a.name: b.name
        for la, lb in zip(find_targets(src).layers, find_targets(dst).layers)
        for (_, a), (_, b) in zip(la.by_role(), lb.by_role())
    }
    d.orthogonal_heads = {names[k]: v for k, v in s.orthogonal_heads.items()}
    d.inits = {f"{names[k.removesuffix('.weight')]}.weight": v for k, v in s.inits.items()}
    return d


def _method_from(data: dict[str, Any]) -> Method:
    """The registered method when it still equals the record, else the record itself."""
    try:
        registered = get_method(data["name"])
        if registered.to_dict() == data:
            return registered
    except UserError:
        pass
    try:
        return Method(**data)
    except TypeError as err:
        raise UserError(f"method record {data.get('name')!r} does not fit this oelm version: {err}") from None


def _restore_frozen(base: nn.Module, frozen: dict[str, str], verify: bool = True) -> None:
    """Freeze exactly the recorded tensors and check their bytes match the saved fingerprints."""
    from oelm.audit import fingerprint

    params = dict(base.named_parameters())
    missing = sorted(set(frozen) - set(params))
    if missing:
        raise UserError(f"recorded frozen tensors missing from the model: {missing[:5]}; wrong model class?")
    for name in frozen:
        params[name].requires_grad_(False)  # tensors frozen outside the method (e.g. embeddings) too
    extra = sorted(n for n, p in params.items() if not p.requires_grad and n not in frozen)
    changed = sorted(n for n, fp in frozen.items() if verify and fingerprint(params[n]) != fp)
    if extra or changed:
        raise UserError(
            "the saved weights do not match their method record: "
            + (f"frozen now but not when saved: {extra[:5]}; " if extra else "")
            + (f"frozen tensors whose bytes differ from the saved fingerprints: {changed[:5]}" if changed else "")
            + "; the folder was edited or mixes two models (loaded in another dtype than saved? then "
            "pass verify=False)"
        )


# ---- folders: save_pretrained / from_pretrained -------------------------------------------------


def write_record(model: nn.Module, folder: str | Path) -> Path:
    """Write `oelm_method.json` for `model` into `folder`."""
    from oelm.training.runlog import atomic_write_text

    path = Path(folder) / RECORD_FILE
    atomic_write_text(path, json.dumps(method_record(model), indent=2) + "\n")
    return path


def read_record(folder: str | Path) -> dict[str, Any] | None:
    """The method record saved in `folder`, or None."""
    path = Path(folder) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{str(path)!r} is not valid JSON ({err}); re-save the model") from None


class _SaveWithRecord:
    """The model class's save_pretrained, then oelm_method.json; an object (not a closure or bound
    method) so that deepcopy rebinds it to the copy and pickling/torch.save of the model works."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> Any:
        out = type(self.model).save_pretrained(self.model, save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True) and method_state(self.model) is not None:
            write_record(self.model, save_directory)
        return out


def install_save_hook(model: nn.Module) -> None:
    """Make a Hugging Face model's own `save_pretrained` also write `oelm_method.json` (per instance)."""
    base = unwrap(model)
    if callable(getattr(type(base), "save_pretrained", None)) and "save_pretrained" not in vars(base):
        base.save_pretrained = _SaveWithRecord(base)


def save_pretrained(model: nn.Module, folder: str | Path, **kwargs: Any) -> Path:
    """Save weights + architecture + method record to `folder` (HF models via their save_pretrained)."""
    from oelm.models.gpt import GPT, GPTClassifier

    base = unwrap(model)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(base, (GPT, GPTClassifier)):
        _save_gpt(base, folder)
    elif callable(getattr(base, "save_pretrained", None)):
        base.save_pretrained(folder, **kwargs)
    else:
        raise UserError(f"cannot save a {type(base).__name__}: neither our GPT nor a Hugging Face model")
    if method_state(base) is not None:
        write_record(base, folder)
    return folder


def _save_gpt(model: nn.Module, folder: Path) -> None:
    from safetensors.torch import save_model

    from oelm.models.gpt import GPTClassifier
    from oelm.training.runlog import atomic_write_text

    arch: dict[str, Any] = {"class": type(model).__name__, "gpt_config": dataclasses.asdict(model.config)}
    if isinstance(model, GPTClassifier):
        arch.update(num_labels=model.num_labels, causal=model.causal)
    tmp = folder / f".{WEIGHTS_FILE}.tmp{os.getpid()}"
    save_model(model, str(tmp))  # de-duplicates the tied LM head
    os.replace(tmp, folder / WEIGHTS_FILE)  # a kill never leaves a half-written weights file
    atomic_write_text(folder / GPT_FILE, json.dumps(arch, indent=2) + "\n")


def _load_gpt(folder: Path) -> nn.Module:
    from oelm.models.gpt import GPT, GPTClassifier, GPTConfig
    from oelm.training.checkpoint import load_weights

    arch = json.loads((folder / GPT_FILE).read_text())
    cfg = GPTConfig(**arch["gpt_config"])
    model = GPT(cfg) if arch["class"] == "GPT" else GPTClassifier(cfg, arch["num_labels"], arch["causal"])
    load_weights(model, folder / WEIGHTS_FILE)
    return model


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
            f"{str(folder)!r} has no {RECORD_FILE}: it was saved without a method. Load it with "
            "transformers' from_pretrained and call oelm.apply_method"
        )
    if (folder / GPT_FILE).is_file():
        model = _load_gpt(folder)
    else:
        model = _hf_class(folder, model_class).from_pretrained(folder, *args, **kwargs)
    reapply(model, record, verify)
    return model


def _hf_class(folder: Path, model_class: Any) -> Any:
    """The class named in config.json's `architectures` (or `model_class` when given)."""
    import transformers

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


# ---- run directories ------------------------------------------------------------------------------


def load_model(run_dir: str | Path, which: str = "best", device: str = "cpu") -> nn.Module:
    """The trained model of an `oelm train` run, its method re-applied and its freeze audit passing.

    which: "best" (default), "latest", or a step number; device: cpu, cuda[:N] or auto.
    """
    from oelm.audit import audit_model, verify_audit
    from oelm.training.checkpoint import load_weights, read_metadata, resolve_checkpoint

    run_dir = existing_run_dir(run_dir)
    if which not in ("best", "latest", "last") and not str(which).isdigit():
        raise UserError(f"which={which!r}: use 'best', 'latest' or a step number")
    path = resolve_checkpoint(run_dir, "last" if which == "latest" else str(which))
    meta = read_metadata(path)
    method, options, seed = _run_method(run_dir, meta)
    torch.manual_seed(seed)  # as the run did before building
    model = _model_from_meta(meta, path)
    apply_method(model, method, seed=seed, **options)
    start = audit_model(model)  # the run's start audit: building and applying are deterministic
    load_weights(model, path)
    check = verify_audit(model, start)
    if not check.ok:
        raise UserError(f"{str(path)!r} does not match its method {method!r}: {'; '.join(check.problems[:5])}")
    from oelm.training.distributed import resolve_device

    return model.to(resolve_device(device)).eval()


def existing_run_dir(run_dir: str | Path) -> Path:
    """The run directory as a Path, or a UserError when it is not a folder."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"run directory {str(path)!r} does not exist; pass the --out folder of an `oelm train` run")
    return path


def _run_method(run_dir: Path, meta: dict[str, str]) -> tuple[str, dict[str, Any], int]:
    """(method, method_options, seed) from the run's config.yaml, else the weights' metadata."""
    import yaml

    cfg: dict[str, Any] = {}
    if (run_dir / "config.yaml").is_file():
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    method = cfg.get("method") or meta.get("method")
    if not method:
        raise UserError(f"{str(run_dir)!r}: neither config.yaml nor the checkpoint names the method")
    return method, dict(cfg.get("method_options") or {}), int(cfg.get("seed", meta.get("seed", 0)))


def _model_from_meta(meta: dict[str, str], path: Path) -> nn.Module:
    """A fresh model of the checkpoint's architecture, from the weights file's metadata."""
    from oelm.models.gpt import GPT, GPTClassifier, GPTConfig

    if "gpt_config" in meta:
        cfg = GPTConfig(**json.loads(meta["gpt_config"]))
        if "num_labels" in meta:
            return GPTClassifier(cfg, int(meta["num_labels"]), causal=json.loads(meta.get("causal", "false")))
        return GPT(cfg)
    if "hf_model" in meta:
        from oelm.models.hf_cls import load_hf_classifier

        labels = json.loads(meta["label_names"]) if "label_names" in meta else None
        return load_hf_classifier(meta["hf_model"], int(meta["num_labels"]), labels)
    raise UserError(f"{str(path)!r} carries no model description (gpt_config or hf_model); not an oelm checkpoint")
