"""Save and load models with their method: `oelm_method.json` beside the weights, and run loading.

The method record is written and read through `method_record`, `reapply` and `carry_method`
only, so a change of `MethodState` is edited here. Re-applying never re-initializes saved
weights: it re-attaches what the method adds (adapters, whose saved values are then loaded),
restores the freeze flags and state, and `check_frozen` proves the frozen tensors are
bit-identical to what was saved.
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
from oelm.methods import get_method
from oelm.targets import unwrap

RECORD_FILE = "oelm_method.json"
GPT_FILE = "oelm_model.json"  # our GPT's architecture (HF models keep theirs in config.json)
WEIGHTS_FILE = "model.safetensors"
RECORD_FORMAT = 1
ADDED = "oelm_adapter"  # state-dict key part of tensors a method adds (oelm.targets.attach_adapter)


# ---- the one place that knows MethodState's fields ----------------------------------------------


def method_record(model: nn.Module) -> dict[str, Any]:
    """What was applied: method, options, seed, qk_init, inits, and every frozen tensor's fingerprint."""
    from oelm import __version__
    from oelm.audit import fingerprint

    state = method_state(model)
    if state is None:
        raise UserError("no method was applied to this model (call oelm.apply_method first)")
    frozen = {n: fingerprint(p) for n, p in unwrap(model).named_parameters() if not p.requires_grad}
    return {
        "format": RECORD_FORMAT,
        "oelm_version": __version__,
        **json.loads(json.dumps(state.record())),  # method, method_options, method_seed
        "qk_init": state.qk_init,
        "family": state.family,
        "layers": list(state.layers),
        "inits": dict(state.inits),
        "orthogonal_heads": dict(state.orthogonal_heads),
        "frozen": frozen,
    }


def _apply_keeping_weights(model: nn.Module, name: str, seed: int, options: dict[str, Any]) -> MethodState:
    """apply_method with the method's targets, flags and adapters but no re-init of saved weights."""
    method = get_method(name)
    opts = dict(options)
    if method.changes_qk:
        opts["qk_init"] = "keep"
    structural = dataclasses.replace(method, ffn_init="default")
    state = apply_method(model, structural, seed=seed, **opts)
    state.method, state.options = method, dict(options)
    return state


def reapply(model: nn.Module, record: dict[str, Any]) -> MethodState:
    """Restore a recorded method on a model holding the saved weights: same flags, nothing re-initialized.

    Tensors the method adds (adapters) are attached fresh: load their saved values afterwards
    (`from_pretrained` does), then call `check_frozen`.
    """
    if record.get("format") != RECORD_FORMAT:
        raise UserError(f"method record format {record.get('format')!r} is not {RECORD_FORMAT}; upgrade oelm")
    try:
        state = _apply_keeping_weights(model, record["method"], record["method_seed"], record["method_options"])
    except UserError as err:
        raise UserError(f"cannot re-apply the saved method: {err} (register a custom method before loading)") from None
    state.qk_init = record["qk_init"]
    state.inits = dict(record["inits"])
    state.orthogonal_heads = {k: int(v) for k, v in record["orthogonal_heads"].items()}
    _restore_flags(unwrap(model), record["frozen"], scheduled=state.method.schedule is not None)
    return state


def carry_method(src: nn.Module, dst: nn.Module) -> MethodState:
    """Put src's method on dst, a converted copy (same layers, other family): flags only, no re-init."""
    from oelm.targets import find_targets

    s = method_state(src)
    if s is None:
        raise UserError("the source model has no method applied")
    d = _apply_keeping_weights(dst, s.method.name, s.seed, s.options)
    d.qk_init = s.qk_init
    # Projection and parameter names differ between families; layer index and role do not.
    src_params = {id(p): n for n, p in unwrap(src).named_parameters()}
    dst_params = {id(p): n for n, p in unwrap(dst).named_parameters()}
    proj, weight = {}, {}
    for la, lb in zip(find_targets(src).layers, find_targets(dst).layers):
        for (_, a), (_, b) in zip(la.by_role(), lb.by_role()):
            proj[a.name] = b.name
            weight[src_params[id(a.weight)]] = dst_params[id(b.weight)]
    d.orthogonal_heads = {proj[k]: v for k, v in s.orthogonal_heads.items()}
    d.inits = {weight.get(k, k): v for k, v in s.inits.items()}
    return d


def _restore_flags(base: nn.Module, frozen: dict[str, str], scheduled: bool) -> None:
    """Freeze exactly the recorded tensors (a schedule's later phase may differ from its start)."""
    params = dict(base.named_parameters())
    missing = sorted(set(frozen) - set(params))
    if missing:
        raise UserError(f"recorded frozen tensors missing from the model: {missing[:5]}; wrong model class?")
    for name in frozen:
        params[name].requires_grad_(False)  # tensors frozen outside the method (e.g. embeddings) too
    extra = sorted(n for n, p in params.items() if not p.requires_grad and n not in frozen)
    if extra and not scheduled:
        raise UserError(f"the method freezes tensors that were trainable when saved: {extra[:5]}; "
                        "the folder mixes two models or the method's record changed")
    for name in extra:  # a schedule had unfrozen them by the time of saving
        params[name].requires_grad_(True)


def check_frozen(model: nn.Module, record: dict[str, Any]) -> None:
    """Raise unless every recorded frozen tensor is bit-identical to its saved fingerprint."""
    from oelm.audit import fingerprint

    params = dict(unwrap(model).named_parameters())
    changed = sorted(n for n, fp in record["frozen"].items() if fingerprint(params[n]) != fp)
    if changed:
        raise UserError(
            f"frozen tensors whose bytes differ from the saved fingerprints: {changed[:5]}; the folder "
            "was edited or mixes two models (loaded in another dtype than saved? then pass verify=False)"
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


def _build_gpt(folder: Path) -> nn.Module:
    from oelm.models.gpt import GPT, GPTClassifier, GPTConfig

    arch = json.loads((folder / GPT_FILE).read_text())
    cfg = GPTConfig(**arch["gpt_config"])
    return GPT(cfg) if arch["class"] == "GPT" else GPTClassifier(cfg, arch["num_labels"], arch["causal"])


def _load_added(model: nn.Module, folder: Path) -> None:
    """Load the saved values of tensors the method added (Hugging Face from_pretrained skips them)."""
    from safetensors import safe_open

    wanted = {k for k in model.state_dict() if ADDED in k}
    if not wanted:
        return
    found: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            found.update({k: fh.get_tensor(k) for k in fh.keys() if k in wanted})
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
            f"{str(folder)!r} has no {RECORD_FILE}: it was saved without a method. Load it with "
            "transformers' from_pretrained and call oelm.apply_method"
        )
    if (folder / GPT_FILE).is_file():
        from oelm.training.checkpoint import load_weights

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

    which: "best" (default), "latest", or a step number; device: cpu, cuda[:N] or auto. Tensors
    that a freeze schedule switched during the run are left out of the check (and keep the
    flags of the schedule's start); every other frozen tensor must equal its start bytes.
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
    state = apply_method(model, method, seed=seed, **options)
    start = audit_model(model)  # the run's start audit: building and applying are deterministic
    _skip_scheduled(model, state, start)
    load_weights(model, path)
    check = verify_audit(model, start)
    if not check.ok:
        raise UserError(f"{str(path)!r} does not match its method {method!r}: {'; '.join(check.problems[:5])}")
    from oelm.training.distributed import resolve_device

    return model.to(resolve_device(device)).eval()


def _skip_scheduled(model: nn.Module, state: MethodState, audit: Any) -> None:
    """Drop the fingerprints of projections a schedule switches: their bytes may move by design."""
    from oelm.targets import find_targets

    if not state.scheduled:
        return
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    switched = {names[id(p)] for layer in find_targets(model).layers for _, proj in layer.by_role()
                if proj.name in state.scheduled for _, p in proj.params()}
    for row in audit.rows:
        if row.name in switched:
            row.fingerprint = None


def existing_run_dir(run_dir: str | Path) -> Path:
    """The run directory as a Path, or a UserError when it is not a folder."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"run directory {str(path)!r} does not exist; pass the --out folder of an `oelm train` run")
    return path


def _run_method(run_dir: Path, meta: dict[str, str]) -> tuple[str, dict[str, Any], int]:
    """(method, method_options, seed) from the weights' metadata, else the run's config.yaml."""
    import yaml

    if meta.get("method") and "method_options" in meta:
        seed = meta.get("method_seed", meta.get("seed", "0"))
        return meta["method"], json.loads(meta["method_options"]), int(json.loads(seed))
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
