"""Resuming a run from its checkpoint: the checks that it is this run's, then the exact restore.

Rank 0 reads (and checks) the checkpoint; every rank gets its state, the weights as the strategy
shares them (DDP: broadcast; FSDP: every rank reads its shard), so under DDP no other rank opens
rank 0's files. Each check refuses with one UserError naming the field and the way out:
- `check_data_and_method`: the data fingerprint, the method, its options and seed;
- `check_strategy`: whole weights (ddp) or sharded files (fsdp), as written;
- `check_world_size`: another number of processes only with the same global batch;
- `check_frozen`: after the restore, the frozen tensors are this run's start bytes;
- `check_ranks_agree`: before the first step, every rank runs, reads and resumed what rank 0 did;
- `load_best`: best/ holds this run's best step before the final evaluation reads it.
`determinism_facts` / `determinism_changes`: what bit-identical resume needs besides the checkpoint
(threads, torch, device); a change is a warning, not a refusal.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from oelm.core.audit import Audit, verify_audit
from oelm.core.schedules import FreezeSchedule
from oelm.training import checkpoint as ckpt
from oelm.training.config import TrainConfig, dump_config
from oelm.training.distributed import DistInfo, agree, from_rank0
from oelm.training.strategy import Strategy
from oelm.training.task import Task
from oelm.utils.errors import UserError

log = logging.getLogger(__name__)


def determinism_facts(device: torch.device) -> dict[str, Any]:
    """What bit-identical resume depends on besides the checkpoint: threads, torch, device."""
    return {
        "threads": torch.get_num_threads(),
        "torch": str(torch.__version__),  # a plain str: state.pt is read with weights_only=True
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
    }


def determinism_changes(saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """One warning per condition of bit-identical resume that differs from the checkpoint's."""
    if not saved:
        return []
    fixes = {
        "threads": f"set OMP_NUM_THREADS={saved.get('threads')} to match",
        "torch": "install that torch",
        "device": "resume on that device",
    }
    return [
        f"resuming with {key} = {now[key]} where the run used {saved[key]}: the run continues, but will not be "
        f"bit-identical to an uninterrupted one ({fixes[key]})"
        for key in now
        if key in saved and saved[key] != now[key]
    ]


# ---- checks: is this checkpoint this run's? -------------------------------------------------------
def check_data_and_method(path: Path, model: nn.Module, task: Task, cfg: TrainConfig) -> None:
    """Refuse a checkpoint of other data, or written under another method, options or method seed,
    naming the field."""
    stored = ckpt.checkpoint_metadata(path)
    data = task.model_metadata().get("data_fingerprint")
    if "data_fingerprint" in stored and data is not None and stored["data_fingerprint"] != data:
        raise UserError(
            f"the data at {str(cfg.data)!r} is not the data this run was trained on (fingerprint "
            f"{data}, checkpoint {stored['data_fingerprint']}: it was prepared again, with other hold-out "
            "seeds, fractions, source or tokenizer); resuming would mix splits. Restore that data, or "
            "start over with --overwrite"
        )
    for key, value in ckpt.method_record(model).items():
        mine = value if isinstance(value, str) else json.dumps(value)
        if key in stored and stored[key] != mine:
            raise UserError(
                f"checkpoint {str(path)!r} was trained with {key} = {stored[key]}, but this run is "
                f"configured with {key} = {mine}; resume with the run's own {key} or pass --overwrite"
            )


def check_strategy(path: Path, state: dict[str, Any], strategy: str) -> None:
    """DDP checkpoints hold whole weights, FSDP ones sharded files: resume with the one that wrote it."""
    saved = state.get("strategy", "ddp")
    if saved != strategy:
        raise UserError(
            f"checkpoint {str(path)!r} was written with --strategy {saved} ("
            f"{'sharded torch.distributed.checkpoint files' if saved == 'fsdp' else 'whole weights'}); "
            f"this resume uses --strategy {strategy}: resume with --strategy {saved}"
        )


def check_world_size(path: Path, state: dict[str, Any], cfg: TrainConfig, dist: DistInfo) -> None:
    """A resume at another world size must keep the global batch (the experiment), else refused."""
    saved = state.get("world_size")
    if saved is None or saved == dist.world:
        return
    now = cfg.batch_size * cfg.grad_accum * dist.world
    before = state.get("global_batch")
    if before != now:
        keep = before // (cfg.batch_size * dist.world) if before % (cfg.batch_size * dist.world) == 0 else None
        fix = (
            f"resume with --grad-accum {keep} --allow-change grad_accum to keep it"
            if keep
            else f"resume with {saved} processes"
        )
        raise UserError(
            f"checkpoint {str(path)!r} was trained by {saved} process(es) with a global batch of {before} "
            f"sequences; this resume has {dist.world} with a global batch of {now} "
            f"(batch_size {cfg.batch_size} x grad_accum {cfg.grad_accum} x {dist.world}), which would "
            f"change the experiment; {fix}"
        )
    if dist.is_main:
        log.warning(
            f"resuming with {dist.world} process(es) where the run used {saved}; the global "
            f"batch stays {now} sequences, but the run will not be bit-identical to an uninterrupted one"
        )


def check_frozen(path: Path, model: nn.Module, audit: Audit) -> None:
    """The checkpoint's frozen tensors must be this run's start bytes: else it is another run's."""
    check = verify_audit(model, audit)
    if not check.ok:
        raise UserError(
            f"checkpoint {str(path)!r} does not belong to this run: {'; '.join(check.problems[:3])} "
            "(its frozen tensors differ from this run's initialization: another seed, method or "
            "model wrote it); resume the run that wrote it or pass --overwrite"
        )


# ---- the restore -------------------------------------------------------------------------------
class Resumable(Protocol):
    """What a resume restores into: the parts of a built run (the Trainer is one)."""

    cfg: TrainConfig
    dist: DistInfo
    device: torch.device
    task: Task
    strategy: Strategy
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    schedule: FreezeSchedule | None
    audit: Audit
    ckpt_root: Path
    step: int
    tokens_seen: int
    best_step: int | None

    def sync_trainable(self) -> None:
        """Refill the optimizer (and the strategy's wrapper) with the parameters that now train."""


@dataclass(frozen=True)
class Resumed:
    """The loop's own counters as the checkpoint stored them."""

    step: int
    tokens_seen: int
    best_val_loss: float
    best_step: int | None
    best_score: float
    metrics_offset: int | None
    step_times: list[float]
    eval_times: list[float]
    wall_time: float


def read_checkpoint(path: Path, run: Resumable) -> dict[str, Any]:
    """Rank 0: check the checkpoint is this run's and read its state (whole-weight strategies: and
    its weights)."""
    check_data_and_method(path, run.model, run.task, run.cfg)
    state = ckpt.load_state(path)
    check_strategy(path, state, run.cfg.strategy)
    check_world_size(path, state, run.cfg, run.dist)
    try:
        run.strategy.read_weights(run.model, path / ckpt.WEIGHTS)
    except RuntimeError as err:  # strict load: the stored weights do not fit this model
        raise UserError(
            f"checkpoint {str(path)!r} does not fit the configured model "
            f"({str(err).splitlines()[0][:120]}); resume with the run's own model settings or pass --overwrite"
        ) from None
    return state


def restore(path: Path, run: Resumable, lr_factor: Callable[[int, TrainConfig], float]) -> Resumed:
    """Restore everything checkpoint `path` holds into `run`, on every rank; return the counters.

    Model, method schedule and optimizer as the strategy loads them, then LR scheduler, grad
    scaler, the frozen-bytes check, the task's data position and every RNG; best/ as of that
    checkpoint (rank 0). `lr_factor`: the LR schedule, for a resume that changes --lr."""
    state = from_rank0(lambda: read_checkpoint(path, run), run.dist)
    if run.dist.is_main:
        for line in determinism_changes(state.get("determinism"), determinism_facts(run.device)):
            log.warning(line)

    def restore_phase() -> None:  # the method schedule's stored phase, and the optimizer's params with it
        if run.schedule is not None:
            run.schedule.load_state_dict(state["method_schedule"], run.audit)
            run.sync_trainable()

    run.strategy.load_training_state(path, run.model, run.optimizer, state, restore_phase)
    run.scheduler.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    check_frozen(path, run.model, run.audit)
    run.task.load_state_dict(state["data"])
    ckpt.set_rng_state(state["rng"])
    resumed = Resumed(
        step=state["step"],
        tokens_seen=state["tokens_seen"],
        best_val_loss=state["best_val_loss"],
        best_step=state["best_step"],
        best_score=state.get("best_score", state["best_val_loss"]),
        metrics_offset=state["metrics_offset"],
        step_times=state["step_times"],
        eval_times=list(state["eval_times"]),
        wall_time=state["wall_time"],
    )
    cfg = run.cfg
    if "lr" in cfg.allow_change:  # the stored scheduler would keep the old peak LR
        run.scheduler.base_lrs = [cfg.lr for _ in run.scheduler.base_lrs]
        for group in run.optimizer.param_groups:
            group["lr"] = cfg.lr * lr_factor(resumed.step, cfg)
    if run.dist.is_main:
        ckpt.restore_best(run.ckpt_root, path, resumed.best_step)
    return resumed


# ---- after the restore: every rank at the same start, best/ this run's -----------------------------
def rank_facts(run: Resumable) -> dict[str, Any]:
    """What every rank must share with rank 0: config, method, data fingerprint, resumed step."""
    config = hashlib.sha256(dump_config(run.cfg).encode("utf-8")).hexdigest()[:16]
    return {
        "config": config,
        "method": f"{run.cfg.method} {json.dumps(run.cfg.method_options, sort_keys=True, default=str)}",
        "data_fingerprint": run.task.model_metadata().get("data_fingerprint"),
        "step": run.step,
        "tokens_seen": run.tokens_seen,
    }


def check_ranks_agree(run: Resumable) -> None:
    """Every rank checks what it runs, reads and resumed against rank 0 before the first step:
    different prepared data or a different checkpoint would otherwise train without a word."""
    agree(rank_facts(run), run.dist, "before the first step")


def load_best(run: Resumable) -> None:
    """Load best/ after checking it holds this run's best step (never stale weights).

    Rank 0 checks the step; then the strategy loads the weights (DDP: rank 0 reads the file and
    broadcasts them; FSDP: every rank reads it and keeps its shard, on the file system the
    start-up check found shared)."""
    best = run.ckpt_root / "best" / ckpt.WEIGHTS
    if run.best_step is None:
        return

    def read() -> None:  # rank 0
        found = ckpt.weights_step(best) if best.is_file() else None
        if found != run.best_step:
            raise UserError(
                f"{str(best)!r} holds step {found}, but this run's best is step {run.best_step} "
                "(left by an interrupted run); rerun with --overwrite"
            )
        run.strategy.read_weights(run.model, best)

    from_rank0(read, run.dist)
    run.strategy.share_weights(run.model, best)
