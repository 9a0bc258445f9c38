"""The sweep record, SWEEP/sweep.yaml: what a sweep planned, read and written in one place.

`oelm sweep` writes it before any run (and again as grids extend); the runner, the report, the
leaderboard and `oelm confirm` read it through `read_sweep_record`, with the strict YAML loader.
It holds the resolved base config, the arms with their LR grids, the seeds, the other swept
fields and the automatic grid extensions; `planned()` lists every run directory it plans.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oelm.records.layout import RunKey, setting_name
from oelm.records.plan import PLAN_FILE, ConfirmationPlan, read_plan
from oelm.utils.errors import UserError
from oelm.utils.io import read_yaml

SWEEP_FILE = "sweep.yaml"
# The rules that choose each arm's learning rate on validation (`lr_rule`; reports.aggregate applies
# them and states them in words): robust (stable settings only) and the earlier best-mean.
ROBUST, BEST_MEAN = "robust", "best-mean"
LR_RULES = (ROBUST, BEST_MEAN)
# The one set of defaults of a sweep's policy keys, for a spec and a stored record alike
# (sweep_policy): automatic LR-grid extensions per side of each arm's grid, and the LR rule.
MAX_EXTEND = 2
LR_RULE = ROBUST
# Not a default but a fact about old files: sweep.yaml written before the `lr_rule` key existed was
# chosen by the best mean, so a stored record without the key says that rule.
LR_RULE_BEFORE_KEY = BEST_MEAN


@dataclass(frozen=True)
class PlannedRun:
    """One run a sweep record plans: its key in the layout and its swept values."""

    key: RunKey
    lr: float
    extra: dict[str, Any]

    @property
    def method(self) -> str:
        """The arm."""
        return self.key.method

    @property
    def seed(self) -> int:
        """The seed."""
        return self.key.seed


@dataclass
class SweepRecord:
    """SWEEP/sweep.yaml as data: one base config, per-method LR grids, seeds, other fields."""

    name: str
    base: dict[str, Any]
    methods: dict[str, dict[str, Any]]
    seeds: list[int]
    grid: dict[str, list[Any]] = field(default_factory=dict)
    out: Path = Path("runs/sweeps/sweep")
    prepare: dict[str, Any] | None = None
    study_numbers: str | None = None
    baseline: str = "baseline"
    # Automatic LR-grid extension: after the runs finish, an arm whose validation-chosen LR is the
    # smallest or largest of its grid gets the next LR beyond that edge, at most `max_extend` per
    # side (0: never; a confirmation's fixed arms set 0).
    max_extend: int = MAX_EXTEND
    # What the extension added, per method: [{"lr", "side": "up" | "down", "chosen": the lr that sat
    # at the edge}].
    extended: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    lr_rule: str = LR_RULE  # how each arm's setting is chosen on validation (LR_RULES)
    # The primary comparisons, declared before any run: [method, compared with] pairs of arms; Holm
    # runs over them only, every other comparison is exploratory. [] = none declared.
    primary: list[list[str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The record as SWEEP/sweep.yaml holds it."""
        return {
            "name": self.name,
            "base": self.base,
            "methods": self.methods,
            "seeds": self.seeds,
            "grid": self.grid,
            "prepare": self.prepare,
            "study_numbers": self.study_numbers,
            "baseline": self.baseline,
            "max_extend": self.max_extend,
            "extended": self.extended,
            "lr_rule": self.lr_rule,
            "primary": self.primary,
        }

    def planned(self) -> list[PlannedRun]:
        """Every run, seed-major so that an interrupted sweep has whole seeds of every arm."""
        keys = list(self.grid)
        combos = [dict(zip(keys, vals)) for vals in itertools.product(*self.grid.values())]
        return [
            PlannedRun(RunKey(method, setting_name(float(lr), extra), int(seed), float(lr)), float(lr), extra)
            for seed in self.seeds
            for method, arm in self.methods.items()
            for lr in arm["lr"]
            for extra in combos
        ]

    def run_dir(self, run: PlannedRun) -> Path:
        """The directory of a planned run."""
        return run.key.path(self.out)

    def same_budget(self, other: SweepRecord) -> list[str]:
        """What differs from another record of the same directory ([] when its runs can pool): base
        config keys, the grid, or an arm's method options (runs of one arm under two settings
        would otherwise be pooled as one arm)."""
        mine, theirs = _plain(self.base), _plain(other.base)
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if _plain(self.grid) != _plain(other.grid):
            diff.append("grid")
        for method in sorted(set(self.methods) & set(other.methods)):
            if _plain(self.methods[method].get("method_options") or {}) != _plain(
                other.methods[method].get("method_options") or {}
            ):
                diff.append(f"methods.{method}.method_options")
        return diff

    def merged(self, stored: SweepRecord | None) -> dict[str, Any]:
        """This record's content with a stored one's seeds, LRs and extensions kept (an extended
        or partial sweep lists everything it ever planned)."""
        data = _plain(self.to_dict())
        if stored is None:
            return data
        data["seeds"] = sorted(set(stored.seeds) | set(self.seeds))
        for method, arm in _plain(stored.methods).items():
            mine = data["methods"].setdefault(method, arm)
            mine["lr"] = sorted(set(mine["lr"]) | set(arm.get("lr", [])))
        # Extensions of arms this call did not revisit (`--methods`) stay on record.
        data["extended"] = {**_plain(stored.extended), **data.get("extended", {})}
        return data


def check_primary(raw: Any, arms: Iterable[str], where: str | Path) -> list[list[str]]:
    """`primary` as [method, compared with] pairs of two different arms; one UserError naming the
    problem and the fix otherwise (before any run)."""
    arms = list(arms)
    example = "e.g. primary: [[oelm-freeze, oelm-nofreeze]]"
    if not isinstance(raw, list):
        raise UserError(f"{where}: primary must be a list of [method, compared with] pairs, {example}")
    pairs = []
    for pair in raw:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise UserError(f"{where}: primary entry {pair!r} is not a [method, compared with] pair; {example}")
        missing = [x for x in pair if x not in arms]
        if missing:
            raise UserError(
                f"{where}: primary pair {list(pair)} names {', '.join(missing)}, not an arm; its arms are "
                f"{', '.join(arms)}: declare pairs of arms the sweep runs"
            )
        if pair[0] == pair[1]:
            raise UserError(f"{where}: primary pair {list(pair)} compares an arm with itself; name two arms")
        if list(pair) in pairs:
            raise UserError(f"{where}: primary pair {list(pair)} is declared twice; list each pair once")
        pairs.append(list(pair))
    return pairs


def sweep_policy(raw: dict[str, Any], where: str | Path) -> tuple[int, str]:
    """(max_extend, lr_rule) of a sweep spec or a stored sweep record: the one parser of these keys,
    with one set of defaults (MAX_EXTEND, LR_RULE); one UserError naming a bad value and the fix."""
    max_extend = raw.get("max_extend", MAX_EXTEND)
    if isinstance(max_extend, bool) or not isinstance(max_extend, int) or max_extend < 0:
        raise UserError(
            f"{where}: max_extend must be a whole number >= 0 (LR-grid extensions per side; 0 disables), "
            f"got {max_extend!r}"
        )
    lr_rule = raw.get("lr_rule", LR_RULE)
    if lr_rule not in LR_RULES:
        raise UserError(
            f"{where}: lr_rule must be one of {', '.join(LR_RULES)} (robust: stable settings only; best-mean: the "
            f"earlier rule), got {lr_rule!r}"
        )
    return max_extend, str(lr_rule)


def _plain(value: Any) -> Any:
    """A JSON round trip: tuples as lists, paths as strings (as the YAML file holds them)."""
    return json.loads(json.dumps(value, default=str))


def read_sweep_record(folder: str | Path) -> SweepRecord | None:
    """The sweep record of a sweep directory (or of the folder above its runs/), or None without
    one; a UserError naming the file when it is not a sweep record."""
    folder = Path(folder)
    for candidate in (folder, folder.parent) if folder.name == "runs" else (folder,):
        path = candidate / SWEEP_FILE
        if path.is_file():
            return _parse(read_yaml(path, "sweep record"), candidate, path)
    return None


def record_from_mapping(raw: dict[str, Any], folder: Path) -> SweepRecord:
    """The SweepRecord a sweep.yaml mapping describes (as read back from FOLDER/sweep.yaml)."""
    return _parse(_plain(raw), Path(folder), Path(folder) / SWEEP_FILE)


def _parse(raw: dict[str, Any], folder: Path, path: Path) -> SweepRecord:
    """A SweepRecord from sweep.yaml's mapping."""
    max_extend, lr_rule = sweep_policy({"lr_rule": LR_RULE_BEFORE_KEY, **raw}, path)
    try:
        methods = {str(m): dict(arm or {}) for m, arm in dict(raw["methods"]).items()}
        for arm in methods.values():
            arm["lr"] = [float(x) for x in arm["lr"]]
        return SweepRecord(
            name=str(raw.get("name") or folder.name),
            base=dict(raw.get("base") or {}),
            methods=methods,
            seeds=[int(s) for s in raw["seeds"]],
            grid={str(k): list(v) for k, v in (raw.get("grid") or {}).items()},
            out=folder,
            prepare=raw.get("prepare"),
            study_numbers=raw.get("study_numbers"),
            baseline=str(raw.get("baseline") or "baseline"),
            max_extend=max_extend,
            extended={str(k): list(v) for k, v in (raw.get("extended") or {}).items()},
            lr_rule=lr_rule,
            primary=check_primary(raw.get("primary") or [], methods, path),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise UserError(
            f"{path} is not a sweep record ({type(err).__name__}: {err}); pass the directory `oelm sweep` "
            "wrote, or remove the stray sweep.yaml"
        ) from err


def sweep_records(paths: Iterable[str | Path]) -> list[SweepRecord]:
    """The sweep record of each path that has one, in order: read once per command, then handed to
    the readers below (a report reads each sweep.yaml once)."""
    return [record for path in paths if (record := read_sweep_record(path)) is not None]


def declared_lr_rule(records: Sequence[SweepRecord]) -> str:
    """The LR rule the first sweep record declares (records written before the key: best-mean);
    ROBUST where no path is a sweep directory."""
    return records[0].lr_rule if records else ROBUST


def declared_primary(paths: Iterable[str | Path], records: Sequence[SweepRecord]) -> list[list[str]]:
    """The primary pairs declared for the runs under `paths`: a confirmation's plan.json (its
    sweep.yaml, written by `oelm confirm run`, carries none), else the first sweep record's ([]
    without one)."""
    for path in paths:
        if (plan := confirmation_plan(path)) is not None and plan.primary:
            return [list(pair) for pair in plan.primary]
    return records[0].primary if records else []


def declared_extensions(records: Sequence[SweepRecord]) -> dict[str, Any] | None:
    """The automatic grid extensions the first sweep record recorded (its `extended` and
    `max_extend`); None without one."""
    return {"max_extend": records[0].max_extend, "arms": records[0].extended} if records else None


def declared_margin(paths: Iterable[str | Path]) -> float | None:
    """The equivalence margin (%) the confirmation plans among `paths` fixed before their runs (None
    without a plan); one UserError when two plans fixed different margins: one board, one margin."""
    margins = {str(path): plan.margin for path in paths if (plan := confirmation_plan(path)) is not None}
    if len(set(margins.values())) > 1:
        shown = ", ".join(f"{path} ±{m:g}%" for path, m in margins.items())
        raise UserError(
            f"the confirmation plans of this board fixed different equivalence margins ({shown}); one board "
            "uses one margin: build a board per margin"
        )
    return next(iter(margins.values()), None)


def confirmation_plan(path: str | Path) -> ConfirmationPlan | None:
    """The plan of a confirmation directory (its plan.json, hash checked), or None elsewhere."""
    return read_plan(path) if (Path(path) / PLAN_FILE).is_file() else None
