"""PNG figures of a comparison: validation curves per method and gaps with intervals."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from oelm.records.run import RunRecord  # noqa: E402
from oelm.reports.aggregate import Group, curve_key, mean_curve  # noqa: E402


def plot_curves(group: Group, path: Path) -> Path | None:
    """Validation curve per method at its chosen LR: mean over seeds, band = min..max."""
    key, label = curve_key(group)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn = False
    for arm in group.arms:
        steps, mean, lo, hi = mean_curve(arm, key)
        if steps.size == 0:
            continue
        line = ax.plot(steps, mean, marker="o", ms=3, label=f"{arm.method} (lr {arm.lr:g}, n={len(arm.runs)})")
        ax.fill_between(steps, lo, hi, color=line[0].get_color(), alpha=0.2, linewidth=0)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.set_title(f"{group.title}\nmean over seeds, band = min..max", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gaps(group: Group, path: Path) -> Path | None:
    """Bar per method: the mean per-seed gap to the baseline in % (+ = worse) with its paired 95% interval."""
    others = ((a.method, group.versus_of(a.method)) for a in group.arms if a.method != group.baseline)
    arms = [(method, vs) for method, vs in others if vs.reported_gap is not None]
    if not arms:
        return None
    fig, ax = plt.subplots(figsize=(max(3.5, 1.4 * len(arms) + 1.5), 3.8))
    heights, errs = [], [[], []]
    for _, vs in arms:
        paired, gap = vs.gap_paired, vs.reported_gap
        heights.append(gap)
        has_ci = paired is not None and paired.ci_low is not None
        # The bar is the mean per-seed gap, the whisker its paired-by-seed interval (the tables' numbers).
        errs[0].append(max(0.0, gap - paired.ci_low) if has_ci else 0.0)
        errs[1].append(max(0.0, paired.ci_high - gap) if has_ci else 0.0)
    x = np.arange(len(arms))
    colors = ["tab:red" if h > 0 else "tab:green" for h in heights]
    ax.bar(x, heights, yerr=errs, capsize=4, color=colors, alpha=0.8)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, [method for method, _ in arms], rotation=15)
    ax.set_ylabel(f"mean per-seed gap vs {group.baseline}, % (+ = worse)")
    ax.set_title(f"{group.title}: {group.primary_metric}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_lr_sensitivity(group: Group, path: Path) -> Path | None:
    """Validation selection metric against learning rate per arm: every seed a point (unstable runs
    as crosses, non-finite ones on the top edge), the mean a line, the chosen LR ringed."""
    arms = [a for a in group.arms if len(a.cells) > 1 or any(c.runs for c in a.cells)]
    points = [(a, c, r) for a in arms for c in a.cells for r in [*c.runs, *c.excluded] if not np.isnan(c.lr)]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    finite = [v for _, _, r in points if (v := _selection(r)) is not None]
    top = max(finite) if finite else 1.0
    for arm in arms:
        flagged = {id(r) for c in arm.cells for r, _ in c.unstable}
        color = ax.plot([], [])[0].get_color()
        xs, ys, marks = [], [], []
        for cell in arm.cells:
            for run in [*cell.runs, *cell.excluded]:
                value = _selection(run)
                xs.append(cell.lr)
                ys.append(top if value is None else value)
                marks.append(id(run) in flagged or value is None)
        for crossed in (False, True):
            pick = [i for i, m in enumerate(marks) if m == crossed]
            ax.scatter([xs[i] for i in pick], [ys[i] for i in pick], color=color, marker="x" if crossed else "o", s=18)
        means = [(c.lr, c.selection.mean) for c in arm.cells if c.selection.mean is not None]
        label = f"{arm.method} (chosen lr {arm.lr:g})" if arm.lr is not None else arm.method
        ax.plot([x for x, _ in means], [y for _, y in means], color=color, label=label, linewidth=1)
        chosen = arm.chosen_cell
        if chosen is not None and chosen.selection.mean is not None:
            ax.scatter([chosen.lr], [chosen.selection.mean], s=120, facecolors="none", edgecolors=color)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(f"{group.selection_metric} (validation)")
    ax.set_title(f"{group.title}\nevery seed a point; x = unstable run; ring = chosen ({group.lr_rule})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _selection(run: RunRecord) -> float | None:
    """A run's finite validation selection value, else None."""
    value = run.results.get(str(run.results.get("selection_metric")))
    if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
        return float(value)
    return None
