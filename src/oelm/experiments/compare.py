"""`oelm compare`: the quickstart: GPTs under each method, fairly, in a regime stored as a preset.

A preset (`presets/<name>.yaml` in this package, or any YAML file) holds the whole regime: data,
tokenizer, hold-out fractions, model, budget, per-method LR grids, seeds. Changing the regime
means editing that file; nothing here hard-codes it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from oelm.experiments.executors import ExecutorSpec
from oelm.experiments.presets import PRESET_DIR, preset_names
from oelm.experiments.resolve import read_file
from oelm.experiments.runner import LOCAL, SweepOutcome, run_sweep
from oelm.experiments.sweep import confirm_command, spec_from_dict
from oelm.records.sweep import MAX_EXTEND
from oelm.reports.reading import reading_lines
from oelm.training.config import format_validation
from oelm.utils.errors import UserError

DEFAULT_OUT = "runs/compare"


class ArmGrid(BaseModel):
    """One method's learning-rate grid."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    lr: list[float] = Field(min_length=1)


class ComparePreset(BaseModel):
    """A quickstart regime: everything `oelm compare` trains and how."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str = ""
    description: str = ""
    data: str
    tokenizer: str
    val_fraction: float = Field(default=0.05, gt=0, lt=1)
    test_fraction: float = Field(gt=0, lt=1)
    split_seed: int = 0
    max_docs: int | None = Field(default=None, gt=0)
    model: str
    steps: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    warmup_fraction: float = Field(default=0.1, ge=0, lt=1)  # of steps, so --steps keeps the shape
    evals: int = Field(default=4, gt=0)  # periodic validation evaluations per run
    eval_batches: int = Field(default=64, gt=0)
    # LRs added beyond an edge where an arm's validation choice sits, per side (0: never; see sweeps).
    max_extend: int = Field(default=MAX_EXTEND, ge=0)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    seeds: list[int] = Field(min_length=1)
    methods: dict[str, ArmGrid] = Field(min_length=1)


def load_preset(name: str | Path) -> ComparePreset:
    """A shipped preset by name, or a preset YAML file by path; UserError naming the problem."""

    path = Path(name)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = PRESET_DIR / f"{name}.yaml"
        if not path.is_file():
            raise UserError(
                f"unknown compare preset {str(name)!r}; choose one of "
                f"{', '.join(preset_names())} or pass a preset YAML file"
            )
    raw = read_file(path)
    try:
        return ComparePreset(**{"name": path.stem, **raw})
    except (ValidationError, TypeError) as err:
        raise UserError(
            format_validation(err, f"compare preset {path}")
            if isinstance(err, ValidationError)
            else f"compare preset {path} is not valid: {err}"
        ) from None


def apply_overrides(
    preset: ComparePreset, methods: Sequence[str] | None = None, lrs: Sequence[float] | None = None, **fields: Any
) -> ComparePreset:
    """The preset with command-line values (None = keep) replacing its own."""
    data = preset.model_dump()
    data.update({k: v for k, v in fields.items() if v is not None})
    grids = data["methods"]
    if methods:
        missing = [m for m in methods if m not in grids and not lrs]
        if missing:
            raise UserError(
                f"preset {preset.name!r} has no LR grid for {missing}; add --lrs or pick from {sorted(grids)}"
            )
        grids = {m: grids.get(m, {"lr": list(lrs or [])}) for m in methods}
    if lrs:
        grids = {m: {"lr": [float(x) for x in lrs]} for m in grids}
    data["methods"] = grids
    try:
        return ComparePreset(**data)
    except ValidationError as err:
        raise UserError(format_validation(err, "compare options")) from None


def compare_spec(preset: ComparePreset, out: str | Path = DEFAULT_OUT) -> dict[str, Any]:
    """The sweep spec of a preset: the same budget for every method, each with its own LR grid."""
    out = Path(out)
    p = preset
    return {
        "name": f"compare-{p.name}" if p.name else "compare",
        "out": out.as_posix(),
        # Seeded validation and test hold-outs (for sources without them): LRs are chosen on
        # validation and perplexity is reported on documents no choice has seen.
        "prepare": {
            "source": p.data,
            "tokenizer": p.tokenizer,
            "val_fraction": p.val_fraction,
            "test_fraction": p.test_fraction,
            "seed": p.split_seed,
            **({"max_docs": p.max_docs} if p.max_docs else {}),
        },
        "config": {
            "task": "lm",
            "data": (out / "data").as_posix(),
            "model": p.model,
            "steps": p.steps,
            "batch_size": p.batch_size,
            "seq_len": p.seq_len,
            "warmup": max(1, round(p.warmup_fraction * p.steps)),
            "eval_every": max(1, p.steps // p.evals),
            "eval_batches": p.eval_batches,
            "final_eval_batches": None,
            "checkpoint_every": 0,
            "device": p.device,
            "dtype": p.dtype,
            "tensorboard": False,
            "log_every": 10,
            "progress": False,
        },
        "methods": {m: {"lr": list(grid.lr)} for m, grid in p.methods.items()},
        "seeds": list(p.seeds),
        "max_extend": p.max_extend,
    }


def default_out(preset: ComparePreset) -> Path:
    """runs/compare/<preset>: presets never share (and so never clash in) one sweep directory."""
    return Path(DEFAULT_OUT) / (preset.name or "custom")


def extend_command(preset: ComparePreset, out: Path | None) -> str:
    """The `oelm confirm plan` call that checks this comparison on fresh seeds ({seeds} filled in later),
    on the folder `run_compare` writes (`out`, else `default_out`: a preset file's `name`, not its stem).

    The comparison's own seeds chose every arm's LR: its verdicts are pilot results.
    """
    return confirm_command(out or default_out(preset))


def default_parallel(device: str = "cpu") -> tuple[int, int | None]:
    """(runs at once, threads per run): on CPU one thread per run, up to 4 runs at once.

    A tiny GPT gains little from a second intra-op thread, while several threaded runs on a
    shared machine oversubscribe its cores and slow every step several-fold.
    """
    if device != "cpu":
        return 1, None
    return max(1, min(4, os.cpu_count() or 1)), 1


def run_compare(
    preset: ComparePreset,
    out: str | Path | None = None,
    progress: bool = True,
    parallel: int | None = None,
    threads: int | None = None,
    extend: str | None = None,
    executor: ExecutorSpec = LOCAL,
) -> SweepOutcome:
    """Prepare the data into OUT/data, train every arm with equal budgets, write OUT/report.

    report.md ends with the plain-language reading (see `oelm.reports.reading`).
    """

    if (parallel is not None and parallel < 1) or (threads is not None and threads < 1):
        raise UserError(f"--parallel and --threads must be at least 1, got {parallel} and {threads}")

    out_dir = Path(out) if out else default_out(preset)
    spec = spec_from_dict(compare_spec(preset, out_dir))
    if extend:
        spec.extend = extend
    auto_parallel, auto_threads = default_parallel(preset.device)
    return run_sweep(
        spec,
        parallel=parallel or auto_parallel,
        progress=progress,
        threads=threads or auto_threads,
        epilogue=reading_lines,
        executor=executor,
    )
