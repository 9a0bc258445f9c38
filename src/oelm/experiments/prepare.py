"""Build an LM data directory from a config's `prepare` recipe when it is not there yet."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from oelm.data.lm import prepare_lm, read_meta
from oelm.training.task import checked_model_config
from oelm.utils.env import env_seconds
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_json

_FILE_NAMES = {"train": "train.txt", "val": "valid.txt", "test": "test.txt"}
_KWARGS = {"config", "val_fraction", "test_fraction", "seed", "max_docs", "text_field"}
_RECIPE_KEYS = _KWARGS | {"source", "files", "tokenizer", "name"}
RECIPE_KEY = "prepare_recipe"  # meta.json: the recipe a sweep or study prepared the folder from
PASSES_KEY = "passes"  # a study config's (or scale's) stated passes over its train split
PASSES_TOLERANCE = 1.25  # a stated number of passes may be off by this factor either way, no more

log = logging.getLogger(__name__)


def _stage_files(files: dict[str, str], staging: Path) -> Path:
    """A folder of links named train/valid/test.txt, which `prepare_lm` reads as official splits."""
    unknown = set(files) - set(_FILE_NAMES)
    if unknown or "train" not in files:
        raise UserError(f"prepare.files needs a 'train' entry and only {sorted(_FILE_NAMES)}; got {sorted(files)}")
    staging.mkdir(parents=True, exist_ok=True)
    for split, src in files.items():
        target = Path(src)
        if not target.is_file():
            raise UserError(f"prepare.files.{split}: {src} does not exist (paths are relative to the repo root)")
        link = staging / _FILE_NAMES[split]
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(target.resolve(), link)
    return staging


def wait_for_file(path: Path, timeout_s: float, poll_s: float = 1.0) -> None:
    """Non-zero ranks wait for rank 0 to prepare the data, but not forever (rank 0 may have failed)."""

    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise UserError(
                f"waited {timeout_s:.0f} s for rank 0 to prepare {str(path)!r}; see rank 0's error; if the ranks "
                "do not share a file system, rank 0's data is not visible here: prepare the data on every node "
                "first with `oelm prepare lm` (OELM_DATA_WAIT_S sets the wait)"
            )
        time.sleep(poll_s)


def ensure_run_data(cfg: Any, meta: dict[str, Any], verbose: bool = True) -> float | None:
    """Build a study config's LM data directory from its `prepare` recipe when it is missing, and
    check the passes its budget plans over the train split against the ones it states; returns
    them (None for other tasks). `oelm train` prints them with its final line: before the run,
    a line on stderr would sit above a refusal that must stand alone.

    Under torchrun rank 0 prepares; the other ranks wait for its meta.json (with a time limit).
    """
    if cfg.task != "lm" or not cfg.data:
        return None
    if "prepare" in meta:
        if int(os.environ.get("RANK", "0")) == 0:
            ensure_lm_data(meta["prepare"], cfg.data, verbose=verbose)
        else:
            wait_for_file(Path(cfg.data) / "meta.json", env_seconds("OELM_DATA_WAIT_S", 3600))
    if PASSES_KEY not in meta and not verbose:
        return None
    world = os.environ.get("WORLD_SIZE", "1")  # init_distributed checks it; here 1 unless a number
    return check_passes(cfg, meta.get(PASSES_KEY), "the config", world=int(world) if world.isdigit() else 1)


def planned_passes(cfg: Any, world: int = 1) -> tuple[float, int, int] | None:
    """(passes, tokens read, train tokens): how many times a language-model run's budget reads its
    prepared train split (steps x batch x grad_accum x processes x seq_len over the split's tokens);
    None when the data is not there yet or is not prepared LM data."""
    if not (Path(cfg.data) / "meta.json").is_file():
        return None
    train = int(read_meta(cfg.data)["splits"].get("train") or 0)
    seq_len = cfg.seq_len or checked_model_config(cfg.model, cfg.model_overrides, cfg.method).block_size
    tokens = cfg.steps * cfg.batch_size * cfg.grad_accum * max(world, 1) * seq_len
    return (tokens / train if train else math.inf), tokens, train


def check_passes(cfg: Any, declared: Any, where: str, world: int = 1) -> float | None:
    """The passes a run plans over its train split; a config that states its passes (`passes:` at
    the top or in its scale, as its header says them) is refused, before any run, when the budget
    plans another number (more than PASSES_TOLERANCE off): a header promising one pass over a
    corpus the steps read 19 times describes another experiment."""
    if declared is not None and (
        isinstance(declared, bool) or not isinstance(declared, int | float) or not 0 < declared < math.inf
    ):
        raise UserError(
            f"{where}: passes must be a positive number (the passes over the train split), got {declared!r}"
        )
    planned = planned_passes(cfg, world)
    if planned is None:
        return None
    passes, tokens, train = planned
    if declared is not None and not declared / PASSES_TOLERANCE <= passes <= declared * PASSES_TOLERANCE:
        raise UserError(
            f"{where} states {declared:g} pass(es) over its train split, but its budget plans {passes:.1f} "
            f"({cfg.steps} steps read {tokens:,} tokens of the {train:,} in {cfg.data}'s train split); "
            "correct `passes` and the header, or the steps"
        )
    return passes


def ensure_lm_data(recipe: dict[str, Any], data_dir: str | Path, verbose: bool = False) -> Path:
    """Prepare `data_dir` from the recipe unless it already holds prepared data; return it."""
    out = Path(data_dir)
    if (out / "meta.json").is_file():
        _check_same_recipe(recipe, out)
        return out

    unknown = set(recipe) - _RECIPE_KEYS
    if unknown:
        raise UserError(f"unknown prepare key(s) {sorted(unknown)}; known: {sorted(_RECIPE_KEYS)}")
    if "tokenizer" not in recipe or not ("source" in recipe or "files" in recipe):
        raise UserError("prepare needs 'tokenizer' and either 'source' or 'files' (train/val/test paths)")
    source: Any = recipe.get("source")
    if "files" in recipe:
        source = _stage_files(recipe["files"], out.with_name(out.name + ".sources"))
    kwargs = {k: v for k, v in recipe.items() if k in _KWARGS}
    prepare_lm(source, recipe["tokenizer"], out, verbose=verbose, **kwargs)
    _record_recipe(out, recipe)
    return out


def _record_recipe(data_dir: Path, recipe: dict[str, Any]) -> None:
    """Record the recipe in meta.json (the next call compares its own with it) and, when it names
    one, a readable dataset name (reports group and title tables by it)."""

    meta = read_meta(data_dir)
    if recipe.get("name"):
        meta["source_files"], meta["source"] = meta["source"], str(recipe["name"])
    meta[RECIPE_KEY] = json.loads(json.dumps(recipe, default=str))
    atomic_write_json(data_dir / "meta.json", meta)


def _same_value(key: str, a: Any, b: Any) -> bool:
    """Equal as written, or (a source, files or tokenizer path) naming the same existing path."""
    if a == b:
        return True
    if key == "files" and isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value("source", a[k], b[k]) for k in a)
    if key in ("source", "tokenizer") and isinstance(a, str) and isinstance(b, str):
        pa, pb = a.partition(":")[2] or a, b.partition(":")[2] or b
        same_prefix = a.partition(":")[0] == b.partition(":")[0] if ":" in a and ":" in b else ":" not in a + b
        return same_prefix and Path(pa).exists() and Path(pb).exists() and Path(pa).resolve() == Path(pb).resolve()
    return False


def _check_same_recipe(recipe: dict[str, Any], out: Path) -> None:
    """Prepared data is reused only for the recipe it was prepared from: another source, tokenizer
    or hold-out would otherwise be trained on and reported as this recipe's data, with exit 0."""

    meta = read_meta(out)
    stored = meta.get(RECIPE_KEY)
    if isinstance(stored, dict):
        differ = sorted(k for k in set(stored) | set(recipe) if not _same_value(k, stored.get(k), recipe.get(k)))
    elif "source" in recipe and not recipe.get("name"):  # prepared before recipes were recorded
        differ = [] if _same_value("source", meta.get("source"), recipe["source"]) else ["source"]
    else:
        return
    if not differ:
        return
    was = stored if isinstance(stored, dict) else {"source": meta.get("source")}
    said = ", ".join(f"{k} {was.get(k)!r} -> {recipe.get(k)!r}" for k in differ[:4])
    raise UserError(
        f"{str(out)!r} holds data prepared from {meta.get('source')!r} (fingerprint {meta.get('fingerprint')}), "
        f"not from this recipe (differs in: {said}); the runs beside it trained on that data: use another "
        f"--out, or delete {str(out)!r} to prepare it again"
    )


def data_summary(data_dir: str | Path) -> str:
    """One line describing a prepared LM directory (source, tokenizer, split sizes)."""

    meta = read_meta(data_dir)
    splits = ", ".join(f"{k} {v:,}" for k, v in meta["splits"].items())
    return f"{meta.get('source')} / {meta.get('tokenizer')} tokenizer: {splits} tokens"
