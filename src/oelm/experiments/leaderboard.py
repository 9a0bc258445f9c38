"""The leaderboard: every method of a sweep ranked on its held-out metric, checked against the target.

Built only from stored run records through the same Comparison as `oelm report` (LR chosen on
validation per method, test metric over seeds, paired gap to the reference with its interval, p
(Holm-adjusted over the board), minimum detectable gap and the verdict in the reports' vocabulary).
The reference row is the best-tuned trainable arm: the best held-out mean among the complete
methods that freeze nothing (baseline, oelm-nofreeze, ...), unless `--baseline` names one. Adds what the question "which frozen-attention variant keeps the quality
while keeping the saving?" needs: the theoretical saving and the share of the reference method's
(oelm-freeze) saving a method keeps, added adapter parameters, a verdict against the target, and
the Pareto front of gap against compute saved. Deterministic: no timestamps, sorted output.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oelm.core.methods import get_method, twin_of
from oelm.records.load import load_runs
from oelm.records.run import RunRecord
from oelm.records.sweep import read_sweep_record
from oelm.reports import stats
from oelm.reports.aggregate import BASELINE, Arm, Group, compare, gap_by_seed, rebase
from oelm.reports.tables import (
    CONFIRM_PLAN,
    NA,
    fmt_gap,
    fmt_int,
    fmt_p,
    fmt_summary,
    fmt_verdict,
    md_table,
    pct_scale,
    pilot_text,
    saving_fraction,
    verdict_text,
)
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text

REFERENCE = "oelm-freeze"  # the method whose Q/K weight-gradient saving the target is measured against
# AdamW keeps two fp32 moments per trainable parameter; DDP all-reduces one fp32 gradient each.
ADAM_STATE_BYTES, GRAD_BYTES = 8, 4


@dataclass(frozen=True)
class Target:
    """The issue's target: gap <= max_gap %, paired upper end <= max_upper %, share >= min_share."""

    max_gap: float = 2.0
    max_upper: float = 3.0
    min_share: float = 0.75
    reference: str = REFERENCE

    def text(self) -> str:
        """The target in one sentence."""
        return (
            f"gap to the reference at most {self.max_gap:g}% with the upper end of its paired 95% "
            f"interval at most {self.max_upper:g}%, while keeping at least "
            f"{self.min_share * 100:g}% of {self.reference}'s Q/K weight-gradient saving"
        )


@dataclass
class Entry:
    """One method of a leaderboard: its arm from the Comparison plus what the leaderboard adds."""

    arm: Arm
    saving: float | None  # theoretical training-FLOP saving, a fraction of full training
    share: float | None  # saving / the reference method's saving
    added_params: int | None  # parameters a method adds (adapter role of the freeze audit)
    step_ratio: stats.Summary  # per-seed step-time ratio vs the reference (paired by seed)
    rank: int | None = None
    twin: str | None = None  # the method's same-init trainable twin (core.methods.twin_of), when on the board
    twin_gap: stats.Summary | None = None  # paired % gap to that twin, where shown
    twin_decision: stats.Decision | None = None  # its verdict (Holm over the twin comparisons)
    meets: bool = False
    misses: list[str] = field(default_factory=list)  # target criteria it misses
    incomplete: str = ""  # why it is not ranked ('' when it is)
    # The saving two more ways, as fractions of the reference's (full training at full width):
    # optimizer state (AdamW moments of every tensor trainable at some step) and gradient bytes
    # all-reduced per step under data parallelism (averaged over a schedule's steps).
    state_saving: float | None = None
    comm_saving: float | None = None

    @property
    def method(self) -> str:
        """Method name."""
        return self.arm.method

    @property
    def upper(self) -> float | None:
        """Upper end of the paired 95% interval of the gap (%)."""
        paired = self.arm.gap_paired
        return None if paired is None else paired.ci_high


@dataclass
class Board:
    """The leaderboard of one table (task, dataset, model, primary metric)."""

    group: Group
    ranked: list[Entry]
    unranked: list[Entry]
    front: list[str]  # methods on the Pareto front (lower gap, higher saving), by saving
    passing: list[str]
    closest: str | None
    verdict: str
    warnings: list[str]
    reference_rule: str = ""  # how the reference row was chosen, in words
    twin: bool = False  # whether any frozen method is also compared with its same-init trainable twin


# ---------------------------------------------------------------------------------------------
# Numbers from the records


def added_params(runs: Sequence[RunRecord]) -> int | None:
    """Parameters of the adapter role in the first readable freeze audit (0 when none were added)."""
    audit = next((r.audit for r in runs if r.audit is not None and r.audit.by_role), None)
    return None if audit is None else audit.role_params("adapter")


def step_ratio(arm: Arm, base: Arm | None) -> stats.Summary:
    """Per-seed ratio of mean step time to the baseline's (same seed), summarized over seeds."""
    if base is None:
        return stats.summarize([])
    base_times = {r.seed: r.results.get("mean_step_time") for r in base.runs}
    ratios = []
    for run in arm.runs:
        t, b = run.results.get("mean_step_time"), base_times.get(run.seed)
        if isinstance(t, (int, float)) and isinstance(b, (int, float)) and b > 0:
            ratios.append(t / b)
    return stats.summarize(ratios)


def _planned(roots: Sequence[str | Path], seeds: set[int] | None = None) -> dict[str, set[str]]:
    """Method -> run directories that a stored SWEEP/sweep.yaml plans (of `seeds`, when given)."""

    planned: dict[str, set[str]] = {}
    for root in roots:
        record = read_sweep_record(root)
        for run in record.planned() if record is not None else []:
            if seeds is None or run.seed in seeds:
                planned.setdefault(run.method, set()).add(os.path.normpath(record.run_dir(run)))
    return planned


def _incomplete_reason(arm: Arm, n_max: int, missing: int, unfinished: int) -> str:
    """Why a method is not ranked ('' when it is complete)."""
    reasons = []
    if arm.primary.n == 0:
        reasons.append("no finished seed at any setting")
    elif arm.primary.n < n_max:
        reasons.append(f"{arm.primary.n} of {n_max} seeds at its chosen setting")
    short = [c.setting for c in arm.cells if len(c.runs) + len(c.excluded) < n_max]
    if short:
        reasons.append("settings with missing seeds: " + ", ".join(short))
    if missing:
        reasons.append(f"{missing} planned run(s) of the sweep not finished")
    elif unfinished:
        reasons.append(f"{unfinished} unfinished run(s)")
    return "; ".join(reasons)


# ---------------------------------------------------------------------------------------------
# Ranking, verdict, Pareto front


def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """Methods no other method beats on both (lower gap, higher saving), ordered by saving."""
    front = []
    for name, (gap, save) in points.items():
        dominated = any(
            g <= gap and s >= save and (g < gap or s > save) for other, (g, s) in points.items() if other != name
        )
        if not dominated:
            front.append(name)
    return sorted(front, key=lambda m: (points[m][1], m))


def _check(entry: Entry, target: Target) -> None:
    """Fill entry.meets and entry.misses against the target."""
    gap, upper, share = entry.arm.gap, entry.upper, entry.share
    misses = []
    if trainable(entry.arm):  # a control saving by architecture (thin keys) is no frozen variant
        misses.append("freezes nothing: a trainable control, not a frozen variant")
    if gap is None or gap > target.max_gap:
        misses.append(f"gap {_pct(gap)} > {target.max_gap:g}%" if gap is not None else "no gap")
    if upper is None or upper > target.max_upper:
        misses.append(
            f"paired upper end {_pct(upper)} > {target.max_upper:g}%"
            if upper is not None
            else "no paired interval (needs >= 2 paired seeds)"
        )
    if share is None or share < target.min_share:
        misses.append(
            f"keeps {share * 100:.0f}% < {target.min_share * 100:g}% of the saving"
            if share is not None
            else f"saving share unknown (no {target.reference} saving)"
        )
    entry.misses, entry.meets = misses, not misses


def _closest(candidates: list[Entry], target: Target) -> Entry | None:
    """Among frozen methods keeping enough saving, the smallest paired upper end; else the smallest gap."""
    keeps = [
        e
        for e in candidates
        if e.share is not None and e.share >= target.min_share and e.upper is not None and not trainable(e.arm)
    ]
    if keeps:
        return min(keeps, key=lambda e: (e.upper, e.method))
    gapped = [e for e in candidates if e.arm.gap is not None]
    return min(gapped, key=lambda e: (e.arm.gap, e.method)) if gapped else None


def _verdict(ranked: list[Entry], baseline: str | None, target: Target) -> tuple[list[str], str | None, str]:
    """Names that meet the target, the closest when none does, and the verdict sentence."""
    candidates = [e for e in ranked if e.method != baseline]
    for e in candidates:
        _check(e, target)
    passing = [e.method for e in candidates if e.meets]
    if passing:
        shown = "; ".join(_entry_numbers(e) for e in candidates if e.meets)
        return passing, None, f"**Target met** by {', '.join(passing)}: {shown}."
    close = _closest(candidates, target)
    if close is None:
        return [], None, "**No method meets the target**: no ranked method has a gap to compare."
    text = (
        f"**No method meets the target.** Closest: {close.method}, {_entry_numbers(close)}; "
        f"it misses: {'; '.join(close.misses)}."
    )
    gapped = [e for e in candidates if e.arm.gap is not None]
    best_gap = min(gapped, key=lambda e: (e.arm.gap, e.method))
    if best_gap is not close:  # the smallest gap fails on another criterion: say which
        text += (
            f" The smallest gap is {best_gap.method}'s ({_entry_numbers(best_gap)}), which "
            f"misses: {'; '.join(best_gap.misses)}."
        )
    return [], close.method, text


def _entry_numbers(e: Entry) -> str:
    """Gap, paired interval, p and saving share of one entry in words."""
    paired = e.arm.gap_paired
    ci = f" [{paired.ci_low:+.2f}, {paired.ci_high:+.2f}]" if paired is not None and paired.ci_low is not None else ""
    d = e.arm.decision
    p = f"p = {d.p:.3g}, Holm p = {d.holm_p:.3g} (m = {d.m}); " if d is not None and d.p is not None else ""
    share = NA if e.share is None else f"{e.share * 100:.0f}%"
    return f"gap {_pct(e.arm.gap)}{ci} ({p}{verdict_text(d)}), keeps {share} of the saving"


def _pct(x: float | None) -> str:
    """A signed percentage or n/a."""
    return NA if x is None else f"{x:+.2f}%"


def trainable(arm: Arm) -> bool:
    """Whether a method freezes nothing: by its registered record, else by its frozen parameters."""
    try:
        method = get_method(arm.method)
    except UserError:  # a method this version does not register: trust the recorded counts
        return arm.frozen_params == 0
    return not method.freeze and not arm.frozen_params


def frozen_twin_of(method: str) -> str | None:
    """The method's same-init trainable twin (`oelm.core.methods.twin_of`); None if unregistered or none."""
    try:
        return twin_of(method)
    except UserError:
        return None


def trainable_counts(arm: Arm) -> tuple[float | None, float | None]:
    """(peak, step-averaged) trainable parameters of an arm, from its start audit and method record.

    Peak: every tensor trainable at some step holds optimizer state (a late freeze does not free
    it). Step-averaged: what data parallelism all-reduces per step. A schedule's tensors count
    for the fraction of steps they train; None when the record cannot say (unknown method, or a
    schedule on a layer subset).
    """
    start = arm.trainable_params
    if start is None:
        return None, None
    try:
        m = get_method(arm.method)
    except UserError:
        return (float(start), float(start)) if not arm.frozen_params else (None, None)
    if m.schedule is None:
        return float(start), float(start)
    run = arm.runs[0] if arm.runs else None
    options = (run.results.get("method_options") if run else None) or {}
    audit = run.audit if run else None
    f = options.get("f")
    if audit is None or not audit.by_role or not isinstance(f, (int, float)) or options.get("layers", "all") != "all":
        return None, None
    scheduled = audit.role_params(*m.freeze)
    if m.schedule == "late-freeze":  # trainable for the first f of the steps
        return float(start), start - (1 - f) * scheduled
    return float(start + scheduled), start + (1 - f) * scheduled  # unfreeze: trainable from f on


def _savings(entry: Entry, ref: Arm | None) -> None:
    """Optimizer-state and all-reduce savings of an entry against the reference's trainable count."""
    if ref is None or not ref.trainable_params:
        return
    peak, avg = trainable_counts(entry.arm)
    full = float(ref.trainable_params)
    entry.state_saving = None if peak is None else 1 - peak / full
    entry.comm_saving = None if avg is None else 1 - avg / full


def choose_reference(group: Group, complete: set[str]) -> Arm | None:
    """The best-tuned trainable arm: the best held-out mean among complete methods freezing nothing."""
    pool = [a for a in group.arms if a.method in complete and a.primary.mean is not None and trainable(a)]
    sign = -1.0 if group.higher_is_better else 1.0
    return min(pool, key=lambda a: (sign * a.primary.mean, a.method)) if pool else None


def _twin_gaps(group: Group, entries: list[Entry], complete: set[str], margin: float) -> bool:
    """Fill the paired gap of every frozen method to its same-init trainable twin (Holm over them all).

    Returns whether any method got one.
    """
    arms = {a.method: a for a in group.arms if a.method in complete}
    family = []
    for e in entries:
        twin = frozen_twin_of(e.method)
        # A twin that is the reference needs no second column: the main gap is to it.
        if twin in arms and twin != group.baseline and not e.incomplete:
            e.twin = twin
            family.append(e)
    gaps = [list(gap_by_seed(e.arm, arms[e.twin], group.higher_is_better).values()) for e in family]
    for e, g, d in zip(family, gaps, stats.decide_family(gaps, margin)):
        e.twin_gap, e.twin_decision = stats.summarize(g), d
    return bool(family)


def build_board(
    group: Group,
    runs: Sequence[RunRecord],
    planned: dict[str, set[str]],
    target: Target = Target(),
    fixed_reference: bool = False,
) -> Board:
    """Rank the complete methods of one table, list the rest, apply the target, find the front.

    Unless `fixed_reference` (the caller named the reference), every gap is taken to the
    best-tuned trainable arm (`choose_reference`).
    """
    finished = {os.path.normpath(r.path) for r in runs if r.finished}
    n_max = max((a.primary.n for a in group.arms), default=0)
    reasons = {}
    for arm in group.arms:
        missing = len(planned.get(arm.method, set()) - finished)
        unfinished = sum(1 for r in runs if not r.finished and r.method == arm.method)
        reasons[arm.method] = _incomplete_reason(arm, n_max, missing, unfinished)
    complete = {m for m, why in reasons.items() if not why}
    if fixed_reference:
        rule = "named by --baseline"
    else:
        best = choose_reference(group, complete)
        if best is not None:
            if best.method != group.baseline:
                rebase(group, best.method)
            rule = "the best-tuned trainable arm: best held-out mean among complete methods freezing nothing"
        else:
            rule = "no complete method freezes nothing: the default reference"
    return rank_board(group, reasons, rule, target)


def rank_board(
    group: Group,
    reasons: dict[str, str],
    rule: str,
    target: Target = Target(),
) -> Board:
    """The board of a table already compared with its reference: `reasons` says why a method is not
    ranked ('' when it is), `rule` how the reference was chosen."""
    complete = {m for m, why in reasons.items() if not why}
    base = next((a for a in group.arms if a.method == group.baseline), None)
    ref = next((a for a in group.arms if a.method == target.reference), None)
    ref_saving = saving_fraction(ref.theoretical_saving) if ref else None
    entries = []
    for arm in group.arms:
        saving = saving_fraction(arm.theoretical_saving)
        share = saving / ref_saving if saving is not None and ref_saving else None
        entry = Entry(arm, saving, share, added_params(arm.runs), step_ratio(arm, base))
        entry.incomplete = reasons[arm.method]
        _savings(entry, base)
        entries.append(entry)
    has_twins = _twin_gaps(group, entries, complete, group.margin)
    sign = -1.0 if group.higher_is_better else 1.0
    ranked = sorted((e for e in entries if not e.incomplete), key=lambda e: (sign * e.arm.primary.mean, e.method))
    for i, e in enumerate(ranked, 1):
        e.rank = i
    unranked = sorted((e for e in entries if e.incomplete), key=lambda e: e.method)
    points = {e.method: (e.arm.gap, e.saving * 100) for e in ranked if e.arm.gap is not None and e.saving is not None}
    passing, closest, verdict = _verdict(ranked, group.baseline, target)
    warnings = list(group.warnings)
    if ref_saving is None:
        warnings.append(
            f"no {target.reference} runs with a recorded saving: the saving share and its criterion cannot be evaluated"
        )
    if base is not None and any(e.method == base.method for e in unranked):
        warnings.append(f"the reference {base.method} is itself incomplete: every gap is provisional")
    board = Board(group, ranked, unranked, pareto_front(points), passing, closest, verdict, warnings)
    board.reference_rule, board.twin = rule, has_twins
    return board


def build(
    paths: Sequence[str | Path],
    baseline: str | None = None,
    target: Target = Target(),
    seeds: Sequence[int] | None = None,
    margin: float = stats.MARGIN,
) -> tuple[list[Board], list[str], list[RunRecord]]:
    """Boards of every table under the sweep directories, planned methods without a run, the runs.

    `seeds` keeps only runs of those seeds: a board over the seeds every method has, when some
    methods (say the main comparison) have more seeds than others. `baseline` fixes the reference
    row; None takes the best-tuned trainable arm of each table. `margin` is the equivalence
    margin (% of the reference's metric).
    """
    keep = None if seeds is None else set(seeds)
    runs = [r for r in load_runs(paths) if keep is None or r.seed in keep]
    if not runs and keep is not None:
        raise UserError(
            f"no run of seeds {sorted(keep)} under {', '.join(map(str, paths))}; "
            "pass seeds the sweep has (its runs live in .../seed<N>/)"
        )
    planned = _planned(paths, keep)
    fixed = baseline is not None
    if baseline is None:  # the starting reference; each table then takes its best trainable arm
        baseline = _stored_baseline(paths) or BASELINE
    comparison = compare(runs, baseline=baseline, margin=margin)
    boards = []
    for group in comparison.groups:
        members = [r for r in runs if r.task == group.task and r.model == group.model]
        boards.append(build_board(group, members, planned, target, fixed_reference=fixed))
    seen = {a.method for g in comparison.groups for a in g.arms}
    not_started = sorted(m for m in planned if m not in seen)
    return boards, not_started, runs


def _stored_baseline(paths: Sequence[str | Path]) -> str | None:
    """The baseline a stored sweep.yaml names, if any."""
    records = (read_sweep_record(root) for root in paths)
    return next((r.baseline for r in records if r is not None), None)


# ---------------------------------------------------------------------------------------------
# Output


def command_line(
    paths: Sequence[str | Path],
    out: str | Path,
    baseline: str | None,
    seeds: Sequence[int] | None = None,
    margin: float = stats.MARGIN,
) -> str:
    """The exact command that regenerates the leaderboard (paths relative to here when inside)."""

    def rel(p: str | Path) -> str:
        text = str(p)
        if os.path.isabs(text):
            rel_text = os.path.relpath(text)  # a committed report names no absolute path
            return text if rel_text.startswith("..") else rel_text
        return text

    parts = ["oelm", "leaderboard", *(rel(p) for p in paths), "--out", rel(out)]
    if baseline:
        parts += ["--baseline", baseline]
    if seeds is not None:
        parts += ["--seeds", *(str(s) for s in seeds)]
    if margin != stats.MARGIN:
        parts += ["--margin", f"{margin:g}"]
    return " ".join(parts)


def _mde(arm: Arm) -> str:
    """Minimum detectable gap (paired t, alpha 0.05, power 0.8) at this number of seeds."""
    pw = arm.power
    if pw is None or pw.mde is None:
        return f"n/a ({pw.n if pw else 0} paired seeds)"
    return f"±{pw.mde:.2f}%"


def _twin_cell(e: Entry) -> str:
    """Paired gap to the trainable twin with its interval and verdict, or —."""
    s = e.twin_gap
    if s is None or s.mean is None:
        return "—"
    ci = f" [{s.ci_low:+.2f}, {s.ci_high:+.2f}]" if s.ci_low is not None else ""
    return f"vs {e.twin}: {s.mean:+.2f}%{ci}: {verdict_text(e.twin_decision)}"


def _ratio(s: stats.Summary) -> str:
    """Step-time ratio mean with its per-seed interval."""
    if s.mean is None:
        return NA
    if s.half_width is None:
        return f"{s.mean:.3f}"
    return f"{s.mean:.3f} ± {s.half_width:.3f}"


def _pct_or_na(x: float | None) -> str:
    """A saving fraction as a percentage (negative: the method costs more), or n/a."""
    return NA if x is None else f"{x * 100:.2f}%"


def _params(e: Entry) -> str:
    """Trainable / frozen / added parameters."""
    return f"{fmt_int(e.arm.trainable_params)} / {fmt_int(e.arm.frozen_params)} / {fmt_int(e.added_params)}"


def _table(board: Board) -> list[str]:
    """Markdown rows of the ranked table."""
    g = board.group
    scale = pct_scale(g)
    direction = "higher" if g.higher_is_better else "lower"
    head = [
        "rank",
        "method",
        "lr (chosen on val)",
        f"{g.primary_metric}: mean ± 95% CI (n seeds), {direction} is better",
        f"gap vs {g.baseline or BASELINE} (%, + = worse) [paired 95% CI]",
        "p (paired t), Holm-adjusted",
        f"verdict vs {g.baseline or BASELINE}",
        "min. detectable gap",
    ]
    if board.twin:
        head.append("gap vs its same-init trainable twin [paired 95% CI]: verdict")
    head += [
        "trainable / frozen / added params",
        "saving: training FLOPs",
        f"share of {REFERENCE}'s FLOP saving",
        "saving: optimizer state",
        "saving: bytes all-reduced per step",
        f"step-time ratio vs {g.baseline or BASELINE} (indicative)",
        "target",
    ]
    rows = []
    for e in board.ranked:
        is_base = e.method == g.baseline
        target = "—" if is_base else ("**meets**" if e.meets else "no")
        rows.append(
            [
                str(e.rank),
                e.method,
                NA if e.arm.lr is None else f"{e.arm.lr:g}",
                fmt_summary(e.arm.primary, scale),
                fmt_gap(e.arm, g),
                fmt_p(e.arm, g) if not is_base else "—",
                fmt_verdict(e.arm, g),
                "—" if is_base else _mde(e.arm),
                *([_twin_cell(e)] if board.twin else []),
                _params(e),
                NA if e.saving is None else f"{e.saving * 100:.2f}%",
                NA if e.share is None else f"{e.share * 100:.0f}%",
                _pct_or_na(e.state_saving),
                _pct_or_na(e.comm_saving),
                _ratio(e.step_ratio),
                target,
            ]
        )
    return md_table(head, rows)


def _unranked(board: Board, not_started: Sequence[str]) -> list[str]:
    """Methods listed apart: too few seeds or missing learning rates."""
    if not board.unranked and not not_started:
        return []
    scale = pct_scale(board.group)
    lines = [
        "### Incomplete (listed, not ranked)",
        "",
        "Fewer seeds than the other methods, or settings of the LR grid not finished: their "
        "numbers are not comparable yet.",
        "",
    ]
    rows = [
        [e.method, e.incomplete, fmt_summary(e.arm.primary, scale), fmt_gap(e.arm, board.group)] for e in board.unranked
    ]
    rows += [[m, "planned by the sweep, no finished run", NA, NA] for m in not_started]
    lines += md_table(["method", "why", f"{board.group.primary_metric} so far", "gap so far"], rows)
    return lines + [""]


TIMING_NOTE = (
    "Step times come from runs on a shared machine (other jobs ran alongside), so the step-time "
    "ratios are indicative only: the ± is the spread of the per-seed ratios (paired by seed), "
    "not the machine's noise floor. No A/A control (the baseline timed against itself) is in "
    "these records, so a ratio within a few percent of 1 cannot be told from timing noise; "
    "`benchmarks/freeze_cost.py --control` measures that floor side by side."
)


def _notes(target: Target, margin: float = stats.MARGIN) -> list[str]:
    """How to read the table."""
    return [
        f"How to read: each method at its own learning rate, chosen on validation "
        f"(`oelm report`'s rule); the metric is held-out test, mean ± half-width of the 95% "
        f"Student-t interval over seeds. The reference row is the best-tuned trainable arm (the "
        f"best held-out mean among the complete methods that freeze nothing: baseline, "
        f"oelm-nofreeze, ...) unless `--baseline` names one; each table says which. The gap is % "
        f"of the reference's mean (+ = worse); the bracket is the 95% interval of the per-seed "
        f"gaps, paired by seed, and p the t-test of those gaps, Holm-adjusted over the m ranked "
        f"methods compared with the reference. The verdict is one of: worse (resolved), better "
        f"(resolved), equivalent within ±{margin:g}% (TOST, Holm-adjusted), or unresolved "
        f"(smallest detectable gap X at 80% power); unresolved is not evidence of no difference. "
        f"A frozen method whose same-init trainable twin is on the board (`oelm methods`: "
        f"oelm-nofreeze for head-wise orthogonal Q/K, baseline-scaled for the scale-matched random "
        f"init, oelm-mimetic-nofreeze, oelm-thin-keys-nofreeze) also shows its gap to that twin, with "
        f"its own verdict (Holm over all twin comparisons): what freezing costs at the same init. "
        f"The saving is given three ways, each against full training of the full-width model: "
        f"training FLOPs as the runs recorded them (every matmul, LM head and attention scores "
        f"included; adapters count as extra cost, schedules are averaged over steps); optimizer "
        f"state (AdamW's two fp32 moments of every tensor trainable at some step, relative to the "
        f"reference's trainable parameters); and gradient bytes all-reduced per step under data "
        f"parallelism (frozen gradients are not communicated; averaged over a schedule's steps). "
        f"The share column divides the FLOP saving by {target.reference}'s, which freezes Q and K "
        f"and so saves exactly their weight gradients. Parameters: trainable / frozen / added by "
        f"the method (the audit's adapter role).",
        "",
        TIMING_NOTE,
    ]


def _pilot_lines(board: Board, confirm: str) -> list[str]:
    """Each ranked method's verdict as a pilot result: the fresh seeds a confirmation needs."""
    texts = []
    for e in board.ranked:
        if e.method != board.group.baseline and (t := pilot_text(e.arm, board.group, confirm)):
            texts.append(f"- {e.method}: {t}")
    if not texts:
        return []
    return [
        "Pilot results: these seeds also chose every LR on validation, so each verdict above is a pilot "
        "result; a confirmation on fresh seeds (`oelm confirm`) needs (power analysis from the pilot's "
        "paired SD of the per-seed gap, paired t, alpha 0.05, power 0.8):",
        "",
        *texts,
        "",
    ]


def render(
    boards: Sequence[Board],
    not_started: Sequence[str],
    command: str,
    n_runs: int,
    target: Target = Target(),
    confirm: str = CONFIRM_PLAN,
    source: str | None = None,
    pareto: str = "pareto.png",
) -> str:
    """leaderboard.md: the command first, then one ranked table per table of runs.

    `source` replaces the line saying where the numbers come from (a board re-rendered from stored
    JSON says so there); `pareto` is the figure's file name.
    """
    built = f"Built from {n_runs} stored run directories (results.json, timing_stats.json, freeze_audit.json) only."
    lines = [
        "# Leaderboard",
        "",
        "Regenerate with:",
        "",
        "```",
        command,
        "```",
        "",
        built if source is None else source,
        "",
        f"**Target:** a variant with a {target.text()}.",
        "",
        *_notes(target, boards[0].group.margin if boards else stats.MARGIN),
        "",
    ]
    if not boards:
        lines += ["No finished runs: nothing to rank.", ""]
        lines += _unranked_only(not_started)
    for i, board in enumerate(boards):
        g = board.group
        lines += [f"## {g.title}: {g.primary_metric}", ""]
        m = g.comparisons
        lines += [
            f"Reference: **{g.baseline}** ({board.reference_rule}); {m} ranked method"
            f"{'s' if m != 1 else ''} compared with it (m = {m}, Holm-adjusted; equivalence margin "
            f"±{g.margin:g}%).",
            "",
            f"Target: {board.verdict}",
            "",
        ]
        if board.warnings:
            lines += [*(f"- **Warning:** {w}" for w in board.warnings), ""]
        lines += [*_table(board), ""]
        lines += _pilot_lines(board, confirm)
        lines += _unranked(board, not_started if i == 0 else [])
        front = ", ".join(board.front) if board.front else NA
        lines += [f"Pareto front (lower gap, higher theoretical saving; ranked methods): {front}.", ""]
        lines += [f"![gap against compute saved]({pareto})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _unranked_only(not_started: Sequence[str]) -> list[str]:
    """Planned methods listed when no table exists."""
    return [f"- {m}: planned by the sweep, no finished run" for m in not_started]


def _summary_json(s: stats.Summary | None) -> dict | None:
    """A Summary as a dict."""
    return None if s is None else s.to_dict()


def _entry_json(e: Entry) -> dict[str, Any]:
    """One row for leaderboard.json."""
    a = e.arm
    return {
        "rank": e.rank,
        "method": a.method,
        "lr": a.lr,
        "setting": a.setting,
        "primary": a.primary.to_dict(),
        "by_seed": {str(k): v for k, v in sorted(a.by_seed.items())},
        "gap_percent": a.gap,
        "gap_paired": _summary_json(a.gap_paired),
        "paired_test": a.test.to_dict() if a.test else None,
        "power": a.power.to_dict() if a.power else None,
        "decision": a.decision.to_dict() if a.decision else None,
        "verdict": None if a.decision is None else verdict_text(a.decision),
        "twin_gap": _summary_json(e.twin_gap),
        "twin_decision": e.twin_decision.to_dict() if e.twin_decision else None,
        "twin_verdict": None if e.twin_decision is None else verdict_text(e.twin_decision),
        "trainable_params": a.trainable_params,
        "frozen_params": a.frozen_params,
        "added_params": e.added_params,
        "theoretical_saving": e.saving,
        "saving_share": e.share,
        "optimizer_state_saving": e.state_saving,
        "allreduce_saving": e.comm_saving,
        "twin": e.twin,
        "step_time_ratio": _summary_json(e.step_ratio),
        "meets_target": e.meets,
        "misses": e.misses,
        "incomplete": e.incomplete or None,
    }


def to_json(
    boards: Sequence[Board],
    not_started: Sequence[str],
    command: str,
    target: Target = Target(),
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """leaderboard.json: the same numbers as the markdown (`provenance`: what a re-rendered board was
    built from, kept for the next re-rendering)."""
    return {
        "command": command,
        **(provenance or {}),
        "target": {
            "max_gap_percent": target.max_gap,
            "max_upper_percent": target.max_upper,
            "min_saving_share": target.min_share,
            "reference": target.reference,
        },
        "tables": [
            {
                "task": b.group.task,
                "dataset": b.group.dataset,
                "model": b.group.model,
                "primary_metric": b.group.primary_metric,
                "higher_is_better": b.group.higher_is_better,
                "baseline": b.group.baseline,
                "reference": b.group.baseline,
                "reference_rule": b.reference_rule,
                "twin": b.twin,
                "margin_percent": b.group.margin,
                "comparisons": b.group.comparisons,
                "verdict": b.verdict,
                "passing": b.passing,
                "closest": b.closest,
                "pareto_front": b.front,
                "warnings": b.warnings,
                "ranked": [_entry_json(e) for e in b.ranked],
                "incomplete": [_entry_json(e) for e in b.unranked],
            }
            for b in boards
        ],
        "not_started": list(not_started),
    }


def plot(boards: Sequence[Board], path: Path, target: Target = Target()) -> Path:
    """pareto.png: gap (paired interval as error bars) against theoretical saving, front drawn."""
    import matplotlib  # heavy optional dependency: imported on use

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy optional dependency: imported on use

    n = max(1, len(boards))
    fig, axes = plt.subplots(1, n, figsize=(6.4 * n, 4.6), squeeze=False)
    for ax, board in zip(axes[0], boards):
        _plot_board(ax, board, target)
    if not boards:
        axes[0][0].text(0.5, 0.5, "no finished runs", ha="center", va="center")
    fig.tight_layout()

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})  # no version stamp
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _plot_board(ax: Any, board: Board, target: Target) -> None:
    """One table's scatter with error bars, labels, the Pareto front and the target's lines."""
    ref = next((e for e in board.ranked + board.unranked if e.method == target.reference), None)
    ref_saving = ref.saving if ref else None
    pts = [e for e in board.ranked if e.arm.gap is not None and e.saving is not None]
    for e in pts:
        x, y = e.saving * 100, e.arm.gap
        paired = e.arm.gap_paired
        has = paired is not None and paired.ci_low is not None
        err = [[max(0.0, y - paired.ci_low) if has else 0.0], [max(0.0, paired.ci_high - y) if has else 0.0]]
        color = "tab:green" if e.meets else ("black" if e.method == board.group.baseline else "tab:blue")
        ax.errorbar([x], [y], yerr=err, fmt="o", color=color, capsize=3, ms=5)
        ax.annotate(e.method, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    front = [e for m in board.front for e in pts if e.method == m]
    if len(front) > 1:
        ax.plot(
            [e.saving * 100 for e in front],
            [e.arm.gap for e in front],
            "--",
            color="tab:red",
            alpha=0.7,
            label="Pareto front",
        )
    ax.axhline(0, color="black", linewidth=0.6)
    ax.axhline(target.max_gap, color="tab:green", linestyle=":", linewidth=1, label=f"target gap {target.max_gap:g}%")
    if ref_saving is not None:
        ax.axvline(
            ref_saving * 100 * target.min_share,
            color="tab:green",
            linestyle="-.",
            linewidth=1,
            label=f"{target.min_share * 100:g}% of {target.reference}'s saving",
        )
    ax.legend(fontsize=7, loc="upper left")
    ax.set_xlabel("compute saved: theoretical training-FLOP saving (%)")
    ax.set_ylabel(f"gap vs {board.group.baseline or BASELINE} (reference; %, + = worse), paired 95% CI")
    ax.set_title(f"{board.group.title}: {board.group.primary_metric}", fontsize=9)
    ax.grid(alpha=0.3)


def write_leaderboard(
    paths: Sequence[str | Path],
    out: str | Path,
    baseline: str | None = None,
    target: Target = Target(),
    seeds: Sequence[int] | None = None,
    margin: float = stats.MARGIN,
) -> tuple[Path, list[Board]]:
    """Read the records under `paths`, write OUT/leaderboard.md, leaderboard.json and pareto.png."""
    if not paths:
        raise UserError("no sweep directory given; pass the directory `oelm sweep` wrote")
    boards, not_started, runs = build(paths, baseline, target, seeds, margin)
    out_dir = Path(out)
    command = command_line(paths, out_dir, baseline, seeds, margin)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(boards, out_dir / "pareto.png", target)
    atomic_write_json(out_dir / "leaderboard.json", to_json(boards, not_started, command, target))
    sweep = Path(paths[0]).as_posix()
    confirm = f"oelm confirm plan {sweep} --seeds {{seeds}} --out {sweep}-confirm" + (
        f" --baseline {baseline}" if baseline else ""
    )
    text = render(boards, not_started, command, len(runs), target, confirm)
    atomic_write_text(out_dir / "leaderboard.md", text)
    return out_dir / "leaderboard.md", boards
