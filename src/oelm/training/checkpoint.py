"""Checkpoints: safetensors weights + a state file, written atomically, with retention."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model

from oelm.training.runlog import atomic_write_text

WEIGHTS = "model.safetensors"
STATE = "state.pt"
_STEP_DIR = re.compile(r"^step_(\d{7,})$")


def step_dir_name(step: int) -> str:
    """Directory name of the checkpoint after `step` optimizer steps."""
    return f"step_{step:07d}"


def _save_weights(model: torch.nn.Module, path: Path, metadata: dict[str, Any]) -> None:
    # save_model de-duplicates tied tensors (lm_head / wte), which save_file refuses.
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    save_model(model, str(path), metadata=meta)


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    model: torch.nn.Module,
    state: dict[str, Any],
    metadata: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write checkpoints/step_N/{model.safetensors,state.pt} atomically, update latest, prune."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp_{step_dir_name(step)}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _save_weights(model, tmp / WEIGHTS, {**metadata, "step": str(step)})
    torch.save(state, tmp / STATE)
    if final.exists():  # a complete checkpoint of this step from before a kill; same content
        shutil.rmtree(final)
    # A directory rename is atomic: a kill leaves either the old set or the complete new one.
    os.replace(tmp, final)
    atomic_write_text(ckpt_root / "latest", final.name + "\n")
    prune(ckpt_root, keep_last)
    return final


def save_best(ckpt_root: Path, model: torch.nn.Module, metadata: dict[str, Any]) -> Path:
    """Write checkpoints/best/model.safetensors atomically (metadata carries step and loss)."""
    best = ckpt_root / "best"
    best.mkdir(parents=True, exist_ok=True)
    tmp = best / f".{WEIGHTS}.tmp{os.getpid()}"
    _save_weights(model, tmp, metadata)
    os.replace(tmp, best / WEIGHTS)
    return best / WEIGHTS


def method_record(model: torch.nn.Module) -> dict[str, Any]:
    """The applied method, its validated options and seed, for weight-file metadata ({} if none)."""
    from oelm.freezing import method_state

    state = method_state(model)
    return state.record() if state is not None else {}


def apply_recorded_method(model: torch.nn.Module, metadata: dict[str, str]) -> None:
    """Re-apply the method recorded in a weight file's metadata, so its added tensors exist to load."""
    from oelm.freezing import apply_method

    method = metadata.get("method")
    if not method:
        return
    options = json.loads(metadata.get("method_options", "{}"))
    seed = int(metadata.get("method_seed", metadata.get("seed", "0")))
    apply_method(model, method, seed=seed, **options)


def list_steps(ckpt_root: Path) -> list[tuple[int, Path]]:
    """Complete step checkpoints, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = []
    for p in ckpt_root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / WEIGHTS).is_file() and (p / STATE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The newest complete step checkpoint, or None."""
    steps = list_steps(ckpt_root)
    return steps[-1][1] if steps else None


def prune(ckpt_root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step checkpoints (best/ is separate and kept)."""
    for _, path in list_steps(ckpt_root)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)


def load_weights(model: torch.nn.Module, path: Path) -> dict[str, str]:
    """Load safetensors weights into model (strict); return the file's metadata."""
    missing, unexpected = load_model(model, str(path), strict=True, device="cpu")
    del missing, unexpected  # strict=True already raised on a mismatch
    return read_metadata(path)


def read_metadata(path: Path) -> dict[str, str]:
    """The string metadata stored in a safetensors file."""
    with safe_open(str(path), framework="pt") as fh:
        return dict(fh.metadata() or {})


def load_state(ckpt: Path) -> dict[str, Any]:
    """Load the state file of a step checkpoint (our own file, so full unpickling is fine)."""
    return torch.load(ckpt / STATE, map_location="cpu", weights_only=False)


def resolve_checkpoint(run_dir: Path, which: str) -> Path:
    """Weights file for 'best', 'last' or an explicit step number in a run directory."""
    from oelm.errors import UserError

    root = Path(run_dir) / "checkpoints"
    if which == "best" and (root / "best" / WEIGHTS).is_file():
        return root / "best" / WEIGHTS
    if which in {"best", "last"}:
        last = latest_checkpoint(root)
        if last is not None:
            return last / WEIGHTS
    elif which.isdigit() and (root / step_dir_name(int(which)) / WEIGHTS).is_file():
        return root / step_dir_name(int(which)) / WEIGHTS
    raise UserError(f"no {which!r} checkpoint in {str(root)!r}; train with checkpoints first")


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch and CUDA RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
