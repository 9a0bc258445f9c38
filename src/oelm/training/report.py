"""Assemble results.json and timing_stats.json of a finished run (schema in docs/architecture.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from oelm.training.runlog import git_commit
from oelm.training.timing import mfu_fields, summarize

if TYPE_CHECKING:
    from oelm.training.loop import Trainer

SCHEMA_VERSION = 1


def device_name(device: torch.device) -> str:
    """A readable device description, e.g. 'cuda:0 (NVIDIA H100 80GB HBM3)' or 'cpu'."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def build_timing(tr: Trainer, peak_mem: int | None, mem_kind: str) -> dict[str, Any]:
    """Step-time statistics (warm-up excluded, data loading excluded), eval time, throughput, MFU."""
    from oelm.flops import device_peak_flops

    cfg = tr.cfg
    stats = summarize(tr.timer.resolve(), cfg.timing_warmup)
    tokens_per_step = tr.tokens_seen / tr.step if tr.step else 0
    mean = stats.get("mean")
    flops = tr.task.flops_per_step(tr.model)
    peak = device_peak_flops(tr.device)
    return {
        "step_time": stats,
        "timer": "cuda_events" if tr.timer.cuda else "perf_counter",
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
        "theoretical_flops_saving": tr.task.flops_saving(tr.model),
        **mfu_fields(flops, stats, peak),
        "compute_dtype": str(tr.amp).removeprefix("torch.") if tr.amp else "float32",
        "compiled": cfg.compile,
        "compile_mode": cfg.compile_mode,
        "world_size": tr.dist.world,
        "device": device_name(tr.device),
        "peak_memory_bytes": peak_mem,
        "memory_kind": mem_kind,
    }


def build_results(
    tr: Trainer,
    val: dict[str, float],
    test: dict[str, float] | None,
    freeze_check: dict[str, Any],
    timing: dict[str, Any],
) -> dict[str, Any]:
    """results.json: the common keys, then the task's keys (of the best checkpoint)."""
    cfg = tr.cfg
    totals = tr.audit.totals
    stats = timing["step_time"]
    common = {
        "schema_version": SCHEMA_VERSION,
        "status": "complete",
        "task": cfg.task,
        "method": cfg.method,
        "model_type": cfg.method,
        "model": cfg.model,
        "dataset": tr.task.dataset_name(),
        "seed": cfg.seed,
        "lr": cfg.lr,
        "steps": tr.step,
        "tokens_seen": tr.tokens_seen,
        "best_val_loss": tr.best_val_loss,
        "best_step": tr.best_step,
        "total_wall_time": tr._wall_time(),
        "mean_step_time": stats.get("mean"),
        "median_step_time": stats.get("median"),
        "tokens_per_second": timing["tokens_per_second"],
        "peak_memory_bytes": timing["peak_memory_bytes"],
        "trainable_params": totals.get("trainable"),
        "frozen_params": totals.get("frozen"),
        "freeze_check": freeze_check,
        "git_commit": git_commit(),
        "device": timing["device"],
        "world_size": tr.dist.world,
        "global_batch_size": cfg.batch_size * cfg.grad_accum * tr.dist.world,
    }
    out = {**common, **tr.task.results(val, test)}
    out.update({alias: out.get(key) for alias, key in tr.task.result_aliases().items()})
    return out
