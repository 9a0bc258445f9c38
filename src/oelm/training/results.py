"""Assemble results.json and timing_stats.json of a finished run.

results.json's keys are defined once, in records.run (RunResults, read by every report);
docs/architecture.md describes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from oelm.core.flops import device_peak_flops, peak_flops_note
from oelm.records.run import COMPLETE, SCHEMA_VERSION, CommonResults, RunResults
from oelm.training.config import TrainConfig, identity_digest
from oelm.training.runlog import git_commit
from oelm.training.timing import mfu_fields, summarize


def device_name(device: torch.device) -> str:
    """A readable device description, e.g. 'cuda:0 (NVIDIA H100 80GB HBM3)' or 'cpu'."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


@dataclass
class RunFacts:
    """Plain values of a finished run, which results.json and timing_stats.json are built from."""

    cfg: TrainConfig
    steps: int
    tokens_seen: int
    best_val_loss: float
    best_step: int | None
    wall_time: float
    step_times: list[float]
    cuda_timer: bool
    eval_times: list[float]
    world: int
    device: torch.device
    amp: torch.dtype | None
    dataset: str
    audit_totals: dict[str, Any]
    method_options: dict[str, Any]  # validated, defaults filled in
    flops_per_step: float | None
    flops_saving: Any
    peak_memory: int | None
    memory_kind: str
    # Gradient bytes of the trainable tensors: what data parallelism all-reduces per step (frozen
    # tensors have no gradient, so none of theirs); and the bytes DDP's hook counted (None alone).
    gradient_bytes: int | None = None
    allreduce_bytes_per_step: float | None = None
    # --strategy fsdp: bytes FSDP2 all-gathered (parameters, forward and backward) and reduce-scattered
    # (gradients) per step, as counted by its custom-comm hooks (None without FSDP2 or one process).
    allgather_bytes_per_step: float | None = None
    reduce_scatter_bytes_per_step: float | None = None
    data_fingerprint: str | None = None  # of the prepared data or the examples read (None: not known)
    task_results: dict[str, Any] = field(default_factory=dict)  # the task's keys (of the best checkpoint)
    result_aliases: dict[str, str] = field(default_factory=dict)


def build_timing(tr: RunFacts) -> dict[str, Any]:
    """Step-time statistics (warm-up excluded, data loading excluded), eval time, throughput, MFU."""

    cfg = tr.cfg
    stats = summarize(tr.step_times, cfg.timing_warmup)
    tokens_per_step = tr.tokens_seen / tr.steps if tr.steps else 0
    mean = stats.get("mean")
    flops = tr.flops_per_step
    peak = device_peak_flops(tr.device, tr.amp)  # tr.amp None: float32 compute
    return {
        "step_time": stats,
        "timer": "cuda_events" if tr.cuda_timer else "perf_counter",
        "data_loading": "excluded",
        "tokens_per_step": tokens_per_step,
        "tokens_per_second": tokens_per_step / mean if mean else None,
        "tokens_per_second_median": tokens_per_step / stats["median"] if mean else None,
        "eval": {
            "count": len(tr.eval_times),
            "total_seconds": sum(tr.eval_times),
            "mean_seconds": sum(tr.eval_times) / len(tr.eval_times) if tr.eval_times else None,
        },
        "flops_per_step": flops,
        "theoretical_flops_saving": tr.flops_saving,
        "gradient_bytes_per_step": tr.gradient_bytes,
        "allreduce_bytes_per_step": tr.allreduce_bytes_per_step,
        "allgather_bytes_per_step": tr.allgather_bytes_per_step,
        "reduce_scatter_bytes_per_step": tr.reduce_scatter_bytes_per_step,
        **mfu_fields(flops, stats, peak, peak_flops_note(tr.device, tr.amp)),
        "compute_dtype": str(tr.amp).removeprefix("torch.") if tr.amp else "float32",
        "compiled": cfg.compile,
        "compile_mode": cfg.compile_mode,
        "world_size": tr.world,
        "device": device_name(tr.device),
        "peak_memory_bytes": tr.peak_memory,
        "memory_kind": tr.memory_kind,
    }


def build_results(tr: RunFacts, freeze_check: dict[str, Any], timing: dict[str, Any]) -> RunResults:
    """results.json: the common keys (records.CommonResults, in its order), then the task's keys."""
    cfg = tr.cfg
    totals = tr.audit_totals
    stats = timing["step_time"]
    common: CommonResults = {
        "schema_version": SCHEMA_VERSION,
        "status": COMPLETE,
        "task": cfg.task,
        "method": cfg.method,
        "method_options": tr.method_options,
        "model": cfg.model,
        "dataset": tr.dataset,
        "seed": cfg.seed,
        "lr": cfg.lr,
        "steps": tr.steps,
        "tokens_seen": tr.tokens_seen,
        "best_val_loss": tr.best_val_loss,
        "best_step": tr.best_step,
        "total_wall_time": tr.wall_time,
        "mean_step_time": stats.get("mean"),
        "median_step_time": stats.get("median"),
        "tokens_per_second": timing["tokens_per_second"],
        "peak_memory_bytes": timing["peak_memory_bytes"],
        "trainable_params": totals.get("trainable"),
        "frozen_params": totals.get("frozen"),
        "freeze_check": freeze_check,
        "git_commit": git_commit(),
        "device": timing["device"],
        "world_size": tr.world,
        "global_batch_size": cfg.batch_size * cfg.grad_accum * tr.world,
        "data_fingerprint": tr.data_fingerprint,
    }
    out: dict[str, Any] = {**common, **tr.task_results}
    # The digest of RUN/config.yaml as written: a resume refuses the file once edited.
    out["config_identity_sha256"] = identity_digest(cfg.identity())
    out.update({alias: out.get(key) for alias, key in tr.result_aliases.items()})
    # Named, not only nulled by the JSON writer: a report says so instead of dropping the run's value.
    non_finite = sorted(k for k, v in out.items() if isinstance(v, float) and not math.isfinite(v))
    if non_finite:
        out["non_finite"] = non_finite
    return cast(RunResults, out)
