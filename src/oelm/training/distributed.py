"""Process-group setup for DDP under torchrun (gloo on CPU, NCCL on CUDA) and small collectives."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from oelm.utils.errors import UserError


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the job; world == 1 means no process group."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """True on the process that writes metrics and checkpoints."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """True when a process group is in use."""
        return self.world > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """Turn 'auto' / 'cuda' / 'cuda:N' / 'cpu' into a device (one GPU per local rank)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"

    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("device cuda requested but CUDA is not available; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"device {name} does not exist ({torch.cuda.device_count()} GPUs); use cuda:0..")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError("device mps requested but MPS is not available; use --device cpu")
    return device


LAUNCH_FIX = "launch with torchrun (it sets them), or unset WORLD_SIZE, RANK and LOCAL_RANK for one process"


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw!r} is not an integer; {LAUNCH_FIX}") from None


def init_distributed(device_name: str) -> tuple[DistInfo, torch.device]:
    """Join the torchrun process group when WORLD_SIZE > 1; return (info, device).

    The launch variables are checked first (a stale WORLD_SIZE from another shell must not hang
    the run), and joining waits at most OELM_DIST_TIMEOUT_S seconds (default 600) for the others.
    """
    world, rank, local_rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if world < 1 or not 0 <= rank < world or local_rank < 0:
        raise UserError(f"WORLD_SIZE={world}, RANK={rank}, LOCAL_RANK={local_rank} do not describe a job; {LAUNCH_FIX}")
    device = resolve_device(device_name, local_rank)
    if world > 1 and not dist.is_initialized():
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing:
            raise UserError(
                f"WORLD_SIZE={world} is set but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                f"(a variable left from another launch?); {LAUNCH_FIX}"
            )
        timeout = _env_int("OELM_DIST_TIMEOUT_S", 600)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        try:
            dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        except (RuntimeError, ValueError, OSError) as err:  # DistNetworkError / DistStoreError are RuntimeErrors
            raise UserError(
                f"could not join the process group of {world} processes as rank {rank} within {timeout} s "
                f"({type(err).__name__}: {str(err).splitlines()[0][:120]}); start every rank, or {LAUNCH_FIX}"
            ) from None
    return DistInfo(rank=rank, world=world, local_rank=local_rank), device


def shutdown_distributed(info: DistInfo, clean: bool = True) -> None:
    """Leave the process group if this module created one.

    clean=False (this rank failed): no barrier, which the other ranks, busy elsewhere, would
    never reach; the failing rank exits at once and torchrun ends the job with its error.
    """
    if info.enabled and dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum a few floats over ranks (identity without a process group)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_tensor(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum a tensor over ranks in place (identity without a process group)."""
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op without a process group)."""
    if info.enabled:
        dist.barrier()
