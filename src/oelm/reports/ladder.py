"""The scale ladder: each frozen method's gap to its same-init trainable twin as a function of
model size, per architecture, with a fitted trend stated as what it is (an extrapolation).

Each sweep directory is one rung (one architecture at one size, every arm at its own
validation-chosen LR, as `oelm report` chooses it). Within a rung every frozen method is compared
with its twin (`core.methods.twin_of`; the baseline where a method has none, e.g. identity-q,
whose Q projection is gone), paired by seed, Holm over the rung's pairs, in the reports'
vocabulary. Across rungs, per architecture and method, a weighted least-squares line of the gap
against log10(parameters) (weights 1/SE^2 of each rung's mean per-seed gap; statsmodels) gives the
trend's slope with its 95% interval and the gap it predicts at 10x the largest rung, with its
prediction interval: an extrapolation from at most a few points, not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from oelm.core.methods import get_method, twin_of
from oelm.records.load import load_runs
from oelm.reports import stats
from oelm.reports.aggregate import BASELINE, Arm, compare, compare_pairs
from oelm.reports.tables import saving_fraction, verdict_text
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_json, atomic_write_text


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


@dataclass
class Trend:
    """A fitted gap-vs-size line for one architecture and method."""

    architecture: str
    method: str
    rungs: int
    slope: float | None  # % gap per decade of parameters
    slope_low: float | None
    slope_high: float | None
    at: float | None  # parameters of the extrapolation (10x the largest rung)
    predicted: float | None
    predicted_low: float | None
    predicted_high: float | None
    note: str = ""


@dataclass
class Ladder:
    steps: list[Step] = field(default_factory=list)
    trends: list[Trend] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


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


def rung(paths: Sequence[str | Path], warnings: list[str] | None = None) -> list[Step]:
    """The steps of one rung (one sweep): every frozen method against its twin. Its tables' warnings
    (unequal budgets, unstable runs, ...) are added to `warnings`, named by the table."""
    comparison = compare(load_runs(paths), baseline=BASELINE)
    steps: list[Step] = []
    for group in comparison.groups:
        if warnings is not None:
            warnings += [f"{group.title}: {w}" for w in group.warnings]
        arms = {a.method: a for a in group.arms}
        base = arms.get(BASELINE)
        size = _params(base) if base is not None else None
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
                )
            )
    return steps


def fit_trend(points: Sequence[Step], confidence: float = stats.CONFIDENCE) -> Trend:
    """WLS of gap on log10(params) over rungs with an interval; the prediction at 10x the largest."""
    import statsmodels.api as sm  # heavy optional dependency: imported on use

    first = points[0]
    usable = [p for p in points if p.params and p.gap is not None and p.ci_low is not None and p.n >= 2]
    trend = Trend(first.architecture, first.method, len(usable), None, None, None, None, None, None, None)
    if len(usable) < 3:
        trend.note = f"{len(usable)} rung(s) with an interval: a line needs at least 3 to have an interval"
        return trend
    x = np.log10([float(p.params) for p in usable])
    y = np.array([p.gap for p in usable], dtype=float)
    # SE of each rung's mean from its t interval: half-width / t(0.975, n-1).
    from scipy.stats import t  # heavy optional dependency: imported on use

    se = np.array([(p.ci_high - p.ci_low) / 2 / t.ppf(0.5 + confidence / 2, p.n - 1) for p in usable])
    weights = 1.0 / np.maximum(se, 1e-9) ** 2
    design = sm.add_constant(x)
    fit = sm.WLS(y, design, weights=weights).fit()
    low, high = fit.conf_int(alpha=1 - confidence)[1]
    trend.slope, trend.slope_low, trend.slope_high = float(fit.params[1]), float(low), float(high)
    at = 10 * max(float(p.params) for p in usable)
    pred = fit.get_prediction(np.array([[1.0, math.log10(at)]])).summary_frame(alpha=1 - confidence)
    trend.at = at
    trend.predicted = float(pred["mean"].iloc[0])
    trend.predicted_low = float(pred["obs_ci_lower"].iloc[0])
    trend.predicted_high = float(pred["obs_ci_upper"].iloc[0])
    trend.note = "extrapolation: a line through the rungs, not a measurement at that size"
    return trend


def build(rungs: Sequence[Sequence[str | Path]]) -> Ladder:
    """The ladder of several rungs (each a list of paths: one sweep or its records)."""
    ladder = Ladder()
    for paths in rungs:
        ladder.steps += rung(paths, ladder.warnings)
    if not ladder.steps:
        raise UserError("no frozen method with a twin in the given sweeps; a ladder rung needs both arms")
    by_series: dict[tuple[str, str], list[Step]] = {}
    for step in ladder.steps:
        by_series.setdefault((step.architecture, step.method), []).append(step)
    for (arch, method), points in sorted(by_series.items()):
        sizes = [p.params for p in points]
        if len(set(sizes)) != len(sizes):
            ladder.warnings.append(f"{arch} {method}: two rungs of one size; each rung should be one size")
        ladder.trends.append(fit_trend(sorted(points, key=lambda p: p.params or 0)))
    ladder.steps.sort(key=lambda s: (s.architecture, s.method, s.params or 0))
    return ladder


def _f(v: float | None, spec: str = "+.2f") -> str:
    return "n/a" if v is None else format(v, spec)


def render(ladder: Ladder, command: str, figure: str = "ladder.png") -> str:
    """ladder.md."""
    lines = [
        "# Scale ladder: the gap to the same-init twin against model size",
        "",
        f"Generated by `{command}` from stored run records; do not edit by hand.",
        "",
        "| architecture | parameters | method | twin | LR | seeds | gap % [95% CI] (+ = worse) | verdict | unstable runs "
        "| training-FLOP saving |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in ladder.steps:
        params = "n/a" if s.params is None else f"{s.params:,}"
        lines.append(
            f"| {s.architecture} | {params} | {s.method} | {s.twin} | {_f(s.lr, 'g')} | {s.n} | "
            f"{_f(s.gap)} [{_f(s.ci_low)}, {_f(s.ci_high)}] | {s.verdict} | {s.unstable} | "
            f"{'n/a' if s.saving is None else format(100 * s.saving, '.2f') + '%'} |"
        )
    lines += [
        "",
        "## Trend (weighted least squares of the gap on log10 parameters)",
        "",
        "| architecture | method | rungs | slope, % per decade [95% CI] | at 10x the largest | predicted gap [95% prediction interval] | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in ladder.trends:
        at = "n/a" if t.at is None else f"{t.at:,.0f}"
        lines.append(
            f"| {t.architecture} | {t.method} | {t.rungs} | {_f(t.slope)} [{_f(t.slope_low)}, {_f(t.slope_high)}] | "
            f"{at} | {_f(t.predicted)} [{_f(t.predicted_low)}, {_f(t.predicted_high)}] | {t.note} |"
        )
    lines += ["", f"![gap to the twin against parameters]({figure})", ""]
    if ladder.warnings:
        lines += ["Warnings:", "", *(f"- {w}" for w in ladder.warnings), ""]
    return "\n".join(lines)


def plot(ladder: Ladder, path: Path) -> Path:
    """ladder.png: gap with its interval against parameters (log), one panel per architecture."""
    import matplotlib  # heavy optional dependency: imported on use

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy optional dependency: imported on use

    archs = sorted({s.architecture for s in ladder.steps})
    fig, axes = plt.subplots(1, len(archs), figsize=(6 * len(archs), 4.2), squeeze=False)
    for ax, arch in zip(axes[0], archs):
        for method in sorted({s.method for s in ladder.steps if s.architecture == arch}):
            pts = [
                s
                for s in ladder.steps
                if s.architecture == arch and s.method == method and s.params and s.gap is not None
            ]
            if not pts:
                continue
            x = [p.params for p in pts]
            y = [p.gap for p in pts]
            err = [
                [p.gap - (p.ci_low if p.ci_low is not None else p.gap) for p in pts],
                [(p.ci_high if p.ci_high is not None else p.gap) - p.gap for p in pts],
            ]
            ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=method)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel("gap to the twin, % (+ = worse)")
        ax.set_title(arch)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_ladder(rungs: Sequence[str | Path], out: str | Path) -> tuple[Path, Ladder]:
    """Read each rung (a sweep or records directory); write OUT/ladder.md, ladder.json, ladder.png."""
    if len(rungs) < 1:
        raise UserError("name at least one rung (a sweep or records directory per size)")
    ladder = build([[r] for r in rungs])
    out_dir = Path(out)
    command = "oelm ladder " + " ".join(Path(r).as_posix() for r in rungs) + f" --out {out_dir.as_posix()}"
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(ladder, out_dir / "ladder.png")
    atomic_write_json(out_dir / "ladder.json", {"command": command, **asdict(ladder)})
    atomic_write_text(out_dir / "ladder.md", render(ladder, command))
    return out_dir / "ladder.md", ladder
