"""The one run loader: the trained model of an `oelm train` run directory, audit verified."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from oelm.core.audit import audit_model, verify_audit
from oelm.core.freezing import apply_method
from oelm.core.state import MethodState
from oelm.core.targets import find_targets, unwrap
from oelm.data.tokenizers import relocated_spec
from oelm.models.catalog import build_lm, config_from_meta
from oelm.models.gpt import GPTClassifier
from oelm.models.hf_cls import load_hf_classifier
from oelm.records.artifacts import FREEZE_AUDIT_FILE
from oelm.records.run import read_yaml_mapping
from oelm.training.checkpoint import load_weights, read_metadata, resolve_checkpoint
from oelm.training.distributed import resolve_device
from oelm.utils.errors import UserError
from oelm.utils.io import read_json


def load_model(run_dir: str | Path, which: str = "best", device: str = "cpu") -> nn.Module:
    """The trained model of an `oelm train` run, its method re-applied and its freeze audit passing.

    which: "best" (default), "latest", or a step number; device: cpu, cuda[:N] or auto. Tensors
    that a freeze schedule switched during the run are left out of the check (and keep the
    flags of the schedule's start); every other frozen tensor must equal its start bytes.
    """

    run_dir = existing_run_dir(run_dir)
    if which not in ("best", "latest", "last") and not str(which).isdigit():
        raise UserError(f"which={which!r}: use 'best', 'latest' or a step number")
    path = resolve_checkpoint(run_dir, "last" if which == "latest" else str(which))
    return load_checkpoint(run_dir, path, read_metadata(path), device)


def load_checkpoint(
    run_dir: Path, path: Path, meta: dict[str, str], device: str = "cpu", config: dict[str, Any] | None = None
) -> nn.Module:
    """load_model's body for a checkpoint already resolved (`path`, a weights file of `run_dir`) and
    its metadata already read (`meta`, read_metadata of it): a command that needs them itself, such
    as `oelm export`, resolves and reads each once and passes them here. config: the run's
    config.yaml when the caller read it (None: read here if the metadata does not name the method).
    """

    method, options, seed = _run_method(run_dir, meta, config)
    torch.manual_seed(seed)  # as the run did before building
    model = model_from_meta(meta, path)
    state = apply_method(model, method, seed=seed, **options)
    start = audit_model(model)  # the run's start audit: building and applying are deterministic
    _skip_scheduled(model, state, start)
    _check_recorded_audit(run_dir, path, start, scheduled=bool(state.scheduled))
    load_weights(model, path, meta)
    check = verify_audit(model, start)
    if not check.ok:
        raise UserError(f"{str(path)!r} does not match its method {method!r}: {'; '.join(check.problems[:5])}")

    return model.to(resolve_device(device)).eval()


def _check_recorded_audit(run_dir: Path, path: Path, start: Any, scheduled: bool) -> None:
    """The method the weights' metadata names must be the one the run trained under: its
    freeze_audit.json records the method and every frozen tensor's fingerprint at the start. An
    edited (or foreign) metadata record would otherwise re-apply another method whose own audit
    passes, and the frozen tensors would load, and export, as trainable ones."""

    raw = read_json(run_dir / FREEZE_AUDIT_FILE)
    recorded = raw.get("start") if isinstance(raw, dict) else None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("method"), str):
        return  # no audit on record (a run written before it, or a foreign folder): nothing to compare
    fix = "restore the checkpoint's metadata or use a checkpoint this run wrote"
    if recorded["method"] != start.method:
        raise UserError(
            f"{str(path)!r}: its method record names {start.method!r}, but the run trained under "
            f"{recorded['method']!r} ({FREEZE_AUDIT_FILE}): the weights' metadata was edited or comes from another run; {fix}"
        )
    if scheduled:
        return  # a schedule moves which tensors are frozen during the run: the start fingerprints differ by design
    rows = recorded.get("rows") if isinstance(recorded.get("rows"), list) else []
    then = {r["name"]: r["fingerprint"] for r in rows if isinstance(r, dict) and r.get("fingerprint") and "name" in r}
    now = start.fingerprints
    differ = sorted(n for n in set(then) | set(now) if then.get(n) != now.get(n))
    if differ:
        raise UserError(
            f"{str(path)!r}: its method record ({start.method!r}, options {start.options}) freezes other tensors "
            f"than the run did ({FREEZE_AUDIT_FILE} differs at {len(differ)} tensor(s), e.g. {differ[0]!r}): the "
            f"weights' metadata was edited or comes from another run; {fix}"
        )


def _skip_scheduled(model: nn.Module, state: MethodState, audit: Any) -> None:
    """Drop the fingerprints of projections a schedule switches: their bytes may move by design."""

    if not state.scheduled:
        return
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    switched = {
        names[id(p)]
        for layer in find_targets(model).layers
        for _, proj in layer.by_role()
        if proj.name in state.scheduled
        for _, p in proj.params()
    }
    for row in audit.rows:
        if row.name in switched:
            row.fingerprint = None


def existing_run_dir(run_dir: str | Path) -> Path:
    """The run directory as a Path, or a UserError when it is not a folder."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"run directory {str(path)!r} does not exist; pass the --out folder of an `oelm train` run")
    return path


def _run_method(
    run_dir: Path, meta: dict[str, str], config: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any], int]:
    """(method, method_options, seed) from the weights' metadata, else the run's config.yaml
    (`config` when the caller has read it, else read here)."""

    if meta.get("method") and "method_options" in meta:
        seed = meta.get("method_seed", meta.get("seed", "0"))
        return meta["method"], json.loads(meta["method_options"]), int(json.loads(seed))
    cfg: dict[str, Any] = {} if config is None else config
    if config is None and (run_dir / "config.yaml").is_file():
        cfg = read_yaml_mapping(run_dir / "config.yaml")
    method = cfg.get("method") or meta.get("method")
    if not method:
        raise UserError(f"{str(run_dir)!r}: neither config.yaml nor the checkpoint names the method")
    return method, dict(cfg.get("method_options") or {}), int(cfg.get("seed", meta.get("seed", 0)))


def model_from_meta(meta: dict[str, str], path: Path) -> nn.Module:
    """A fresh model of the checkpoint's architecture, from the weights file's metadata."""

    cfg = config_from_meta(meta)
    if cfg is not None:
        if "num_labels" in meta:
            return GPTClassifier(cfg, int(meta["num_labels"]), causal=json.loads(meta.get("causal", "false")))
        return build_lm(cfg)
    if "hf_model" in meta:
        labels = json.loads(meta["label_names"]) if "label_names" in meta else None
        return load_hf_classifier(meta["hf_model"], int(meta["num_labels"]), labels)
    raise UserError(
        f"{str(path)!r} carries no model description (gpt_config, llama_config or hf_model); not an oelm checkpoint"
    )


TOKENIZER_DIR = "tokenizer"  # RUN/tokenizer/: the run's copy of a tokenizer given by a local path


def run_tokenizer_spec(run_dir: str | Path, meta: dict[str, str]) -> str:
    """The tokenizer spec to use for a run: its own copy (RUN/tokenizer/) when it has one, so a
    run moved to another machine still loads it; else the spec recorded in the weights."""
    spec = meta.get("tokenizer", "")
    copy = Path(run_dir) / TOKENIZER_DIR
    return relocated_spec(spec, copy.resolve()) if spec and copy.is_dir() else spec
