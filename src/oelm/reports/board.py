"""The leaderboard's boards: every method of a sweep ranked on its held-out metric, checked
against the target, with its Pareto front. `oelm.reports.leaderboard` writes them out.

Built only from stored run records through the same Comparison as `oelm report` (LR chosen on
validation per method, test metric over seeds, paired gap to the reference with its interval, p
(Holm-adjusted over the board), minimum detectable gap and the verdict in the reports' vocabulary).
The reference row is the best-tuned trainable arm: the best validation mean (never a held-out
number) among the complete methods that freeze nothing (baseline, oelm-nofreeze, ...), unless `--baseline` names one. Adds
what the question "which frozen-attention variant keeps the quality while keeping the saving?"
needs: the theoretical saving and the share of the reference method's (oelm-freeze) saving a
method keeps, added adapter parameters, a verdict against the target, and the Pareto front of gap
against compute saved. Deterministic: sorted output.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from oelm.core.methods import get_method, twin_of
from oelm.records.load import load_runs
from oelm.records.run import RunRecord
from oelm.records.sweep import SweepRecord, declared_lr_rule, declared_primary, sweep_records
from oelm.reports import stats
from oelm.reports.aggregate import BASELINE, Arm, Group, Versus, compare, compare_pairs, rebase, step_time_ratio
from oelm.reports.tables import (
    GAP_NAME,
    MEANS_NAME,
    fmt_fraction,
    fmt_holm,
    fmt_pct,
    fmt_versus_gap,
    saving_fraction,
    verdict_text,
)
from oelm.utils.errors import UserError

REFERENCE = "oelm-freeze"  # the method whose Q/K weight-gradient saving the target is measured against


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
            f"{GAP_NAME} to the reference at most {self.max_gap:g}% with the upper end of its paired 95% "
            f"interval at most {self.max_upper:g}%, while keeping at least "
            f"{self.min_share * 100:g}% of {self.reference}'s Q/K weight-gradient saving"
        )


TARGET = Target()  # the target, every board's default


@dataclass
class Entry:
    """One method of a leaderboard: its arm and its comparison with the board's reference from the
    Comparison, plus what the leaderboard adds."""

    arm: Arm
    versus: Versus  # against the board's reference (the group's versus_of this method)
    saving: float | None  # theoretical training-FLOP saving, a fraction of full training
    share: float | None  # saving / the reference method's saving
    added_params: int | None  # parameters a method adds (adapter role of the freeze audit)
    step_ratio: float | None  # step-time ratio vs the reference (aggregate.step_time_ratio)
    rank: int | None = None
    # Against the method's same-init trainable twin (core.methods.twin_of), when on the board and not
    # the reference: compare_pairs over every such pair (Holm over the twin comparisons).
    twin_versus: Versus | None = None
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
        paired = self.versus.gap_paired
        return None if paired is None else paired.ci_high

    @property
    def twin(self) -> str | None:
        """The same-init trainable twin it is compared with, where shown."""
        return None if self.twin_versus is None else self.twin_versus.reference

    @property
    def twin_gap(self) -> stats.Summary | None:
        """Paired % gap to that twin, where shown."""
        return None if self.twin_versus is None else self.twin_versus.gap_paired

    @property
    def twin_decision(self) -> stats.Decision | None:
        """Its verdict (Holm over the twin comparisons), where shown."""
        return None if self.twin_versus is None else self.twin_versus.decision


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


def step_ratio(arm: Arm, base: Arm | None) -> float | None:
    """The arm's step-time ratio to the baseline (aggregate.step_time_ratio over the chosen runs)."""
    return None if base is None else step_time_ratio(arm.runs, base.runs)


def _planned(records: Sequence[SweepRecord], seeds: set[int] | None = None) -> dict[str, set[str]]:
    """Method -> run directories that the stored sweep records plan (of `seeds`, when given)."""

    planned: dict[str, set[str]] = {}
    for record in records:
        for run in record.planned():
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
    gap, upper, share = entry.versus.reported_gap, entry.upper, entry.share
    misses = []
    if trainable(entry.arm):  # a control saving by architecture (thin keys) is no frozen variant
        misses.append("freezes nothing: a trainable control, not a frozen variant")
    if gap is None or gap > target.max_gap:
        misses.append(
            f"{_gap_name(entry.versus)} {fmt_pct(gap)} > {target.max_gap:g}%" if gap is not None else "no gap"
        )
    if upper is None or upper > target.max_upper:
        misses.append(
            f"paired upper end {fmt_pct(upper)} > {target.max_upper:g}%"
            if upper is not None
            else "no paired interval (needs >= 2 paired seeds)"
        )
    if share is None or share < target.min_share:
        misses.append(
            f"keeps {fmt_fraction(share, 0)} < {target.min_share * 100:g}% of the saving"
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
    gapped = [e for e in candidates if e.versus.reported_gap is not None]
    return min(gapped, key=lambda e: (e.versus.reported_gap, e.method)) if gapped else None


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
    gapped = [e for e in candidates if e.versus.reported_gap is not None]
    best_gap = min(gapped, key=lambda e: (e.versus.reported_gap, e.method))
    if best_gap is not close:  # the smallest gap fails on another criterion: say which
        text += (
            f" The smallest gap is {best_gap.method}'s ({_entry_numbers(best_gap)}), which "
            f"misses: {'; '.join(best_gap.misses)}."
        )
    return [], close.method, text


def _gap_name(vs: Versus) -> str:
    """What the gap of a comparison is called on a board: the mean per-seed gap, else the gap of the means."""
    return GAP_NAME if vs.mean_seed_gap is not None else MEANS_NAME


def _entry_numbers(e: Entry) -> str:
    """Gap, paired interval, p and saving share of one entry in words."""
    d = e.versus.decision
    p = f"{fmt_holm(d)}; " if d is not None and d.p is not None else ""
    return (
        f"{GAP_NAME + ' ' if e.versus.mean_seed_gap is not None else ''}{fmt_versus_gap(e.versus)} "
        f"({p}{verdict_text(d)}), "
        f"keeps {fmt_fraction(e.share, 0)} of the saving"
    )


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


def validation_score(arm: Arm) -> float | None:
    """The mean validation selection metric of the arm's chosen setting (None when not kept)."""
    cell = next((c for c in arm.cells if c.setting == arm.setting), None)
    return cell.selection.mean if cell is not None else None


def choose_reference(group: Group, complete: set[str]) -> Arm | None:
    """The best-tuned trainable arm: the best mean *validation* score among complete methods
    freezing nothing. Held-out numbers are what the board reports, so they never choose its
    reference; None when no such arm kept a validation score (then name one with --baseline)."""
    pool = [a for a in group.arms if a.method in complete and trainable(a) and validation_score(a) is not None]
    sign = -1.0 if group.higher_is_better else 1.0
    return min(pool, key=lambda a: (sign * validation_score(a), a.method)) if pool else None


def twin_comparisons(group: Group, reasons: dict[str, str]) -> dict[str, Versus]:
    """Every complete frozen method against its same-init trainable twin, by method: compare_pairs
    over all such pairs (Holm over them all). A twin that is the reference needs no second column:
    the main gap is to it."""
    complete = {a.method: a for a in group.arms if not reasons[a.method]}
    pairs = [
        (arm, complete[twin])
        for arm in complete.values()
        if (twin := frozen_twin_of(arm.method)) in complete and twin != group.baseline
    ]
    compared = compare_pairs(pairs, group.higher_is_better, group.margin)
    return {arm.method: vs for (arm, _), vs in zip(pairs, compared)}


def build_board(
    group: Group,
    runs: Sequence[RunRecord],
    planned: dict[str, set[str]],
    target: Target = TARGET,
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
                group = rebase(group, best.method)
            rule = "the best-tuned trainable arm: best validation mean among complete methods freezing nothing"
        else:
            rule = "no complete method that freezes nothing kept a validation score: the default reference"
    return rank_board(group, reasons, rule, target)


def rank_board(
    group: Group,
    reasons: dict[str, str],
    rule: str,
    target: Target = TARGET,
) -> Board:
    """The board of a table already compared with its reference: `reasons` says why a method is not
    ranked ('' when it is), `rule` how the reference was chosen."""
    base = next((a for a in group.arms if a.method == group.baseline), None)
    ref = next((a for a in group.arms if a.method == target.reference), None)
    ref_saving = saving_fraction(ref.theoretical_saving) if ref else None
    twins = twin_comparisons(group, reasons)
    entries = []
    for arm in group.arms:
        saving = saving_fraction(arm.theoretical_saving)
        share = saving / ref_saving if saving is not None and ref_saving else None
        entry = Entry(arm, group.versus_of(arm.method), saving, share, added_params(arm.runs), step_ratio(arm, base))
        entry.incomplete, entry.twin_versus = reasons[arm.method], twins.get(arm.method)
        _savings(entry, base)
        entries.append(entry)
    sign = -1.0 if group.higher_is_better else 1.0
    ranked = sorted((e for e in entries if not e.incomplete), key=lambda e: (sign * e.arm.primary.mean, e.method))
    for i, e in enumerate(ranked, 1):
        e.rank = i
    unranked = sorted((e for e in entries if e.incomplete), key=lambda e: e.method)
    points = {
        e.method: (e.versus.reported_gap, e.saving * 100)
        for e in ranked
        if e.versus.reported_gap is not None and e.saving is not None
    }
    passing, closest, verdict = _verdict(ranked, group.baseline, target)
    warnings = list(group.warnings)
    if ref_saving is None:
        warnings.append(
            f"no {target.reference} runs with a recorded saving: the saving share and its criterion cannot be evaluated"
        )
    if base is not None and any(e.method == base.method for e in unranked):
        warnings.append(f"the reference {base.method} is itself incomplete: every gap is provisional")
    board = Board(group, ranked, unranked, pareto_front(points), passing, closest, verdict, warnings)
    board.reference_rule, board.twin = rule, bool(twins)
    return board


def build(
    paths: Sequence[str | Path],
    baseline: str | None = None,
    target: Target = TARGET,
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
    records = sweep_records(paths)  # each sweep.yaml read once
    planned = _planned(records, keep)
    fixed = baseline is not None
    if baseline is None:  # the starting reference; each table then takes its best trainable arm
        baseline = next((r.baseline for r in records), None) or BASELINE
    comparison = compare(
        runs,
        baseline=baseline,
        margin=margin,
        lr_rule=declared_lr_rule(records),
        primary=[tuple(p) for p in declared_primary(paths, records)],
    )
    boards = []
    for group in comparison.groups:
        members = [r for r in runs if r.task == group.task and r.model == group.model]
        boards.append(build_board(group, members, planned, target, fixed_reference=fixed))
    seen = {a.method for g in comparison.groups for a in g.arms}
    not_started = sorted(m for m in planned if m not in seen)
    return boards, not_started, runs
