"""Fair sweeps: methods x seeds x learning rates (x other fields) over one base config, resumable."""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from oelm.core.methods import get_method, validate_method_options
from oelm.experiments.resolve import read_file, resolve_config, resolve_raw, run_raw
from oelm.records.compact import relative_under
from oelm.records.comparable import config_differences
from oelm.records.layout import RUN_RECORD_FILE
from oelm.records.load import load_run
from oelm.records.run import read_results, read_run_config, run_finished
from oelm.records.sweep import BEST_MEAN, PlannedRun, SweepRecord, check_primary, sweep_policy
from oelm.reports.aggregate import chosen_setting
from oelm.utils.errors import UserError

log = logging.getLogger(__name__)

# Fields a sweep sets per run; the spec may not put them in `grid` or `overrides`.
PER_RUN = ("method", "lr", "seed", "out", "resume", "overwrite", "data_seed")
# Fields allowed to differ between the runs of one sweep (everything else is the equal budget).
VARYING = ("method", "lr", "seed", "method_options")
# The fields SweepSpec._run sets on each run: the configs of one grid point's runs differ in no other.
RUN_FIELDS = ("method", "lr", "seed", "out", "resume", "method_options")
SPEC_KEYS = {
    "name",
    "base",
    "scale",
    "config",
    "overrides",
    "methods",
    "seeds",
    "grid",
    "out",
    "study_numbers",
    "baseline",
    "prepare",
    "max_extend",
    "lr_rule",
    "primary",
    "extended",  # written by the sweep (its automatic grid extensions): read back, never set by hand
}


@dataclass
class RunSpec:
    """One run of a sweep: its arm, its directory and its full TrainConfig dict."""

    method: str
    lr: float
    seed: int
    extra: dict[str, Any]
    run_dir: Path
    config: dict[str, Any]

    @property
    def label(self) -> str:
        """Short description for progress lines."""
        extra = "".join(f" {k}={v}" for k, v in self.extra.items())
        return f"{self.method} lr={self.lr:g}{extra} seed={self.seed}"

    def finished(self) -> bool:
        """Whether the run directory holds a finished run (the one rule, records.run.run_finished)."""

        return run_finished(self.run_dir)

    def stored_differences(self) -> list[str]:
        """The fields (dotted) in which the run its directory already holds was trained otherwise
        than this run plans ([] without one). Runtime fields never count (records.comparable), nor a
        field the stored config lacks (written before the field existed)."""
        path = self.run_dir / "config.yaml"
        if not path.is_file():
            if (self.run_dir / RUN_RECORD_FILE).is_file():  # restored from committed records
                return self.differences_from(load_run(self.run_dir).config, recorded=True)
            return []
        return self.differences_from(read_run_config(path))  # an unreadable file is refused, naming it

    def differences_from(self, config: dict[str, Any], recorded: bool = False) -> list[str]:
        """The fields (dotted) in which a run trained with `config` (a run record's) differs from
        this run as planned; the rules of stored_differences. A compact record (`recorded`) keeps
        the paths under its sweep directory relative to it: the plan is read the same way."""
        planned = resolve_config(self.config).identity()
        if recorded:
            sweep_dir = self.run_dir.parents[3]  # SWEEP/runs/<method>/<setting>/seed<N>
            planned = json.loads(relative_under(json.dumps(planned, default=str), sweep_dir))
        return config_differences(planned, config)


@dataclass
class SweepSpec(SweepRecord):
    """A resolved sweep: the sweep record (records.sweep) plus what one invocation runs."""

    # The `oelm confirm plan` call that checks this pilot on fresh seeds ({seeds}: how many), quoted
    # by the report's verdict lines; not part of the sweep's identity.
    extend: str = "oelm confirm plan SWEEP_DIR --seeds {seeds} --out CONFIRM_DIR"
    # `oelm sweep --methods`: train only these arms, in this order. The plan (sweep.yaml, what
    # reports and the leaderboard list as not yet finished) stays the whole spec.
    only: list[str] | None = None
    # The passes over the train split the base config states (`passes:`, experiments.prepare
    # checks the budget against it before any run); not part of the sweep's identity.
    passes: float | None = None
    # The record this invocation last wrote to SWEEP/sweep.yaml (runner._write_spec), handed in
    # memory to the report rather than read back; not part of the sweep's identity.
    record: SweepRecord | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_record(cls, record: SweepRecord) -> SweepSpec:
        """The spec a stored sweep record describes (its directory as `out`)."""
        return cls(**{f.name: getattr(record, f.name) for f in fields(SweepRecord)})

    def runs(self) -> list[RunSpec]:
        """Every run, seed-major so that an interrupted sweep has whole seeds of every arm."""
        return [self._run(p) for p in self.planned()]

    def selected_runs(self) -> list[RunSpec]:
        """The runs this invocation trains: every run, or those of `only`'s arms in its order."""
        runs = self.runs()
        if self.only is None:
            return runs
        order = {m: i for i, m in enumerate(self.only)}
        seeds = {s: i for i, s in enumerate(self.seeds)}
        return sorted((r for r in runs if r.method in order), key=lambda r: (seeds[r.seed], order[r.method]))

    def _run(self, planned: PlannedRun) -> RunSpec:
        """One RunSpec: base + grid values + the arm's fields, in the sweep layout."""
        run_dir = self.run_dir(planned)
        arm = self.methods[planned.method]
        per_run = {"method": planned.method, "lr": planned.lr, "seed": planned.seed, "out": run_dir.as_posix()}
        per_run["resume"] = True
        if arm.get("method_options"):
            per_run["method_options"] = arm["method_options"]
        config = run_raw(self.base, planned.extra, per_run)
        return RunSpec(planned.method, planned.lr, planned.seed, planned.extra, run_dir, config)


def _as_list(value: Any, what: str) -> list[Any]:
    """A scalar or list as a non-empty list."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise UserError(f"{what} is empty; give at least one value")
    return values


def _seeds(value: Any) -> list[int]:
    """The spec's seeds as integers."""
    seeds = _as_list(value, "seeds")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise UserError(f"seeds must be integers, got {seeds}; e.g. seeds: [0, 1, 2]")
    return seeds


def _parse_methods(raw: Any, default_lr: float | None) -> dict[str, dict[str, Any]]:
    """methods: {name: {lr: [..], method_options: {..}}} (or a list of names using the base lr)."""

    if isinstance(raw, list):
        raw = {name: {} for name in raw}
    if not isinstance(raw, dict) or not raw:
        raise UserError("sweep spec needs 'methods': {baseline: {lr: [3e-4, 1e-3]}, oelm-freeze: {...}}")
    methods = {}
    for name, arm in raw.items():
        get_method(name)  # UserError naming the registered methods
        arm = dict(arm or {})
        unknown = set(arm) - {"lr", "method_options"}
        if unknown:
            raise UserError(
                f"methods.{name}: only 'lr' and 'method_options' may differ per method (equal "
                f"budgets); move {sorted(unknown)} to 'overrides' or 'grid'"
            )
        lrs = _as_list(arm.get("lr", default_lr), f"methods.{name}.lr")
        if any(not isinstance(x, (int, float)) or x <= 0 for x in lrs):
            raise UserError(f"methods.{name}.lr must be positive numbers, got {lrs}")
        methods[name] = {
            "lr": [float(x) for x in lrs],
            **({"method_options": arm["method_options"]} if arm.get("method_options") else {}),
        }
    return methods


def _base_config(raw: dict[str, Any], spec_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainConfig dict, meta) from `base:` (a study config, relative to the spec) or `config:`."""

    if "base" in raw:
        path = Path(raw["base"])
        source: Any = path if path.is_absolute() or path.is_file() else spec_dir / path
    elif "config" in raw:
        source = raw["config"]
        if not isinstance(source, dict):
            raise UserError("the sweep spec's 'config:' must be a mapping of TrainConfig keys")
    else:
        raise UserError("sweep spec needs 'base: configs/study/gpt-01.yaml' or an inline 'config:'")
    overrides = raw.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise UserError("the sweep spec's 'overrides:' must be a mapping, e.g. {steps: 200}")
    return resolve_raw(source, raw.get("scale"), overrides=overrides)


def spec_from_dict(raw: dict[str, Any], spec_dir: Path = Path("."), name: str = "sweep") -> SweepSpec:
    """Resolve and validate a sweep spec mapping (every run's config is validated up front)."""
    unknown = set(raw) - SPEC_KEYS
    if unknown:
        raise UserError(f"unknown sweep spec key(s) {sorted(unknown)}; known: {sorted(SPEC_KEYS)}")
    base, meta = _base_config(raw, spec_dir)
    for key in PER_RUN:
        if key in (raw.get("overrides") or {}) or key in (raw.get("grid") or {}):
            raise UserError(f"'{key}' is set per run by the sweep; use 'methods'/'seeds', not overrides or grid")
        base.pop(key, None)  # the study config's own method/lr/seed are replaced per run
    grid = {k: _as_list(v, f"grid.{k}") for k, v in (raw.get("grid") or {}).items()}
    spec = SweepSpec(
        name=str(raw.get("name", name)),
        base=base,
        methods=_parse_methods(raw.get("methods"), raw.get("lr")),
        seeds=_seeds(raw.get("seeds", [0])),
        grid=grid,
        out=Path(raw.get("out") or f"runs/sweeps/{raw.get('name', name)}"),
        prepare=raw.get("prepare") or meta.get("prepare"),
        study_numbers=raw.get("study_numbers"),
        baseline=str(raw.get("baseline", _declared_reference(raw))),
    )
    spec.max_extend, spec.lr_rule = sweep_policy(raw, "the sweep spec")
    spec.passes = meta.get("passes")
    spec.primary = check_primary(raw.get("primary") or [], spec.methods, "the sweep spec")
    validate(spec)
    return spec


def _declared_reference(raw: dict[str, Any]) -> str:
    """The reference when the spec names none: 'baseline', or, when the spec has no 'baseline' arm
    and every declared primary pair compares with one arm (a same-init twin), that arm."""
    methods, primary = raw.get("methods") or {}, raw.get("primary") or []
    others = {str(p[1]) for p in primary if isinstance(p, (list, tuple)) and len(p) == 2}
    if "baseline" not in methods and len(others) == 1:
        return others.pop()
    return "baseline"


def edge_step(grid: list[float], side: str) -> float:
    """The geometric step beyond an edge: the ratio of the grid's two points at that edge (x2 / /2
    for a one-point grid)."""
    if len(grid) < 2:
        return 2.0 if side == "up" else 0.5
    return grid[-1] / grid[-2] if side == "up" else grid[0] / grid[1]


def extend_grids(spec: SweepSpec, methods: Sequence[str] | None = None) -> list[str]:
    """Add one LR beyond the edge where an arm's validation choice sits; return what was added.

    For each arm being trained (`methods`, else spec.only, else all) whose runs of the spec's seeds are all
    finished: the setting chosen on validation (the report's rule, reports.aggregate) is found; if
    its LR is the largest (smallest) of the arm's grid and fewer than `max_extend` LRs were added on
    that side, the next LR beyond it joins the arm's grid, at the grid's own geometric step at that
    edge (x2 or /2 for a one-point grid), so the caller trains it for the same seeds. The same
    holds where the edge has the best mean validation value but the robust rule rejected it (its
    seeds scatter): the best LR may lie beyond that edge, and a grid that stops there never finds
    it (a ladder's transfer rule once left a control 30% behind this way). Only validation
    decides: no held-out number is read. A one-point grid is at both edges.
    """
    if spec.max_extend <= 0:
        return []
    added = []
    for method in methods or spec.only or list(spec.methods):
        arm_runs = [r for r in spec.runs() if r.method == method]
        if not arm_runs or not all(r.finished() for r in arm_runs):
            continue  # a failed or unfinished run: the choice is not settled
        records = [load_run(r.run_dir) for r in arm_runs]
        chosen = chosen_setting(records, spec.lr_rule)
        if chosen is None:
            continue
        best = chosen_setting(records, BEST_MEAN) if spec.lr_rule != BEST_MEAN else chosen
        edges_to_pass = {chosen.lr} | ({best.lr} if best is not None else set())
        grid = sorted(spec.methods[method]["lr"])
        made = spec.extended.setdefault(method, [])
        original = sorted(set(grid) - {e["lr"] for e in made})
        for side, edge in (("down", grid[0]), ("up", grid[-1])):
            if edge not in edges_to_pass or sum(e["side"] == side for e in made) >= spec.max_extend:
                continue
            new = float(f"{edge * edge_step(original, side):.6g}")
            if new in grid:
                continue
            made.append({"lr": new, "side": side, "chosen": chosen.lr})
            spec.methods[method]["lr"] = sorted([*spec.methods[method]["lr"], new])
            why = "chosen" if chosen.lr == edge else "best mean (rejected as unstable)"
            added.append(
                f"{method}: {why} lr {edge:g} at the {'largest' if side == 'up' else 'smallest'} "
                f"of its grid, adding lr {new:g}"
            )
        if not made:
            spec.extended.pop(method)
    return added


def load_spec(
    path: str | Path,
    seeds: Sequence[int] | None = None,
    out: str | Path | None = None,
    methods: Sequence[str] | None = None,
    raw: dict[str, Any] | None = None,
) -> SweepSpec:
    """Read a sweep spec YAML; `seeds` and `out` replace the spec's own, `methods` keeps those arms.
    `raw`: the mapping read from `path` and edited (`oelm compare`'s flags), read in its place."""
    path = Path(path)
    raw = read_file(path) if raw is None else raw
    if seeds:
        raw["seeds"] = list(seeds)
    only = _check_methods(raw.get("methods"), methods, path) if methods else None
    if out:
        raw["out"] = str(out)
    if raw.get("study_numbers"):
        numbers = Path(raw["study_numbers"])
        raw["study_numbers"] = str(numbers if numbers.is_file() else path.parent / numbers)
    spec = spec_from_dict(raw, path.parent, name=path.stem)
    spec.extend = confirm_command(spec.out)
    spec.only = only
    return spec


def confirm_command(sweep_dir: Path) -> str:
    """`oelm confirm plan` of a pilot sweep directory, {seeds} left to fill in."""
    out = sweep_dir.as_posix()
    return f"oelm confirm plan {out} --seeds {{seeds}} --out {out}-confirm"


def dry_run(runs: Sequence[RunSpec]) -> Iterator[str]:
    """`oelm sweep --dry-run`'s lines: 'todo' or 'done' and each run's folder, then the counts and,
    from the finished runs' own wall times, about how long the rest takes in one process."""
    walls: list[float] = []
    done = 0
    for run in runs:
        finished = run.finished()
        done += finished
        wall = (read_results(run.run_dir) or {}).get("total_wall_time") if finished else None
        if isinstance(wall, int | float) and wall > 0:
            walls.append(float(wall))
        yield f"{'done' if finished else 'todo'}  {run.run_dir}"
    todo = len(runs) - done
    line = f"{len(runs)} runs: {todo} to do, {done} done"
    if todo and walls:
        mean = sum(walls) / len(walls)
        line += (
            f"; about {_duration(todo * mean)} in one process at the mean wall time of {len(walls)} finished "
            f"run(s) ({mean:.0f} s), less with --parallel"
        )
    elif todo:
        line += "; no finished run yet to estimate their time from"
    yield line


def _duration(seconds: float) -> str:
    """Seconds as a reader says them: s, min or h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _check_methods(raw: Any, names: Sequence[str], path: Path) -> list[str]:
    """`names` without repeats, once each is known to be an arm of the spec; else one error."""
    arms = list(raw or {})
    missing = [n for n in names if n not in arms]
    if missing:
        raise UserError(f"--methods {' '.join(missing)}: not an arm of {path}; its arms are {', '.join(arms)}")
    return list(dict.fromkeys(names))


def check_stored_runs(spec: SweepSpec) -> None:
    """Refuse a sweep whose run folders already hold runs trained otherwise than the spec plans them
    (the spec edited between two invocations, sweep.yaml gone, another sweep's runs): a finished one
    would be skipped and reported as this spec's, pooled with runs of the new settings."""
    stale = [(run, diff) for run in spec.runs() if (diff := run.stored_differences())]
    if stale:
        run, diff = stale[0]
        raise UserError(
            f"{len(stale)} run folder(s) under {spec.out} hold runs trained otherwise than this spec plans them, "
            f"e.g. {run.run_dir} (differs in: {', '.join(diff[:5])}); the sweep would count them as this spec's. "
            "Run the spec they were trained with, or give this one another --out"
        )


def planned_identities(spec: SweepSpec) -> dict[str, dict[str, Any]]:
    """Each planned run's TrainConfig.identity(), by its run folder (os.path.normpath), with one config
    validated per grid point and each arm's method options checked once, not every run's config: the
    runs of one grid point differ only in RUN_FIELDS, set here on the validated run's identity as
    TrainConfig would hold them. For `oelm confirm report`, which trains nothing and checks the runs
    it judges against these (resolve_config(run.config).identity() gives the same, run by run)."""
    templates: dict[str, dict[str, Any]] = {}
    checked: set[str] = set()
    identities = {}
    for run in spec.runs():
        options = run.config.get("method_options") or {}
        arm = json.dumps([run.method, options], sort_keys=True, default=str)
        rest = json.dumps({k: v for k, v in run.config.items() if k not in RUN_FIELDS}, sort_keys=True, default=str)
        if rest not in templates:
            templates[rest] = resolve_config(run.config).identity()  # checks this run's arm too
        elif arm not in checked:
            validate_method_options(run.method, options)
        checked.add(arm)
        per_run = {
            "method": run.method,
            "lr": float(run.lr),
            "seed": run.seed,
            "method_options": copy.deepcopy(options),
        }
        identities[os.path.normpath(run.run_dir)] = {**templates[rest], **per_run}
    return identities


def validate(spec: SweepSpec) -> None:
    """Validate every run's config and check that the arms differ only where they may."""

    if len(set(spec.seeds)) != len(spec.seeds):
        raise UserError(f"seeds repeat: {spec.seeds}; list each seed once")
    if spec.baseline not in spec.methods:
        log.warning(f"the sweep has no '{spec.baseline}' arm; gaps will not be computed")
    identities = set()
    for run in spec.runs():
        identity = resolve_config(run.config).identity()
        ident = {k: v for k, v in identity.items() if k not in VARYING and k not in spec.grid}
        identities.add(json.dumps(ident, sort_keys=True, default=str))
    if len(identities) > 1:  # cannot happen by construction; kept as the fairness guarantee
        raise UserError("the sweep's runs differ beyond method/lr/seed/grid: budgets would be unequal")
