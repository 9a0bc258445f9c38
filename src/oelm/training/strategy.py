"""How the ranks of one run share the model: one process, DDP or FSDP2, behind one interface.

The Trainer picks a strategy when it is built (`make_strategy`) and its step then reads the same
for all three: `shard` the model before the optimizer, `wrap` it for the training step, one
`train_step` context around each optimizer step with a `micro_batch` context per micro-batch
(gradients are synchronised on the last one only), `clip`, `evaluation` around evaluation's
forward passes; `save_best` / `save_checkpoint` write the run's weights and checkpoints,
`read_weights` / `share_weights` / `load_training_state` read them back, `comm_bytes` reports the
collectives counted during training steps. The collectives themselves are
`training/distributed.py`'s helpers.

Who reads and writes the run directory:
- one process (`SingleProcess`) and DDP: rank 0 alone reads what it wrote (checkpoints, best/)
  and broadcasts weights; the other ranks need not see the directory.
- FSDP2: every rank writes and reads its shard of the checkpoints (torch.distributed.checkpoint),
  so every rank must see the run directory (`check_run_dir`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from oelm.training import checkpoint as ckpt
from oelm.training.distributed import (
    CommCounter,
    DistInfo,
    all_reduce_sum,
    barrier,
    broadcast_tensors,
    count_comm,
    gathered,
    set_gradient_sync,
    shard_model,
)
from oelm.utils.env import env_seconds
from oelm.utils.errors import UserError

# The state.pt of a checkpoint, given the optimizer's state (None under FSDP: sharded in dcp/).
StateFn = Callable[[dict[str, Any] | None], dict[str, Any]]


def fs_wait_seconds() -> float:
    """OELM_FS_WAIT_S: how long fsdp ranks look for rank 0's run directory (default 60 s)."""
    return env_seconds("OELM_FS_WAIT_S", 60)


class Strategy:
    """The interface, with the behaviour of one process where a method does nothing across ranks.

    What rank 0 alone does (writing whole weights, reading them back) is written for a process
    group too: DDP inherits it, and each helper of `training/distributed.py` is a no-op without one.
    """

    def __init__(self, dist: DistInfo, device: torch.device) -> None:
        self.dist, self.device = dist, device

    # ---- the model ---------------------------------------------------------------------------
    def shard(self, model: nn.Module) -> None:
        """Before the optimizer is built (it must hold the parameters that train): place them."""

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the training step calls; called again when a schedule switches what trains."""
        return model

    # ---- one training step -------------------------------------------------------------------
    @contextmanager
    def train_step(self) -> Iterator[None]:
        """Around one optimizer step: collectives are counted here only (not evaluation's)."""
        yield

    def micro_batch(self, index: int, accum: int) -> AbstractContextManager[Any]:
        """Around forward and backward of micro-batch `index` of `accum`: gradients are synchronised
        over ranks on the last micro-batch only."""
        return nullcontext()

    def clip(self, params: Iterable[torch.Tensor], max_norm: float) -> None:
        """Clip the (unscaled) gradients to a total norm of max_norm, over all ranks' shards."""
        torch.nn.utils.clip_grad_norm_(params, max_norm)

    def evaluation(self, model: nn.Module) -> AbstractContextManager[Any]:
        """Around evaluation's forward passes (which may differ in number between ranks)."""
        return nullcontext()

    # ---- run directory and checkpoints ---------------------------------------------------------
    def check_run_dir(self, run_dir: Path) -> None:
        """Refuse, on every rank, a job whose ranks do not see the run directory they must share."""

    def save_best(self, ckpt_root: Path, model: nn.Module, meta: dict[str, Any]) -> None:
        """best/model.safetensors: whole weights, written by rank 0."""
        if self.dist.is_main:
            ckpt.save_best(ckpt_root, model, meta)

    def save_checkpoint(
        self,
        ckpt_root: Path,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: StateFn,
        meta: Callable[[], dict[str, Any]],
        keep_last: int,
        last: bool,
    ) -> None:
        """checkpoints/step_N/: whole weights + state.pt (optimizer included), written by rank 0."""
        if self.dist.is_main:
            ckpt.save_checkpoint(ckpt_root, step, model, state(optimizer.state_dict()), meta(), keep_last)

    def read_weights(self, model: nn.Module, path: Path) -> None:
        """Rank 0 (inside `from_rank0`): load whole weights from `path`, strictly."""
        ckpt.load_weights(model, path)

    def share_weights(self, model: nn.Module, path: Path) -> None:
        """Every rank, after `read_weights`: take the weights rank 0 read (parameters and buffers)."""
        broadcast_tensors([*model.parameters(), *model.buffers()], self.dist)

    def load_training_state(
        self,
        path: Path,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        restore_phase: Callable[[], None],
    ) -> None:
        """Resume from checkpoint `path` (weights read by rank 0): the weights, then the method
        schedule's stored phase (`restore_phase`: it decides which parameters the optimizer holds),
        then the optimizer state."""
        self.share_weights(model, path)
        restore_phase()
        optimizer.load_state_dict(state["optimizer"])

    # ---- reporting -----------------------------------------------------------------------------
    def comm_bytes(self) -> dict[str, int | None]:
        """Bytes of each collective counted during this session's training steps (None: none run)."""
        return {"all_reduce": None, "all_gather": None, "reduce_scatter": None}


class SingleProcess(Strategy):
    """One process: the model trains as built; nothing is synchronised or counted."""


class DDPStrategy(Strategy):
    """DistributedDataParallel: whole weights on every rank, gradients all-reduced in buckets.

    Rank 0 alone reads and writes the run directory and broadcasts what it read.
    """

    def __init__(self, dist: DistInfo, device: torch.device) -> None:
        super().__init__(dist, device)
        self.wrapped: DDP | None = None
        self.allreduce_bytes = 0  # all-reduced gradient bytes this session

    def wrap(self, model: nn.Module) -> nn.Module:
        """A new DDP wrapper (frozen tensors have no gradient, so DDP leaves them out), its buckets'
        all-reduce counted."""
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.wrapped = DDP(model, device_ids=ids)

        def count_allreduce(state, bucket):  # unannotated: DDP checks annotations against its own types
            """DDP's own all-reduce of a gradient bucket, its bytes counted (frozen tensors have none)."""
            buffer = bucket.buffer()
            self.allreduce_bytes += buffer.numel() * buffer.element_size()
            return allreduce_hook(state, bucket)

        self.wrapped.register_comm_hook(None, count_allreduce)
        return self.wrapped

    def micro_batch(self, index: int, accum: int) -> AbstractContextManager[Any]:
        """All-reduce only on the last micro-batch: the others accumulate under `no_sync`."""
        return self.wrapped.no_sync() if index < accum - 1 else nullcontext()

    def comm_bytes(self) -> dict[str, int | None]:
        """The bytes DDP's comm hook saw: exactly the trainable gradients, once per step."""
        return {"all_reduce": self.allreduce_bytes, "all_gather": None, "reduce_scatter": None}


class FSDPStrategy(Strategy):
    """FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded over the ranks.

    Step checkpoints are torch.distributed.checkpoint files, one per rank, so every rank reads and
    writes the run directory; best/ and the last step also hold whole weights, gathered.
    """

    def __init__(self, dist: DistInfo, device: torch.device, fs_wait: float) -> None:
        super().__init__(dist, device)
        self.fs_wait = fs_wait
        self.sharded: nn.Module | None = None
        self.counter: CommCounter | None = None  # all-gather / reduce-scatter bytes (training steps)

    def shard(self, model: nn.Module) -> None:
        """`fully_shard` the blocks and the root; with a process group, count their collectives."""
        shard_model(model, self.device, self.dist.world)
        self.sharded = model
        if self.dist.enabled:  # counted during training steps only (not evaluation's gathers)
            self.counter = count_comm(model)
            self.counter.active = False

    @contextmanager
    def train_step(self) -> Iterator[None]:
        """Count FSDP2's all-gathers and reduce-scatters while the step runs."""
        if self.counter is not None:
            self.counter.active = True
        try:
            yield
        finally:
            if self.counter is not None:
                self.counter.active = False

    @contextmanager
    def micro_batch(self, index: int, accum: int) -> Iterator[None]:
        """Reduce-scatter only in the last micro-batch's backward: the others accumulate."""
        if accum > 1:
            set_gradient_sync(self.sharded, index == accum - 1)
        yield

    def evaluation(self, model: nn.Module) -> AbstractContextManager[Any]:
        """Parameters gathered once for all of evaluation: its forward passes run no collective."""
        return gathered(model)

    def check_run_dir(self, run_dir: Path) -> None:
        """Every rank writes and reads its part of the sharded checkpoints in the run directory, so
        refuse, on every rank, a job whose ranks do not see rank 0's run directory, instead of failing
        later. Network file systems may show a new file late, so the ranks look again for up to
        OELM_FS_WAIT_S seconds."""
        if not self.dist.enabled:
            return
        barrier(self.dist)
        wait = self.fs_wait
        deadline = time.monotonic() + wait
        while True:
            seen = 1.0 if (run_dir / "config.yaml").is_file() else 0.0
            blind = self.dist.world - round(all_reduce_sum([seen], self.dist, self.device)[0])
            if blind == 0:
                return
            if all_reduce_sum([float(time.monotonic() >= deadline)], self.dist, self.device)[0] > 0:
                break  # every rank leaves the loop at the same poll
            time.sleep(0.5)
        raise UserError(
            f"{blind} of {self.dist.world} ranks cannot see the run directory {str(run_dir)!r} that rank 0 "
            f"wrote (waited {wait:g} s): the ranks do not share a file system. Under --strategy fsdp every rank "
            "writes and reads its shard of the checkpoints (torch.distributed.checkpoint) there: put --out on "
            "a file system all of them see, or use --strategy ddp (rank 0 alone reads the run directory)"
        )

    def save_best(self, ckpt_root: Path, model: nn.Module, meta: dict[str, Any]) -> None:
        """Gathered on every rank, written by rank 0: whole weights, as under DDP."""
        ckpt.save_best_sharded(ckpt_root, model, meta, self.dist.is_main)

    def save_checkpoint(
        self,
        ckpt_root: Path,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: StateFn,
        meta: Callable[[], dict[str, Any]],
        keep_last: int,
        last: bool,
    ) -> None:
        """Every rank writes its shard of model and optimizer (dcp/); rank 0 adds state.pt, without
        the optimizer; the run's last step also gets whole weights."""
        ckpt.save_sharded_checkpoint(
            ckpt_root,
            step,
            model,
            optimizer,
            state(None) if self.dist.is_main else None,
            meta(),
            keep_last,
            self.dist.is_main,
            whole_weights=last,
        )

    def read_weights(self, model: nn.Module, path: Path) -> None:
        """Nothing on rank 0 alone: every rank reads the file in `share_weights`."""

    def share_weights(self, model: nn.Module, path: Path) -> None:
        """Every rank reads the whole weights and keeps its shard (the run directory is shared)."""
        ckpt.load_whole_weights(model, path)

    def load_training_state(
        self,
        path: Path,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        restore_phase: Callable[[], None],
    ) -> None:
        """The stored phase first: it decides which parameters the optimizer holds, and the sharded
        model and optimizer state (dcp/, resharded to this world size) are loaded into exactly those."""
        restore_phase()
        ckpt.load_sharded_checkpoint(path, model, optimizer)

    def comm_bytes(self) -> dict[str, int | None]:
        """FSDP2's all-gather and reduce-scatter bytes (None in a process group of one)."""
        counted = self.counter.bytes if self.counter is not None else {}
        return {
            "all_reduce": None,
            "all_gather": counted.get("all_gather"),
            "reduce_scatter": counted.get("reduce_scatter"),
        }


def make_strategy(name: str, dist: DistInfo, device: torch.device) -> Strategy:
    """The strategy of `--strategy name` in this job: FSDP2 also in one process (a group of one);
    DDP only with a process group, else one process."""
    fs_wait = fs_wait_seconds()  # read for every strategy, now: a bad value is refused before any work
    if name == "fsdp":
        return FSDPStrategy(dist, device, fs_wait)
    if dist.enabled:
        return DDPStrategy(dist, device)
    return SingleProcess(dist, device)
