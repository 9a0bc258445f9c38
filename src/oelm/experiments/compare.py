"""`oelm compare`: the quickstart: GPTs under each method, fairly, in a regime stored as a preset.

A preset (`presets/<name>.yaml` in this package, or any sweep spec file) is a sweep spec holding
the whole regime: data recipe, model, budget, per-method LR grids, seeds. Changing the regime
means editing that file; nothing here hard-codes it. The command's flags are edits of that
mapping (`preset_spec`), which the one sweep-spec parser (experiments.sweep.load_spec) then reads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oelm.experiments.executors import ExecutorSpec
from oelm.experiments.presets import PRESET_DIR, preset_names
from oelm.experiments.resolve import read_file
from oelm.experiments.runner import LOCAL, SweepOutcome, run_sweep
from oelm.experiments.sweep import SweepSpec, load_spec
from oelm.reports.reading import reading_lines
from oelm.training.config import apply_dotted
from oelm.utils.errors import UserError

DEFAULT_OUT = "runs/compare"
# The flags that set one field of the spec (dotted; `config.` is the spec's inline base config).
FLAG_FIELDS = {
    "data": "prepare.source",
    "tokenizer": "prepare.tokenizer",
    "model": "config.model",
    "steps": "config.steps",
    "batch_size": "config.batch_size",
    "seq_len": "config.seq_len",
    "device": "config.device",
    "seeds": "seeds",
}


def preset_path(name: str | Path) -> Path:
    """A shipped preset's file by name, or a sweep spec file by path; UserError naming the choices."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UserError(
            f"unknown compare preset {str(name)!r}; choose one of {', '.join(preset_names())} or pass a sweep spec file"
        )
    return path


def preset_spec(
    preset: str | Path,
    out: str | Path | None = None,
    methods: Sequence[str] | None = None,
    lrs: Sequence[float] | None = None,
    **flags: Any,
) -> dict[str, Any]:
    """The sweep spec mapping of a preset with the command line's values (None = keep) set in it.

    `flags` are FLAG_FIELDS' keys, each set by the one dotted setter; `--steps` keeps the preset's
    warmup and evaluation count as fractions of the steps. `methods` keeps those arms (a new one
    needs `lrs`); `lrs` replaces every arm's grid. `out` (default: the spec's, else
    runs/compare/<name>) moves a `config.data` inside the spec's folder along with it.
    """
    path = preset_path(preset)
    raw = read_file(path)
    section = "overrides" if "base" in raw else "config"  # where a spec states its config fields
    config = raw.get(section) if isinstance(raw.get(section), dict) else {}
    steps, before = flags.get("steps"), config.get("steps")
    if steps is not None and isinstance(before, int) and before > 0:
        if isinstance(config.get("warmup"), int) and config["warmup"] > 0:
            flags["warmup"] = max(1, round(config["warmup"] / before * steps))
        if isinstance(config.get("eval_every"), int) and config["eval_every"] > 0:
            flags["eval_every"] = max(1, steps // max(1, before // config["eval_every"]))
    dotted = {FLAG_FIELDS.get(k, f"config.{k}").replace("config.", f"{section}.", 1): v for k, v in flags.items()}
    raw = apply_dotted(raw, dotted)
    if methods or lrs:
        grids = raw.get("methods")  # a mapping, or a list of names (the sweep parser refuses the rest)
        grids = {m: {} for m in grids} if isinstance(grids, list) else grids if isinstance(grids, dict) else {}
        missing = [m for m in methods or () if m not in grids and not lrs]
        if missing:
            raise UserError(
                f"preset {str(preset)!r} has no LR grid for {missing}; add --lrs or pick from {sorted(grids)}"
            )
        arms = {m: grids[m] if isinstance(grids.get(m), dict) else {} for m in methods or grids}
        raw["methods"] = {m: {**arm, "lr": [float(x) for x in lrs]} if lrs else arm for m, arm in arms.items()}
    spec_out = Path(raw.get("out") or Path(DEFAULT_OUT) / str(raw.get("name") or path.stem))
    new_out = Path(out) if out else spec_out
    config = raw.get(section)
    data = config.get("data") if isinstance(config, dict) else None
    if isinstance(data, str) and Path(data).is_relative_to(spec_out):
        raw[section]["data"] = (new_out / Path(data).relative_to(spec_out)).as_posix()
    raw["out"] = new_out.as_posix()
    return raw


def load_compare(preset: str | Path, **flags: Any) -> SweepSpec:
    """The sweep `oelm compare --preset PRESET FLAGS` runs (flags as in `preset_spec`), validated by
    the sweep parser; its `extend` quotes `oelm confirm plan` on the folder the runs go to."""
    return load_spec(preset_path(preset), raw=preset_spec(preset, **flags))


def default_parallel(device: str = "cpu") -> tuple[int, int | None]:
    """(runs at once, threads per run): on CPU one thread per run, up to 4 runs at once.

    A tiny GPT gains little from a second intra-op thread, while several threaded runs on a
    shared machine oversubscribe its cores and slow every step several-fold.
    """
    if device != "cpu":
        return 1, None
    return max(1, min(4, os.cpu_count() or 1)), 1


def run_compare(
    spec: SweepSpec,
    progress: bool = True,
    parallel: int | None = None,
    threads: int | None = None,
    executor: ExecutorSpec = LOCAL,
) -> SweepOutcome:
    """Prepare the data into OUT/data, train every arm with equal budgets, write OUT/report.

    report.md ends with the plain-language reading (see `oelm.reports.reading`).
    """

    if (parallel is not None and parallel < 1) or (threads is not None and threads < 1):
        raise UserError(f"--parallel and --threads must be at least 1, got {parallel} and {threads}")
    auto_parallel, auto_threads = default_parallel(str(spec.base.get("device", "auto")))
    return run_sweep(
        spec,
        parallel=parallel or auto_parallel,
        progress=progress,
        threads=threads or auto_threads,
        epilogue=reading_lines,
        executor=executor,
    )
