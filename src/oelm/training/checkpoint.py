"""Checkpoints: safetensors weights + a state file, written atomically, with retention."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model

from oelm.core.state import method_state
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_text, follow_umask

WEIGHTS = "model.safetensors"
STATE = "state.pt"
BEST_COPY = "best.safetensors"  # best/ weights as of this checkpoint (a kill may leave best/ newer)
_STEP_DIR = re.compile(r"^step_(\d{7,})$")


def step_dir_name(step: int) -> str:
    """Directory name of the checkpoint after `step` optimizer steps."""
    return f"step_{step:07d}"


def _save_weights(model: torch.nn.Module, path: Path, metadata: dict[str, Any]) -> None:
    # save_model de-duplicates tied tensors (lm_head / wte), which save_file refuses.
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    save_model(model, str(path), metadata=meta)
    follow_umask(path)


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
    with _written_or_removed(tmp, ckpt_root, _nbytes(model.state_dict()) + _nbytes(state)):
        tmp.mkdir()
        _save_weights(model, tmp / WEIGHTS, {**metadata, "step": str(step)})
        torch.save(state, tmp / STATE)
        best = ckpt_root / "best" / WEIGHTS
        if best.is_file():  # a hard link costs nothing; best/ is replaced by rename, never edited in place
            _link_or_copy(best, tmp / BEST_COPY)
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
    with _written_or_removed(tmp, ckpt_root, _nbytes(model.state_dict())):
        _save_weights(model, tmp, metadata)
    os.replace(tmp, best / WEIGHTS)
    return best / WEIGHTS


def _nbytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) state: what a checkpoint of it needs on disk, roughly."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


@contextlib.contextmanager
def _written_or_removed(tmp: Path, ckpt_root: Path, needed: int) -> Iterator[None]:
    """Remove the partial `tmp` (file or folder) when writing fails, and say why in one UserError.

    A full disk surfaces as OSError (ENOSPC) or as torch's RuntimeError ("unexpected pos ...");
    either way the previous checkpoint is untouched, because `tmp` is only renamed once complete.
    """
    try:
        yield
    except (OSError, RuntimeError) as err:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        latest = latest_checkpoint(ckpt_root)
        kept = f"the last complete checkpoint {latest.name} is intact" if latest else "no checkpoint was complete yet"
        what = f"{type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else ''}"
        full = getattr(err, "errno", None) == errno.ENOSPC or "unexpected pos" in str(err)
        if not full:  # not a full disk: say what failed, not how much space is free
            raise UserError(
                f"could not write a checkpoint in {str(ckpt_root)!r} ({what}); {kept}: fix the cause and rerun "
                "with --resume"
            ) from err
        free = shutil.disk_usage(ckpt_root).free if ckpt_root.exists() else 0
        raise UserError(
            f"could not write a checkpoint in {str(ckpt_root)!r} ({what}): the disk is full; "
            f"it needs about {needed / 2**20:,.1f} MiB and {free / 2**20:,.1f} MiB are free; {kept}: "
            "free some space (or lower keep_last) and rerun with --resume"
        ) from None


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # file systems without hard links
        shutil.copyfile(src, dst)


def weights_step(path: Path) -> int | None:
    """The optimizer step recorded in a weights file's metadata (None when absent)."""
    step = read_metadata(path).get("step")
    return int(step) if step is not None and str(step).isdigit() else None


def restore_best(ckpt_root: Path, step_dir: Path, best_step: int | None) -> None:
    """Make best/ hold the best weights as of the checkpoint being resumed.

    A killed process may have written best/ after its last checkpoint; the resumed run replays
    those steps and must not start from (or end with) weights it has not produced itself.
    """
    best = ckpt_root / "best" / WEIGHTS
    if best.is_file() and best_step is not None and weights_step(best) == best_step:
        return
    if best.is_file():
        best.unlink()
    copy = step_dir / BEST_COPY
    if best_step is not None and copy.is_file() and weights_step(copy) == best_step:
        best.parent.mkdir(parents=True, exist_ok=True)
        tmp = best.parent / f".{WEIGHTS}.tmp{os.getpid()}"
        shutil.copyfile(copy, tmp)
        os.replace(tmp, best)


def method_record(model: torch.nn.Module) -> dict[str, Any]:
    """The applied method, its validated options and seed, for weight-file metadata ({} if none)."""

    state = method_state(model)
    return state.record() if state is not None else {}


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
    meta = read_metadata(path)  # a damaged file is a UserError before load_model touches it
    missing, unexpected = load_model(model, str(path), strict=True, device="cpu")
    del missing, unexpected  # strict=True already raised on a mismatch
    return meta


def read_metadata(path: Path) -> dict[str, str]:
    """The string metadata stored in a safetensors file."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            return dict(fh.metadata() or {})
    except Exception as err:  # noqa: BLE001 (SafetensorError and I/O errors: a damaged file)
        raise UserError(
            f"weights file {str(path)!r} is unreadable ({type(err).__name__}: {str(err)[:80]}); use another "
            "checkpoint (--checkpoint last or a step) or retrain"
        ) from None


def load_state(ckpt: Path) -> dict[str, Any]:
    """Load a step checkpoint's state file as plain tensors and containers (never runs code)."""
    try:
        return torch.load(ckpt / STATE, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 (an unpicklable or foreign file: refuse, clearly)
        raise UserError(
            f"checkpoint state {str(ckpt / STATE)!r} cannot be loaded safely ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:120] if str(err) else ''}); delete {str(ckpt)!r} to resume from "
            "an earlier checkpoint, or pass --overwrite to start over"
        ) from None


def resolve_checkpoint(run_dir: Path, which: str) -> Path:
    """Weights file for 'best', 'last' or an explicit step number in a run directory (no fallback)."""
    root = Path(run_dir) / "checkpoints"
    if which == "best":
        if (root / "best" / WEIGHTS).is_file():
            return root / "best" / WEIGHTS
        raise UserError(
            f"no 'best' checkpoint in {str(root)!r} (no validation ran or improved); pass "
            "--checkpoint last or a step number"
        )
    if which == "last":
        last = latest_checkpoint(root)
        if last is not None:
            return last / WEIGHTS
    elif which.isdigit():
        if (root / step_dir_name(int(which)) / WEIGHTS).is_file():
            return root / step_dir_name(int(which)) / WEIGHTS
    else:
        raise UserError(f"checkpoint {which!r} is not 'best', 'last' or a step number; pass one of those")
    steps = ", ".join(str(s) for s, _ in list_steps(root)) or "none"
    raise UserError(f"no {which!r} checkpoint in {str(root)!r} (steps saved: {steps}); train with checkpoints first")


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch and CUDA RNG states as plain containers and tensors (safe to load)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
