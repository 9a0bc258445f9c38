"""The fine-tuning board: every arm of a fine-tuning sweep against full fine-tuning, in accuracy
points, with what it costs (trainable parameters, optimizer state, step time) and its Pareto view.

The question it answers is a practitioner's: should I freeze Q/K when I fine-tune, or use one of
the field's methods (LoRA, BitFit, LayerNorm tuning, (IA)^3)? Built only from stored run records:

- Each arm's setting (LR) is chosen on validation by the same rule as `oelm report` (`compare`).
- Held-out accuracy per seed at that setting; the difference to the reference (full fine-tuning)
  in accuracy points, paired by seed and by test example, with a Student-t interval over seeds x
  test examples (stats.seeds_items_interval: crossed variance components, Satterthwaite df), so its
  interval includes the test set's noise and holds its coverage at 3-5 seeds
  (tests/test_interval_coverage.py).
- The verdict in the reports' vocabulary, from the same t statistic: worse / better (resolved) when the
  Holm-adjusted two-sided p < alpha; equivalent within ±margin points when the Holm-adjusted
  TOST p < alpha; otherwise unresolved, with the smallest difference the data could detect
  (80% power at Holm's strictest level alpha/m, from the interval's standard error and df).
- Families, declared here once: the primary family is every arm against full fine-tuning; the
  exploratory family compares frozen Q/K (`freeze-qk`, pretrained Q/K as they are) with each
  other arm that saves something. Holm runs within each family.
- Seeds at chance: a run whose validation accuracy stayed at chance level (status "collapsed") is what
  the arm gave on that seed at its chosen LR, so the board keeps it, at its held-out accuracy, in
  the mean, the interval and the paired test, and counts it per arm ("at chance"): dropping it
  would show the surviving seeds only. A run without a held-out result (diverged) cannot enter and
  is counted the same way.
- Costs: trainable parameters (the freeze audit), AdamW state (2 fp32 moments per trainable
  parameter), step time relative to full fine-tuning (paired by seed, the runs' own timing), peak
  memory as the runs recorded it. An arm is dominated when another arm has at least its mean
  accuracy at no more of every cost, and less of one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oelm.records.load import load_runs
from oelm.records.run import COLLAPSED, RunRecord
from oelm.reports import stats
from oelm.reports.aggregate import ITEMS_METRIC, Arm, Group, compare, step_time_ratio
from oelm.reports.comparison import page_json
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_json, atomic_write_text

REFERENCE = "baseline"  # full fine-tuning
FROZEN_QK = "freeze-qk"  # the practitioner's "freeze Q/K": pretrained Q/K kept, frozen
MARGIN_POINTS = 0.5  # the field's scale of a difference that matters (accuracy points)
ADAMW_BYTES = 8  # two fp32 moments per trainable parameter
COSTS = ("trainable_params", "optimizer_bytes", "step_ratio")
# The memory_kind of a run that recorded its process's lifetime peak (training.timing.PeakMemory).
LIFETIME_PEAK = "process_max_rss"


@dataclass
class Row:
    """One arm of the board: its accuracy, its difference to full fine-tuning, and its costs."""

    method: str
    lr: float | None
    seeds: list[int]
    accuracy: float | None  # mean held-out accuracy (%) over seeds
    accuracy_low: float | None = None  # 95% interval of the mean over seeds x test examples (%)
    accuracy_high: float | None = None
    diff: float | None = None  # mean paired difference to the reference, accuracy points (+ = better)
    diff_low: float | None = None
    diff_high: float | None = None
    p: float | None = None
    holm_p: float | None = None
    tost_p: float | None = None
    tost_holm_p: float | None = None
    se: float | None = None  # standard error of diff (seeds x test examples)
    mde: float | None = None  # smallest |diff| detectable at 80% power, Holm's strictest level
    m: int = 0
    verdict: str = ""
    family: str = "primary"
    trainable_params: int | None = None
    optimizer_bytes: int | None = None
    step_ratio: float | None = None
    peak_memory_bytes: float | None = None
    # The runs recorded the process's lifetime peak (before each run's peak was measured from its
    # start): an upper bound of the run's, shown as such and not compared across arms.
    memory_upper_bound: bool = False
    dominated_by: list[str] = field(default_factory=list)
    unstable: str = ""
    at_chance: int = 0  # seeds at the chosen LR that ended at chance level on validation (kept, counted)
    no_result: int = 0  # seeds at the chosen LR without a held-out result (diverged: counted, not averaged)


@dataclass
class FinetuneBoard:
    """One dataset's board."""

    title: str
    reference: str
    margin: float
    rows: list[Row]
    exploratory: list[Row]
    warnings: list[str]
    n_examples: int | None


# ---------------------------------------------------------------------------------------------
# Intervals over seeds x test examples, in accuracy points


def _has_items(run: RunRecord) -> bool:
    items = run.test_items()
    return bool(items) and items.get("metric") == ITEMS_METRIC and run.seed is not None


def _runs(arm: Arm) -> list[RunRecord]:
    """The runs the board reads at the arm's chosen LR: those the arm counts (aggregate.counted_runs,
    the one rule for seeds at chance: kept, with their held-out result)."""
    return arm.runs


def _items(arm: Arm) -> dict[int, np.ndarray]:
    """Per-seed 0/1 correctness on the test set (seed -> array), from the board's runs' test_items."""
    out = {}
    for run in _runs(arm):
        items = run.test_items()
        if run.seed is not None and items and items.get("metric") == ITEMS_METRIC:
            out[int(run.seed)] = np.asarray(items["values"], dtype=np.float64)
    return out


def _fill(row: Row, arm: Arm, ref: Arm | None) -> stats.ItemsInterval | None:
    """Accuracy interval and the paired difference to `ref` (None: the reference itself), both
    Student-t intervals over seeds x test examples (stats.seeds_items_interval); returns the
    difference's interval (None without a paired comparison)."""
    mine = _items(arm)
    if ref is None:
        seeds = sorted(mine)
        if len(seeds) >= 2:
            acc = stats.seeds_items_interval(np.stack([mine[s] for s in seeds]) * 100)
            row.accuracy_low, row.accuracy_high = acc.ci_low, acc.ci_high
        return None
    theirs = _items(ref)
    seeds = sorted(set(mine) & set(theirs))
    if len(seeds) < 2 or len({len(mine[s]) for s in seeds} | {len(theirs[s]) for s in seeds}) != 1:
        return None
    m, b = np.stack([mine[s] for s in seeds]) * 100, np.stack([theirs[s] for s in seeds]) * 100
    acc = stats.seeds_items_interval(m)
    row.accuracy_low, row.accuracy_high = acc.ci_low, acc.ci_high
    diff = stats.seeds_items_interval(m - b)
    row.diff, row.se = diff.mean, diff.se
    row.diff_low, row.diff_high = diff.ci_low, diff.ci_high
    row.p = diff.p_value()
    return diff


def _decide(
    rows: list[Row],
    reps: dict[str, stats.ItemsInterval],
    margin: float,
    alpha: float = stats.ALPHA,
    power: float = stats.POWER,
) -> None:
    """Holm over the rows that have a difference (`reps`: their intervals); the verdict in the vocabulary."""
    tested = [r for r in rows if r.method in reps]
    for r in tested:
        r.tost_p = reps[r.method].tost_p(margin)
    holm_p = stats.holm([r.p for r in tested])
    holm_t = stats.holm([r.tost_p for r in tested])
    m = len(tested)
    level = alpha / max(m, 1)
    for r, hp, ht in zip(tested, holm_p, holm_t):
        r.holm_p, r.tost_holm_p, r.m = hp, ht, m
        r.mde = reps[r.method].mde(level, power)
        if hp is not None and hp < alpha and r.diff:
            r.verdict = "better (resolved)" if r.diff > 0 else "worse (resolved)"
        elif ht is not None and ht < alpha:
            r.verdict = f"equivalent within ±{margin:g} points"
        else:
            holm = ", Holm-adjusted" if m > 1 else ""
            r.verdict = f"unresolved (smallest detectable difference {r.mde:.2f} points at 80% power{holm})"
    for r in rows:
        if r.p is None and not r.verdict:
            r.verdict = "unresolved (no paired test: fewer than 2 shared seeds with per-example results)"


# ---------------------------------------------------------------------------------------------
# Costs and dominance


def _mean_result(arm: Arm, key: str) -> float | None:
    vals = [v for r in arm.runs if isinstance(v := r.results.get(key), (int, float)) and math.isfinite(v)]
    return float(np.mean(vals)) if vals else None


def _dominance(rows: list[Row]) -> None:
    def costs(r: Row) -> tuple[float, ...] | None:
        vals = [getattr(r, c) for c in COSTS]
        return None if any(v is None for v in vals) or r.accuracy is None else tuple(float(v) for v in vals)

    for r in rows:
        mine = costs(r)
        if mine is None:
            continue
        for other in rows:
            theirs = costs(other)
            if other is r or theirs is None:
                continue
            no_worse = other.accuracy >= r.accuracy and all(t <= c for t, c in zip(theirs, mine))
            strictly = other.accuracy > r.accuracy or any(t < c for t, c in zip(theirs, mine))
            if no_worse and strictly:
                r.dominated_by.append(other.method)


# ---------------------------------------------------------------------------------------------
# Building


def _row(arm: Arm) -> Row:
    items = _items(arm)
    values = [float(v.mean()) * 100 for v in items.values()] or [v * 100 for v in arm.by_seed.values()]
    unstable, finished = arm.unstable_count() if hasattr(arm, "unstable_count") else (0, 0)
    cell = arm.chosen_cell
    excluded = cell.excluded if cell else []
    return Row(
        method=arm.method,
        lr=arm.lr,
        seeds=sorted(items) or sorted(arm.by_seed),
        accuracy=float(np.mean(values)) if values else None,
        at_chance=sum(1 for r in excluded if r.status == COLLAPSED and _has_items(r)),
        no_result=sum(1 for r in excluded if not _has_items(r)),
        trainable_params=arm.trainable_params,
        optimizer_bytes=None if arm.trainable_params is None else ADAMW_BYTES * int(arm.trainable_params),
        peak_memory_bytes=_mean_result(arm, "peak_memory_bytes"),
        memory_upper_bound=any(r.timing.get("memory_kind") == LIFETIME_PEAK for r in arm.runs),
        unstable=f"{unstable} of {finished}" if finished else "",
    )


def board_of(group: Group, reference: str = REFERENCE, margin: float = MARGIN_POINTS) -> FinetuneBoard:
    """The fine-tuning board of one dataset table."""
    arms = {a.method: a for a in group.arms}
    if reference not in arms:
        raise UserError(
            f"{group.title}: no finished arm {reference!r} (full fine-tuning) to compare with; arms: {', '.join(arms)}"
        )
    if group.primary_metric != ITEMS_METRIC:
        raise UserError(
            f"{group.title}: the fine-tuning board reads held-out accuracy, but this table's metric is "
            f"{group.primary_metric}; use `oelm report` for it"
        )
    ref = arms[reference]
    rows, reps = [], {}
    for arm in group.arms:
        row = _row(arm)
        diff = _fill(row, arm, None if arm is ref else ref)
        if diff is not None:
            reps[arm.method] = diff
        row.step_ratio = 1.0 if arm is ref else step_time_ratio(_runs(arm), _runs(ref))
        rows.append(row)
    primary = [r for r in rows if r.method != reference]
    _decide(primary, reps, margin)
    next(r for r in rows if r.method == reference).verdict = "reference"
    _dominance(rows)
    exploratory: list[Row] = []
    if FROZEN_QK in arms:
        reps = {}
        for other in group.arms:
            if other.method in (FROZEN_QK, reference):
                continue
            row = _row(other)
            diff = _fill(row, other, arms[FROZEN_QK])
            if diff is not None:
                reps[other.method] = diff
            row.family = f"exploratory: against {FROZEN_QK}"
            exploratory.append(row)
        _decide(exploratory, reps, margin)
    n_ex = next((len(v) for v in _items(ref).values()), None)
    return FinetuneBoard(group.title, reference, margin, rows, exploratory, list(group.warnings), n_ex)


def build(
    paths: Sequence[str | Path], reference: str = REFERENCE, margin: float = MARGIN_POINTS
) -> list[FinetuneBoard]:
    """Every classification table under the paths as a fine-tuning board."""
    runs: list[RunRecord] = load_runs(paths)
    comparison = compare(runs, baseline=reference)
    groups = [g for g in comparison.groups if g.primary_metric == ITEMS_METRIC]
    if not groups:
        raise UserError("no classification runs with held-out accuracy under the given paths")
    return [board_of(g, reference, margin) for g in groups]


# ---------------------------------------------------------------------------------------------
# Output


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def _params(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}k"


def _bytes(n: float | None) -> str:
    return "n/a" if n is None else (f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB")


def _table(rows: list[Row], ref_name: str) -> list[str]:
    lines = [
        f"| method | LR | seeds | at chance | accuracy % [95% CI] | Δ vs {ref_name}, points [95% CI] | Holm p | "
        "verdict | trainable | AdamW state | peak memory | step time ratio | dominated by |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acc = f"{_fmt(r.accuracy)} [{_fmt(r.accuracy_low)}, {_fmt(r.accuracy_high)}]"
        diff = "—" if r.diff is None else f"{r.diff:+.2f} [{r.diff_low:+.2f}, {r.diff_high:+.2f}]"
        lines.append(
            f"| {r.method} | {_fmt(r.lr, 'g')} | {len(r.seeds)} | {_chance(r)} | {acc} | {diff} | "
            f"{_fmt(r.holm_p, '.3g')} | "
            f"{r.verdict} | {_params(r.trainable_params)} | {_bytes(r.optimizer_bytes)} | "
            f"{'≤ ' * r.memory_upper_bound}{_bytes(r.peak_memory_bytes)} | {_fmt(r.step_ratio)} | {', '.join(r.dominated_by) or 'no'} |"
        )
    return lines


PEFT = ("lora", "ia3", "bitfit", "ln-tuning")


def _chance(r: Row) -> str:
    """Seeds at chance (kept) and seeds without a result (not averaged), of the seeds run."""
    text = f"{r.at_chance} of {len(r.seeds) + r.no_result}"
    return text + (f"; {r.no_result} without a result" if r.no_result else "")


def _said(r: Row) -> str:
    """An arm's difference and verdict in one phrase."""
    if r.diff is None:
        return f"{r.method}: no paired comparison"
    return f"{r.method} {r.diff:+.2f} points [{r.diff_low:+.2f}, {r.diff_high:+.2f}], {r.verdict}"


def reading(b: FinetuneBoard) -> list[str]:
    """The board in plain words, from its rows only: where frozen Q/K stands, and the advice it supports."""
    rows = {r.method: r for r in b.rows}
    ref = rows.get(b.reference)
    lines = [f"### What this says ({b.title})", ""]
    frozen = [rows[m] for m in (FROZEN_QK, "oelm-freeze") if m in rows]
    peft = [rows[m] for m in PEFT if m in rows]
    if frozen:
        lines.append("- Frozen Q/K against full fine-tuning: " + "; ".join(_said(r) for r in frozen) + ".")
    if peft:
        lines.append("- The fine-tuning field against full fine-tuning: " + "; ".join(_said(r) for r in peft) + ".")
    controls = [rows[m] for m in ("freeze-k", "freeze-qk-weights", "freeze-vo") if m in rows]
    if controls:
        lines.append("- Controls: " + "; ".join(_said(r) for r in controls) + ".")
    if ref is not None and ref.trainable_params and FROZEN_QK in rows:
        f = rows[FROZEN_QK]
        if f.trainable_params is not None:
            lines.append(
                f"- Freezing Q/K keeps {f.trainable_params / ref.trainable_params:.1%} of the parameters trainable; "
                + "; ".join(
                    f"{r.method} trains {r.trainable_params / ref.trainable_params:.2%}"
                    for r in peft
                    if r.trainable_params is not None
                )
                + "."
            )
    chance = [r for r in b.rows if r.at_chance or r.no_result]
    if chance:
        lines.append(
            "- Seeds that ended at chance level on validation (kept in every mean, interval and test): "
            + "; ".join(f"{r.method} {_chance(r)}" for r in chance)
            + "."
        )
    front = [r.method for r in b.rows if not r.dominated_by and r.accuracy is not None]
    lines.append(f"- Not dominated (means of accuracy and every cost): {', '.join(front) or 'none'}.")
    lines += ["", "For a practitioner:", ""]
    if FROZEN_QK in rows:
        f = rows[FROZEN_QK]
        better_peft = [m for m in f.dominated_by if m in PEFT]
        if better_peft:
            lines.append(
                f"On this task freezing Q/K is dominated: {', '.join(better_peft)} reached at least its mean "
                "accuracy while training and storing far less, so there is no reason here to freeze Q/K to save "
                "compute or memory; use a method of the field (its difference to full fine-tuning is in the table)."
            )
        elif f.verdict.startswith("worse"):
            lines.append(
                "On this task freezing Q/K costs accuracy (resolved) for a small saving; it is not worth it here."
            )
        else:
            lines.append(
                "On this task frozen Q/K is not dominated and its cost is not resolved; its saving is small next to "
                "the field's methods, so freeze Q/K only where its saving is the point and the table's interval is "
                "an acceptable risk."
            )
    study = rows.get("oelm-freeze")
    if study is not None and study.diff is not None:
        dominated = [m for m in study.dominated_by if m in PEFT]
        lines.append(
            f"\nThe study's recipe (oelm-freeze: pretrained Q/K re-orthogonalized, then frozen) is {study.verdict} "
            f"against full fine-tuning ({study.diff:+.2f} points)"
            + (f" and dominated by {', '.join(dominated)}." if dominated else ".")
        )
    lines += [
        "",
        "Every statement is at this board's scale (its model, task, budget and seeds); the verdicts say what "
        "the data resolve, and the detectable differences say what they could not.",
        "",
    ]
    return lines


def _task(b: FinetuneBoard) -> str:
    return b.title.split(" (")[0]


def _short(r: Row | None, margin: float) -> str:
    """One cell of the across-tasks table: the difference, its interval and the verdict in a word."""
    if r is None:
        return "not run"
    if r.diff is None:
        return "no paired comparison"
    v = r.verdict
    word = (
        v.split(" (")[0]
        if v.startswith(("worse", "better"))
        else (f"equivalent (±{margin:g})" if v.startswith("equivalent") else f"unresolved (detectable {r.mde:.2f})")
    )
    chance = f"; {_chance(r)} seeds at chance" if r.at_chance or r.no_result else ""
    return f"{r.diff:+.2f} [{r.diff_low:+.2f}, {r.diff_high:+.2f}] {word}{chance}" + (
        f"; dominated by {', '.join(r.dominated_by)}" if r.dominated_by else ""
    )


def _kind(r: Row | None) -> str:
    if r is None or r.diff is None:
        return "none"
    for k in ("worse", "better", "equivalent"):
        if r.verdict.startswith(k):
            return k
    return "unresolved"


def _tasks_where(boards: Sequence[FinetuneBoard], method: str, kind: str) -> list[str]:
    rows = [{r.method: r for r in b.rows}.get(method) for b in boards]
    return [_task(b) for b, r in zip(boards, rows) if _kind(r) == kind]


def _share(boards: Sequence[FinetuneBoard], method: str) -> tuple[float, float] | None:
    """The range over tasks of the method's trainable parameters as a share of full fine-tuning's."""
    shares = []
    for b in boards:
        rows = {r.method: r for r in b.rows}
        me, ref = rows.get(method), rows.get(b.reference)
        if me and ref and me.trainable_params is not None and ref.trainable_params:
            shares.append(me.trainable_params / ref.trainable_params)
    return (min(shares), max(shares)) if shares else None


def _fmt_share(span: tuple[float, float] | None) -> str:
    if span is None:
        return "n/a"
    lo, hi = span
    spec = ".1%" if lo >= 0.01 else ".2%"
    return format(lo, spec) if format(lo, spec) == format(hi, spec) else f"{lo:{spec}}-{hi:{spec}}"


def _record(boards: Sequence[FinetuneBoard], method: str) -> str:
    """Where a method's verdicts fall over the tasks, in one clause."""
    parts = []
    for kind in ("worse", "better", "equivalent", "unresolved"):
        tasks = _tasks_where(boards, method, kind)
        if tasks:
            label = {"worse": "worse (resolved)", "better": "better (resolved)"}.get(kind, kind)
            parts.append(f"{label} on {', '.join(tasks)}")
    return "; ".join(parts) or "no paired comparison"


def _span(lo: float, hi: float) -> str:
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def across(boards: Sequence[FinetuneBoard]) -> list[str]:
    """With more than one task: every arm's difference to full fine-tuning per task in one table, and the
    practitioner's answer over the tasks, from the boards' rows only."""
    if len(boards) < 2:
        return []
    margin = boards[0].margin
    order = [FROZEN_QK, "oelm-freeze", "freeze-k", "freeze-qk-weights", "freeze-vo", *PEFT]
    seen = [r.method for b in boards for r in b.rows if r.method != b.reference]
    methods = [m for m in order if m in seen] + sorted({m for m in seen if m not in order})
    tasks = [_task(b) for b in boards]
    lines = [
        "## Across the tasks",
        "",
        "Each cell: the difference to full fine-tuning in accuracy points [95% CI], its verdict (Holm within "
        "the task's primary family), and the arms that dominate it on that task.",
        "",
        "| method | trainable (share of full fine-tuning) | " + " | ".join(tasks) + " |",
        "|---|---|" + "---|" * len(tasks),
    ]
    for m in methods:
        cells = [_short({r.method: r for r in b.rows}.get(m), margin) for b in boards]
        lines.append(f"| {m} | {_fmt_share(_share(boards, m))} | " + " | ".join(cells) + " |")
    lines += ["", "For a practitioner, over these tasks:", ""]
    for m, name in (
        (FROZEN_QK, "Frozen pretrained Q/K (`freeze-qk`)"),
        ("oelm-freeze", "The study's recipe (`oelm-freeze`)"),
    ):
        if m not in seen:
            continue
        dominated = [_task(b) for b in boards if any(r.method == m and r.dominated_by for r in b.rows)]
        lines.append(
            f"- {name}: {_record(boards, m)}"
            + (f"; dominated on {', '.join(dominated)}" if dominated else "")
            + f". It trains {_fmt_share(_share(boards, m))} of the parameters."
        )
    peft = [m for m in PEFT if m in seen]
    if peft:
        lines.append(
            "- The field: "
            + "; ".join(f"{m} ({_fmt_share(_share(boards, m))} trained) {_record(boards, m)}" for m in peft)
            + "."
        )
    if FROZEN_QK in seen:
        worse = _tasks_where(boards, FROZEN_QK, "worse")
        equal = _tasks_where(boards, FROZEN_QK, "equivalent")
        span = _share(boards, FROZEN_QK)
        saves = "" if span is None else f", saving {_fmt_share((1 - span[1], 1 - span[0]))} of the AdamW state"
        never_worse = [m for m in peft if not _tasks_where(boards, m, "worse") and _share(boards, m)]
        mdes = [r.mde for b in boards for r in b.rows if r.method == FROZEN_QK and _kind(r) == "unresolved" and r.mde]
        if worse:
            advice = (
                f"Freezing pretrained Q/K cost accuracy (resolved) on {', '.join(worse)}{saves}: "
                "do not freeze Q/K to save compute or memory."
            )
        elif len(equal) == len(boards):
            advice = (
                f"Freezing pretrained Q/K stayed within ±{margin:g} points of full fine-tuning on every task "
                f"(equivalence shown){saves}."
            )
        else:
            advice = (
                "No task resolved a loss from freezing pretrained Q/K"
                + (
                    f", but no task showed it within ±{margin:g} points either (these seeds could detect "
                    f"differences of {_span(min(mdes), max(mdes))} points)"
                    if mdes
                    else ""
                )
                + f"{saves}."
            )
        if never_worse:
            most = max(_share(boards, m)[1] for m in never_worse)  # type: ignore[index]
            advice += (
                f" Where the saving is the point, {', '.join(never_worse)} train at most {most:.2%} of the "
                "parameters, and no task resolved a loss from them."
            )
        lines += ["", advice]
    models = sorted({b.title.split(", ")[-1].rstrip(")") for b in boards if ", " in b.title})
    seeds = sorted({len(r.seeds) for b in boards for r in b.rows})
    lines += [
        "",
        f"Every statement is at these boards' scale (model: {', '.join(models) or 'n/a'}; "
        f"{'-'.join(map(str, (seeds[0], seeds[-1]))) if len(seeds) > 1 else seeds[0] if seeds else 0} seeds per arm; "
        "each task's budget as its spec states): the verdicts say what the data resolve, and the detectable "
        "differences say what they could not.",
        "",
    ]
    return lines


def render(boards: Sequence[FinetuneBoard], command: str, figure: str = "pareto.png") -> str:
    """The board page (markdown)."""
    lines = [
        "# Frozen Q/K against the fine-tuning field",
        "",
        f"Generated by `{command}` from stored run records; do not edit by hand.",
        "",
        "Each arm's LR is chosen on validation; accuracy is on the held-out set at that LR. Intervals "
        "are Student-t intervals over seeds x test examples (test-set noise included). Verdicts: "
        "Holm-adjusted within each family; equivalence by TOST within ±margin points.",
        "",
    ]
    lines += across(boards)
    for b in boards:
        lines += [
            f"## {b.title}",
            "",
            f"Reference: {b.reference} (full fine-tuning). Margin ±{b.margin:g} accuracy points. "
            f"Held-out examples: {b.n_examples}.",
            "",
            "### Primary family: every arm against full fine-tuning",
            "",
            *_table(b.rows, b.reference),
            "",
        ]
        if b.exploratory:
            lines += [
                f"### Exploratory family: {FROZEN_QK} against each arm (labelled exploratory)",
                "",
                *_table(b.exploratory, FROZEN_QK),
                "",
            ]
        lines += reading(b)
        if b.warnings:
            lines += ["Warnings:", "", *(f"- {w}" for w in b.warnings), ""]
    lines += [
        f"![accuracy against trainable parameters, optimizer state and step time]({figure})",
        "",
        "Costs: trainable parameters from the freeze audit; AdamW state = 2 fp32 moments per trainable "
        "parameter; peak memory as the runs recorded it (on CPU the run's peak resident memory, which "
        "includes the data and the interpreter"
        + (
            "; a figure marked ≤ was recorded as the process's lifetime peak, which includes what the process "
            "held before the run (a sweep worker's earlier runs, the data its parent prepared): it bounds the "
            "run's from above, and is not a difference between arms"
            if any(r.memory_upper_bound for b in boards for r in b.rows + b.exploratory)
            else ""
        )
        + "); step time = the runs' own mean step time over full "
        "fine-tuning's, paired by seed "
        "(runs shared the machine, so this ratio is rough). Dominated: another arm has at least the "
        "same mean accuracy at no more of every cost and less of one (means, not tests).",
        "",
    ]
    return "\n".join(lines)


def plot(boards: Sequence[FinetuneBoard], path: Path) -> Path:
    """Accuracy (seeds x test examples interval) against trainable parameters, AdamW state and step time."""
    import matplotlib  # heavy optional dependency: imported on use

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy optional dependency: imported on use

    panels = (
        ("trainable_params", "trainable parameters", True),
        ("optimizer_bytes", "AdamW state (bytes)", True),
        ("step_ratio", "step time / full fine-tuning", False),
    )
    fig, axes = plt.subplots(len(boards), 3, figsize=(15, 4.2 * len(boards)), squeeze=False)
    for b, row_axes in zip(boards, axes):
        for ax, (key, label, log) in zip(row_axes, panels):
            for r in b.rows:
                x = getattr(r, key)
                if x is None or r.accuracy is None:
                    continue
                low = r.accuracy - (r.accuracy_low if r.accuracy_low is not None else r.accuracy)
                high = (r.accuracy_high if r.accuracy_high is not None else r.accuracy) - r.accuracy
                color = "tab:gray" if r.dominated_by else "tab:blue"
                ax.errorbar([x], [r.accuracy], yerr=[[low], [high]], fmt="o", color=color, capsize=3)
                ax.annotate(r.method, (x, r.accuracy), textcoords="offset points", xytext=(4, 4), fontsize=7)
            if log:
                ax.set_xscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel("held-out accuracy (%)")
            ax.set_title(b.title, fontsize=9)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def to_json(boards: Sequence[FinetuneBoard], command: str) -> dict[str, Any]:
    """board.json: every number of the page."""
    return {"command": command, "boards": [asdict(b) for b in boards]}


def write_board(
    paths: Sequence[str | Path], out: str | Path, reference: str = REFERENCE, margin: float = MARGIN_POINTS
) -> tuple[Path, list[FinetuneBoard]]:
    """Read the records under `paths`; write OUT/board.md, board.json and pareto.png."""
    boards = build(paths, reference, margin)
    out_dir = Path(out)
    shown = " ".join(Path(p).as_posix() for p in paths)
    command = (
        f"oelm report --view finetune {shown} --out {out_dir.as_posix()}"
        + (f" --baseline {reference}" if reference != REFERENCE else "")
        + (f" --margin {margin:g}" if margin != MARGIN_POINTS else "")
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(boards, out_dir / "pareto.png")
    atomic_write_json(out_dir / "board.json", page_json("finetune", to_json(boards, command)))
    atomic_write_text(out_dir / "board.md", render(boards, command))
    return out_dir / "board.md", boards
