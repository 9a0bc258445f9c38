"""Process-group setup for DDP / FSDP2 under torchrun (gloo on CPU, NCCL on CUDA), sharding, collectives."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from oelm.core.freezing import rebind_targets
from oelm.core.targets import find_targets
from oelm.utils.env import env_seconds
from oelm.utils.errors import AgreedRefusal, UserError

try:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
except ImportError:  # a torch without FSDP2: --strategy fsdp is refused by the config
    FSDPModule = fully_shard = init_device_mesh = None
# What FSDP2's default comms call: the *_single names from torch 2.13, the older ones before.
ALL_GATHER = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)


def fsdp_available() -> bool:
    """Whether this torch has FSDP2 (`torch.distributed.fsdp.fully_shard`)."""
    return fully_shard is not None and dist.is_available()


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


# How long a rank that refuses before joining (a bad OELM_DIST_TIMEOUT_S) waits for the others under
# torchrun, to end with them; after that it refuses alone.
REFUSAL_JOIN_S = 30.0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw!r} is not an integer; {LAUNCH_FIX}") from None


def init_distributed(device_name: str, group_of_one: bool = False) -> tuple[DistInfo, torch.device]:
    """Join the torchrun process group when WORLD_SIZE > 1; return (info, device).

    The launch variables are checked first (a stale WORLD_SIZE from another shell must not hang
    the run), and joining waits at most OELM_DIST_TIMEOUT_S seconds (default 600) for the others.
    group_of_one: a single process still gets a process group of its own (FSDP2 shards over a
    device mesh, which needs one), in memory, with no rendezvous.
    """
    world, rank, local_rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if world < 1 or not 0 <= rank < world or local_rank < 0:
        raise UserError(f"WORLD_SIZE={world}, RANK={rank}, LOCAL_RANK={local_rank} do not describe a job; {LAUNCH_FIX}")
    # Checked in every process before any work. Under torchrun (which started every rank) a bad
    # value is refused once the ranks have joined, waiting at most REFUSAL_JOIN_S for them: every
    # rank then ends at the same point with the same line and exit code, where refusing before
    # joining races torchrun, which SIGTERMs the others as soon as the first rank has exited.
    refusal: UserError | None = None
    try:
        timeout = env_seconds("OELM_DIST_TIMEOUT_S", 600, positive=True)
    except UserError as err:
        if world == 1 or dist.is_initialized() or not os.environ.get("TORCHELASTIC_RUN_ID"):
            raise
        timeout, refusal = REFUSAL_JOIN_S, err
    device = resolve_device(device_name, local_rank)
    info = DistInfo(rank=rank, world=world, local_rank=local_rank)
    if world > 1 and not dist.is_initialized():
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing:
            raise UserError(
                f"WORLD_SIZE={world} is set but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                f"(a variable left from another launch?); {LAUNCH_FIX}"
            )
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        try:
            dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        except (RuntimeError, ValueError, OSError) as err:  # DistNetworkError / DistStoreError are RuntimeErrors
            if refusal is not None:  # the others did not come in time: this rank's own refusal
                raise refusal from None
            raise UserError(
                f"could not join the process group of {world} processes as rank {rank} within {timeout:g} s "
                f"({type(err).__name__}: {str(err).splitlines()[0][:120]}); start every rank, or {LAUNCH_FIX}"
            ) from None
        try:  # a refusal of the start above, on any rank, ends every rank alike
            share_refusal(refusal, info)
        except AgreedRefusal:
            shutdown_distributed(info, clean=True)
            raise
    if world == 1 and group_of_one and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return info, device


def shutdown_distributed(info: DistInfo, clean: bool = True) -> None:
    """Leave the process group if this module created one.

    clean=False (this rank failed): no barrier, which the other ranks, busy elsewhere, would
    never reach; the failing rank exits at once and torchrun ends the job with its error.
    """
    if dist.is_initialized():  # also a group of one (FSDP2 in one process)
        if clean and info.enabled:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum a few floats over ranks (identity without a process group)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def agreed_signal(signum: int | None, due: bool, info: DistInfo, device: torch.device) -> int | None:
    """The signal to stop on. One process stops at the step it got it; in a process group the
    ranks agree at `due` steps only (log steps), so the step loop gains no all-reduce or host sync
    per step; a rank the signal missed stops with the others (SIGTERM)."""
    if not info.enabled:
        return signum
    if not due or not all_reduce_sum([float(signum or 0)], info, device)[0]:
        return None
    return signum or int(signal.SIGTERM)


def all_reduce_tensor(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum a tensor over ranks in place (identity without a process group)."""
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op without a process group)."""
    if info.enabled:
        dist.barrier()


T = TypeVar("T")


def share_refusal(error: UserError | None, info: DistInfo) -> None:
    """Every rank says whether it refused here (`error`); if any did, every rank raises the same
    `AgreedRefusal`: the first refusing rank's line (prefixed with that rank when it is not rank
    0) and its exit code. Without a process group, `error` is raised as it is."""
    if not info.enabled:
        if error is not None:
            raise error
        return
    mine = None if error is None else (str(error), getattr(error, "exit_code", 2))
    gathered: list[Any] = [None] * info.world
    dist.all_gather_object(gathered, mine)
    for rank, refusal in enumerate(gathered):
        if refusal is not None:
            message, code = refusal
            raise AgreedRefusal(message if rank == 0 else f"rank {rank} of {info.world}: {message}", code)


@contextmanager
def refusals_agreed(info: DistInfo) -> Iterator[None]:
    """Around a part of the start that may refuse on some ranks only (rank 0's directory lock, a
    rank's own data or model files) and runs no collective itself: every rank leaves it together,
    all with the same one-line refusal (`share_refusal`) or none. A refusal already agreed inside
    passes through as it is (every rank raised it at the same point)."""
    try:
        yield
    except AgreedRefusal:
        raise
    except UserError as err:
        share_refusal(err, info)
        raise  # share_refusal raised already; kept for readers and type checkers
    share_refusal(None, info)


def from_rank0(read: Callable[[], T], info: DistInfo) -> T:
    """Run `read` on rank 0 only and hand its result, or its UserError, to every rank.

    For what rank 0 wrote into the run directory (run plan, checkpoint state, metadata): the other
    ranks never open those files, so they need not share rank 0's file system. The value travels
    pickled (torch.distributed.broadcast_object_list): small things, not whole weights.
    """
    if not info.enabled:
        return read()
    box: list[Any] = [None]
    if info.is_main:
        try:
            box = [("ok", read())]
        except UserError as err:  # every rank stops with rank 0's message, none waits for it
            box = [("error", (str(err), getattr(err, "exit_code", 2)))]
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise AgreedRefusal(*value)
    return value


# What each fact means when ranks disagree on it, and the fix.
AGREE_FIXES = {
    "config": "every rank must run the same config (same file and overrides on every node)",
    "data_fingerprint": "every rank must read the same prepared data: prepare it once on a shared file "
    "system, or copy the same prepared folder to every node",
    "step": "every rank must resume from the same checkpoint: point --out at one shared run directory",
    "tokens_seen": "every rank must resume from the same checkpoint: point --out at one shared run directory",
    "method": "every rank must apply the same method and options",
}


def agree(facts: dict[str, Any], info: DistInfo, when: str) -> None:
    """Check every rank's `facts` equal rank 0's (`when`: e.g. "before the first step"); otherwise
    one UserError on every rank, naming the first rank and fact that differ and the fix. A no-op
    without a process group. The facts travel pickled (all_gather_object): keep them small."""
    if not info.enabled:
        return
    gathered: list[Any] = [None] * info.world
    dist.all_gather_object(gathered, facts)
    base = gathered[0]
    for rank, other in enumerate(gathered[1:], start=1):
        for key, value in base.items():
            if other.get(key) != value:
                fix = AGREE_FIXES.get(key, "every rank must start from the same state")
                raise AgreedRefusal(
                    f"rank {rank} disagrees with rank 0 {when} on {key}: {other.get(key)!r} vs {value!r}; {fix}"
                )


# What a collective raises on a rank whose peer left (killed, crashed, out of memory): gloo's
# socket errors (also inside NCCL's messages), and torch's DistNetworkError.
LOST_PEER = ("by peer", "connection closed", "pair closure", "broken pipe", "connection refused", "socket closed")


def lost_peer(err: BaseException, info: DistInfo) -> str | None:
    """A one-line reason when `err` is a collective that failed because another rank of the job left
    (None otherwise, and always without a process group): what the loop turns into one line naming
    the rank and the fix instead of a backend traceback."""
    if not info.enabled or not isinstance(err, RuntimeError):
        return None
    text = str(err)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if isinstance(err, dist.DistNetworkError) or any(marker in text.lower() for marker in LOST_PEER):
        return first.split("] ", 1)[-1].split(". ", 1)[0][:160]
    return None


def peer_text(info: DistInfo) -> str:
    """Which rank this one lost: the other one in a job of two, else 'another rank'."""
    return f"rank {1 - info.rank}" if info.world == 2 else "another rank"


def broadcast_tensors(tensors: Sequence[torch.Tensor], info: DistInfo) -> None:
    """Overwrite each tensor with rank 0's values, in place (weights rank 0 alone has read)."""
    if info.enabled:
        for t in tensors:
            dist.broadcast(t.data, src=0)


# ---- FSDP2 (--strategy fsdp) ---------------------------------------------------------------------
def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks: the members of a layer list that hold a layer's Q projection.

    Each is one FSDP2 unit, so a block's fused Q/K/V (our GPT's `fused_qkv`) is gathered whole
    and keeps running as one GEMM that skips frozen weights' gradients.
    """
    # W_Q = I leaves a layer no Q: its K marks the block then.
    q_ids = {id((layer.q or layer.k).weight) for layer in find_targets(model).layers}
    blocks = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            blocks += [m for m in module if any(id(p) in q_ids for p in m.parameters())]
    return blocks


def shard_model(model: nn.Module, device: torch.device, world: int) -> nn.Module:
    """FSDP2: `fully_shard` each transformer block, then the root (embeddings, final norm, head).

    Parameters become DTensors sharded on dim 0 over all ranks; the method's cached targets are
    re-pointed at them by name (`rebind_targets`), so the audit, FLOP counts and schedules see the
    parameters that train. Frozen tensors stay frozen (requires_grad is carried per parameter:
    FSDP2 reduce-scatters gradients only for those that require them).
    """
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    blocks = transformer_blocks(model)
    if not blocks:
        raise UserError(
            f"--strategy fsdp found no transformer blocks (layer list) to shard in {type(model).__name__}; "
            "use --strategy ddp for this model"
        )
    mesh = init_device_mesh(device.type, (world,))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    rebind_targets(model, names)
    return model


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The FSDP2 units of a model, root last (empty for a model that is not sharded)."""
    if FSDPModule is None:
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)][::-1]


@dataclass
class CommCounter:
    """Bytes of the collectives FSDP2 runs, by kind, counted while `active` (the training steps).

    A count is the size of the whole tensor of one collective, as DDP's figure is the size of its
    all-reduced buckets: an all-gather's output (every rank's shard, padded to equal size), a
    reduce-scatter's input (the full gradients of the tensors that require them). With a ring
    algorithm each rank sends and receives (world - 1) / world of it.
    """

    bytes: dict[str, int] = field(default_factory=lambda: {"all_gather": 0, "reduce_scatter": 0})
    calls: dict[str, int] = field(default_factory=lambda: {"all_gather": 0, "reduce_scatter": 0})
    active: bool = True

    def add(self, kind: str, t: torch.Tensor) -> None:
        """Count one collective over tensor `t`."""
        if self.active:
            self.bytes[kind] += t.numel() * t.element_size()
            self.calls[kind] += 1


class CountingAllGather:
    """FSDP2's default all-gather (torch.empty buffers, the same collective), counted."""

    def __init__(self, counter: CommCounter) -> None:
        self.counter = counter

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The buffer FSDP2 gathers into (as its default allocation)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False):
        """All-gather every rank's shard into output_tensor."""
        self.counter.add("all_gather", output_tensor)
        return ALL_GATHER(output_tensor, input_tensor, group=group, async_op=async_op)


class CountingReduceScatter:
    """FSDP2's default reduce-scatter (torch.empty buffers, the same collective), counted."""

    def __init__(self, counter: CommCounter) -> None:
        self.counter = counter

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The buffer FSDP2 reduces into (as its default allocation)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any, async_op: bool = False
    ):
        """Reduce the ranks' full gradients and keep this rank's shard in output_tensor."""
        self.counter.add("reduce_scatter", input_tensor)
        return REDUCE_SCATTER(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def count_comm(model: nn.Module) -> CommCounter:
    """Count the bytes FSDP2 all-gathers and reduce-scatters for a sharded model.

    Installed through FSDP2's own extension points (`set_custom_all_gather` /
    `set_custom_reduce_scatter` on every unit), so what is counted is what FSDP2 sends: frozen
    tensors are all-gathered (forward, and again in backward for units that reshard after
    forward) but have no gradient, so nothing of theirs is reduce-scattered.
    """
    counter = CommCounter()
    for unit in fsdp_modules(model):
        unit.set_custom_all_gather(CountingAllGather(counter))
        unit.set_custom_reduce_scatter(CountingReduceScatter(counter))
    return counter


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """FSDP2: reduce-scatter gradients in this backward (the last micro-batch) or keep accumulating."""
    model.set_requires_gradient_sync(sync)


@contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """Hold an FSDP2 model's parameters gathered (evaluation): forward passes then run no collective.

    Each rank evaluates its own windows, and their number may differ by one between ranks; a
    sharded forward would all-gather per block and wait for a rank that has no more windows. So
    evaluation gathers every unit once (all ranks, in the same order) and reshards after; it needs
    the whole model's memory on each rank while it lasts. A model that is not sharded is left alone.
    """
    units = fsdp_modules(model)
    if not units:
        yield
        return
    model.set_reshard_after_forward(False)
    for unit in units[::-1]:  # root first, as its forward would
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
        model.set_reshard_after_forward(True)
        model.set_reshard_after_forward(False, recurse=False)  # the root keeps its default
