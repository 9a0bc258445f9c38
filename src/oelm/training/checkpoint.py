"""Checkpoints: safetensors weights + a state file, written atomically, with retention."""

from __future__ import annotations

import contextlib
import errno
import hashlib
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
import torch.distributed as tdist
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from oelm.core.state import method_state
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_json, atomic_write_text, follow_umask, read_json_object

try:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )
except ImportError:  # a torch without torch.distributed: --strategy fsdp is refused by the config
    dcp = None

    class CheckpointException(BaseException):  # type: ignore[no-redef]  # never raised without DCP
        """Stands in for DCP's exception where torch has no torch.distributed."""


WEIGHTS = "model.safetensors"
STATE = "state.pt"
SHARD_DIGESTS = "shards.json"  # in step_N/dcp/: {"step", "files": {shard file: sha256}}
SHARDED = "dcp"  # --strategy fsdp: the sharded model + optimizer (torch.distributed.checkpoint)
SHARDED_META = "meta.json"  # --strategy fsdp: the weights' metadata, as model.safetensors holds it
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


def plain_scalars(value: Any) -> Any:
    """`value` with every numpy scalar (np.float64 from a metric, np.int64 from a count) made the
    Python number it holds: state.pt is read back with torch.load(weights_only=True), which refuses
    numpy objects, so a task that slipped one into its state could not resume."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain_scalars(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_scalars(v) for v in value]
    if type(value) is tuple:
        return tuple(plain_scalars(v) for v in value)
    return value


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    model: torch.nn.Module,
    state: dict[str, Any],
    metadata: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write checkpoints/step_N/{model.safetensors,state.pt} atomically, update latest, prune."""
    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp_{step_dir_name(step)}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with _written_or_removed(tmp, ckpt_root, _nbytes(model.state_dict()) + _nbytes(state)):
        ckpt_root.mkdir(parents=True, exist_ok=True)  # a full disk may refuse even a folder
        tmp.mkdir()
        _save_weights(model, tmp / WEIGHTS, {**metadata, "step": str(step)})
        torch.save(plain_scalars(state), tmp / STATE)
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


# What a writer killed mid-save leaves: a step folder being written (`.tmp_step_N_<pid>`, or
# `.tmp_step_N_sharded` under FSDP) or best/'s weights being replaced (`.model.safetensors.tmp<pid>`).
_DEBRIS = re.compile(r"^\.tmp_step_\d{7,}_(?P<owner>\d+|sharded)$|^\." + re.escape(WEIGHTS) + r"\.tmp(?P<pid>\d+)$")


def remove_debris(ckpt_root: Path, pid: int | None = None) -> list[str]:
    """Remove what a checkpoint writer killed mid-save left in `ckpt_root` and its best/ (never a
    complete checkpoint, which only exists once renamed into place); return the names removed.

    `pid=None` removes every such entry: for the run's owner at start-up, under the directory lock,
    when no writer can be running. With `pid`, only what that process (a dead rank 0) was writing,
    and the sharded folder that every rank of its job writes into and it alone renames.
    """
    removed = []
    for folder in (ckpt_root, ckpt_root / "best"):
        try:
            entries = list(folder.iterdir())
        except OSError:  # no checkpoints yet
            continue
        for entry in entries:
            m = _DEBRIS.match(entry.name)
            if m is None:
                continue
            owner = m["owner"] or m["pid"]
            if pid is not None and owner not in (str(pid), "sharded"):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(str(entry.relative_to(ckpt_root)))
    return removed


def save_best(ckpt_root: Path, model: torch.nn.Module, metadata: dict[str, Any]) -> Path:
    """Write checkpoints/best/model.safetensors atomically (metadata carries step and loss)."""
    best = ckpt_root / "best"
    tmp = best / f".{WEIGHTS}.tmp{os.getpid()}"
    with _written_or_removed(tmp, ckpt_root, _nbytes(model.state_dict())):
        best.mkdir(parents=True, exist_ok=True)
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
    """Remove the partial `tmp` (file or folder) when writing fails, and say why in one UserError
    (`write_failure`); the previous checkpoint is untouched, because `tmp` is only renamed once
    complete."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError, UserError) as err:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise write_failure(err, ckpt_root, needed) from None


# How a full disk reads once a library has wrapped it: torch.save's zip writer ("unexpected pos"),
# safetensors ("os error 28"), or the system's own text.
_FULL_DISK_SIGNS = ("unexpected pos", "os error 28", "No space left", "Disk quota exceeded", "os error 122")


def write_failure(err: BaseException, ckpt_root: Path, needed: int, what: str = "a checkpoint") -> UserError:
    """One UserError for a checkpoint write that failed: what failed, and for a full disk how much
    space it needs and how much is free; the last complete checkpoint named as intact.

    A full disk surfaces as OSError (ENOSPC, EDQUOT), as torch's RuntimeError ("unexpected pos ...")
    or as safetensors' SafetensorError ("... (os error 28)"); under FSDP as DCP's CheckpointException,
    which carries each failing rank's own exception (the first is named).
    """
    cause, rank = err, None
    if isinstance(err, CheckpointException) and getattr(err, "failures", None):
        rank, (cause, _) = min(err.failures.items())
    text = str(cause)
    reason = f"{type(cause).__name__}: {text.splitlines()[0][:100] if text else ''}"
    if rank is not None:
        reason = f"rank {rank}: {reason}"
    latest = latest_checkpoint(ckpt_root)
    kept = f"the last complete checkpoint {latest.name} is intact" if latest else "no checkpoint was complete yet"
    full = getattr(cause, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(s in text for s in _FULL_DISK_SIGNS)
    if not full:  # not a full disk: say what failed, not how much space is free
        return UserError(
            f"could not write {what} in {str(ckpt_root)!r} ({reason}); {kept}: fix the cause and rerun with --resume"
        )
    try:
        free = shutil.disk_usage(ckpt_root).free
    except OSError:
        free = 0
    return UserError(
        f"could not write {what} in {str(ckpt_root)!r} ({reason}): the disk is full; "
        f"it needs about {needed / 2**20:,.1f} MiB and {free / 2**20:,.1f} MiB are free; {kept}: "
        "free some space (or lower keep_last) and rerun with --resume"
    )


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
    """Complete step checkpoints (whole weights, or sharded with their metadata), oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = []
    for p in ckpt_root.iterdir():
        m = _STEP_DIR.match(p.name)
        weights = (p / WEIGHTS).is_file() or (p / SHARDED / ".metadata").is_file()
        if m and weights and (p / STATE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def checkpoint_metadata(step_dir: Path) -> dict[str, str]:
    """A step checkpoint's weight metadata: from model.safetensors, or a sharded one's meta.json."""
    if (step_dir / WEIGHTS).is_file():
        return read_metadata(step_dir / WEIGHTS)
    fix = f"delete {str(step_dir)!r} to resume from an earlier checkpoint, or pass --overwrite"
    return {k: str(v) for k, v in read_json_object(step_dir / SHARDED_META, fix).items()}


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """The newest complete step checkpoint, or None."""
    steps = list_steps(ckpt_root)
    return steps[-1][1] if steps else None


def prune(ckpt_root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step checkpoints (best/ is separate and kept)."""
    for _, path in list_steps(ckpt_root)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)


def load_weights(model: torch.nn.Module, path: Path, meta: dict[str, str] | None = None) -> dict[str, str]:
    """Load safetensors weights into model (strict); return the file's metadata. meta: that
    metadata when the caller has read it already (read_metadata, so the file's header is known
    readable): it is not read a second time."""
    if meta is None:
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
            return _whole_weights(last)
    elif which.isdigit():
        if (root / step_dir_name(int(which)) / WEIGHTS).is_file():
            return root / step_dir_name(int(which)) / WEIGHTS
        if (root / step_dir_name(int(which)) / SHARDED).is_dir():
            return _whole_weights(root / step_dir_name(int(which)))
    else:
        raise UserError(f"checkpoint {which!r} is not 'best', 'last' or a step number; pass one of those")
    steps = ", ".join(str(s) for s, _ in list_steps(root)) or "none"
    raise UserError(f"no {which!r} checkpoint in {str(root)!r} (steps saved: {steps}); train with checkpoints first")


def _whole_weights(step_dir: Path) -> Path:
    if (step_dir / WEIGHTS).is_file():
        return step_dir / WEIGHTS
    raise UserError(
        f"checkpoint {str(step_dir)!r} is sharded (--strategy fsdp: torch.distributed.checkpoint files in "
        f"{SHARDED}/); only best/ and the run's last step hold whole weights: pass --checkpoint best, finish "
        "the run with --resume, or convert it with torch.distributed.checkpoint.format_utils.dcp_to_torch_save"
    )


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


# ---- --strategy fsdp: sharded step checkpoints (torch.distributed.checkpoint) and whole weights ----
def tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Groups of parameter names that share one tensor (our GPT: lm_head.weight and transformer.wte.weight)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [sorted(names) for names in by_id.values() if len(names) > 1]


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on CPU on rank 0 ({} elsewhere); a collective: every rank calls it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def _save_full(model: torch.nn.Module, sd: dict[str, torch.Tensor], path: Path, metadata: dict[str, Any]) -> None:
    """Write a gathered state dict as save_model writes a whole model: tied tensors once, under the
    first name in sorted order, the others named in the metadata (what load_model expects)."""
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    sd = dict(sd)
    for names in tied_names(model):
        for other in names[1:]:
            sd.pop(other, None)
            meta.setdefault(other, names[0])
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata=meta)
    follow_umask(path)


def save_best_sharded(ckpt_root: Path, model: torch.nn.Module, metadata: dict[str, Any], is_main: bool) -> None:
    """best/model.safetensors from a sharded model: gathered on every rank's call, written by rank 0."""
    sd = full_state_dict(model)
    if not is_main:
        return
    best = ckpt_root / "best"
    tmp = best / f".{WEIGHTS}.tmp{os.getpid()}"
    with _written_or_removed(tmp, ckpt_root, _nbytes(sd)):
        best.mkdir(parents=True, exist_ok=True)
        _save_full(model, sd, tmp, metadata)
    os.replace(tmp, best / WEIGHTS)


def save_sharded_checkpoint(
    ckpt_root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any] | None,
    metadata: dict[str, Any],
    keep_last: int,
    is_main: bool,
    whole_weights: bool,
) -> Path:
    """checkpoints/step_N/ for --strategy fsdp, written by every rank, renamed into place by rank 0.

    step_N/dcp/ holds the model and optimizer as torch.distributed.checkpoint writes them (one file
    per rank + .metadata; loadable at any world size), step_N/state.pt the rest (rank 0's `state`),
    step_N/meta.json the weights' metadata; `whole_weights` (the run's last step) adds
    model.safetensors, gathered, for the tools that read whole weights. Every rank writes into the
    same temporary directory, which rank 0 renames once all have finished.
    """
    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp_{step_dir_name(step)}_sharded"
    try:  # a rank that leaves mid-save (killed, crashed) fails the collectives here: no debris stays
        refusal = None
        if is_main:  # a full disk here is the same one line on every rank (shared below)
            try:
                ckpt_root.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
            except OSError as err:
                refusal = str(write_failure(err, ckpt_root, 0, f"the sharded checkpoint {step_dir_name(step)}"))
        _agree_on_rank0(refusal)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        needed = _nbytes(model_sd) + _nbytes(optim_sd)  # the shards of every rank, on the shared disk
        try:
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / SHARDED))
        except (Exception, CheckpointException) as err:  # noqa: BLE001 (DCP raises every rank's failure,
            # gathered, on every rank, as a CheckpointException: a BaseException, not an Exception)
            # every rank meets it: rank 0 removes the partial folder, then its line is every rank's
            if is_main:
                shutil.rmtree(tmp, ignore_errors=True)
                refusal = str(write_failure(err, ckpt_root, needed, f"the sharded checkpoint {step_dir_name(step)}"))
            _agree_on_rank0(refusal)  # rank 0 always has a line here: every rank raises it
        # Every rank's shard digests, so a resume can tell a shard of this save from another one's.
        digests: list[Any] = [None] * tdist.get_world_size()
        tdist.all_gather_object(digests, _shard_digests(tmp / SHARDED, tdist.get_rank()))
        whole = full_state_dict(model) if whole_weights else {}
        if is_main:  # rank 0's part, in the folder before it is renamed; a failure is every rank's line
            try:
                with _written_or_removed(tmp, ckpt_root, needed + _nbytes(whole) + _nbytes(state)):
                    meta = {**metadata, "step": str(step)}
                    files = {name: digest for rank in digests for name, digest in rank.items()}
                    atomic_write_json(tmp / SHARDED / SHARD_DIGESTS, {"step": step, "files": files})
                    meta_text = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
                    atomic_write_json(tmp / SHARDED_META, meta_text)
                    if whole_weights:
                        _save_full(model, whole, tmp / WEIGHTS, meta)
                    torch.save(plain_scalars(state), tmp / STATE)
                    best = ckpt_root / "best" / WEIGHTS
                    if best.is_file():
                        _link_or_copy(best, tmp / BEST_COPY)
            except UserError as err:
                refusal = str(err)
        _agree_on_rank0(refusal)  # also: every rank's shard is on disk before rank 0 renames the folder
    except BaseException:
        if is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not is_main:
        return final
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(ckpt_root / "latest", final.name + "\n")
    prune(ckpt_root, keep_last)
    return final


def _agree_on_rank0(refusal: str | None) -> None:
    """Every rank takes rank 0's refusal (None: go on) and raises it as its own one line: a full disk
    met by rank 0 alone would otherwise end the others later as a lost peer (a collective only)."""
    box = [refusal]
    tdist.broadcast_object_list(box, src=0)
    if box[0]:
        raise UserError(box[0])


def _shard_digests(folder: Path, rank: int) -> dict[str, str]:
    """sha256 of the shard files one rank wrote (DCP names them __<rank>_<n>.distcp)."""
    out = {}
    for path in sorted(folder.glob(f"__{rank}_*.distcp")):
        with path.open("rb") as f:
            out[path.name] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def shard_problem(step_dir: Path) -> str | None:
    """Why step_N/dcp/ is not the checkpoint its shards.json describes (None: it is, or it predates
    shards.json): a shard missing, or one whose bytes are another save's (e.g. from another step)."""
    folder = step_dir / SHARDED
    record = folder / SHARD_DIGESTS
    if not record.is_file():
        return None
    try:
        stored = json.loads(record.read_text(encoding="utf-8"))
        files = dict(stored["files"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{record} is unreadable ({type(err).__name__}); resume from an earlier checkpoint or pass --overwrite"
    for name, digest in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            return (
                f"sharded checkpoint {str(folder)!r} lacks the shard {name} written at step {stored.get('step')}; "
                "restore the file, resume from an earlier checkpoint, or pass --overwrite"
            )
        with path.open("rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != digest:
                return (
                    f"shard {name} in {str(folder)!r} is not the one written at step {stored.get('step')} (its "
                    "bytes differ: a shard from another save?); resume from an earlier checkpoint or pass --overwrite"
                )
    return None


def _why(err: BaseException, width: int) -> str:
    """A DCP failure in one line: its type and the first `width` characters of its first line (of
    the first failing rank's own exception, where DCP wrapped it)."""
    if isinstance(err, CheckpointException) and getattr(err, "failures", None):
        rank, (cause, _) = min(err.failures.items())
        return f"rank {rank}: {_why(cause, width)}"
    text = str(err)
    return f"{type(err).__name__}: {text.splitlines()[0][:width] if text else ''}"


def load_sharded_checkpoint(step_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load step_N/dcp/ into a sharded model and its optimizer, resharded to this job's world size,
    after rank 0 checked every shard against the digests written with it (shards.json)."""
    box = [shard_problem(step_dir) if tdist.get_rank() == 0 else None]
    tdist.broadcast_object_list(box, src=0)
    if box[0]:
        raise UserError(box[0])
    model_sd, optim_sd = get_state_dict(model, optimizer)
    loaded = {"model": model_sd, "optim": optim_sd}
    try:
        dcp.load(loaded, checkpoint_id=str(step_dir / SHARDED))
    except (Exception, CheckpointException) as err:  # noqa: BLE001 (DCP wraps every rank's failure in one
        # CheckpointException, a BaseException)
        raise UserError(
            f"sharded checkpoint {str(step_dir / SHARDED)!r} does not fit this run ({_why(err, 160)}); "
            "resume with the run's own model settings "
            "or pass --overwrite"
        ) from None
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])


def load_whole_weights(model: torch.nn.Module, path: Path) -> dict[str, str]:
    """Load a whole-model safetensors file into a sharded model (every rank reads it and keeps its shard)."""
    meta = read_metadata(path)
    sd = load_file(str(path))
    for names in tied_names(model):
        present = next((n for n in names if n in sd), None)
        for n in names:
            if present is not None and n not in sd:
                sd[n] = sd[present]
    set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True, strict=True))
    return meta
