"""The scale ladder: each frozen method's gap to its same-init trainable twin as a function of
model size, per architecture, with a fitted trend stated as what it is (an extrapolation).

Each sweep directory is one rung (one architecture at one size, every arm at its own
validation-chosen LR, as `oelm report` chooses it). Within a rung every frozen method is compared
with its twin (`core.methods.twin_of`; the baseline where a method has none, e.g. identity-q,
whose Q projection is gone), paired by seed, Holm over the rung's pairs, in the reports'
vocabulary. Across rungs, per architecture and method, a weighted least-squares line of the gap
against log10(parameters) (weights 1/SE^2 of each rung's mean per-seed gap; statsmodels) gives the
trend's slope with its 95% interval and the gap it predicts at 10x the largest rung, with its
prediction interval: an extrapolation from at most a few points, not a measurement. That line
is also the declared trend test: the cost shrinks with size (resolved) when the slope's one-sided
p-value, Holm-adjusted over an architecture's methods, is below 0.05; it grows (resolved) in the
mirror case; else unresolved, with the smallest slope the rungs could detect.

With at least five rungs, each frozen method and its control also get the field's scaling fit
(oelm.reports.scaling: L(N) = E + A / N^alpha per arm, paired bootstrap over seeds): exponents,
their difference, the parameter multiplier at the top rung and the extrapolated gap at GPT-2
small's size.

A confirmation directory (an `oelm confirm` plan.json beside its records) given with its pilot
rung joins that rung: its fresh seeds, at the LRs the pilot chose, are shown beside the pilot's
gap, and where the pilot ran one seed per LR (no interval: the GPU rungs' protocol) they become
the rung's gap, so the rung enters the trend test and the fits. A pilot with seeds enough for
an interval keeps its own gap: the declared test reads pilots.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oelm.core.methods import get_method, twin_of
from oelm.records.load import load_runs
from oelm.records.plan import PLAN_FILE
from oelm.reports import scaling, stats
from oelm.reports.aggregate import BASELINE, Arm, compare, compare_pairs
from oelm.reports.comparison import page_json
from oelm.reports.tables import fmt_spec, saving_fraction, verdict_text
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_json, atomic_write_text, no_file_in_the_way, writable_dir


@dataclass
class Step:
    """One method at one rung, against its twin."""

    architecture: str
    model: str
    params: int | None
    method: str
    twin: str
    lr: float | None
    n: int
    gap: float | None  # mean per-seed % gap to the twin (+ = worse)
    ci_low: float | None
    ci_high: float | None
    verdict: str
    unstable: str  # "k of n" over every LR of the arm
    saving: float | None = None  # the method's theoretical training-FLOP saving (fraction), as recorded
    # Test loss (nats per token) per seed at the chosen LR, of the method and of its twin: the fits' points.
    seed_loss: dict[int, float] = field(default_factory=dict)
    twin_seed_loss: dict[int, float] = field(default_factory=dict)
    tokens: int | None = None  # training tokens of the method's runs
    budget: float | None = None  # nominal tokens per parameter: rungs within 1.5x of each other share one
    # Mean validation selection value per LR of the method and of its twin (the LR transfer check).
    val_by_lr: dict[float, float] = field(default_factory=dict)
    twin_lr: float | None = None
    twin_val_by_lr: dict[float, float] = field(default_factory=dict)
    higher_is_better: bool = False  # of the validation selection value
    # A confirmation's fresh seeds at this rung: "" without one; "fresh seeds" where they replaced a
    # one-seed pilot's gap; else the fresh reading shown beside the pilot's (one line of text).
    fresh: str = ""
    pilot_gap: float | None = None  # the pilot's own gap, where fresh seeds replaced it

    @property
    def tokens_per_param(self) -> float | None:
        return self.tokens / self.params if self.tokens and self.params else None


SIZE, DATA = "parameters", "tokens per parameter"


@dataclass
class Trend:
    """A fitted gap line for one architecture and method: against size (at a fixed budget of tokens
    per parameter) or against data (tokens per parameter, at a fixed size)."""

    architecture: str
    method: str
    rungs: int
    slope: float | None  # % gap per decade of parameters (or of tokens per parameter)
    slope_low: float | None
    slope_high: float | None
    at: float | None  # parameters of the extrapolation (10x the largest rung)
    predicted: float | None
    predicted_low: float | None
    predicted_high: float | None
    note: str = ""
    # The declared trend test: one-sided p-values of the slope (Holm over an architecture's methods).
    p_shrink: float | None = None
    p_grow: float | None = None
    verdict: str = ""
    detectable: float | None = None  # the slope (% per decade) the rungs detect at 80% power, one-sided
    axis: str = SIZE  # SIZE or DATA
    held: str = ""  # what is fixed along the line: "20 tokens per parameter" or "9,408 parameters"
    # The declared test redone with each rung left out (lines of 4 or more rungs): the slope's range
    # over those refits, and in how many of them the verdict stays what it is with every rung.
    loo_slope: list[float] | None = None
    loo_holds: str = ""
    # Exploratory, not the declared test: the line over size refitted from each larger starting rung
    # (the smallest rungs dropped one at a time, while 3 weighed rungs remain), each start judged as
    # the test judges, Holm over the family at that start: {"from", "rungs", "slope", "low", "high", "verdict"}.
    from_start: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Transfer:
    """One arm's move to the next larger rung at one budget: the LR the rung below chose (the
    centre of this rung's grid) against the LR this rung chose, and what keeping the rung below's LR
    without a grid would have cost on validation."""

    architecture: str
    method: str
    params_below: int
    params: int
    lr_below: float
    lr: float
    cost: float | None  # % of the chosen LR's mean validation value (+ = worse); None: not run here
    budget: float | None = None

    @property
    def moved(self) -> float:
        """Grid steps (factors of 2) from the rung below's LR to this rung's choice (+ = larger)."""
        return math.log2(self.lr / self.lr_below)


@dataclass
class Ladder:
    steps: list[Step] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    trends: list[Trend] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    arm_fits: list[scaling.ArmFit] = field(default_factory=list)
    pair_fits: list[scaling.PairFit] = field(default_factory=list)
    data_fits: list[scaling.DataFit] = field(default_factory=list)


def architecture_of(model: str) -> str:
    """The family a model name belongs to (our presets: gpt-*, llama-*; else the name)."""
    for prefix in ("gpt", "llama"):
        if model.startswith(prefix):
            return prefix
    return model


def _params(arm: Arm) -> int | None:
    for run in arm.runs:
        t, f = run.results.get("trainable_params"), run.results.get("frozen_params")
        if isinstance(t, int) and isinstance(f, int):
            return t + f
    return None


def _freezes(method: str) -> bool:
    try:
        m = get_method(method)
    except UserError:
        return False
    return bool(m.freeze) or getattr(m, "q_identity", False)


def _tokens(arm: Arm) -> int | None:
    """Training tokens of an arm's runs (one budget per arm in a sweep)."""
    seen = {r.results.get("tokens_seen") for r in arm.runs}
    return next(iter(seen)) if len(seen) == 1 and isinstance(next(iter(seen)), int) else None


def _seed_losses(arm: Arm, metric: str) -> dict[int, float]:
    """Per-seed test loss in nats per token (the log of a perplexity)."""
    if "perplexity" in metric:
        return {s: math.log(v) for s, v in sorted(arm.by_seed.items()) if v > 0}
    return dict(sorted(arm.by_seed.items())) if metric.endswith("loss") else {}


def rung(paths: Sequence[str | Path], warnings: list[str] | None = None) -> list[Step]:
    """The steps of one rung (one sweep): every frozen method against its twin. Its tables' warnings
    (unequal budgets, unstable runs, ...) are added to `warnings`, named by the table."""
    comparison = compare(load_runs(paths), baseline=BASELINE)
    steps: list[Step] = []
    for group in comparison.groups:
        if warnings is not None:
            warnings += [f"{group.title}: {w}" for w in group.warnings]
        arms = {a.method: a for a in group.arms}
        # The rung's size: the baseline's total parameters, else any arm's (frozen ones included).
        ordered = [arms[BASELINE]] if BASELINE in arms else []
        size = next((n for a in [*ordered, *arms.values()] if (n := _params(a)) is not None), None)
        pairs = []
        for method, arm in arms.items():
            if not _freezes(method):
                continue
            twin = twin_of(method) if twin_of(method) in arms else BASELINE
            if twin in arms and twin != method:
                pairs.append((arm, arms[twin]))
        versus = compare_pairs(pairs, group.higher_is_better) if pairs else []
        for (arm, twin), vs in zip(pairs, versus):
            gaps = vs.gap_paired
            unstable, finished = arm.unstable_count()
            steps.append(
                Step(
                    architecture=architecture_of(group.model),
                    model=group.model,
                    params=size,
                    method=arm.method,
                    twin=twin.method,
                    lr=arm.lr,
                    n=gaps.n if gaps else 0,
                    gap=gaps.mean if gaps else None,
                    ci_low=gaps.ci_low if gaps else None,
                    ci_high=gaps.ci_high if gaps else None,
                    verdict=verdict_text(vs.decision),
                    unstable=f"{unstable} of {finished}",
                    saving=saving_fraction(arm.theoretical_saving),
                    seed_loss=_seed_losses(arm, group.primary_metric),
                    twin_seed_loss=_seed_losses(twin, group.primary_metric),
                    tokens=_tokens(arm),
                    val_by_lr=_val_by_lr(arm),
                    twin_lr=twin.lr,
                    twin_val_by_lr=_val_by_lr(twin),
                    higher_is_better=group.higher_is_better,
                )
            )
    return steps


def _val_by_lr(arm: Arm) -> dict[float, float]:
    """The arm's mean validation selection value at each LR of its grid (the first setting of an LR)."""
    out: dict[float, float] = {}
    for cell in arm.cells:
        if cell.selection.mean is not None and math.isfinite(cell.selection.mean):
            out.setdefault(cell.lr, float(cell.selection.mean))
    return out


def transfers(steps: Sequence[Step], data_axis: bool = False) -> list[Transfer]:
    """Every arm's moves between consecutive rungs (each frozen method and each control once): the
    check of the ladder's LR transfer rule, read on validation, never on held-out data. With a data
    axis, only along an architecture's main budget (the one with the most sizes)."""
    sizes_at: dict[tuple[str, float | None], set[int]] = {}
    for s in steps:
        if s.params is not None:
            sizes_at.setdefault((s.architecture, s.budget if data_axis else None), set()).add(s.params)
    main: dict[str, float | None] = {}
    for architecture, budget in sorted(sizes_at, key=lambda key: -len(sizes_at[key])):
        main.setdefault(architecture, budget)
    series: dict[tuple[str, str], dict[int, tuple[float, dict[float, float], bool]]] = {}
    for s in steps:
        if s.params is None or main.get(s.architecture) != (s.budget if data_axis else None):
            continue
        for method, lr, vals in ((s.method, s.lr, s.val_by_lr), (s.twin, s.twin_lr, s.twin_val_by_lr)):
            if lr is not None and lr in vals:
                by_size = series.setdefault((s.architecture, method), {})
                by_size.setdefault(s.params, (lr, vals, s.higher_is_better))
    out: list[Transfer] = []
    for (architecture, method), by_size in sorted(series.items()):
        sizes = sorted(by_size)
        for below, size in zip(sizes, sizes[1:]):
            lr_below, (lr, vals, higher) = by_size[below][0], by_size[size]
            cost = None
            if lr_below in vals and vals[lr]:
                cost = 100 * (vals[lr_below] - vals[lr]) / abs(vals[lr]) * (-1 if higher else 1)
            out.append(Transfer(architecture, method, below, size, lr_below, lr, cost, main[architecture]))
    return out


def _x(p: Step, axis: str) -> float | None:
    return float(p.params) if axis == SIZE and p.params else p.tokens_per_param if axis == DATA else None


def _weighed(p: Step, axis: str) -> bool:
    """Whether the trend test weighs this rung: a place on the axis and a gap with an interval."""
    return bool(_x(p, axis)) and p.gap is not None and p.ci_low is not None and p.n >= 2


def fit_trend(points: Sequence[Step], confidence: float = stats.CONFIDENCE, axis: str = SIZE) -> Trend:
    """WLS of gap on log10(params) (or log10(tokens per parameter)) over rungs with an interval; the
    prediction at 10x the largest."""
    import statsmodels.api as sm  # heavy optional dependency: imported on use

    first = points[0]
    usable = [p for p in points if _weighed(p, axis)]
    trend = Trend(first.architecture, first.method, len(usable), None, None, None, None, None, None, None, axis=axis)
    if len(usable) < 3:
        trend.note = f"{len(usable)} rung(s) with an interval: a line needs at least 3 to have an interval"
        return trend
    x = np.log10([_x(p, axis) for p in usable])
    y = np.array([p.gap for p in usable], dtype=float)
    # SE of each rung's mean from its t interval: half-width / t(0.975, n-1).
    from scipy.stats import t  # heavy optional dependency: imported on use

    se = np.array([(p.ci_high - p.ci_low) / 2 / t.ppf(0.5 + confidence / 2, p.n - 1) for p in usable])
    weights = 1.0 / np.maximum(se, 1e-9) ** 2
    design = sm.add_constant(x)
    fit = sm.WLS(y, design, weights=weights).fit()
    low, high = fit.conf_int(alpha=1 - confidence)[1]
    trend.slope, trend.slope_low, trend.slope_high = float(fit.params[1]), float(low), float(high)
    at = 10 * max(_x(p, axis) for p in usable)
    pred = fit.get_prediction(np.array([[1.0, math.log10(at)]])).summary_frame(alpha=1 - confidence)
    trend.at = at
    trend.predicted = float(pred["mean"].iloc[0])
    trend.predicted_low = float(pred["obs_ci_lower"].iloc[0])
    trend.predicted_high = float(pred["obs_ci_upper"].iloc[0])
    trend.note = (
        f"extrapolation: a line through the rungs, not a measurement at that {'size' if axis == SIZE else 'budget'}"
    )
    t_stat, df = float(fit.tvalues[1]), float(fit.df_resid)
    trend.p_shrink, trend.p_grow = float(t.cdf(t_stat, df)), float(t.sf(t_stat, df))
    trend.detectable = float((t.ppf(0.95, df) + t.ppf(0.80, df)) * fit.bse[1])
    return trend


def judge_trends(trends: list[Trend], alpha: float = stats.ALPHA) -> None:
    """The declared trend test's verdicts, Holm over the methods of each architecture and line (one-sided)."""
    for key in sorted({(t.architecture, t.axis, t.held) for t in trends}):
        family = [t for t in trends if (t.architecture, t.axis, t.held) == key]
        what = "size" if key[1] == SIZE else "data"
        shrink = stats.holm([t.p_shrink for t in family])
        grow = stats.holm([t.p_grow for t in family])
        for t, ps, pg in zip(family, shrink, grow, strict=True):
            t.p_shrink, t.p_grow = ps, pg
            if ps is None:
                t.verdict = "no test (fewer than 3 rungs with an interval)"
            elif ps < alpha:
                t.verdict = f"shrinks with {what} (resolved)"
            elif pg < alpha:
                t.verdict = f"grows with {what} (resolved)"
            else:
                t.verdict = f"unresolved (smallest detectable slope {t.detectable:.2f}% per decade at 80% power)"


def build(rungs: Sequence[Sequence[str | Path]]) -> Ladder:
    """The ladder of several rungs (each a list of paths: one sweep or its records)."""
    ladder = Ladder()
    first: dict[tuple, str] = {}  # (architecture, method, parameters, tokens) -> the rung that gave it
    confirmations = [paths for paths in rungs if any((Path(p) / PLAN_FILE).is_file() for p in paths)]
    for paths in [r for r in rungs if r not in confirmations]:
        shown = ", ".join(Path(p).as_posix() for p in paths)
        for step in rung(paths, ladder.warnings):
            key = (step.architecture, step.method, step.params, step.tokens)
            if key in first:
                raise UserError(
                    f"rungs {first[key]} and {shown} both hold {step.architecture} {step.method} at "
                    f"{_count(step.params)} parameters and {_count(step.tokens)} tokens: one size counted twice would "
                    "fake a "
                    "trend (a line through a repeated point); name each rung once"
                )
            first[key] = shown
            ladder.steps.append(step)
    if not ladder.steps:
        raise UserError("no frozen method with a twin in the given sweeps; a ladder rung needs both arms")
    for paths in confirmations:
        _join_confirmation(ladder, paths)
    _assign_budgets(ladder.steps)
    # Lines over size are drawn per budget only where the ladder has a data axis (a size trained at
    # two budgets); otherwise every rung of a method is one line, whatever its tokens per parameter.
    seen: dict[tuple[str, str, int | None], set] = {}
    for step in ladder.steps:
        seen.setdefault((step.architecture, step.method, step.params), set()).add(step.budget)
    data_axis = any(len(b) > 1 for b in seen.values())
    ladder.transfers = transfers(ladder.steps, data_axis)
    lines: list[tuple[Trend, list[Step]]] = []  # every line with the rungs it was drawn through
    by_series: dict[tuple[str, str, float | None], list[Step]] = {}
    for step in ladder.steps:
        by_series.setdefault((step.architecture, step.method, step.budget if data_axis else None), []).append(step)
    for (_, _, budget), points in sorted(by_series.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        points = sorted(points, key=lambda p: p.params or 0)
        if len(points) < 2 and data_axis:
            continue  # a single rung at this budget: a point of the data axis, not a line over size
        trend = fit_trend(points)
        lines.append((trend, points))
        budgets = {p.budget for p in points}
        trend.held = (
            f"{budget:g} tokens per parameter"
            if budget
            else (f"{points[0].budget:g} tokens per parameter" if len(budgets) == 1 and points[0].budget else "")
        )
        ladder.trends.append(trend)
        _fit_scaling(ladder, points, trend.held)
    lines += _data_trends(ladder)
    if data_axis:
        _fit_data(ladder)
    judge_trends(ladder.trends)
    _judge_without_each_rung(lines)
    _judge_from_each_start(lines)
    ladder.steps.sort(key=lambda s: (s.architecture, s.method, (s.budget or 0) if data_axis else 0, s.params or 0))
    return ladder


def _join_confirmation(ladder: Ladder, paths: Sequence[str | Path]) -> None:
    """Join a confirmation's fresh seeds to its pilot's steps (same architecture, method, size and
    tokens, at the LR the pilot chose); refuse a confirmation whose pilot rung was not given."""
    shown = ", ".join(Path(p).as_posix() for p in paths)
    pilots = {(s.architecture, s.method, s.params, s.tokens): s for s in ladder.steps}
    for fresh in rung(paths, ladder.warnings):
        pilot = pilots.get((fresh.architecture, fresh.method, fresh.params, fresh.tokens))
        if pilot is None:
            raise UserError(
                f"confirmation {shown} holds {fresh.architecture} {fresh.method} at {_count(fresh.params)} parameters "
                f"and {_count(fresh.tokens)} tokens, and no rung given does: name its pilot rung too"
            )
        if (fresh.lr, fresh.twin_lr) != (pilot.lr, pilot.twin_lr):
            raise UserError(
                f"confirmation {shown} trained {fresh.method} at LR {_f(fresh.lr, 'g')} (its twin at "
                f"{_f(fresh.twin_lr, 'g')}) where its pilot rung chose {_f(pilot.lr, 'g')} ({_f(pilot.twin_lr, 'g')}): "
                "it confirms another choice; "
                "plan it from this pilot (`oelm confirm plan`)"
            )
        if pilot.n >= 2 and pilot.ci_low is not None:
            pilot.fresh = f"{_f(fresh.gap)} [{_f(fresh.ci_low)}, {_f(fresh.ci_high)}] on {fresh.n}: {fresh.verdict}"
            continue
        pilot.pilot_gap, pilot.fresh = pilot.gap, "fresh seeds"
        for name in ("n", "gap", "ci_low", "ci_high", "verdict", "unstable", "seed_loss", "twin_seed_loss"):
            setattr(pilot, name, getattr(fresh, name))


def _count(v: int | None) -> str:
    return "?" if v is None else f"{v:,}"


def _assign_budgets(steps: list[Step]) -> None:
    """Nominal tokens per parameter: ratios within 1.5x of the smallest of a run of them share the
    rounded median (20.2 and 21.6 are one budget; 20, 80 and 300 are three)."""
    ratios = sorted({r for s in steps if (r := s.tokens_per_param)})
    groups: list[list[float]] = []
    for r in ratios:
        if groups and r <= groups[-1][0] * 1.5:
            groups[-1].append(r)
        else:
            groups.append([r])
    nominal = {r: float(f"{np.median(g):.2g}") for g in groups for r in g}
    for s in steps:
        s.budget = nominal.get(s.tokens_per_param) if s.tokens_per_param else None


def _kind(verdict: str) -> str:
    """A verdict's kind: 'shrinks with size', 'grows with data', 'unresolved', 'no test'."""
    return verdict.split(" (")[0]


def _holm_families(lines: list[tuple[Trend, list[Step]]]) -> dict[tuple[str, str, str], list[tuple[Trend, list[Step]]]]:
    """The lines the declared test judges together (one Holm family): one architecture, axis and
    quantity held fixed."""
    families: dict[tuple[str, str, str], list[tuple[Trend, list[Step]]]] = {}
    for trend, points in lines:
        families.setdefault((trend.architecture, trend.axis, trend.held), []).append((trend, points))
    return families


def _refit_family(family: list[tuple[Trend, list[Step]]], axis: str, keep: Callable[[Step], bool]) -> list[Trend]:
    """Every line of one Holm family refitted on the rungs `keep` admits and judged as the declared
    test judges them (Holm over the family's refitted lines)."""
    redone = [fit_trend([p for p in points if keep(p)], axis=axis) for _, points in family]
    for r, (t, _) in zip(redone, family):
        r.held = t.held
    judge_trends(redone)
    return redone


def _judge_without_each_rung(lines: list[tuple[Trend, list[Step]]]) -> None:
    """The declared test redone with each rung (one size, or one budget on a line over data) left
    out of every line of a Holm family at once: each line's slope range over those refits and in
    how many its verdict keeps its kind. A verdict resting on one rung shows it here."""
    for (_, axis, _), family in _holm_families(lines).items():
        if max(t.rungs for t, _ in family) < 4:
            continue  # without one of 3 rungs no line has an interval
        refits: dict[int, list[Trend]] = {}
        for left in sorted({_x(p, axis) for _, points in family for p in points if _weighed(p, axis)}):
            redone = _refit_family(family, axis, lambda p, left=left: _x(p, axis) != left)
            for i, r in enumerate(redone):
                refits.setdefault(i, []).append(r)
        for i, (t, _) in enumerate(family):
            slopes = [r.slope for r in refits.get(i, []) if r.slope is not None]
            if t.rungs < 4 or not slopes:
                continue
            t.loo_slope = [min(slopes), max(slopes)]
            t.loo_holds = f"{sum(_kind(r.verdict) == _kind(t.verdict) for r in refits[i])} of {len(refits[i])}"


def _judge_from_each_start(lines: list[tuple[Trend, list[Step]]]) -> None:
    """Each line over size refitted with its smallest rungs dropped one at a time, while at least 3
    weighed rungs remain, and judged as the declared test judges (Holm over the lines of its family
    refitted from the same start). Exploratory: which start to believe is not declared; every start
    is shown, so that a verdict that lives or dies with the smallest models shows it."""
    for (_, axis, _), family in _holm_families(lines).items():
        if axis != SIZE:
            continue
        sizes = sorted({_x(p, SIZE) for _, points in family for p in points if _weighed(p, SIZE)})
        for start in sizes[1:]:
            redone = _refit_family(family, SIZE, lambda p, start=start: (_x(p, SIZE) or 0) >= start)
            for r, (t, _) in zip(redone, family):
                if r.slope is not None:
                    t.from_start.append(
                        {
                            "from": int(start),
                            "rungs": r.rungs,
                            "slope": r.slope,
                            "low": r.slope_low,
                            "high": r.slope_high,
                            "verdict": r.verdict,
                        }
                    )


def _data_trends(ladder: Ladder) -> list[tuple[Trend, list[Step]]]:
    """At each size trained at two or more budgets: the gap's line against tokens per parameter."""
    out = []
    by_size: dict[tuple[str, str, int], list[Step]] = {}
    for s in ladder.steps:
        if s.params and s.budget:
            by_size.setdefault((s.architecture, s.method, s.params), []).append(s)
    for (_, _, params), points in sorted(by_size.items()):
        if len({p.budget for p in points}) < 2:
            continue
        points = sorted(points, key=lambda p: p.budget)
        trend = fit_trend(points, axis=DATA)
        trend.held = f"{params:,} parameters"
        ladder.trends.append(trend)
        out.append((trend, points))
    return out


def _fit_scaling(ladder: Ladder, points: list[Step], held: str) -> None:
    """The scaling fits of one frozen method and its twin over the rungs of one budget (`held`; the
    twin's fit once per budget)."""
    series_f = {p.params: p.seed_loss for p in points if p.params and p.seed_loss}
    series_c = {p.params: p.twin_seed_loss for p in points if p.params and p.twin_seed_loss}
    first = points[0]
    if len(points) < 2:
        return
    method_fit, control_fit, pair = scaling.fit_pair(first.architecture, first.method, first.twin, series_f, series_c)
    pair.held = method_fit.held = control_fit.held = held
    ladder.pair_fits.append(pair)
    ladder.arm_fits.append(method_fit)
    if not any((a.architecture, a.method, a.held) == (first.architecture, first.twin, held) for a in ladder.arm_fits):
        ladder.arm_fits.append(control_fit)


def _fit_data(ladder: Ladder) -> None:
    """L(N, D) of each frozen method and its twin over every rung and budget (scaling.fit_data_pair)."""
    pairs: dict[tuple[str, str, str], list[Step]] = {}
    for s in ladder.steps:
        if s.params and s.tokens:
            pairs.setdefault((s.architecture, s.method, s.twin), []).append(s)
    for (architecture, method, twin), steps in sorted(pairs.items()):
        cells_f = {(s.params, s.tokens): s.seed_loss for s in steps if s.seed_loss}
        cells_c = {(s.params, s.tokens): s.twin_seed_loss for s in steps if s.twin_seed_loss}
        ladder.data_fits.append(scaling.fit_data_pair(architecture, method, twin, cells_f, cells_c))


def _f(v: float | None, spec: str = "+.2f") -> str:
    return "n/a" if v is None else format(v, spec)


def render(ladder: Ladder, command: str, figure: str = "ladder.png") -> str:
    """ladder.md."""
    lines = [
        "# Scale ladder: the gap to the same-init twin against model size",
        "",
        f"Generated by `{command}` from stored run records; do not edit by hand.",
        "",
        *_render_answer(ladder),
        "## Every rung",
        "",
        "| architecture | parameters | tokens per parameter | method | twin | LR | seeds | gap % [95% CI] (+ = worse) "
        "| verdict | unstable runs | training-FLOP saving |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in ladder.steps:
        params = "n/a" if s.params is None else f"{s.params:,}"
        lines.append(
            f"| {s.architecture} | {params} | {_f(s.tokens_per_param, '.1f')} | {s.method} | {s.twin} | "
            f"{_f(s.lr, 'g')} | {_seeds_text(s)} | "
            f"{_f(s.gap)} [{_f(s.ci_low)}, {_f(s.ci_high)}] | {_verdict_text(s)} | {s.unstable} | "
            f"{'n/a' if s.saving is None else format(100 * s.saving, '.2f') + '%'} |"
        )
    if any(s.fresh for s in ladder.steps):
        lines += [
            "",
            "Seeds marked *fresh* are a confirmation's (`oelm confirm`, at the LRs the pilot chose): they give "
            "the gap of a rung whose pilot ran one seed per LR; beside a pilot with an interval they are shown "
            "after its verdict and leave the pilot's gap, the one the declared test reads.",
        ]
    lines += [
        "",
        "## Trend (weighted least squares of the gap on log10 of the axis)",
        "",
        "| architecture | method | axis | held fixed | rungs | slope, % per decade [95% CI] | at 10x the largest "
        "| predicted gap [95% prediction interval] | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in ladder.trends:
        at = "n/a" if t.at is None else f"{t.at:,.0f}"
        lines.append(
            f"| {t.architecture} | {t.method} | {t.axis} | {t.held or 'n/a'} | {t.rungs} | "
            f"{_f(t.slope)} [{_f(t.slope_low)}, {_f(t.slope_high)}] | "
            f"{at} | {_f(t.predicted)} [{_f(t.predicted_low)}, {_f(t.predicted_high)}] | {t.note} |"
        )
    lines += ["", f"![gap to the twin against parameters]({figure})", ""]
    lines += _render_trend_test(ladder) + _render_transfer(ladder) + _render_fits(ladder) + _render_data_fits(ladder)
    if ladder.warnings:
        lines += ["Warnings:", "", *(f"- {w}" for w in ladder.warnings), ""]
    return "\n".join(lines)


def _seeds_text(s: Step) -> str:
    return f"{s.n} fresh" if s.fresh == "fresh seeds" else str(s.n)


def _verdict_text(s: Step) -> str:
    if s.fresh == "fresh seeds":
        return f"{s.verdict}; the pilot's one seed {_f(s.pilot_gap)}%"
    return f"{s.verdict}; fresh seeds {s.fresh}" if s.fresh else s.verdict


def _answer_line(t: Trend, pair: scaling.PairFit | None, twin: str) -> str:
    """One pair's answer: the trend's verdict with its slope, and where a fit exists, what it says."""
    what = "size" if t.axis == SIZE else "data"
    held = f" at {t.held}" if t.held else ""
    slope = "" if t.slope is None else f" (slope {t.slope:+.2f}% per decade [{t.slope_low:+.2f}, {t.slope_high:+.2f}])"
    text = f"- {t.architecture}, {t.method} vs {twin}, over {what}{held}, {t.rungs} rungs: {t.verdict}{slope}."
    if t.loo_slope:
        text += (
            f" Leaving one rung out, the slope runs from {t.loo_slope[0]:+.2f}% to {t.loo_slope[1]:+.2f}% per decade;"
            f" {t.loo_holds} refits keep the verdict '{_kind(t.verdict)}'."
        )
    if pair is not None and pair.d_alpha is not None:
        never = f"; {100 * pair.never:.0f}% of refits never match" if pair.never else ""
        text += (
            f" Fit: exponent difference {fmt_spec(pair.d_alpha, '+.3g')} [{fmt_spec(pair.d_alpha_low, '+.3g')}, "
            f"{fmt_spec(pair.d_alpha_high, '+.3g')}]; the frozen arm needs {fmt_spec(pair.multiplier, '.3g')}x "
            f"[{fmt_spec(pair.multiplier_low, '.3g')}, {fmt_spec(pair.multiplier_high, '.3g')}] the parameters to match "
            f"at {pair.at:,}{never}; extrapolated gap at {pair.target / 1e6:g}M parameters "
            f"{fmt_spec(pair.predicted_gap, '+.3g')}% [{fmt_spec(pair.predicted_low, '+.3g')}, {fmt_spec(pair.predicted_high, '+.3g')}]"
            f"{_loo_text(pair.predicted_loo)}, {_reach_text(pair)}."
        )
        for caveat in (scaling.FLOORLESS, scaling.MISFIT):
            if caveat in pair.note:
                text += " " + caveat[0].upper() + caveat[1:] + "."
    return text


def _loo_text(span: list[float | None] | None, spec: str = "+.3g") -> str:
    """' (a to b leaving one rung out)': how far the extrapolation moves without any one size."""
    return "" if not span or span[0] is None else f" ({_span(span, '%', spec)} leaving one rung out)"


def _reach_text(pair: scaling.PairFit) -> str:
    """Where the fitted gap falls to 1%, in words ('never': not below 10^12 parameters)."""
    interval = f"[{fmt_spec(pair.reach_low, '.3g')}, {fmt_spec(pair.reach_high, '.3g')}]"
    if pair.reach_1pct is not None and math.isinf(pair.reach_1pct):
        return f"the fitted gap does not fall to {scaling.REACH_GAP:g}% below 10^12 parameters (bootstrap: {interval})"
    return f"it falls to {scaling.REACH_GAP:g}% at {fmt_spec(pair.reach_1pct, '.3g')} parameters {interval}"


def _render_answer(ladder: Ladder) -> list[str]:
    """The page's first lines: does the cost shrink with size, with data, by how much, and where
    would it reach 1%? Read from the declared trend test and the fits."""
    twins = {(s.architecture, s.method): s.twin for s in ladder.steps}
    fits = {(p.architecture, p.method, p.held): p for p in ladder.pair_fits}
    lines = [
        "## The answer",
        "",
        "Does the gap of each frozen method to its control shrink as the model grows (at a fixed budget "
        "of tokens per parameter), or as the data grows (at a fixed size)? The declared one-sided trend "
        "test (below), with the scaling fits where the ladder has at least "
        f"{scaling.MIN_RUNGS} rungs; fitted extrapolations are far outside the rungs and say so.",
        "",
    ]
    lines += _tally(ladder.trends) + _without_smallest(ladder.trends) + _untested(ladder.steps)
    for t in sorted(ladder.trends, key=lambda t: (t.architecture, t.axis != SIZE, t.held, t.method)):
        pair = fits.get((t.architecture, t.method, t.held)) if t.axis == SIZE else None
        lines.append(_answer_line(t, pair, twins.get((t.architecture, t.method), "its control")))
    lines += [_data_fit_line(f) for f in ladder.data_fits]
    return [*lines, ""]


def _tally(trends: Sequence[Trend]) -> list[str]:
    """The answer in one line per axis: how many lines the declared test finds shrinking, growing
    or unresolved, and how many slopes point each way."""
    out = []
    for axis, what in ((SIZE, "size"), (DATA, "data")):
        lines = [t for t in trends if t.axis == axis and t.slope is not None]  # the tested lines
        if not lines:
            continue
        shrink = sum(t.verdict.startswith("shrinks") for t in lines)
        grow = sum(t.verdict.startswith("grows") for t in lines)
        positive = sum(t.slope > 0 for t in lines)
        archs = ", ".join(sorted({t.architecture for t in lines}))
        out.append(
            f"**Over {what}** ({len(lines)} tested line{'s' if len(lines) > 1 else ''} of a frozen method against "
            f"its control; {archs}): the "
            f"gap shrinks (resolved) on {shrink}, grows (resolved) on {grow}, is unresolved on "
            f"{len(lines) - shrink - grow}; {positive} of {len(lines)} slopes are positive (the gap growing)."
        )
    return [*out, ""] if out else []


def _without_smallest(trends: Sequence[Trend]) -> list[str]:
    """One line on the exploratory refits: each line over size from its largest start that keeps 3
    rungs with an interval, how many slopes point each way and how many resolve."""
    last = [(t, t.from_start[-1]) for t in trends if t.from_start]
    if not last:
        return []
    negative = sum(r["slope"] < 0 for _, r in last)
    kinds = [_kind(r["verdict"]) for _, r in last]
    starts = ", ".join(f"{a} from {n:,}" for a, n in sorted({(t.architecture, r["from"]) for t, r in last}))
    return [
        f"**Without the smallest rungs** (exploratory, not the declared test): refitted from the largest start "
        f"that keeps 3 rungs with an interval ({starts} parameters), {negative} of {len(last)} slopes are "
        f"negative (the gap shrinking with size); {kinds.count('shrinks with size')} shrink (resolved), "
        f"{kinds.count('grows with size')} grow (resolved). Every start is in the table 'Without the smallest "
        "rungs'.",
        "",
    ]


def _untested(steps: Sequence[Step]) -> list[str]:
    """The rungs the trend test leaves out (fewer than two paired seeds: no interval, so no weight),
    with their gaps, one line per architecture: the answer names what it does not weigh."""
    left = sorted(
        (s for s in steps if s.gap is not None and (s.ci_low is None or s.n < 2)), key=lambda s: s.params or 0
    )
    out = []
    for arch in sorted({s.architecture for s in left}):
        mine = [s for s in left if s.architecture == arch]
        sizes = ", ".join(f"{p:,}" for p in dict.fromkeys(s.params for s in mine if s.params))
        gaps: dict[tuple[str, str], list[str]] = {}
        for s in mine:
            gaps.setdefault((s.method, s.twin), []).append(f"{s.gap:+.2f}%")
        pairs = "; ".join(f"{m} vs {twin} {', '.join(g)}" for (m, twin), g in sorted(gaps.items()))
        out.append(
            f"**Not in the test** ({arch}; {sizes} parameters; one paired seed, so no interval to weigh): {pairs}. "
            "Seeds enough for an interval there would enter the test."
        )
    return [*out, ""] if out else []


def _render_trend_test(ladder: Ladder) -> list[str]:
    """The declared trend test's table: does each method's gap shrink with size?"""
    lines = [
        "## Does the cost shrink with size? (the declared trend test)",
        "",
        "One-sided tests of the trend's slope, Holm over the methods of each architecture and line (axis and "
        "what is held fixed): 'shrinks' needs the slope below 0, 'grows' above 0, each at 0.05 after Holm.",
        "",
        "| architecture | method vs control | axis | held fixed | rungs | slope, % per decade [95% CI] | "
        "p (shrinks), Holm | p (grows), Holm | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    twins = {(s.architecture, s.method): s.twin for s in ladder.steps}
    for t in ladder.trends:
        lines.append(
            f"| {t.architecture} | {t.method} vs {twins.get((t.architecture, t.method), 'n/a')} | {t.axis} | "
            f"{t.held or 'n/a'} | {t.rungs} | "
            f"{_f(t.slope)} [{_f(t.slope_low)}, {_f(t.slope_high)}] | {_f(t.p_shrink, '.3g')} | "
            f"{_f(t.p_grow, '.3g')} | {t.verdict} |"
        )
    return [*lines, "", *_render_from_each_start(ladder, twins)]


def _render_from_each_start(ladder: Ladder, twins: dict[tuple[str, str], str]) -> list[str]:
    """The exploratory refits from each larger starting rung (_judge_from_each_start)."""
    rows = [(t, r) for t in ladder.trends for r in t.from_start]
    if not rows:
        return []
    lines = [
        "### Without the smallest rungs (exploratory, not the declared test)",
        "",
        "The line over size refitted from each larger starting rung, the smaller ones dropped, while at least 3 "
        "rungs with an interval remain; each start judged as the declared test judges, Holm over the methods of "
        "its architecture and line at that start. The smallest rungs sit near the loss of a model that learns "
        "little beyond byte frequencies, where every arm is alike; no start was declared, so none of these "
        "verdicts is a finding of the ladder: they show which of its answers depend on those rungs.",
        "",
        "| architecture | method vs control | held fixed | from, parameters | rungs | slope, % per decade [95% CI] "
        "| verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, r in rows:
        lines.append(
            f"| {t.architecture} | {t.method} vs {twins.get((t.architecture, t.method), 'n/a')} | {t.held or 'n/a'} | "
            f"{r['from']:,} | {r['rungs']} | {_f(r['slope'])} [{_f(r['low'])}, {_f(r['high'])}] | {r['verdict']} |"
        )
    return [*lines, ""]


def _transfer_summary(architecture: str, moves: list[Transfer]) -> str:
    """One architecture's reading of the transfer check: kept, worst and median cost, safe or not."""
    kept = sum(t.lr == t.lr_below for t in moves)
    costs = [t for t in moves if t.cost is not None]
    text = f"- {architecture}: the rung below's LR stayed the choice in {kept} of {len(moves)} moves"
    if not costs:
        return text + "; no move's cost is measurable (the rung below's LR was not run)."
    worst = max(costs, key=lambda t: t.cost or 0.0)
    median = float(np.median([t.cost for t in costs]))
    text += (
        f"; kept without a grid, it would have cost up to {worst.cost:+.2f}% ({worst.method}, "
        f"{worst.params_below:,} to {worst.params:,} parameters), median {median:+.2f}%"
    )
    if len(costs) < len(moves):
        missing = len(moves) - len(costs)
        text += f" ({missing} move{'s' if missing > 1 else ''} not measurable: the rung below's LR was not run)"
    if (worst.cost or 0.0) > stats.MARGIN:
        return (
            text
            + f": above the {stats.MARGIN:g}% margin, so one LR per rung, carried over from the rung below, is not safe here: the rungs need their grids."
        )
    return text + f": within the {stats.MARGIN:g}% margin on these rungs."


def _render_transfer(ladder: Ladder) -> list[str]:
    """Is one LR per rung enough? The transfer rule checked on validation."""
    if not ladder.transfers:
        return []
    lines = [
        "## Is one LR per rung enough? (the transfer rule, checked on validation)",
        "",
        "Could each rung skip its grid and train every arm at the LR the rung below chose for it? Had "
        "that LR been kept, each arm would have paid the cost below: its mean validation value at that "
        "LR against the LR this rung chose, in % (+ = worse); 'not run' where this rung's grid did not "
        f"hold it. Keeping it is safe where no move costs more than the {stats.MARGIN:g}% margin. Read "
        "on validation only.",
        "",
    ]
    by_arch: dict[str, list[Transfer]] = {}
    for t in ladder.transfers:
        by_arch.setdefault(t.architecture, []).append(t)
    lines += [_transfer_summary(a, moves) for a, moves in by_arch.items()]
    lines += [
        "",
        "| architecture | arm | parameters (rung below to this) | LR below | LR chosen | moved (steps of x2) "
        "| validation cost of the LR below |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in ladder.transfers:
        cost = "not run" if t.cost is None else f"{t.cost:+.2f}%"
        lines.append(
            f"| {t.architecture} | {t.method} | {t.params_below:,} to {t.params:,} | {t.lr_below:g} | {t.lr:g} | "
            f"{t.moved:+g} | {cost} |"
        )
    return [*lines, ""]


def _render_fits(ladder: Ladder) -> list[str]:
    """The scaling fits: each arm's curve, then each frozen method against its control."""
    if not any(p.d_alpha is not None for p in ladder.pair_fits):
        notes = sorted({p.note for p in ladder.pair_fits})
        return ["## Scaling fits: L(N) = E + A / N^alpha per arm", "", f"No fit: {'; '.join(notes)}.", ""]
    lines = [
        "## Scaling fits: L(N) = E + A / N^alpha per arm",
        "",
        f"Test loss (nats per token) of every seed at the chosen LR; Huber loss (delta {scaling.HUBER_DELTA:g}) "
        "on log L, L-BFGS-B from a grid of starts; 95% intervals from "
        f"{scaling.BOOTSTRAP} paired bootstrap draws over seeds. N = total parameters. A fit needs at least "
        f"{scaling.MIN_RUNGS} rungs.",
        "",
        "| architecture | arm | held fixed | rungs | runs | alpha [95% CI] | E, nats [95% CI] | A | largest miss "
        "of a rung's mean loss, % | largest SE of a rung's mean, % | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in sorted(ladder.arm_fits, key=lambda a: (a.architecture, a.method, a.held)):
        lines.append(
            f"| {a.architecture} | {a.method} | {a.held or 'n/a'} | {a.rungs} | {a.runs} | {fmt_spec(a.alpha)} [{fmt_spec(a.alpha_low)}, "
            f"{fmt_spec(a.alpha_high)}] | {fmt_spec(a.E)} [{fmt_spec(a.E_low)}, {fmt_spec(a.E_high)}] | {fmt_spec(a.A)} | {fmt_spec(a.misfit, '.3g')} | "
            f"{fmt_spec(a.seed_se, '.3g')} | {a.note} |"
        )
    lines += [
        "",
        "Each frozen method against its control. The multiplier: how many times the top rung's parameters "
        "the frozen arm needs to reach the control's fitted loss there (its square is the compute multiplier "
        "at a fixed tokens-per-parameter ratio; 'never': the frozen arm's floor E lies above that loss). "
        f"The gap at {scaling.TARGET_PARAMS / 1e6:g}M parameters and the size where the gap falls to "
        f"{scaling.REACH_GAP:g}% are extrapolations far beyond the rungs, at the ladder's tokens per parameter.",
        "",
        "| architecture | method vs control | held fixed | alpha difference [95% CI] | parameter multiplier at the "
        "top rung [95% CI] | refits that never match | predicted gap at 124M, % [95% CI] | range leaving one rung "
        "out, % | gap reaches 1% at N [95% CI] | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in ladder.pair_fits:
        at = "" if p.at is None else f" ({p.at:,})"
        never = "n/a" if p.never is None else f"{100 * p.never:.1f}%"
        lines.append(
            f"| {p.architecture} | {p.method} vs {p.control} | {p.held or 'n/a'} | {fmt_spec(p.d_alpha, '+.4g')} [{fmt_spec(p.d_alpha_low, '+.4g')}, "
            f"{fmt_spec(p.d_alpha_high, '+.4g')}] | {fmt_spec(p.multiplier)}{at} [{fmt_spec(p.multiplier_low)}, "
            f"{fmt_spec(p.multiplier_high)}] | {never} | {fmt_spec(p.predicted_gap, '+.4g')} [{fmt_spec(p.predicted_low, '+.4g')}, "
            f"{fmt_spec(p.predicted_high, '+.4g')}] | {_span(p.predicted_loo)} | {fmt_spec(p.reach_1pct, '.3g')} [{fmt_spec(p.reach_low, '.3g')}, "
            f"{fmt_spec(p.reach_high, '.3g')}] | {p.note} |"
        )
    return [*lines, ""]


def _span(span: list[float | None] | None, unit: str = "", spec: str = "+.3g") -> str:
    """'a to b' of a [low, high] range ('n/a' without one)."""
    if not span or span[0] is None:
        return "n/a"
    return f"{fmt_spec(span[0], spec)}{unit} to {fmt_spec(span[1], spec)}{unit}"


_DATA_SPEC = f"+.{scaling.EXTRAPOLATED_DIGITS}g"  # the L(N, D) extrapolations' stored precision


def _predicted(fit: scaling.DataFit, budget: int) -> str:
    value, low, high = fit.predicted.get(budget) or [None, None, None]
    return f"{fmt_spec(value, _DATA_SPEC)}% [{fmt_spec(low, _DATA_SPEC)}, {fmt_spec(high, _DATA_SPEC)}]"


def _data_fit_line(fit: scaling.DataFit) -> str:
    """One pair's L(N, D) reading for the answer: the gaps it extrapolates to GPT-2 small's size."""
    head = f"- {fit.architecture}, {fit.method} vs {fit.control}, over size and data together"
    if fit.d_beta is None:
        return f"{head}: no L(N, D) fit ({fit.note})."
    budgets = " and ".join(
        f"{_predicted(fit, b)}{_loo_text(fit.predicted_loo.get(b), _DATA_SPEC)} at {b} tokens per parameter"
        for b in scaling.DATA_BUDGETS
    )
    text = (
        f"{head} (L(N, D) over {fit.cells} cells): extrapolated gap at {fit.target / 1e6:g}M parameters "
        f"{budgets}; the frozen arm's exponent in data minus the control's {fmt_spec(fit.d_beta, '+.3g')} "
        f"[{fmt_spec(fit.d_beta_low, '+.3g')}, {fmt_spec(fit.d_beta_high, '+.3g')}]."
    )
    for caveat in (scaling.FLOORLESS, scaling.MISFIT_CELL):
        if caveat in fit.note:
            text += " " + caveat[0].upper() + caveat[1:] + "."
    return text


def _render_data_fits(ladder: Ladder) -> list[str]:
    """L(N, D) per pair, where the ladder has a data axis."""
    if not ladder.data_fits:
        return []
    lines = [
        "## Scaling fits over size and data: L(N, D) = E + A / N^alpha + B / D^beta per arm",
        "",
        "Every rung and every budget of the tokens-per-parameter axis together, each seed's test loss a "
        "point (D = the run's training tokens), fitted as the L(N) curves are (Huber on log L, L-BFGS-B "
        f"from a grid of starts, {scaling.BOOTSTRAP} paired bootstrap draws over seeds). Along the "
        "ladder D grows with N, so only the sizes trained at several budgets tell the two exponents "
        f"apart. The gaps at {scaling.TARGET_PARAMS / 1e6:g}M parameters are extrapolations far beyond the "
        "cells, at each budget. With three seeds a cell the bootstrap intervals are narrower than the "
        "extrapolation's real uncertainty (on a synthetic surface with known exponents, the true gap at "
        f"{scaling.TARGET_PARAMS / 1e6:g}M falls outside them in some draws): read them as its lower bound. "
        f"They are rounded to {scaling.EXTRAPOLATED_DIGITS} digits: the five parameters trade off along a "
        "flat valley, and the last bits of another CPU's arithmetic move an interval's end by up to about 1%.",
        "",
        "| architecture | method vs control | cells (sizes, budgets) | alpha, method / control | "
        "alpha difference [95% CI] | beta, method / control | beta difference [95% CI] | "
        + " | ".join(
            f"predicted gap at 124M, {b} tokens per parameter, % [95% CI] (range leaving one size out)"
            for b in scaling.DATA_BUDGETS
        )
        + " | largest miss of a cell's mean, % | largest SE of a cell's mean, % | note |",
        "|---|---|---|---|---|---|---|" + "---|" * len(scaling.DATA_BUDGETS) + "---|---|---|",
    ]
    for f in ladder.data_fits:
        lines.append(
            f"| {f.architecture} | {f.method} vs {f.control} | {f.cells} ({f.sizes}, {f.budgets}) | "
            f"{fmt_spec(f.alpha)} / {fmt_spec(f.alpha_control)} | {fmt_spec(f.d_alpha, '+.4g')} [{fmt_spec(f.d_alpha_low, '+.4g')}, "
            f"{fmt_spec(f.d_alpha_high, '+.4g')}] | {fmt_spec(f.beta)} / {fmt_spec(f.beta_control)} | {fmt_spec(f.d_beta, '+.4g')} "
            f"[{fmt_spec(f.d_beta_low, '+.4g')}, {fmt_spec(f.d_beta_high, '+.4g')}] | "
            + " | ".join(
                f"{_predicted(f, b)} ({_span(f.predicted_loo.get(b), spec=_DATA_SPEC)})" for b in scaling.DATA_BUDGETS
            )
            + f" | {fmt_spec(f.misfit, '.3g')} | {fmt_spec(f.seed_se, '.3g')} | {f.note} |"
        )
    return [*lines, ""]


def _save(fig: Any, path: Path) -> Path:
    """Write a finished figure to `path` and release it."""
    import matplotlib.pyplot as plt  # heavy optional dependency: imported on use

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(ladder: Ladder, path: Path) -> Path:
    """ladder.png: gap with its interval against parameters (log), one panel per architecture."""
    import matplotlib  # heavy optional dependency: imported on use

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy optional dependency: imported on use

    archs = sorted({s.architecture for s in ladder.steps})
    fig, axes = plt.subplots(1, len(archs), figsize=(6 * len(archs), 4.2), squeeze=False)
    for ax, arch in zip(axes[0], archs):
        budgets = sorted({s.budget or 0 for s in ladder.steps if s.architecture == arch})
        for method, budget in sorted({(s.method, s.budget or 0) for s in ladder.steps if s.architecture == arch}):
            pts = [
                s
                for s in ladder.steps
                if s.architecture == arch
                and s.method == method
                and (s.budget or 0) == budget
                and s.params
                and s.gap is not None
            ]
            if not pts:
                continue
            label = f"{method}, {budget:g} tokens/parameter" if len(budgets) > 1 else method
            x = [p.params for p in pts]
            y = [p.gap for p in pts]
            err = [
                [p.gap - (p.ci_low if p.ci_low is not None else p.gap) for p in pts],
                [(p.ci_high if p.ci_high is not None else p.gap) - p.gap for p in pts],
            ]
            ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=label)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel("gap to the twin, % (+ = worse)")
        ax.set_title(arch)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return _save(fig, path)


def _held(s: Step) -> str:
    """The budget a step's size line holds fixed, as trends and fits name it."""
    return f"{s.budget:g} tokens per parameter" if s.budget else ""


def plot_fits(ladder: Ladder, path: Path) -> Path:
    """scaling.png: per architecture, loss against parameters with each arm's fitted curve (top) and
    each frozen method's gap to its control with the bootstrap band, extrapolated to 124M (bottom)."""
    import matplotlib  # heavy optional dependency: imported on use

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy optional dependency: imported on use

    archs = sorted({p.architecture for p in ladder.pair_fits if p.curves})
    fig, axes = plt.subplots(2, len(archs), figsize=(6.5 * len(archs), 8.5), squeeze=False)
    for col, arch in enumerate(archs):
        top, bottom = axes[0][col], axes[1][col]
        pairs = [p for p in ladder.pair_fits if p.architecture == arch and p.curves]
        drawn: set[str] = set()
        for p in pairs:
            points = [
                s
                for s in ladder.steps
                if s.architecture == arch and s.method == p.method and s.params and _held(s) == p.held
            ]
            lo, hi = min(s.params for s in points), max(s.params for s in points)
            grid = np.geomspace(lo / 1.5, hi * 1.5, 100)
            for method, fit, key in (
                (p.method, p.curves["fit"][0], "seed_loss"),
                (p.control, p.curves["fit"][1], "twin_seed_loss"),
            ):
                if method in drawn:
                    continue
                drawn.add(method)
                xs = [s.params for s in points for _ in getattr(s, key)]
                ys = [v for s in points for v in getattr(s, key).values()]
                line = top.plot(grid, fit.loss(grid), lw=1.2, label=f"{method}: alpha {fit.alpha:.3f}")[0]
                top.scatter(xs, ys, s=10, color=line.get_color(), alpha=0.7)
            far = np.geomspace(lo, scaling.TARGET_PARAMS, 120)
            boot = np.array([100 * np.expm1(f.loss(far) - c.loss(far)) for f, c in p.curves["boot"]])
            f, c = p.curves["fit"]
            line = bottom.plot(far, 100 * np.expm1(f.loss(far) - c.loss(far)), label=f"{p.method} vs {p.control}")[0]
            bottom.fill_between(far, *np.percentile(boot, [2.5, 97.5], axis=0), color=line.get_color(), alpha=0.15)
            measured = [(s.params, s.gap) for s in points if s.gap is not None]
            bottom.scatter(*zip(*measured), s=14, color=line.get_color())
        top.set(xscale="log", yscale="log", xlabel="parameters", ylabel="test loss, nats per token", title=arch)
        bottom.axhline(0, color="black", lw=0.8)
        bottom.axvspan(
            max(s.params for s in ladder.steps if s.architecture == arch),
            scaling.TARGET_PARAMS,
            color="grey",
            alpha=0.08,
        )
        bottom.set(xscale="log", xlabel="parameters (shaded: extrapolation)", ylabel="gap to the control, % perplexity")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    return _save(fig, path)


def write_ladder(rungs: Sequence[str | Path], out: str | Path) -> tuple[Path, Ladder]:
    """Read each rung (a sweep or records directory); write OUT/ladder.md, ladder.json, ladder.png."""
    if len(rungs) < 1:
        raise UserError("name at least one rung (a sweep or records directory per size)")
    fix = "pass --out with a writable folder (rungs are only read)"
    no_file_in_the_way(out, "ladder folder", fix)
    ladder = build([[r] for r in rungs])
    out_dir = writable_dir(out, "ladder folder", fix)
    command = (
        "oelm report --view ladder " + " ".join(Path(r).as_posix() for r in rungs) + f" --out {out_dir.as_posix()}"
    )
    plot(ladder, out_dir / "ladder.png")
    if any(p.curves for p in ladder.pair_fits):
        plot_fits(ladder, out_dir / "scaling.png")
    stored = asdict(ladder)
    for p in stored["pair_fits"]:
        p.pop("curves")  # the bootstrap refits: the plot's band, not a stored number
    atomic_write_json(out_dir / "ladder.json", page_json("ladder", {"command": command, **stored}))
    atomic_write_text(out_dir / "ladder.md", render(ladder, command))
    return out_dir / "ladder.md", ladder
