"""Deciding what to do with an output directory: fresh start, resume, reuse, or refuse."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from oelm.data.tokenizers import copy_local_tokenizer
from oelm.records.comparable import RUNTIME_FIELDS, config_differences
from oelm.records.run import RESULTS_FILE, RunResults, is_finished, read_results
from oelm.training.checkpoint import latest_checkpoint, remove_debris
from oelm.training.config import TrainConfig, identity_digest, written_digest
from oelm.training.runs import TOKENIZER_DIR
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_text, load_yaml_text
from oelm.utils.lock import LOCK_NAME

log = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """The outcome of inspecting the run directory."""

    run_dir: Path
    resume_from: Path | None = None  # a step checkpoint to continue from
    finished: RunResults | None = None  # results of a finished run to return as is
    clear: bool = False  # the directory's previous contents must go (overwrite / fresh restart)
    reopen: bool = False  # a finished run continues: its results.json no longer holds


def _read_stored(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """The run's stored settings (runtime fields left out), or None and why the file cannot give them."""
    try:
        stored = load_yaml_text((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        return None, " ".join(str(err).split())[:200] or type(err).__name__
    if not isinstance(stored, dict):
        return None, f"it holds a YAML {type(stored).__name__}, not the mapping of settings oelm train writes"
    return {k: v for k, v in stored.items() if k not in RUNTIME_FIELDS}, ""


def check_not_edited(run_dir: Path, stored: dict[str, Any] | None, results: dict[str, Any] | None) -> None:
    """Refuse a config.yaml edited after the run wrote it: its settings are no longer the ones the
    checkpoints and results were made with, and resuming from it would report them as if they were.

    The digest is config.yaml's first line; a finished run's results.json records it too (a YAML
    tool that rewrites the file drops comments)."""
    try:
        written = written_digest((run_dir / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return  # unreadable: differences() reports it
    written = written or (results or {}).get("config_identity_sha256")
    if written is None or stored is None or identity_digest(stored) == written:
        return  # files written before the digest existed are compared as before
    raise UserError(
        f"{str(run_dir / 'config.yaml')!r} was edited after the run wrote it (its identity digest no longer "
        "matches): its settings are not the ones the checkpoints were trained with. Restore the file; to change "
        "a setting, resume with the original config plus KEY=VALUE and --allow-change KEY; or start over with "
        "--overwrite"
    )


def _allowed(key: str, allow: list[str]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allow)


def differences(cfg: TrainConfig, stored: dict[str, Any] | None, *, allowed_too: bool = False) -> list[str]:
    """Keys (dotted) in which cfg differs from a stored config (without cfg.allow_change unless asked):
    the one stored-against-planned check, records.comparable.config_differences."""
    if stored is None:
        return ["config.yaml unreadable"]
    keys = config_differences(cfg.identity(), stored)
    return keys if allowed_too else [k for k in keys if not _allowed(k, list(cfg.allow_change))]


def has_progress(run_dir: Path) -> bool:
    """Whether a run directory holds anything worth keeping: a step checkpoint or a result."""
    return latest_checkpoint(run_dir / "checkpoints") is not None or (run_dir / RESULTS_FILE).is_file()


def free_dir(run_dir: Path) -> str:
    """The first of RUN_DIR-2, RUN_DIR-3, ... that does not exist: a folder a suggested --out can use."""
    n = 2
    while run_dir.with_name(f"{run_dir.name}-{n}").exists():
        n += 1
    return run_dir.with_name(f"{run_dir.name}-{n}").as_posix()


def plan_run(cfg: TrainConfig) -> RunPlan:
    """Inspect cfg's output directory; raise UserError when using it would mix two runs."""
    run_dir = cfg.run_dir()
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"output {str(run_dir)!r} exists and is not a directory")
    if not run_dir.exists() or not any(p.name != LOCK_NAME for p in run_dir.iterdir()):
        return RunPlan(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(
            f"output directory {str(run_dir)!r} is not empty and holds no run (no config.yaml); choose another --out"
        )
    if cfg.overwrite or not has_progress(run_dir):
        # A start that failed before its first checkpoint left nothing to resume or protect.
        return RunPlan(run_dir, clear=True)
    results = read_results(run_dir)
    finished = is_finished(results)
    stored, why = _read_stored(run_dir)
    if stored is None:  # its settings are unknown: neither resumed nor compared
        raise UserError(
            f"{str(run_dir / 'config.yaml')!r} cannot be read ({why}): the settings of the run in "
            f"{str(run_dir)!r} are unknown, so it can neither be resumed nor told apart from this one. Restore "
            "the file from a copy, or pass --overwrite to replace that run (or choose another --out)"
        )
    check_not_edited(run_dir, stored, results)
    diff = differences(cfg, stored)
    state = "finished" if finished else "unfinished"
    if not cfg.resume and diff:  # --resume would be refused too: it continues only the same settings
        raise UserError(
            f"output directory {str(run_dir)!r} already holds a different {state} run (differs in: "
            f"{', '.join(diff)}); choose another --out (e.g. --out {free_dir(run_dir)}, which is free), or pass "
            "--overwrite to replace that run"
        )
    if not cfg.resume:
        action = "reuse its results" if finished else "continue it"
        raise UserError(
            f"output directory {str(run_dir)!r} already holds a {state} run; pass --resume to {action} "
            "or --overwrite to replace it (or choose another --out)"
        )
    if diff:
        raise UserError(
            f"cannot resume: {str(run_dir)!r} holds a different run (differs in: {', '.join(diff)}); "
            "use the same settings, list the keys that may change with --allow-change "
            f"{','.join(diff)}, or use another --out / --overwrite"
        )
    changed = bool(differences(cfg, stored, allowed_too=True))  # only keys in --allow-change
    if finished and not changed:
        return RunPlan(run_dir, finished=results)
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    # A finished run continued with allowed changes (e.g. more steps) is reopened from its last checkpoint.
    return RunPlan(run_dir, resume_from=ckpt, clear=ckpt is None, reopen=finished)


def clear_run_dir(run_dir: Path) -> None:
    """Remove a previous run's files (only called on a directory holding a run's config.yaml)."""
    for child in run_dir.iterdir():
        if child.name == LOCK_NAME:  # held by this process
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def open_run_dir(run_dir: Path, plan: RunPlan, config_text: str, tokenizer: str | None) -> None:
    """Rank 0, under the directory lock, once every rank has read the plan: carry it out (clear,
    reopen), remove what a killed save left, write config.yaml and a local tokenizer's copy."""
    if plan.clear:
        clear_run_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # A writer killed mid-save (this run's earlier process, or its rank 0) left its temporary
    # folder; under the directory lock no writer runs, so none of it is anyone's work.
    if removed := remove_debris(run_dir / "checkpoints"):
        log.warning("removed what a killed checkpoint save left: %s", ", ".join(removed))
    if plan.reopen:
        (run_dir / RESULTS_FILE).unlink(missing_ok=True)
    atomic_write_text(run_dir / "config.yaml", config_text)
    if tokenizer:  # a tokenizer given by a local path travels with the run (sample, export)
        copy_local_tokenizer(tokenizer, run_dir / TOKENIZER_DIR)
