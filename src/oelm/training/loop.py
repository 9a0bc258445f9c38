"""The training loop core: one loop for every task (optimizer, schedule, AMP, DDP, eval, resume)."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn
from tqdm import tqdm

from oelm.core.audit import AuditCheck, audit_model, verify_audit
from oelm.core.freezing import apply_validated_method, optimizer_groups, scale_group_lrs, sync_optimizer
from oelm.core.schedules import make_schedule
from oelm.records.run import DIVERGED, RESULTS_FILE, SCHEMA_VERSION, TEST_ITEMS_FILE
from oelm.training import checkpoint as ckpt
from oelm.training.config import TrainConfig, dump_config, make_config
from oelm.training.distributed import (
    DistInfo,
    all_reduce_sum,
    barrier,
    from_rank0,
    init_distributed,
    refusals_agreed,
    shutdown_distributed,
)
from oelm.training.results import RunFacts, build_results, build_timing
from oelm.training.resume import check_ranks_agree, determinism_facts, load_best, restore
from oelm.training.rundir import RunPlan, open_run_dir, plan_run
from oelm.training.runlog import MetricsLog, TensorBoard
from oelm.training.strategy import Strategy, make_strategy
from oelm.training.task import Task, make_task
from oelm.training.timing import PeakMemory, StepTimer
from oelm.training.wandb import FanOut, WandbLogger
from oelm.utils.errors import AgreedRefusal, Diverged, UserError
from oelm.utils.io import atomic_write_json
from oelm.utils.lock import dir_lock

log = logging.getLogger(__name__)


def train(config: TrainConfig | dict[str, Any], overrides: list[str] | None = None) -> dict[str, Any]:
    """Train one run described by config (+ key=value overrides); return its results.json dict."""

    cfg = make_config(config, overrides)
    owns_group = not (tdist.is_available() and tdist.is_initialized())
    info, device = init_distributed(cfg.device, group_of_one=cfg.strategy == "fsdp")
    together = False  # every rank ends here at the same point: done, or one refusal they agreed on
    try:
        with ExitStack() as held:
            # One process (rank 0 of a job) trains into a directory at a time; a second job is
            # refused on every rank with rank 0's line, not only on rank 0.
            with refusals_agreed(info):
                if info.is_main:
                    held.enter_context(dir_lock(cfg.run_dir(), "training run"))
            results = Trainer(cfg, info, device).run()
        together = True
        return results
    except AgreedRefusal:
        together = True
        raise
    finally:
        if owns_group:  # after a failure of one rank no barrier: it exits now, and torchrun stops the rest
            shutdown_distributed(info, clean=together)


EVAL_SHOWN = ("loss", "perplexity", "accuracy", "macro_f1", "sequence_accuracy")  # in this order


def eval_line(step: int, steps: int, metrics: dict[str, Any], best: bool) -> str:
    """One validation result as training prints it: 4 significant digits, the best so far marked."""
    shown = ", ".join(f"{k} {metrics[k]:.4g}" for k in EVAL_SHOWN if isinstance(metrics.get(k), float | int))
    return f"step {step}/{steps}: validation {shown}" + (" (best so far)" if best else "")


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr at optimizer step `step` (0-based): linear warmup, then decay."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def resolve_amp(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (None = plain float32) for the config's dtype on this device."""
    if dtype == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype == "float16" and device.type != "cuda":
        raise UserError("dtype float16 needs a CUDA device; use bfloat16 or float32 on CPU")
    return {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def make_adamw(params: Any, **kwargs: Any) -> torch.optim.AdamW:
    """AdamW with the fused (single-kernel) step, on CUDA and on CPU where torch has it.

    The fused step replaces a Python loop over parameters (about 4 ms of a 60-75 ms gpt-tiny step
    on one CPU core, 0.7 ms fused); builds of torch without a fused CPU AdamW fall back to the
    multi-tensor (foreach) step.
    """
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except RuntimeError:  # no fused kernel for this device in this torch build
        return torch.optim.AdamW(params, foreach=True, **kwargs)


# torch.OutOfMemoryError from 2.5, torch.cuda.OutOfMemoryError before; CPU allocators raise
# a RuntimeError with one of these messages.
OutOfMemoryError = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
CPU_OOM_MESSAGES = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")


class Trainer:
    """One run: build, (resume), train, evaluate the best checkpoint, write the run directory."""

    def __init__(self, cfg: TrainConfig, dist: DistInfo, device: torch.device) -> None:
        self.cfg, self.dist, self.device = cfg, dist, device
        self.memory = PeakMemory(device)  # this run's peak, from here (not the process's)
        with refusals_agreed(dist):  # each rank reads its own data: one rank's refusal stops all alike
            self.amp = resolve_amp(cfg.dtype, device)
            self.task: Task = make_task(cfg, dist, device)
            self.task.validate()
            self.cfg = cfg = self.task.resolved_config()
        # Rank 0 inspects the run directory and every rank follows its plan: the others need not
        # see the directory (no shared file system under DDP); each keeps its own path to it.
        self.plan: RunPlan = from_rank0(lambda: plan_run(cfg), dist)
        # One process, DDP or FSDP2: how the ranks share model, gradients, checkpoints and faults.
        self.strategy: Strategy = make_strategy(cfg.strategy, dist, device)
        self.run_dir = cfg.run_dir()
        self.ckpt_root = self.run_dir / "checkpoints"
        self.step, self.tokens_seen = 0, 0
        self.best_val_loss, self.best_step = float("inf"), None
        self.best_score = float("inf")  # task.selection_score of the best checkpoint (lower is better)
        self.metrics_offset: int | None = None
        self.eval_times: list[float] = []
        self.prior_wall = 0.0
        self.timer = StepTimer(device)
        self.session_first_step = 0  # collectives are counted from here (this session)
        self.last_lr = cfg.lr
        self.last_loss: torch.Tensor | float = 0.0  # of the latest step, checked before a checkpoint

    # ---- setup -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Execute the plan and return the results."""
        if self.plan.finished is not None:
            if self.plan.finished.get("status") == DIVERGED:  # finished, but not a result to use
                raise Diverged(str(self.plan.finished.get("message") or "this run diverged"))
            return self.plan.finished
        self.session_start = time.perf_counter()
        # Build (model, method, optimizer) before touching the directory: a start that fails here
        # leaves nothing behind that could block the corrected rerun.
        self._build()
        barrier(self.dist)  # every rank has inspected the directory before rank 0 changes it
        with refusals_agreed(self.dist):  # rank 0 alone writes: its refusal reaches every rank
            if self.dist.is_main:
                tokenizer = self.task.model_metadata().get("tokenizer")
                open_run_dir(self.run_dir, self.plan, dump_config(self.cfg), tokenizer)
        self.strategy.check_run_dir(self.run_dir)
        if self.plan.resume_from is not None:
            self._restore(self.plan.resume_from)
        check_ranks_agree(self)  # config, data, resumed step: every rank as rank 0, or one line
        self.session_first_step = self.step
        barrier(self.dist)
        self._open_logs()
        # Every step in train mode: a model built in eval mode (Hugging Face's from_pretrained) ran
        # its steps before the first evaluation, and a resumed run its steps up to the next, with
        # dropout off.
        self.model.train()
        try:
            with self._lost_peer_is_clear(final=False):
                self._loop()
        finally:
            self.metrics.close()
            self.tb.close()
        with self._lost_peer_is_clear(final=True):
            return self._finish()

    def _lost_peer_is_clear(self, final: bool) -> AbstractContextManager[None]:
        """A rank that left ends this one with one line naming it and --resume (the strategy's)."""
        return self.strategy.lost_peer_is_clear(self.run_dir, lambda: self.step, self.cfg.steps, final)

    def _build(self) -> None:

        # Seed before building so tensors a method leaves alone are identical across methods.
        torch.manual_seed(self.cfg.seed)
        with refusals_agreed(self.dist):  # each rank reads its own model files (a pretrained folder)
            model = self.task.build_model()
            apply_validated_method(model, self.cfg.method, self.cfg.seed, self.cfg.method_settings())
        self.audit = audit_model(model)
        self.schedule = make_schedule(model, self.cfg.steps)  # None unless the method has one
        if self.schedule is not None:
            self.audit.schedule = self.schedule.summary()
        self.model = model.to(self.device)
        self.strategy.shard(self.model)  # before the optimizer: FSDP2's sharded (DTensor) parameters
        self.optimizer = make_adamw(
            scale_group_lrs(optimizer_groups(self.model, self.cfg.weight_decay, self.cfg.layer_lr_decay), self.cfg.lr),
            lr=self.cfg.lr,
            betas=self.cfg.betas,
            eps=self.cfg.eps,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, self.cfg))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == torch.float16)
        # Not `compiled or self.model`: a compiled module's truth value calls len(), which torch
        # 2.13 refuses for a module that is not a container.
        self.eval_model: nn.Module = (
            torch.compile(self.model, mode=self.cfg.compile_mode) if self.cfg.compile else self.model
        )
        self._wrap_trainable()

    def _wrap_trainable(self) -> None:
        """The trainable-parameter list and the strategy's wrapper (rebuilt when a schedule switches)."""
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.train_model: nn.Module = self.strategy.wrap(self.eval_model)

    # ---- method schedule (oelm.core.schedules): switches by step, restored exactly on resume ------
    def _schedule_step(self) -> None:
        """Switch the method's schedule when its step comes, then refill optimizer and wrapper."""
        if self.schedule is not None and self.schedule.update(self.step, self.audit):
            self.sync_trainable()

    def sync_trainable(self) -> None:
        """Refill the optimizer and rewrap the model with the parameters that now train."""
        sync_optimizer(self.optimizer, self.model, self.cfg.weight_decay, self.cfg.layer_lr_decay)
        self._wrap_trainable()

    def _restore(self, path) -> None:
        """Resume from checkpoint `path` (training/resume.py checks it and restores every part)."""
        resumed = restore(path, self, lr_factor)
        self.step, self.tokens_seen = resumed.step, resumed.tokens_seen
        self.best_val_loss, self.best_step = resumed.best_val_loss, resumed.best_step
        self.best_score = resumed.best_score
        self.metrics_offset = resumed.metrics_offset
        self.timer = StepTimer(self.device, resumed.step_times)
        self.eval_times = resumed.eval_times
        self.prior_wall = resumed.wall_time
        self.last_lr = self.scheduler.get_last_lr()[0]

    def _open_logs(self) -> None:
        main = self.dist.is_main
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", self.metrics_offset, enabled=main)
        resumed = self.plan.resume_from is not None
        tb_dir = self.run_dir / "tb" if main and self.cfg.tensorboard else None
        self.tb = TensorBoard(tb_dir, purge_step=self.step + 1 if resumed else None)
        if main and self.cfg.wandb:
            self.tb = FanOut(
                self.tb, WandbLogger(self.run_dir, self.cfg.model_dump(mode="json"), self.cfg.wandb_project)
            )
        if main:
            atomic_write_json(self.run_dir / "freeze_audit.json", {"start": self.audit.to_dict(), "end": None})

    # ---- training ----------------------------------------------------------------------------
    def _loop(self) -> None:
        cfg = self.cfg
        bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            disable=not (self.dist.is_main and cfg.progress),
            desc=f"{cfg.method} s{cfg.seed}",
            dynamic_ncols=True,
            mininterval=1.0,
        )
        with bar, self.strategy.stop_signals() as stop:
            while self.step < cfg.steps:
                self._schedule_step()
                with self._out_of_memory_is_clear("training"):
                    loss, tokens = self._train_step()
                self.last_loss = loss
                self.step += 1
                self.tokens_seen += tokens
                last = self.step == cfg.steps
                log_due = self.step % cfg.log_every == 0 or last
                stopping = stop.agreed(log_due)  # on the last step too: the run then stops before _finish
                if log_due or self.step == 1 or stopping:
                    self._log_train(loss, tokens, bar)
                if (cfg.eval_every and self.step % cfg.eval_every == 0) or last:
                    # Non-finite weights must never be evaluated into best/ (a NaN classifier's
                    # argmax can still score the majority class).
                    self._stop_if_diverged(self._mean_loss())
                    with self._out_of_memory_is_clear("evaluation"):
                        self._evaluate()
                if (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) or last or stopping:
                    self._checkpoint()
                bar.update(1)
                if stopping:
                    raise stop.stopped(stopping, self.step, cfg.steps, self.run_dir)

    @contextmanager
    def _out_of_memory_is_clear(self, phase: str) -> Iterator[None]:
        """Turn an out-of-memory error into one line naming the sizes to lower."""
        try:
            yield
        except (OutOfMemoryError, RuntimeError) as err:
            text = str(err)
            if not isinstance(err, OutOfMemoryError) and not any(m in text for m in CPU_OOM_MESSAGES):
                raise
            cfg = self.cfg
            latest = ckpt.latest_checkpoint(self.ckpt_root)
            kept = f"; the last checkpoint {latest.name} is intact (--resume after the change)" if latest else ""
            raise UserError(
                f"out of memory during {phase} at step {self.step + (phase == 'training')} on {self.device} "
                f"(batch_size {cfg.batch_size} x seq_len {cfg.seq_len or 'block_size'}, grad_accum {cfg.grad_accum}); "
                "lower --batch-size and raise --grad-accum to keep the global batch, or lower --seq-len"
                + (" / --eval-batches" if phase == "evaluation" else "")
                + kept
            ) from None

    def _autocast(self):
        if self.amp is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp)

    def _train_step(self) -> tuple[torch.Tensor, int]:
        """One optimizer step over grad_accum micro-batches; returns (mean loss, global tokens)."""
        accum = self.cfg.grad_accum
        batches = [self.task.next_batch() for _ in range(accum)]  # data loading is not timed
        with self.strategy.train_step():
            self.timer.start()
            # The loss stays on the device (read only at log intervals): no host sync inside a step.
            total: torch.Tensor | None = None
            for i, batch in enumerate(batches):
                # Gradients are synchronised over ranks on the last micro-batch only.
                with self.strategy.micro_batch(i, accum):
                    with self._autocast():
                        loss = self.task.loss(self.train_model, batch)
                    self.scaler.scale(loss / accum).backward()
                total = loss.detach() if total is None else total + loss.detach()
            if self.cfg.clip > 0:
                self.scaler.unscale_(self.optimizer)
                self.strategy.clip(self.params, self.cfg.clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.last_lr = self.scheduler.get_last_lr()[0]
            self.scheduler.step()
            self.timer.stop()
        tokens = sum(self.task.batch_tokens(b) for b in batches) * self.dist.world
        return (total / accum if accum > 1 else total), tokens

    def _mean_loss(self) -> float:
        """The latest step's loss averaged over ranks (a host sync: only at eval and checkpoint)."""
        return all_reduce_sum([float(self.last_loss)], self.dist, self.device)[0] / self.dist.world

    def _stop_if_diverged(self, loss: float) -> None:
        """A non-finite training loss ends the run here: recorded in results.json, never checkpointed."""
        if math.isfinite(loss):
            return
        latest = ckpt.latest_checkpoint(self.ckpt_root)
        kept = f"the last checkpoint, {latest.name}, predates it" if latest else "no checkpoint was written"
        message = (
            f"training loss became {loss} at step {self.step} (lr {self.last_lr:.3g}): the run stopped and "
            f"{RESULTS_FILE} records it as diverged; {kept}. Lower --lr (or raise --warmup / set --clip)"
        )
        if self.dist.is_main:
            record = {
                "schema_version": SCHEMA_VERSION,
                "status": DIVERGED,
                "task": self.cfg.task,
                "method": self.cfg.method,
                "model": self.cfg.model,
                "seed": self.cfg.seed,
                "lr": self.cfg.lr,
                "steps": self.cfg.steps,
                "diverged_at_step": self.step,
                "diverged_loss": str(loss),
                "last_checkpoint": latest.name if latest else None,
                "message": message,
            }
            atomic_write_json(self.run_dir / RESULTS_FILE, record)
        raise Diverged(message)

    def _log_train(self, loss_t: torch.Tensor, tokens: int, bar: tqdm) -> None:
        loss = all_reduce_sum([float(loss_t)], self.dist, self.device)[0] / self.dist.world
        step_time = self.timer.last()
        record = {
            "kind": "train",
            "step": self.step,
            "loss": loss,
            "lr": self.last_lr,
            "tokens": self.tokens_seen,
            "step_time": step_time,
        }
        self.metrics.write(record)
        self._stop_if_diverged(loss)
        self.tb.scalars("train", {"loss": loss, "lr": self.last_lr, "step_time": step_time}, self.step)
        recent = self.timer.times[-20:]
        tok_s = tokens * len(recent) / sum(recent) if recent else float("nan")
        bar.set_postfix({**self.task.progress_fields(loss), "tok/s": f"{tok_s:,.0f}"}, refresh=False)

    def _evaluate(self) -> None:
        metrics, seconds = self._run_eval("val", final=False)
        self.eval_times.append(seconds)
        record = {"kind": "eval", "step": self.step, "split": "val"}
        record.update({k: v for k, v in metrics.items() if k != "tokens"})
        self.metrics.write(record)
        self.tb.scalars("val", record, self.step)
        score = self.task.selection_score(metrics)
        best = score < self.best_score
        if best:
            self.best_score = score
            self.best_val_loss, self.best_step = metrics["loss"], self.step
            self.strategy.save_best(self.ckpt_root, self.model, {**self._weights_meta(), "val_loss": metrics["loss"]})
        if self.dist.is_main and self.cfg.progress:  # above the bar, as each evaluation comes
            tqdm.write(eval_line(self.step, self.cfg.steps, metrics, best), file=sys.stderr)

    def _run_eval(self, split: str, final: bool) -> tuple[dict[str, float], float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # eval is timed apart from training steps
        start = time.perf_counter()
        self.model.eval()
        with torch.no_grad(), self._autocast(), self.strategy.evaluation(self.model):
            metrics = self.task.evaluate(self.eval_model, split, final)
        self.model.train()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return metrics, time.perf_counter() - start

    def _weights_meta(self) -> dict[str, Any]:
        return {
            **self.task.model_metadata(),
            **ckpt.method_record(self.model),
            "task": self.cfg.task,
            "seed": self.cfg.seed,
            "step": self.step,
        }

    def _wall_time(self) -> float:
        return self.prior_wall + time.perf_counter() - self.session_start

    def _checkpoint(self) -> None:
        # Between log lines a loss may have become non-finite: such weights are never checkpointed.
        self._stop_if_diverged(self._mean_loss())
        self.strategy.save_checkpoint(
            self.ckpt_root,
            self.step,
            self.model,
            self.optimizer,
            self._checkpoint_state,
            self._weights_meta,
            self.cfg.keep_last,
            last=self.step == self.cfg.steps,
        )
        barrier(self.dist)

    def _checkpoint_state(self, optimizer: dict[str, Any] | None) -> dict[str, Any]:
        """state.pt: everything but the weights (and, under FSDP, the optimizer: sharded in dcp/).

        Called on rank 0 only (by the strategy)."""
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": ckpt.rng_state(),
            "data": self.task.state_dict(),
            "best_val_loss": self.best_val_loss,
            "best_step": self.best_step,
            "best_score": self.best_score,
            "metrics_offset": self.metrics.offset(),
            "step_times": self.timer.resolve(),
            "eval_times": self.eval_times,
            "wall_time": self._wall_time(),
            "config": self.cfg.identity(),
            "method_schedule": self.schedule.state_dict() if self.schedule is not None else None,
            "determinism": determinism_facts(self.device),
            "world_size": self.dist.world,
            "global_batch": self.cfg.batch_size * self.cfg.grad_accum * self.dist.world,
            "strategy": self.cfg.strategy,
        }

    # ---- end of run --------------------------------------------------------------------------
    def _verify_freezing(self) -> AuditCheck:
        """The freeze check on the trained weights, then on best/ loaded for evaluation.

        The trained weights show the freeze held through training (optimizer included); best/
        shows the evaluated weights are consistent with it. A late-frozen tensor is checked on best/
        only when best/ was saved after its freeze: before it, that tensor was still training.
        """
        trained = verify_audit(self.model, self.audit, optimizer=self.optimizer)
        load_best(self)  # best/ checked to hold this run's best step (resume.py)
        if self.best_step is None:
            return trained
        early = self.schedule.frozen_after(self.best_step) if self.schedule is not None else set()
        best = verify_audit(self.model, self.audit, skip=early)
        extra = [f"best/ (step {self.best_step}): {p}" for p in best.problems if p not in trained.problems]
        notes = []
        if early:
            notes.append(
                f"best/ is step {self.best_step}, not after the late freeze (before optimizer step "
                f"{self.schedule.at_step + 1}): its {len(early)} late-frozen tensors are from their "
                "trainable phase, checked on the final weights only"
            )
        problems = trained.problems + extra
        return AuditCheck(not problems, problems, trained.n_frozen_checked, notes)

    def _per_step(self, counted: int | None) -> float | None:
        """Bytes counted this session per optimizer step (None: not counted: one process)."""
        steps = self.step - self.session_first_step
        return counted / steps if counted is not None and steps > 0 else None

    def _finish(self) -> dict[str, Any]:
        barrier(self.dist)  # rank 0 has written best/ before anyone reads it
        check = self._verify_freezing()
        val, _ = self._run_eval("val", final=True)
        test = self._run_eval("test", final=True)[0] if self.task.has_split("test") else None
        # The test metric per item (LM window, example), in a fixed order shared by every arm:
        # reports pair two runs item by item.
        items = test.pop("items", None) if test else None
        mem, mem_kind = self.memory.read()
        comm = self.strategy.comm_bytes()
        facts = RunFacts(
            cfg=self.cfg,
            steps=self.step,
            tokens_seen=self.tokens_seen,
            best_val_loss=self.best_val_loss,
            best_step=self.best_step,
            wall_time=self._wall_time(),
            step_times=self.timer.resolve(),
            cuda_timer=self.timer.cuda,
            eval_times=list(self.eval_times),
            world=self.dist.world,
            device=self.device,
            amp=self.amp,
            dataset=self.task.dataset_name(),
            audit_totals=self.audit.totals,
            method_options=dict(self.audit.options),
            flops_per_step=self.task.flops_per_step(self.model),
            flops_saving=self.task.flops_saving(self.model),
            peak_memory=mem,
            memory_kind=mem_kind,
            gradient_bytes=sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad),
            data_fingerprint=self.task.model_metadata().get("data_fingerprint"),
            allreduce_bytes_per_step=self._per_step(comm["all_reduce"]),
            allgather_bytes_per_step=self._per_step(comm["all_gather"]),
            reduce_scatter_bytes_per_step=self._per_step(comm["reduce_scatter"]),
            task_results=self.task.results(val, test),
            result_aliases=self.task.result_aliases(),
        )
        timing = build_timing(facts)
        results = build_results(facts, check.to_dict(), timing)
        if self.dist.is_main:
            atomic_write_json(self.run_dir / "timing_stats.json", timing)
            if items is not None:
                atomic_write_json(
                    self.run_dir / TEST_ITEMS_FILE, {**items, "values": [round(x, 6) for x in items["values"]]}
                )
            atomic_write_json(
                self.run_dir / "freeze_audit.json", {"start": self.audit.to_dict(), "end": check.to_dict()}
            )
            atomic_write_json(self.run_dir / RESULTS_FILE, results)  # last: marks the run complete
        barrier(self.dist)
        return results
