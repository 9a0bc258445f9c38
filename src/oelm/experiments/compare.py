"""`oelm compare`: the quickstart: tiny GPTs under baseline / oelm-freeze / oelm-random, fairly."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oelm.experiments.runner import SweepOutcome, run_sweep
from oelm.experiments.sweep import spec_from_dict

DEFAULT_METHODS = ("baseline", "oelm-freeze", "oelm-random")
DEFAULT_LRS = (3e-4, 1e-3, 3e-3)
DEFAULT_OUT = "runs/compare"


def compare_spec(
    out: str | Path = DEFAULT_OUT,
    data: str = "builtin:python-docs",
    tokenizer: str = "byte",
    model: str = "gpt-tiny",
    methods: Sequence[str] = DEFAULT_METHODS,
    seeds: Sequence[int] = (0, 1, 2),
    steps: int = 100,
    lrs: Sequence[float] = DEFAULT_LRS,
    batch_size: int = 8,
    seq_len: int = 128,
    device: str = "cpu",
) -> dict[str, Any]:
    """The sweep spec of the quickstart: same budget and LR grid for every method."""
    out = Path(out)
    data_dir = out / "data"
    return {
        "name": "compare",
        "out": out.as_posix(),
        # A seeded test hold-out (for sources without one): LRs are chosen on validation and
        # perplexity is reported on documents no choice has seen.
        "prepare": {"source": data, "tokenizer": tokenizer, "test_fraction": 0.05},
        "config": {
            "task": "lm", "data": data_dir.as_posix(), "model": model, "steps": steps,
            "batch_size": batch_size, "seq_len": seq_len, "warmup": max(1, steps // 10),
            "eval_every": max(1, steps // 4), "eval_batches": 8, "final_eval_batches": 16,
            "checkpoint_every": 0, "device": device, "tensorboard": False, "log_every": 10,
        },
        "methods": {m: {"lr": [float(x) for x in lrs]} for m in methods},
        "seeds": [int(s) for s in seeds],
    }


def default_parallel(device: str = "cpu") -> tuple[int, int | None]:
    """(runs at once, threads per run): on CPU one thread per run, up to 4 runs at once.

    A tiny GPT gains little from a second intra-op thread, while several threaded runs on a
    shared machine oversubscribe its cores and slow every step several-fold.
    """
    if device != "cpu":
        return 1, None
    return max(1, min(4, os.cpu_count() or 1)), 1


def run_compare(progress: bool = True, parallel: int | None = None, threads: int | None = None,
                **kwargs: Any) -> SweepOutcome:
    """Prepare the data into OUT/data, train every arm with equal budgets, write OUT/report."""
    from oelm.errors import UserError

    if (parallel is not None and parallel < 1) or (threads is not None and threads < 1):
        raise UserError(f"--parallel and --threads must be at least 1, got {parallel} and {threads}")
    spec = spec_from_dict(compare_spec(**kwargs))
    auto_parallel, auto_threads = default_parallel(kwargs.get("device", "cpu"))
    return run_sweep(spec, parallel=parallel or auto_parallel, progress=progress,
                     threads=threads or auto_threads)
