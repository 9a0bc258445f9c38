"""Rebuild a report's tables from a stored report.json (or a board's rows from leaderboard.json).

The run directories behind a committed report may be gone; its JSON still holds, per method, the
held-out metric of every seed at the chosen setting (`by_seed`), which is all the comparison
needs. `group_from_json` rebuilds the table's `aggregate.Group` from it and compares every arm
with the reference through `aggregate.rebase`: the paired per-seed gaps, their t-tests, the Holm
adjustment over the table, the TOST at the margin and the minimum detectable gaps are computed
again with today's code, so a record written by an older version reads in today's vocabulary.

What the JSON does not keep is omitted with a note on the table, never invented: validation
curves (the crossing points it stored are kept while the reference is the stored one), per-item
test values (the paired test-set noise of a gap against another reference, the classifiers'
bootstrap over test examples), per-seed step times against another reference.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oelm.reports import stats
from oelm.reports.aggregate import Arm, Comparison, Crossing, Group, LrCell, Noise, StoredTable, rebase
from oelm.utils.errors import UserError

RUN_PATH = re.compile(r"(?:^|/)(?P<method>[^/]+)/(?P<setting>[^/]+)/seed(?P<seed>\d+)/?$")


@dataclass
class StoredRun:
    """A run a stored record names by its path only (what a report lists of it, nothing to read)."""

    path: Path
    method: str | None = None
    setting: str | None = None
    seed: int | None = None
    lr: float | None = None
    status: str = "excluded"
    reason: str = ""

    @classmethod
    def from_path(cls, path: str, **fields: Any) -> StoredRun:
        """A stored run with its method, setting and seed read from `.../<method>/<setting>/seed<N>`."""
        found = RUN_PATH.search(str(path).replace(os.sep, "/"))
        if found is not None:
            fields.setdefault("method", found["method"])
            fields.setdefault("setting", found["setting"])
            fields.setdefault("seed", int(found["seed"]))
            lr = re.match(r"lr([0-9.eE+-]+?)(?:_|$)", found["setting"])
            if lr is not None:
                with contextlib.suppress(ValueError):  # a setting named like an LR but not one
                    fields.setdefault("lr", float(lr.group(1)))
        return cls(Path(path), **fields)


def summary_from_json(d: dict | None) -> stats.Summary | None:
    """A stats.Summary from its to_dict() form."""
    if not isinstance(d, dict):
        return None
    return stats.Summary(d.get("n", 0), d.get("mean"), d.get("std"), d.get("ci_low"), d.get("ci_high"))


def noise_from_json(d: dict | None) -> Noise | None:
    """An aggregate.Noise from report.json (which adds the derived ratio)."""
    if not isinstance(d, dict):
        return None
    return Noise(d["metric"], d["test_se"], d.get("seed_sd"), d.get("test_size"), d.get("unit", ""))


def _float(value: Any) -> float | None:
    """A finite float or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _cell(c: dict) -> LrCell:
    """One row of a stored LR sweep: its setting, LR, validation summary and the runs it names."""
    runs = [StoredRun.from_path(p, status="complete") for p in c.get("runs") or []]
    excluded = [StoredRun.from_path(p, status="excluded (status not stored)") for p in c.get("excluded") or []]
    lr = _float(c.get("lr"))
    selection = summary_from_json(c.get("selection")) or stats.summarize([])
    return LrCell(str(c.get("setting")), math.nan if lr is None else lr, runs, excluded, selection)


def arm_from_json(d: dict) -> Arm:
    """An aggregate.Arm from one arm of report.json or one entry of leaderboard.json.

    The held-out summary is recomputed from `by_seed`; comparisons (gap, interval, tests,
    verdict) are left empty for `rebase` to compute. The arm has no runs.
    """
    by_seed = {int(k): float(v) for k, v in (d.get("by_seed") or {}).items() if _float(v) is not None}
    step = _float(d.get("mean_step_time"))
    tps = _float(d.get("tokens_per_second"))
    return Arm(
        method=str(d["method"]),
        lr=_float(d.get("lr")),
        setting=d.get("setting"),
        cells=[_cell(c) for c in d.get("lr_sweep") or []],
        runs=[],
        primary=stats.summarize(list(by_seed.values())),
        by_seed=by_seed,
        step_time=stats.Summary(1 if step is not None else 0, step, None, None, None),
        tokens_per_second=stats.Summary(1 if tps is not None else 0, tps, None, None, None),
        trainable_params=d.get("trainable_params"),
        frozen_params=d.get("frozen_params"),
        theoretical_saving=d.get("theoretical_saving"),
        noise=noise_from_json(d.get("noise")),
        study=d.get("study"),
    )


def stored_reference(raw: dict) -> str | None:
    """The reference a stored table used (`reference`, else the older `baseline` key)."""
    ref = raw.get("reference", raw.get("baseline"))
    return str(ref) if ref else None


def stored_budget(raw: dict) -> str:
    """The budget text of a stored table: its `budget`, else as its stored reading words it."""
    if "budget" in raw:
        return str(raw["budget"] or "")
    found = re.search(r" with [^()]* \((.*?)\d+ seeds?, every method", raw.get("reading") or "")
    return found.group(1).rstrip(", ") if found else ""


def stored_margin(raw: dict, top: dict | None = None, margin: float | None = None) -> float:
    """The margin to use: `margin` when given, else the table's stored one, the record's, or the default."""
    if margin is not None:
        return float(margin)
    for source in (raw, top or {}):
        if _float(source.get("margin_percent")) is not None:
            return float(source["margin_percent"])
    return stats.MARGIN


def group_from_json(
    raw: dict,
    source: str,
    baseline: str | None = None,
    margin: float | None = None,
    top: dict | None = None,
    entries: list[dict] | None = None,
) -> Group:
    """One table of a stored record, compared again with its reference by today's code.

    `raw` is a group of report.json or a table of leaderboard.json (pass its rows as `entries`);
    the reference is the stored one unless `baseline` names another arm of the table; `margin`
    defaults to the stored one (1% where the record has none).
    """
    rows = raw.get("arms") if entries is None else entries
    arms = [arm_from_json(d) for d in rows or []]
    old = stored_reference(raw)
    reference = baseline or old
    if entries is None:  # a report's order: the reference first, then by name
        arms.sort(key=lambda a: (a.method != reference, a.method))
    group = Group(
        task=str(raw.get("task", "?")),
        dataset=str(raw.get("dataset", "?")),
        model=str(raw.get("model", "?")),
        primary_metric=str(raw.get("primary_metric", "?")),
        selection_metric=str(raw.get("selection_metric") or "?"),
        arms=arms,
        baseline=None,
        direction=raw.get("higher_is_better"),
        warnings=[str(w) for w in raw.get("warnings") or []],
        margin=stored_margin(raw, top, margin),
        splits=dict(raw.get("splits") or {}),
    )
    group.heldout_notes = [(StoredRun.from_path(n["path"]), str(n["note"])) for n in raw.get("heldout_notes") or []]
    changed = reference != old
    crossings = {m: Crossing(**c) for m, c in (raw.get("crossings") or {}).items()}
    group.stored = StoredTable(source, stored_budget(raw), None if changed else crossings)
    have = [a.method for a in arms]
    if baseline is not None and baseline not in have:
        raise UserError(
            f"--baseline {baseline}: no such method in {group.title} of {source} (methods: {', '.join(have)}); "
            "name one of them or leave --baseline out to keep the stored reference"
        )
    base = next((a for a in arms if a.method == reference and a.primary.n > 0), None)
    if base is None:
        group.margin = stored_margin(raw, top, margin)
        group.warnings.append(
            f"no stored '{reference or 'baseline'}' values in this table: gaps and tests are not computed"
        )
    else:
        rebase(group, reference, group.margin)
    group.stored.notes = _notes(group, raw, rows or [], changed, old)
    return group


def _notes(group: Group, raw: dict, rows: list[dict], changed: bool, old: str | None) -> list[str]:
    """What the stored JSON lacks for this table (and so the table omits), in words."""
    notes = []
    if changed:
        notes.append(
            f"The reference is **{group.baseline}** (named by --baseline; the stored record compared with "
            f"{old}). The test-set noise of each gap paired item by item and where the validation curves "
            f"cross the reference's are omitted: the JSON keeps them against {old} only, and the runs' "
            "per-item test values and curves are not in it."
        )
    else:
        stored_pairs = {d["method"]: noise_from_json(d.get("paired_noise")) for d in rows}
        for arm in group.arms:
            arm.paired_noise = stored_pairs.get(arm.method)  # measured against this same reference
    if group.task == "classification":
        notes.append(
            "Gap intervals are paired by seed only: the paired bootstrap over seeds and test examples needs the "
            "runs' per-example test values (test_items.json), which the JSON does not keep."
        )
    if not group.stored.budget and "arms" in raw:  # a board (leaderboard.json) has no reading to budget
        notes.append("The JSON does not record the training budget (steps, batch, length), so the reading omits it.")
    excluded = [r for a in group.arms for c in a.cells for r in c.excluded]
    if excluded:
        notes.append(f"{len(excluded)} excluded run(s) are named in the LR sweep; the JSON does not keep their status.")
    return notes


def read_record(path: str | Path, kind: str) -> dict:
    """A stored report.json ('report') or leaderboard.json ('leaderboard'), or one UserError saying why not."""
    file = Path(path)
    key = "groups" if kind == "report" else "tables"
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"cannot read {path} ({err.strerror}); pass a {kind}.json that `oelm {kind}` wrote") from err
    except ValueError as err:
        raise UserError(f"{path} is not JSON ({err}); pass a {kind}.json that `oelm {kind}` wrote") from err
    if not isinstance(raw, dict) or not isinstance(raw.get(key), list):
        other = "leaderboard" if kind == "report" else "report"
        raise UserError(
            f"{path} is not a stored {kind}.json (no '{key}' list); a {other}.json re-renders with "
            f"`oelm {other} --from-json`"
        )
    return raw


def stored_runs(raw: dict) -> tuple[int, list[str]]:
    """How many run directories a stored report was built from, and the folders they lie under.

    New records store both (`n_runs`, `sources`); older ones are counted from the run paths their
    LR sweeps and run lists name.
    """
    paths = [
        p
        for g in raw.get("groups", [])
        for a in g.get("arms", [])
        for c in a.get("lr_sweep") or []
        for p in (c.get("runs") or []) + (c.get("excluded") or [])
    ]
    paths += [r["path"] for r in raw.get("incomplete") or [] if isinstance(r, dict) and "path" in r]
    n = raw.get("n_runs") if isinstance(raw.get("n_runs"), int) else len(set(paths))
    sources = raw.get("sources")
    if not isinstance(sources, list):
        folders = {str(Path(p).parent.parent.parent) for p in paths}
        sources = [os.path.commonpath(sorted(folders)).replace(os.sep, "/")] if folders else []
    return n, [str(s) for s in sources]


def comparison_from_json(
    path: str | Path, baseline: str | None = None, margin: float | None = None
) -> tuple[Comparison, dict]:
    """The Comparison of a stored report.json, every table compared again; also the raw JSON."""
    raw = read_record(path, "report")
    groups = [group_from_json(g, str(path), baseline, margin, top=raw) for g in raw["groups"]]
    if baseline is not None and not any(g.baseline == baseline for g in groups):
        raise UserError(f"--baseline {baseline}: no table of {path} has it")

    def listed(key: str, status: str) -> list[StoredRun]:
        return [
            StoredRun.from_path(r["path"], status=status, reason=str(r.get("reason", "")))
            for r in raw.get(key) or []
            if isinstance(r, dict) and "path" in r
        ]

    n_runs, _ = stored_runs(raw)
    comparison = Comparison(
        groups=groups,
        incomplete=listed("incomplete", "incomplete"),
        excluded=listed("excluded", "excluded"),
        n_runs=n_runs,
        margin=groups[0].margin if groups else stored_margin(raw, None, margin),
    )
    return comparison, raw
