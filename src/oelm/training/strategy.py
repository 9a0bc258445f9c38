"""How the ranks of one run share the model: one process, DDP or FSDP2, behind one interface.

The Trainer picks a strategy when it is built (`make_strategy`) and its step then reads the same
for all three: `shard` the model before the optimizer, `wrap` it for the training step, one
`train_step` context around each optimizer step with a `micro_batch` context per micro-batch
(gradients are synchronised on the last one only), `clip`, `evaluation` around evaluation's
forward passes; `save_best` / `save_checkpoint` write the run's weights and checkpoints,
`read_weights` / `share_weights` / `load_training_state` read them back, `comm_bytes` reports the
collectives counted during training steps. The collectives themselves are
`training/distributed.py`'s helpers.

What a rank does when the job is stopped or loses a rank is the strategy's too, the same for all
three: `stop_signals` catches SIGINT / SIGTERM and has the ranks agree to stop at a log step;
`lost_peer_is_clear` turns a collective that failed because another rank left into one line
(and, on rank 0's node, removes the checkpoint a killed rank 0 was writing).

Who reads and writes the run directory:
- one process (`SingleProcess`) and DDP: rank 0 alone reads what it wrote (checkpoints, best/)
  and broadcasts weights; the other ranks need not see the directory.
- FSDP2: every rank writes and reads its shard of the checkpoints (torch.distributed.checkpoint),
  so every rank must see the run directory (`check_run_dir`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from oelm.records.run import RESULTS_FILE
from oelm.training import checkpoint as ckpt
from oelm.training.distributed import (
    CommCounter,
    DistInfo,
    agreed_signal,
    all_reduce_sum,
    barrier,
    broadcast_tensors,
    count_comm,
    from_rank0,
    gathered,
    lost_peer,
    peer_text,
    set_gradient_sync,
    shard_model,
)
from oelm.utils.env import env_seconds
from oelm.utils.errors import AgreedRefusal, Interrupted, UserError

log = logging.getLogger(__name__)

# The state.pt of a checkpoint, given the optimizer's state (None under FSDP: sharded in dcp/).
StateFn = Callable[[dict[str, Any] | None], dict[str, Any]]


def fs_wait_seconds() -> float:
    """OELM_FS_WAIT_S: how long fsdp ranks look for rank 0's run directory (default 60 s)."""
    return env_seconds("OELM_FS_WAIT_S", 60)


def process_gone(pid: int) -> bool:
    """Whether process `pid` of this machine has ended: no such process, or a zombie (killed, not yet
    reaped by its launcher; Linux's /proc says so, elsewhere a zombie counts as running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:  # no /proc here
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # another user's process: the pid was reused, so the one we knew is gone
            return True
        return False
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


class StopSignals:
    """Catch SIGINT/SIGTERM during the step loop: the loop finishes its step, writes a checkpoint
    and stops with `Interrupted`. A second Ctrl-C gets the previous behaviour (stop at once)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, dist: DistInfo, device: torch.device) -> None:
        self.dist, self.device = dist, device
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum
        # A second Ctrl-C stops at once; a SIGTERM that follows (a sweep stopping its workers after
        # the terminal's SIGINT reached them too) waits for the checkpoint like the first signal.
        if signal.SIGINT in self.previous:
            signal.signal(signal.SIGINT, self.previous[signal.SIGINT])

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for s in self.SIGNALS:
                self.previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def agreed(self, due: bool) -> int | None:
        """The signal to stop on after this step (`agreed_signal`: in a process group the ranks
        agree at `due` steps only, so the step loop gains no collective per step)."""
        return agreed_signal(self.signum, due, self.dist, self.device)

    @staticmethod
    def stopped(signum: int, step: int, steps: int, run_dir: Path) -> Interrupted:
        """The error the loop stops with, once the checkpoint of `step` is written."""
        return Interrupted(
            f"{signal.Signals(signum).name} at step {step} of {steps}: checkpoint "
            f"{ckpt.step_dir_name(step)} written in {str(run_dir)!r}; "
            "continue with the same command and --resume",
            signum,
        )


class Strategy:
    """The interface, with the behaviour of one process where a method does nothing across ranks.

    What rank 0 alone does (writing whole weights, reading them back) is written for a process
    group too: DDP inherits it, and each helper of `training/distributed.py` is a no-op without one.
    Built on every rank at the same point of the start (it asks rank 0 where it runs).
    """

    def __init__(self, dist: DistInfo, device: torch.device) -> None:
        self.dist, self.device = dist, device
        # Rank 0 alone renames checkpoints into place: where it runs lets a survivor on its node
        # remove what it was writing when it was killed (`remove_dead_rank0_debris`).
        self.rank0_process: tuple[str, int] = from_rank0(lambda: (socket.gethostname(), os.getpid()), dist)

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

    # ---- faults: a stop signal, a rank that left ----------------------------------------------------
    def stop_signals(self) -> StopSignals:
        """Around the step loop: SIGINT / SIGTERM caught, the stop agreed over the ranks."""
        return StopSignals(self.dist, self.device)

    @contextmanager
    def lost_peer_is_clear(self, run_dir: Path, step: Callable[[], int], steps: int, final: bool) -> Iterator[None]:
        """A collective that fails because another rank left (killed, crashed) ends this rank with
        one line naming the lost rank, what is kept and --resume, instead of a backend traceback.
        `step`: the run's step when it failed; `final`: around the final evaluation."""
        try:
            yield
        except RuntimeError as err:
            if (reason := lost_peer(err, self.dist)) is None:
                raise
            self.remove_dead_rank0_debris(run_dir / "checkpoints")
            raise UserError(self.lost_peer_text(run_dir, reason, step(), steps, final)) from None

    def remove_dead_rank0_debris(self, ckpt_root: Path) -> None:
        """On rank 0's node, once rank 0 is gone: remove the checkpoint it was writing when killed
        (it alone renames checkpoints into place, so no one else would); a rank elsewhere leaves it
        to the next start, which removes it before anything else (`rundir.open_run_dir`)."""
        host, pid = self.rank0_process
        if self.dist.is_main or host != socket.gethostname():
            return
        # A killed process closes its sockets before it becomes a zombie: give it a moment.
        deadline = time.monotonic() + 3.0
        while not process_gone(pid):
            if time.monotonic() > deadline:
                return  # rank 0 still runs: what it writes is its own to finish or remove
            time.sleep(0.05)
        for name in ckpt.remove_debris(ckpt_root, pid):
            log.info("removed %s, which rank 0 was writing when it was lost", name)

    def lost_peer_text(self, run_dir: Path, reason: str, step: int, steps: int, final: bool) -> str:
        """One line for a collective that failed because another rank left mid-step, mid-save or
        during the final evaluation (after the last step: results.json is written only once the
        evaluation of every rank is in, so it is never written from part of one)."""
        dist = self.dist
        last = ckpt.latest_checkpoint(run_dir / "checkpoints") if dist.is_main else None
        written = dist.is_main and final and (run_dir / RESULTS_FILE).is_file()
        if written:  # the peer left after the last collective of a complete evaluation
            kept = f"{RESULTS_FILE} was written from the complete evaluation before it left, so the run is done"
        elif not dist.is_main:
            kept = f"rank 0's {'final' if final else 'last complete'} checkpoint stays in place"
        elif last is None:
            kept = "no checkpoint was written yet"
        elif final:
            kept = f"the final checkpoint, {last.name}, is in place and {RESULTS_FILE} was not written"
        else:
            kept = f"the last complete checkpoint, {last.name}, is in place"
        when = f"during the final evaluation (after step {step} of {steps})" if final else ""
        if written:
            fix = "--resume prints its results"
        else:
            fix = "Find why it stopped (its log, memory, the node), then rerun the same command with --resume"
            fix += " (it evaluates the final checkpoint without training again)" if final else ""
        return (
            f"rank {dist.rank} of {dist.world} lost {peer_text(dist)} "
            f"{when or f'after step {step}'} ({reason}): that rank stopped or was killed (the launcher's "
            f"report names it and its exit code); {kept}. {fix}"
        )


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
        raise AgreedRefusal(
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
