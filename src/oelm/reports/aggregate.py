"""Aggregate run records into per-dataset comparisons: LR chosen on validation, seeds pooled."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from oelm.core.methods import get_method
from oelm.core.schedules import saved_before_switch, switch_step
from oelm.records.compact import FROM_RUN
from oelm.records.comparable import check_protocol
from oelm.records.facts import ReportingFacts, facts_of
from oelm.records.layout import setting_lr
from oelm.records.run import COLLAPSED, COMPLETE, INVALID, RunRecord, heldout_note
from oelm.records.stability import Instability, instability, selects_on_loss
from oelm.records.sweep import BEST_MEAN, LR_RULES, ROBUST
from oelm.reports import stats
from oelm.reports.study_numbers import StudyNumbers
from oelm.utils.errors import UserError

BASELINE = "baseline"

# How flagged runs (records.stability) enter the statistics: fixed here, before any run, for every arm.
INSTABILITY_POLICY = (
    "Unstable runs are kept and counted per arm and per learning rate. A finite unstable run (a spike) "
    "enters every mean, interval and test with its value at the checkpoint validation chose, like any "
    "other run of every arm; a non-finite one (diverged) has no value to average: it is listed and counted, "
    "and its setting is chosen only where every setting has one"
)

MIN_LR_SEEDS = 3  # below this many seeds per setting the scatter check sees little
MAX_SPREAD = 0.10  # seeds scatter when (max - min) / |mean| of their validation selection values exceeds this


def lr_rule_text(rule: str) -> str:
    """The rule in words, as every report states it."""
    if rule == BEST_MEAN:
        return (
            "LR rule `best-mean`: each arm's setting is the one with the best mean validation selection "
            "metric (settings without a collapsed, diverged or invalid seed first)"
        )
    return (
        "LR rule `robust`: a setting is stable when none of its runs is unstable, its seeds do not scatter "
        f"((max - min) / |mean| of their validation selection values at most {MAX_SPREAD:.0%}) and the "
        "next larger learning rate of the arm's grid holds no unstable run; each arm's setting is the best "
        "mean validation selection metric among its stable settings (every setting unstable: the best mean "
        "of all, with a warning)"
    )


@dataclass
class LrCell:
    """All finished runs of one method at one setting (learning rate + other swept fields)."""

    setting: str
    lr: float
    runs: list[RunRecord]
    excluded: list[RunRecord]
    selection: stats.Summary
    # Finished runs (kept or excluded) that the stability rule flags, with what it found.
    unstable: list[tuple[RunRecord, Instability]] = field(default_factory=list)

    @property
    def finished(self) -> int:
        """Finished runs at this setting (kept and excluded)."""
        return len(self.runs) + len(self.excluded)

    @property
    def eligible(self) -> bool:
        """A setting where a seed collapsed, diverged or failed its freeze check is chosen only
        if every setting has such a seed (all decided on validation and the audit)."""
        return not any(r.status in (COLLAPSED, INVALID) for r in self.excluded)

    @property
    def spread(self) -> float | None:
        """(max - min) / |mean| of the kept seeds' validation selection values (None below 2 seeds)."""
        values = [v for r in self.runs if (v := _num(r.results.get(_selection_key(r)))) is not None]
        if len(values) < 2 or not np.mean(values):
            return None
        return float((max(values) - min(values)) / abs(np.mean(values)))

    def unstable_text(self) -> str:
        """'1 of 4 (1 diverged)': flagged runs of the finished ones, by kind."""
        n = len(self.unstable)
        if not n:
            return f"0 of {self.finished}"
        kinds = [i.kind for _, i in self.unstable]
        parts = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
        return f"{n} of {self.finished} ({parts})"


@dataclass(frozen=True)
class Noise:
    """Test-set noise of one arm next to its seed-to-seed spread, in the same units."""

    metric: str  # what both are measured on (test_loss for LMs, heldout_accuracy for classifiers)
    test_se: float  # standard error from the finite test set (mean over the arm's seeds)
    seed_sd: float | None  # standard deviation of that metric over seeds
    test_size: int | None  # windows or examples in the test set
    unit: str = ""  # what one test item is ("window", "example"), where known

    @property
    def ratio(self) -> float | None:
        """test_se / seed_sd: well below 1 means seeds, not the test set, dominate the noise."""
        return None if not self.seed_sd else self.test_se / self.seed_sd


@dataclass(frozen=True)
class Arm:
    """One method of a dataset table at its chosen setting: its summary, computed once from its runs.

    How it compares with the table's reference is a separate value (`Versus`, in `Group.versus`).
    """

    method: str
    lr: float | None
    setting: str | None
    cells: list[LrCell]
    runs: list[RunRecord]
    primary: stats.Summary
    by_seed: dict[int, float]
    step_time: stats.Summary
    tokens_per_second: stats.Summary
    trainable_params: int | None
    frozen_params: int | None
    theoretical_saving: Any = None
    noise: Noise | None = None  # test-set noise next to seed noise
    study: dict[str, Any] | None = None  # the original study's reported number for this arm
    lr_rule: str = BEST_MEAN  # the rule that chose `setting` (LR_RULES)
    # Under the robust rule: why each setting failed its stability check ('' where it passed).
    rejected: dict[str, str] = field(default_factory=dict)
    # LR sensitivity (stats.lr_sensitivity) over the arm's grid; None below two LRs or without losses.
    sensitivity: float | None = None

    @property
    def chosen_cell(self) -> LrCell | None:
        """The cell of the chosen setting."""
        return next((c for c in self.cells if c.setting == self.setting), None)

    @property
    def unstable_choice(self) -> str:
        """Why the chosen setting fails the robust rule's stability check ('' where it passes): under
        the robust rule, no setting passed; under best-mean, the robust rule would choose another."""
        return (self.rejected.get(self.setting) or "") if self.setting is not None else ""

    def unstable_count(self) -> tuple[int, int]:
        """(unstable, finished) runs over every setting of the arm."""
        return sum(len(c.unstable) for c in self.cells), sum(c.finished for c in self.cells)


@dataclass(frozen=True)
class Versus:
    """One arm compared with a reference arm: a value built by `compare_to` / `compare_pairs`, never
    changed. The reference against itself has gap 0, delta 0, step-time ratio 1 and nothing paired;
    `Versus()` (no reference) is what an arm of a table without one gets."""

    reference: str | None = None
    gap: float | None = None  # gap of the means, % of the reference's (+ = worse)
    gap_paired: stats.Summary | None = None  # the per-seed % gaps (paired by seed) and their interval
    delta: float | None = None  # difference of the means in the metric's units
    test: stats.PairedTest | None = None
    power: stats.Power | None = None  # MDE of the paired gap (%), at this arm's number of seeds
    # Test-set noise of the difference, paired item by item (runs that stored per-item test values),
    # next to the seed spread of that difference.
    paired_noise: Noise | None = None
    step_time_ratio: float | None = None
    # Classifiers whose runs stored per-example test correctness: the gap's Student-t interval over
    # seeds x test examples (stats.paired_items_gap, test-set noise included); None: seeds-only interval.
    gap_items: stats.ItemsInterval | None = None
    # The verdict (Holm-adjusted over the family of comparisons it was decided in).
    decision: stats.Decision | None = None

    @property
    def mean_seed_gap(self) -> float | None:
        """The mean per-seed % gap (+ = worse): the mean over the shared seeds of each seed's paired
        % gap, the quantity of the paired interval, the t-test, the TOST, the verdict and the power
        analysis (its `observed`); None where no seed pairs. `gap` is another quantity, the gap of
        the means, which differs from it where a seed's reference is far from the others."""
        paired = self.gap_paired
        return None if paired is None else paired.mean

    @property
    def reported_gap(self) -> float | None:
        """The gap a page prints, ranks and checks a target with: the mean per-seed gap, or the gap
        of the means where no seed pairs (tables.fmt_gap labels that case)."""
        return self.gap if self.mean_seed_gap is None else self.mean_seed_gap


NO_VERSUS = Versus()


@dataclass(frozen=True)
class Group:
    """One table: runs of one task, dataset, model and primary metric, its arms and their comparisons."""

    task: str
    dataset: str
    model: str
    primary_metric: str
    selection_metric: str
    arms: list[Arm]
    baseline: str | None  # the reference every arm is compared with (None: no finished one)
    direction: bool | None = None  # the task's recorded higher_is_better (None: records predate it)
    warnings: list[str] = field(default_factory=list)
    # Runs of the chosen settings whose held-out numbers look wrong: shown, never used to select.
    heldout_notes: list[tuple[RunRecord, str]] = field(default_factory=list)
    margin: float = stats.MARGIN  # equivalence margin of the TOST, % of the reference's metric
    # What the splits are (eval_sets): the final split, the test split's origin, the selection set.
    splits: dict[str, Any] = field(default_factory=dict)
    # How the task's runs are reported, as they recorded it (None: the task's legacy facts).
    reporting: ReportingFacts | None = None
    # Each method against `baseline` (compare_to; empty without a reference). Read it by versus_of.
    versus: dict[str, Versus] = field(default_factory=dict)
    lr_rule: str = BEST_MEAN  # the rule that chose every arm's setting (LR_RULES)
    loss_cap: float | None = None  # L0 of the arms' LR sensitivity (loss_cap)
    # The primary comparisons declared before the runs (a sweep spec's or plan's `primary`), as
    # (method, compared with) pairs; () where none was declared.
    primary: tuple[Pair, ...] = ()

    @property
    def primary_versus(self) -> dict[Pair, Versus]:
        """The declared primary comparisons present in this table, one Holm family (empty without)."""
        return primary_comparisons(self.arms, self.primary, self.higher_is_better, self.margin)

    @property
    def families(self) -> dict[str, int]:
        """The Holm families of the table's comparisons with the reference and their sizes m."""
        out: dict[str, int] = {}
        for vs in self.versus.values():
            if vs.decision is not None:
                out[vs.decision.family] = vs.decision.m
        return out

    def versus_of(self, method: str) -> Versus:
        """How a method compares with the table's reference (`NO_VERSUS` without one)."""
        return self.versus.get(method, NO_VERSUS)

    @property
    def comparisons(self) -> int:
        """The comparisons against the reference that have a test (without a declared primary
        family: the Holm family's size m)."""
        return sum(v.decision is not None and v.decision.p is not None for v in self.versus.values())

    @property
    def higher_is_better(self) -> bool:
        """Direction of the primary (and selection) metric: as the task recorded it."""
        return metric_direction(self.direction, self.primary_metric)

    @property
    def facts(self) -> ReportingFacts:
        """How this table's task is reported (records.facts)."""
        return self.reporting or facts_of(self.task)

    @property
    def title(self) -> str:
        """Heading of the table."""
        return f"{self.dataset} ({self.task}, {self.model})"


@dataclass
class Comparison:
    """Everything a report shows, computed only from stored run records."""

    groups: list[Group]
    incomplete: list[RunRecord]
    excluded: list[RunRecord]
    n_runs: int
    margin: float = stats.MARGIN


def _num(value: Any) -> float | None:
    """A finite float or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _group_key(run: RunRecord) -> tuple[str, str, str, str, str]:
    """Runs that share a table: task, dataset, model, primary and selection metric."""
    res = run.results
    return (
        run.task,
        run.dataset,
        run.model,
        str(res.get("primary_metric") or "?"),
        str(res.get("selection_metric") or "?"),
    )


def _selection_key(run: RunRecord) -> str:
    return str(run.results.get("selection_metric") or "?")


def _lr_cells(runs: list[RunRecord], selection_metric: str) -> list[LrCell]:
    """Runs of one method split by setting, with the mean validation selection metric and the runs
    the stability rule flags."""
    by_setting: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        by_setting[run.setting].append(run)
    cells = []
    for setting, members in by_setting.items():
        good = [r for r in members if r.status == COMPLETE]
        bad = [r for r in members if r.status != COMPLETE]
        sel = stats.summarize([_num(r.results.get(selection_metric)) for r in good])
        lr = members[0].lr if members[0].lr is not None else math.nan
        flagged = [(r, f) for r in members if r.finished and (f := instability(r)) is not None]
        cells.append(LrCell(setting, lr, good, bad, sel, flagged))
    return sorted(cells, key=lambda c: (c.lr, c.setting))


def _other_fields(setting: str) -> str:
    """A setting's name without its LR: the settings of one LR grid share it."""
    lr = setting_lr(setting)
    return setting.split("_", 1)[1] if lr is not None and "_" in setting else ("" if lr is not None else setting)


def stability_check(cells: Sequence[LrCell]) -> dict[str, str]:
    """Why the robust rule rejects each setting ('' where it passes): an unstable run, seeds that
    scatter, or an unstable run at the next larger LR of the same grid (the other swept fields equal)."""
    reasons = {}
    for cell in cells:
        if cell.unstable:
            run, flag = cell.unstable[0]
            reasons[cell.setting] = f"seed {run.seed} unstable ({flag.kind}: {flag.reason})"
            continue
        spread = cell.spread
        if spread is not None and spread > MAX_SPREAD:
            reasons[cell.setting] = f"seeds scatter ({spread:.1%} > {MAX_SPREAD:.0%})"
            continue
        larger = sorted(
            (c for c in cells if _other_fields(c.setting) == _other_fields(cell.setting) and c.lr > cell.lr),
            key=lambda c: c.lr,
        )
        if larger and larger[0].unstable:
            reasons[cell.setting] = f"its next larger lr {larger[0].lr:g} holds an unstable run"
            continue
        reasons[cell.setting] = ""
    return reasons


def choose_lr(cells: Sequence[LrCell], higher_is_better: bool, rule: str = BEST_MEAN) -> LrCell | None:
    """The LR cell the rule chooses on validation (LR_RULES; lr_rule_text says each in words).

    best-mean: the best mean validation selection metric (collapse-free cells first). robust: the
    same among the cells stability_check passes (none: among all, as best-mean). A single setting with runs is the
    choice whether or not its selection value was kept: there is nothing to choose between (a
    confirmation's fixed arm, a record rebuilt from a stored table).
    """
    if rule not in LR_RULES:
        raise UserError(f"lr_rule {rule!r} is not a rule; use one of {', '.join(LR_RULES)}")
    if len(cells) == 1 and cells[0].runs:
        return cells[0]
    scored = [c for c in cells if c.selection.mean is not None]
    pool = [c for c in scored if c.eligible] or scored
    if rule == ROBUST:
        rejected = stability_check(cells)
        pool = [c for c in pool if not rejected[c.setting]] or pool
    if not pool:
        return None
    sign = -1.0 if higher_is_better else 1.0
    return min(pool, key=lambda c: (sign * c.selection.mean, c.lr, c.setting))


def chosen_setting(runs: Sequence[RunRecord], rule: str = BEST_MEAN) -> LrCell | None:
    """The setting one method's runs choose on validation (the report's rule: choose_lr over their
    settings, by the selection metric and direction the runs recorded); None when none is scored."""
    finished = [r for r in runs if r.finished]
    if not finished:
        return None
    selection = str(finished[0].results.get("selection_metric") or "?")
    direction = metric_direction(recorded_direction(finished), selection)
    return choose_lr(_lr_cells(finished, selection), direction, rule)


def _first(runs: list[RunRecord], key: str) -> Any:
    """The first non-null value of a results key among runs."""
    for run in runs:
        val = run.results.get(key)
        if val is not None:
            return val
    return None


def _saving(runs: list[RunRecord]) -> Any:
    """Theoretical compute saving recorded by the runs (results, then timing_stats)."""
    for run in runs:
        for source in (run.results, run.timing):
            for key in ("theoretical_saving", "theoretical_flops_saving"):
                if source.get(key) is not None:
                    return source[key]
    return None


def metric_direction(recorded: bool | None, metric: str) -> bool:
    """higher_is_better as the task recorded it; from the metric's name for older records."""
    return bool(recorded) if recorded is not None else stats.is_higher_better(metric)


def recorded_direction(runs: Sequence[RunRecord]) -> bool | None:
    """The task's declared metric direction, if its runs recorded one."""
    values = {r.results.get("higher_is_better") for r in runs} - {None}
    return values.pop() if len(values) == 1 else None


def final_val_loss(run: RunRecord) -> float | None:
    """The run's final validation loss: its last validation eval line's `loss` (nan when non-finite),
    else results' final_val_loss, else its selection metric where that is a loss; None without one.
    A run stopped as diverged has nan."""
    if run.results.get("status") == "diverged":
        return math.nan
    lines = [
        x["loss"] for x in run.metrics if x.get("kind") == "eval" and x.get("split", "val") == "val" and "loss" in x
    ]
    for value in (lines[-1] if lines else None, run.results.get("final_val_loss")):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    selection = _selection_key(run)
    if selects_on_loss(run.results) and "loss" in selection and isinstance(run.results.get(selection), (int, float)):
        return float(run.results[selection])
    return None


def loss_cap(runs: Sequence[RunRecord]) -> float | None:
    """L0 of the LR sensitivity: the highest first validation loss (the first eval line) among a
    table's runs, the loss early in training that a diverged learning rate is counted at; None
    where no run stored a validation curve."""
    first = []
    for run in runs:
        lines = [
            x["loss"] for x in run.metrics if x.get("kind") == "eval" and x.get("split", "val") == "val" and "loss" in x
        ]
        if lines and isinstance(lines[0], (int, float)) and math.isfinite(lines[0]):
            first.append(float(lines[0]))
    return max(first) if first else None


def arm_sensitivity(cells: Sequence[LrCell], chosen: LrCell | None, cap: float | None) -> float | None:
    """stats.lr_sensitivity over the LRs of the chosen setting's grid (the other swept fields equal):
    each LR's loss is the mean over its finished seeds of min(final validation loss, L0)."""
    if chosen is None or cap is None:
        return None
    losses = []
    for cell in cells:
        if _other_fields(cell.setting) != _other_fields(chosen.setting):
            continue
        values = [final_val_loss(r) for r in [*cell.runs, *cell.excluded]]
        values = [cap if not math.isfinite(v) else min(v, cap) for v in values if v is not None]
        if values:
            losses.append(float(np.mean(values)))
    return stats.lr_sensitivity(losses, cap)


def counted_runs(cell: LrCell, primary: str) -> list[RunRecord]:
    """The seeds an arm's numbers count at its chosen setting: the one rule for seeds at chance,
    shared by every view. A seed that ended at chance level on validation (status collapsed) is what
    the arm gave on that seed at that LR, so when it has a held-out result it is kept in the mean,
    the interval and the paired test (dropping it would show the surviving seeds only), and counted
    ("at chance"); a run without a finite held-out result, or one that failed its freeze check,
    cannot enter. A setting with such a seed is chosen only when every setting has one (eligible)."""
    at_chance = [r for r in cell.excluded if r.status == COLLAPSED and _num(r.results.get(primary)) is not None]
    return [*cell.runs, *at_chance]


def _arm(
    method: str,
    runs: list[RunRecord],
    group_key: tuple,
    study: StudyNumbers | None = None,
    rule: str = BEST_MEAN,
    cap: float | None = None,
) -> Arm:
    """Pick the LR on validation by the rule and summarize the primary metric of that LR's seeds."""
    primary, selection = group_key[3], group_key[4]
    cells = _lr_cells(runs, selection)
    chosen = choose_lr(cells, metric_direction(recorded_direction(runs), selection), rule)
    rejected = stability_check(cells) if len(cells) > 1 else {}  # shown under either rule
    chosen_runs = counted_runs(chosen, primary) if chosen else []
    by_seed = {r.seed: v for r in chosen_runs if r.seed is not None and (v := _num(r.results.get(primary))) is not None}
    return Arm(
        method=method,
        lr=chosen.lr if chosen else None,
        setting=chosen.setting if chosen else None,
        cells=cells,
        runs=chosen_runs,
        primary=stats.summarize([_num(r.results.get(primary)) for r in chosen_runs]),
        by_seed=by_seed,
        step_time=stats.summarize([_num(r.results.get("mean_step_time")) for r in chosen_runs]),
        tokens_per_second=stats.summarize([_num(r.results.get("tokens_per_second")) for r in chosen_runs]),
        trainable_params=_first(chosen_runs, "trainable_params"),
        frozen_params=_first(chosen_runs, "frozen_params"),
        theoretical_saving=_saving(chosen_runs),
        noise=_noise(chosen_runs),
        study=None if study is None else study.lookup(group_key[0], group_key[1], group_key[2], method),
        lr_rule=rule,
        rejected=rejected,
        sensitivity=arm_sensitivity(cells, chosen, cap),
    )


def _noise(runs: list[RunRecord]) -> Noise | None:
    """Standard error of the test metric from the test set's size, next to the seed SD.

    LMs record the SE of the test loss over test windows; for classifiers the binomial SE
    sqrt(p(1-p)/n) of held-out accuracy over n examples is used.
    """
    ses, values, sizes = [], [], []
    for run in runs:
        res = run.results
        if _num(res.get("test_loss_se")) is not None and _num(res.get("test_loss")) is not None:
            metric = "test_loss"
            ses.append(float(res["test_loss_se"]))
            values.append(float(res["test_loss"]))
            sizes.append(_num(res.get("test_windows")))
        elif (acc := _num(res.get("heldout_accuracy"))) is not None and _num(res.get("heldout_examples")):
            metric = "heldout_accuracy"
            n = float(res["heldout_examples"])
            ses.append(math.sqrt(acc * (1 - acc) / n))
            values.append(acc)
            sizes.append(n)
    if not ses:
        return None
    size = sizes[0]
    return Noise(
        metric, float(sum(ses) / len(ses)), stats.summarize(values).std, int(size) if size is not None else None
    )


def _paired_noise(runs: list[RunRecord], base_runs: list[RunRecord]) -> Noise | None:
    """Test-set noise of the difference to the baseline, paired item by item.

    Every arm reads the same test items (LM windows, classifier examples), so the part of the
    test set's noise that can move a gap is the spread of the per-item *differences* (of window
    losses, of 0/1 correctness), not of the values themselves. Its standard error (mean over the
    seeds both arms share) is set next to the standard deviation over seeds of the per-seed
    difference of the test metric.
    """
    base_by_seed = {r.seed: r for r in base_runs if r.seed is not None}
    ses, diffs, size, metric, unit = [], [], None, "", ""
    for run in runs:
        base = base_by_seed.get(run.seed)
        mine, theirs = run.test_items(), base.test_items() if base is not None else None
        if not mine or not theirs or mine["metric"] != theirs["metric"]:
            continue
        a, b = mine["values"], theirs["values"]
        if len(a) != len(b) or len(a) < 2:
            continue
        per = [x - y for x, y in zip(a, b)]
        ses.append(stats.summarize(per).std / math.sqrt(len(per)))
        diffs.append(sum(per) / len(per))
        size, metric, unit = len(per), mine["metric"], mine.get("unit", "item")
    if not ses:
        return None
    return Noise(f"{metric} difference", float(sum(ses) / len(ses)), stats.summarize(diffs).std, size, unit)


ITEMS_METRIC = "heldout_accuracy"  # classifiers' per-example 0/1 correctness (test_items.json)


def items_gap(runs: list[RunRecord], base_runs: list[RunRecord], higher_is_better: bool) -> stats.ItemsInterval | None:
    """The accuracy gap's interval with the test set's noise: the Student-t interval over the seeds
    both arms share and the shared test examples (stats.paired_items_gap). None unless every shared seed of
    both arms stored per-example correctness of one test set (>= 2 seeds): the report then shows
    the seeds-only interval, labelled as such."""
    base_by_seed = {r.seed: r for r in base_runs if r.seed is not None}
    rows_m, rows_b = [], []
    for run in sorted((r for r in runs if r.seed in base_by_seed), key=lambda r: r.seed):
        mine, theirs = run.test_items(), base_by_seed[run.seed].test_items()
        if not mine or not theirs or {mine["metric"], theirs["metric"]} != {ITEMS_METRIC}:
            return None
        if len(mine["values"]) != len(theirs["values"]) or (rows_m and len(mine["values"]) != len(rows_m[0])):
            return None
        rows_m.append(mine["values"])
        rows_b.append(theirs["values"])
    if len(rows_m) < 2 or len(rows_m[0]) < 2:
        return None
    return stats.paired_items_gap(np.array(rows_m), np.array(rows_b), higher_is_better)


def gap_by_seed(arm: Arm, base: Arm, higher_is_better: bool) -> dict[int, float]:
    """Per-seed relative gap (%, + = worse) of an arm to the reference, over the seeds both have."""
    gaps = {
        s: stats.relative_gap(v, base.by_seed[s], higher_is_better) for s, v in arm.by_seed.items() if s in base.by_seed
    }
    return {s: g for s, g in sorted(gaps.items()) if math.isfinite(g)}


def step_time_ratio(runs: Sequence[RunRecord], base_runs: Sequence[RunRecord]) -> float | None:
    """The step-time ratio of every view (one definition): the mean step time of the arm's runs
    over the mean of the control's, both over the seeds the two share (every seed where they share
    none). A ratio of means, not a mean of per-seed ratios: a sweep times its arms one after the
    other, so a seed's two runs share no machine load that pairing would cancel, and one fast
    control seed would dominate a mean of ratios (the quickstart's per-seed ratios run from 1.1 to
    4.4). Indicative only on a shared machine: benchmarks/ measures speed side by side."""

    def times(rs: Sequence[RunRecord]) -> dict:
        return {r.seed: t for r in rs if isinstance(t := r.results.get("mean_step_time"), int | float) and t > 0}

    mine, base = times(runs), times(base_runs)
    shared = sorted(set(mine) & set(base), key=str)
    a, b = (
        ([mine[s] for s in shared], [base[s] for s in shared]) if shared else (list(mine.values()), list(base.values()))
    )
    if not a or not b:
        return None
    return float(np.mean(a) / np.mean(b))


def compare_arm(arm: Arm, base: Arm, higher_is_better: bool, decision: stats.Decision | None = None) -> Versus:
    """An arm against one reference arm, as a new value (nothing is changed): the gap of the means,
    delta and step-time ratio; for another arm also the paired interval, test and power (all on the
    per-seed % gaps), the paired test-set noise and the seeds x test items interval. `decision` is the verdict,
    which needs the whole family (`compare_pairs`)."""
    gap = delta = ratio = None
    if arm.primary.mean is not None and base.primary.mean is not None:
        gap = stats.relative_gap(arm.primary.mean, base.primary.mean, higher_is_better)
        delta = arm.primary.mean - base.primary.mean
    ratio = step_time_ratio(arm.runs, base.runs)
    if arm is base:
        return Versus(base.method, gap=gap, delta=delta, step_time_ratio=ratio, decision=decision)
    gaps = gap_by_seed(arm, base, higher_is_better)
    return Versus(
        base.method,
        gap=gap,
        gap_paired=stats.summarize(list(gaps.values())),
        delta=delta,
        # The t-test of the gaps against 0: the same quantity as the interval and the power analysis.
        test=stats.paired_test(gaps, dict.fromkeys(gaps, 0.0)),
        power=stats.power_analysis(list(gaps.values())),
        paired_noise=_paired_noise(arm.runs, base.runs),
        step_time_ratio=ratio,
        gap_items=items_gap(arm.runs, base.runs, higher_is_better),
        decision=decision,
    )


def compare_pairs(
    pairs: Sequence[tuple[Arm, Arm]], higher_is_better: bool, margin: float = stats.MARGIN, family: str = ""
) -> list[Versus]:
    """Each (arm, reference) pair compared (`compare_arm`), with its verdict: the family is every pair, and
    both its difference tests and its equivalence tests (TOST within ±margin) are Holm-adjusted over
    it (`family` names it in each Decision). Reads only the arms' per-seed values and runs; builds
    new values and changes nothing."""
    gaps = [list(gap_by_seed(arm, base, higher_is_better).values()) for arm, base in pairs]
    decisions = stats.decide_family(gaps, margin, family=family)
    return [compare_arm(arm, base, higher_is_better, d) for (arm, base), d in zip(pairs, decisions)]


Pair = tuple[str, str]  # (method, the method it is compared with): a declared primary comparison


def present_pairs(arms: Sequence[Arm], primary: Sequence[Pair]) -> list[Pair]:
    """The declared primary pairs whose two arms both have a summary in this table."""
    have = {a.method for a in arms if a.primary.n > 0}
    return [(m, r) for m, r in primary if m in have and r in have]


def primary_comparisons(
    arms: Sequence[Arm], primary: Sequence[Pair], higher_is_better: bool, margin: float = stats.MARGIN
) -> dict[Pair, Versus]:
    """The declared primary comparisons present in the table, by pair: one Holm family of them only."""
    by = {a.method: a for a in arms}
    pairs = present_pairs(arms, primary)
    compared = compare_pairs([(by[m], by[r]) for m, r in pairs], higher_is_better, margin, stats.PRIMARY)
    return dict(zip(pairs, compared))


def compare_to(
    arms: Sequence[Arm],
    reference: str,
    higher_is_better: bool,
    margin: float = stats.MARGIN,
    primary: Sequence[Pair] = (),
) -> dict[str, Versus]:
    """Every arm of a table against the reference method, by method; the reference gets its
    comparison with itself. Changes nothing.

    Without a declared primary family (or none of its pairs in the table), the family of
    `compare_pairs` is every other arm. With one, an arm whose (arm, reference) pair is primary
    gets its primary-family verdict (primary_comparisons), and every other arm is compared in an
    exploratory family of its own (its own Holm), labelled so.
    """
    base = next((a for a in arms if a.method == reference), None)
    if base is None:
        raise ValueError(f"no arm {reference!r} to compare with (arms: {', '.join(a.method for a in arms)})")
    declared = primary_comparisons(arms, primary, higher_is_better, margin)
    pairs = [(a, base) for a in arms if a is not base and (a.method, reference) not in declared]
    family = stats.EXPLORATORY if declared else ""
    compared = {a.method: vs for (a, _), vs in zip(pairs, compare_pairs(pairs, higher_is_better, margin, family))}
    compared |= {m: vs for (m, r), vs in declared.items() if r == reference}
    return {a.method: compare_arm(base, base, higher_is_better) if a is base else compared[a.method] for a in arms}


def rebase(group: Group, reference: str, margin: float | None = None) -> Group:
    """The table compared with another reference method (its gaps, tests, verdicts), as a new Group:
    `group` and its arms are left as they were."""
    margin = group.margin if margin is None else margin
    return replace(
        group,
        baseline=reference,
        warnings=[w for w in group.warnings if not w.startswith("no finished '")],
        margin=margin,
        versus=compare_to(group.arms, reference, group.higher_is_better, margin, group.primary),
    )


def _budget_warnings(arms: list[Arm]) -> list[str]:
    """Warn when runs of one seed did not get the same steps or tokens in every arm.

    Tokens may differ between seeds (a seed's data order sets the dynamic padding of
    classification batches), so budgets are compared seed by seed.
    """
    warnings = []
    for key in ("steps", "tokens_seen"):
        by_seed: dict[Any, dict[str, set]] = {}
        for a in arms:
            for r in a.runs:
                value = r.results.get(key)
                if value is not None:
                    by_seed.setdefault(r.results.get("seed"), {}).setdefault(a.method, set()).add(value)
        bad = {seed: per for seed, per in by_seed.items() if len(set().union(*per.values())) > 1}
        if bad:
            detail = "; ".join(
                f"seed {seed}: " + ", ".join(f"{m} {sorted(v)}" for m, v in per.items()) for seed, per in bad.items()
            )
            warnings.append(f"unequal budgets ({key} differ between runs of the same seed: {detail})")
    return warnings


def _edge_warnings(arms: list[Arm], extensions: dict[str, Any] | None = None) -> list[str]:
    """Warn when an arm's chosen LR sits at the edge of its grid: its optimum may lie beyond.

    `extensions` is the sweep record's `extended` (what `oelm sweep` added beyond each edge, and
    `max_extend`): a choice still at an edge after the cap says so.
    """
    warnings = []
    ext = extensions or {}
    for arm in arms:
        lrs = sorted({c.lr for c in arm.cells if c.selection.mean is not None and not math.isnan(c.lr)})
        if len(lrs) < 2 or arm.lr is None or arm.lr not in (lrs[0], lrs[-1]):
            continue
        edge = "largest" if arm.lr == lrs[-1] else "smallest"
        side = "up" if edge == "largest" else "down"
        grid = ", ".join(f"{x:g}" for x in lrs)
        added = [e for e in (ext.get("arms") or {}).get(arm.method, []) if e.get("side") == side]
        cap = ext.get("max_extend")
        if added and cap is not None and len(added) >= cap:
            warnings.append(
                f"{arm.method}: the chosen lr {arm.lr:g} is still the {edge} of its grid [{grid}] after "
                f"{len(added)} automatic extension(s) on that side (max_extend {cap}); its best LR may "
                "lie beyond it: raise max_extend or widen the grid before trusting the gap"
            )
            continue
        warnings.append(
            f"{arm.method}: the chosen lr {arm.lr:g} is the {edge} of its grid [{grid}]; its best LR "
            "may lie beyond it, so extend the grid before trusting the gap"
        )
    return warnings


def _invalid_warnings(runs: list[RunRecord]) -> list[str]:
    """Name every run whose freeze check failed: its arm did not run the method it claims."""
    bad = [r for r in runs if r.status == INVALID]
    if not bad:
        return []
    shown = ", ".join(f"{r.method} {r.setting} seed {r.seed}" for r in bad)
    return [f"{len(bad)} run(s) failed their freeze check and are excluded (their settings are ineligible): {shown}"]


def _scored_before_freeze(results: dict) -> bool:
    """Whether a late-freeze run's best checkpoint was saved before its freeze (schedules' rule)."""

    try:
        method = get_method(results.get("method") or "")
    except UserError:  # a method this version does not register
        return False
    f = (results.get("method_options") or {}).get("f")
    best, steps = results.get("best_step"), results.get("steps")
    if method.schedule != "late-freeze" or f is None or not steps or best is None:
        return False
    return saved_before_switch(best, switch_step(f, steps))


def _prefreeze_warnings(arms: list[Arm]) -> list[str]:
    """Name arms whose chosen runs were scored at a best checkpoint saved before their late freeze.

    Selection treats every arm alike (best validation step), but such a score comes from weights
    whose Q/K were still training: the frozen phase, and its saving, did not produce it.
    """
    warnings = []
    for arm in arms:
        early = [r for r in arm.runs if _scored_before_freeze(r.results)]
        if early:
            steps = ", ".join(f"seed {r.seed}: step {r.results['best_step']}" for r in early)
            warnings.append(
                f"{arm.method}: {len(early)} of {len(arm.runs)} runs were scored at a best checkpoint saved "
                f"before their late freeze ({steps}): those scores come from weights whose Q/K still "
                "trained, not from the frozen phase"
            )
    return warnings


def _stability_warnings(arms: list[Arm]) -> list[str]:
    """Name every arm whose chosen setting holds an unstable run, or whose robust choice found no
    stable setting: its numbers come from a setting at the edge of stability."""
    warnings = []
    for arm in arms:
        cell = arm.chosen_cell
        if cell is not None and cell.unstable:
            shown = "; ".join(f"seed {r.seed}: {f.kind}, {f.reason}" for r, f in cell.unstable)
            warnings.append(
                f"{arm.method}: {cell.unstable_text()} runs at its chosen setting {cell.setting} are unstable ({shown}); "
                "they enter its statistics as the stated policy says"
            )
        thin = [c.setting for c in arm.cells if 0 < c.selection.n < MIN_LR_SEEDS]
        if len(arm.cells) > 1 and thin:
            warnings.append(
                f"{arm.method}: the stability check judged seed scatter at {', '.join(thin)} on fewer than "
                f"{MIN_LR_SEEDS} seeds; a pilot of at least {MIN_LR_SEEDS} seeds per LR lets it see scatter"
            )
        if arm.unstable_choice and arm.lr_rule == ROBUST:
            warnings.append(
                f"{arm.method}: no setting passed the robust LR rule's stability check (chosen {arm.setting}: "
                f"{arm.unstable_choice}); its choice is the best mean of all, at the edge of stability: "
                "rerun it with a wider or lower grid"
            )
        elif arm.unstable_choice:
            warnings.append(
                f"{arm.method}: its setting {arm.setting}, chosen by the best-mean rule, fails the robust rule's "
                f"stability check ({arm.unstable_choice}); the robust rule would choose another"
            )
    return warnings


def _rebuilt_warnings(runs: list[RunRecord]) -> list[str]:
    """Say which runs are compact records rebuilt from a stored table (their run directories lost)."""
    sources = sorted({r.source for r in runs if r.source != FROM_RUN})
    if not sources:
        return []
    n = sum(r.source != FROM_RUN for r in runs)
    return [
        f"{n} of {len(runs)} runs are records rebuilt from the stored table {', '.join(sources)}: their run "
        "directories were not kept, so these records hold only each seed's held-out value at the setting "
        "validation chose. What else that table stored (per-LR validation means, step times, noise) stays "
        "in it as its only record and is not recomputed here; curves, per-item test values and audits are "
        "lost. Rerun the sweep to restore them"
    ]


def _method_order(methods: Sequence[str], baseline: str) -> list[str]:
    """Baseline first, then the rest alphabetically."""
    return sorted(methods, key=lambda m: (m != baseline, m))


def eval_sets(runs: Sequence[RunRecord]) -> dict[str, Any]:
    """What a table's numbers are measured on, as its runs recorded it (records.normalize_results).

    final_split: "test" | "val" (| "mixed"); test_source: where the test split came from (None
    without one); val_windows / val_windows_all / val_subset: the LM selection set (None when not
    recorded or not an LM).
    """

    def one(key: str) -> Any:
        values = {json_key(r.results.get(key)) for r in runs}
        if values == {None}:
            return None
        return values.pop() if len(values) == 1 else "mixed"  # records that differ (or half say): no claim

    return {k: one(k) for k in ("final_split", "test_source", "val_windows", "val_windows_all", "val_subset")}


def json_key(value: Any) -> Any:
    """A hashable stand-in for a recorded value (lists and dicts as their repr)."""
    return repr(value) if isinstance(value, (list, dict)) else value


def split_text(splits: dict[str, Any]) -> str:
    """One sentence naming the splits: '' when the records say nothing about them."""
    parts = []
    if splits.get("final_split") == "val":
        parts.append("final numbers on **validation** (the data has no test split)")
    elif splits.get("final_split") == "test":
        parts.append(f"final numbers on the **test** split ({splits.get('test_source') or 'source not recorded'})")
    elif splits.get("final_split") == "mixed":
        parts.append("final numbers on **different splits** in different runs")
    if splits.get("val_subset") is True and splits.get("val_windows"):
        parts.append(
            f"validation = a fixed subset of {splits['val_windows']:,} of the split's "
            f"{splits.get('val_windows_all') or '?':,} windows"
        )
    elif splits.get("val_subset") is False and splits.get("val_windows"):
        parts.append(f"validation = the whole split ({splits['val_windows']:,} windows)")
    return ("Splits: " + "; ".join(parts) + ".") if parts else ""


def metric_label(metric: str, splits: dict[str, Any]) -> str:
    """A metric's name with the part of the split it was measured on: 'val_perplexity (val, subset
    of 64 windows)'; unchanged where nothing qualifies it."""
    if metric.startswith("val_") and splits.get("val_subset") is True and splits.get("val_windows"):
        return f"{metric} (val, subset of {splits['val_windows']:,} windows)"
    if metric.startswith("val_"):
        return f"{metric} (val)"
    return metric


def _group(
    key: tuple,
    runs: list[RunRecord],
    baseline: str,
    study: StudyNumbers | None,
    margin: float = stats.MARGIN,
    extensions: dict[str, Any] | None = None,
    lr_rule: str = ROBUST,
    primary: Sequence[Pair] = (),
) -> Group:
    """Build one dataset table."""
    by_method: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        by_method[run.method or "?"].append(run)
    cap = loss_cap(runs)
    arms = [_arm(m, by_method[m], key, study, lr_rule, cap) for m in _method_order(list(by_method), baseline)]
    splits = eval_sets([r for a in arms for r in a.runs])
    warnings = (
        _invalid_warnings(runs) + _budget_warnings(arms) + _edge_warnings(arms, extensions) + _prefreeze_warnings(arms)
    )
    warnings += _rebuilt_warnings(runs) + _stability_warnings(arms)
    if key[3].startswith("val_"):
        warnings.append(
            f"{metric_label(key[3], splits)} is measured on the validation split that chose the LR (the "
            "data has no test split): it is optimistic; prepare a test split for a held-out number"
        )
    direction = recorded_direction(runs)
    compared = any(a.method == baseline and a.primary.n > 0 for a in arms)
    if not compared:
        warnings.append(f"no finished '{baseline}' runs in this table: gaps and tests are not computed")
    return Group(
        *key,
        arms,
        baseline if compared else None,
        direction,
        warnings=warnings,
        heldout_notes=[(r, note) for a in arms for r in a.runs if (note := heldout_note(r.results))],
        margin=margin,
        splits=splits,
        reporting=facts_of(key[0], (r.results for r in runs)),
        versus=compare_to(arms, baseline, metric_direction(direction, key[3]), margin, primary) if compared else {},
        lr_rule=lr_rule,
        loss_cap=cap,
        primary=tuple(primary),
    )


def _check_same_data(key: tuple, runs: Sequence[RunRecord]) -> None:
    """Refuse to compare runs of one table that were trained on different data (re-prepared between
    them: other hold-outs, source or tokenizer). Runs without a fingerprint are not checked."""
    by_print: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        fp = run.results.get("data_fingerprint")
        if fp:
            by_print[fp].append(run)
    if len(by_print) > 1:
        parts = "; ".join(f"{fp}: {len(rs)} run(s), e.g. {rs[0].path}" for fp, rs in sorted(by_print.items()))
        raise UserError(
            f"the runs of {' / '.join(map(str, key))} were trained on different data ({parts}); the data was "
            "prepared again between them. Compare runs of one preparation (rerun the others on it)"
        )


def require_arm(groups: Sequence[Group], name: str, flag: str = "--baseline") -> None:
    """A control the user named must be an arm of some table: a typo would otherwise give a page
    with every gap 'not computed' and exit 0."""
    if not any(a.method == name for g in groups for a in g.arms):
        arms = sorted({a.method for g in groups for a in g.arms})
        raise UserError(f"{flag} {name!r} names no arm of these runs; arms: {', '.join(arms) or 'none'}")


def compare(
    runs: Sequence[RunRecord],
    baseline: str = BASELINE,
    study: StudyNumbers | None = None,
    margin: float = stats.MARGIN,
    extensions: dict[str, Any] | None = None,
    lr_rule: str = ROBUST,
    primary: Sequence[Pair] = (),
) -> Comparison:
    """Group finished runs into dataset tables; list incomplete and excluded runs apart.

    `extensions`: the sweep record's automatic grid extensions (see _edge_warnings). `lr_rule`: how
    each arm's setting is chosen on validation (LR_RULES). `primary`: the (method, compared with)
    pairs declared as the primary family (compare_to).

    Every method of a table is compared with the reference `baseline` (Holm-adjusted over the
    table's comparisons; equivalence by TOST within ±`margin` % of the reference's metric).
    """
    finished = [r for r in runs if r.finished]
    grouped: dict[tuple, list[RunRecord]] = defaultdict(list)
    for run in finished:
        grouped[_group_key(run)].append(run)
    for key, members in grouped.items():
        _check_same_data(key, members)
        check_protocol(f"{key[1]} ({key[0]}, {key[2]})", members)
    if lr_rule not in LR_RULES:
        raise UserError(f"lr_rule {lr_rule!r} is not a rule; use one of {', '.join(LR_RULES)}")
    pairs = [(str(m), str(r)) for m, r in primary]
    groups = [_group(k, grouped[k], baseline, study, margin, extensions, lr_rule, pairs) for k in sorted(grouped)]
    return Comparison(
        groups=groups,
        incomplete=[r for r in runs if not r.finished],
        excluded=[r for r in runs if r.status in (COLLAPSED, INVALID)],
        n_runs=len(runs),
        margin=margin,
    )


# ---------------------------------------------------------------------------------------------
# Validation curves


def curve_key(group: Group) -> tuple[str, str]:
    """Eval-line key of a table's validation curves and its axis label (the task's recorded facts)."""
    return group.facts.curve_metric, group.facts.curve_label


def mean_curve(arm: Arm, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps seen by every seed of the arm, with the mean, min and max over seeds."""
    curves = [dict(run.eval_curve(key)) for run in arm.runs]
    curves = [c for c in curves if c]
    if not curves:
        empty = np.array([])
        return empty, empty, empty, empty
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    values = np.array([[c[s] for s in steps] for c in curves])
    return np.array(steps), values.mean(0), values.min(0), values.max(0)


@dataclass
class Crossing:
    """Where an arm's mean validation curve crosses the baseline's for the last time."""

    last_other: int  # last evaluated step on the other side of the baseline than at the end
    first_final: int  # first evaluated step after it (the final side from here on)
    ahead_at_end: bool  # the arm is better than the baseline at the last shared step


def crossing(arm: Arm, base: Arm, group: Group) -> Crossing | None:
    """The last sign change of (arm - baseline) on the mean validation curves, if any.

    Shows when the sign of a gap depends on the budget: e.g. a method ahead early and behind at
    the end. Only steps every seed of both arms evaluated are compared.
    """
    key, _ = curve_key(group)
    s_arm, m_arm, _, _ = mean_curve(arm, key)
    s_base, m_base, _, _ = mean_curve(base, key)
    shared = sorted(set(s_arm.tolist()) & set(s_base.tolist()))
    if len(shared) < 2:
        return None
    a = dict(zip(s_arm.tolist(), m_arm.tolist()))
    b = dict(zip(s_base.tolist(), m_base.tolist()))
    better = [(a[s] > b[s]) if group.higher_is_better else (a[s] < b[s]) for s in shared]
    final = better[-1]
    other = [i for i, x in enumerate(better) if x != final and a[shared[i]] != b[shared[i]]]
    if not other:
        return None
    i = other[-1]
    return Crossing(shared[i], shared[i + 1], final)
