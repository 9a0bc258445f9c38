"""The probe section of `oelm report`: per probe and method (at the LR chosen on validation),
held-out answer accuracy, the steps each seed needed to reach the target validation accuracy, and
what the best checkpoints' attention does (induction and previous-token scores, MQAR accuracy by
query order, as each run recorded them in results.json: training/probe.py), read from the records
alone, never from weights. `oelm report` adds it to report.md whenever its runs hold probe tables
(the data switch it on), from the same comparison as the rest of the page. A column the runs did
not record (older runs, records rebuilt from a stored table) is left out, never shown as a
measurement. How to read it: docs/reading.md#probes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from oelm.records.load import load_runs
from oelm.reports.aggregate import Arm, Comparison, Group, compare
from oelm.reports.plots import plt
from oelm.reports.reading import how_to_read
from oelm.reports.tables import fmt_fixed, fmt_lr, fmt_mean_pm, md_table

CURVE_STEPS = (100, 200, 400, 800)  # validation accuracy shown at these steps when logged
EMPTY = "-"  # the summary's empty cell


def _ci(arm: Arm) -> str:
    """Test answer accuracy: 'mean ± half-width (n seeds)'."""
    return fmt_mean_pm(arm.primary, 3, n=True, missing=EMPTY)


def _mean(values: Sequence[float], digits: int = 2) -> str:
    """The mean of some values at `digits` decimals, or the empty cell."""
    return fmt_fixed(statistics.fmean(values), digits) if values else EMPTY


def _steps(arm: Arm) -> tuple[str, str]:
    """(seeds reaching the target, per-seed steps with the median of those that did); empty cells
    where the runs did not record steps_to_target (a missing record is not 'never')."""
    runs = sorted(arm.runs, key=lambda r: r.seed or 0)
    if not any("steps_to_target" in r.results for r in runs):
        return EMPTY, EMPTY
    steps = [r.results.get("steps_to_target") for r in runs]
    hit = [s for s in steps if s is not None]
    per_seed = ", ".join("never" if s is None else str(s) for s in steps)
    median = f" (median {statistics.median(hit):g})" if hit else ""
    return f"{len(hit)}/{len(steps)}", per_seed + median


def _curve(arm: Arm, step: int) -> str:
    """Mean validation accuracy over seeds at a step (periodic evals), or '-'."""
    vals = [dict(r.eval_curve("accuracy")).get(step) for r in arm.runs]
    return _mean([v for v in vals if v is not None])


def _head_cells(arm: Arm) -> list[str]:
    """Best head's induction and previous-token scores: mean over seeds (per seed)."""
    runs = sorted(arm.runs, key=lambda r: r.seed or 0)
    scores = [s for s in (r.results.get("head_scores") for r in runs) if s]
    if not scores:
        return [EMPTY, EMPTY]
    cells = []
    for key in ("induction", "previous_token"):
        best = [max(max(layer) for layer in s[key]) for s in scores]
        cells.append(f"{_mean(best)} ({', '.join(fmt_fixed(b, 2) for b in best)})")
    return cells


def _query_cell(arm: Arm) -> str:
    """First- and last-query test accuracy, mean over seeds."""
    ranks = [q for q in (r.results.get("accuracy_by_query") for r in arm.runs) if q]
    if not ranks:
        return EMPTY
    return f"{_mean([q[0] for q in ranks])} / {_mean([q[-1] for q in ranks])}"


def group_table(group: Group) -> list[str]:
    """Markdown table of one probe."""
    runs = [r for arm in group.arms for r in arm.runs]
    target = runs[0].results.get("target_accuracy", 0.9) if runs else 0.9
    chance = runs[0].results.get("chance_accuracy") if runs else None
    steps = [s for s in CURVE_STEPS if any(dict(r.eval_curve("accuracy")).get(s) is not None for r in runs)]
    head = [
        "method",
        "lr (val)",
        "test answer acc ± 95% CI (n)",
        "test sequence acc",
        f"seeds reaching {target:.0%} val",
        f"steps to {target:.0%} val per seed",
    ]
    head += [f"val acc @{s}" for s in steps]
    induction = group.dataset.startswith("induction")
    if induction:
        head += ["induction score (best head)", "previous-token score (best head)"]
    mqar = group.dataset.startswith("mqar")
    if mqar:
        head += ["test acc, first / last query (recall / elimination possible)"]
    rows = []
    for arm in group.arms:
        seqs = [r.results.get("test_sequence_accuracy") for r in arm.runs]
        seqs = [s for s in seqs if s is not None]
        hits, per_seed = _steps(arm)
        row = [
            arm.method,
            fmt_lr(arm.lr, EMPTY),
            _ci(arm),
            _mean(seqs, 3),
            hits,
            per_seed,
        ]
        row += [_curve(arm, s) for s in steps]
        if induction:
            row += _head_cells(arm)
        if mqar:
            row.append(_query_cell(arm))
        rows.append(row)
    # A column no run recorded (records rebuilt from a stored table) is left out, not shown empty.
    keep = [i for i in range(len(head)) if i < 3 or any(r[i] != EMPTY for r in rows)]
    head, rows = [head[i] for i in keep], [[r[i] for i in keep] for r in rows]
    chance_text = "" if chance is None else f"; chance {fmt_fixed(chance, 3)}"
    return [f"### {group.dataset} ({group.model}{chance_text})", "", *md_table(head, rows)]


def _difficulty(group: Group) -> dict | None:
    """The probe options of a group's runs (one dataset name = one set of options), or None."""
    for arm in group.arms:
        for run in arm.runs:
            opts = run.results.get("probe_options")
            if opts:
                return opts
    return None


def scaling_table(groups: Sequence[Group], kind: str = "mqar") -> list[str]:
    """Test answer accuracy of every method across the difficulties of one probe kind.

    One column per difficulty (sorted by sequence length, then pairs), one row per method at its
    LR chosen on validation in that difficulty; empty when fewer than two difficulties were run.
    """
    cols = [(g, o) for g in groups if (o := _difficulty(g)) and o.get("kind") == kind]
    if len(cols) < 2:
        return []
    cols.sort(key=lambda c: (c[1]["seq_len"], c[1].get("n_pairs", 0)))
    methods = list(dict.fromkeys(a.method for g, _ in cols for a in g.arms))
    head = ["method"] + [f"{o.get('n_pairs')} pairs, length {o['seq_len']}" for _, o in cols]
    lines = [
        f"### {kind}: test answer accuracy by difficulty (mean ± 95% CI (n seeds); seeds reaching "
        "the target on validation)",
        "",
        "Solving is all-or-nothing per seed here, so a 3-seed t interval can span [0, 1]; the seed count says more.",
        "",
    ]
    rows = []
    for m in methods:
        cells = [m]
        for g, _ in cols:
            arm = next((a for a in g.arms if a.method == m), None)
            cells.append(f"{_ci(arm)}; {_steps(arm)[0]} solved" if arm else EMPTY)
        rows.append(cells)
    return lines + md_table(head, rows)


def scaling_plot(groups: Sequence[Group], out: Path, kind: str = "mqar") -> Path | None:
    """Accuracy against pairs (at each length) and against length (at each pair count), per method.

    Two panels; a line needs at least two difficulties along its axis. None when nothing to plot.
    """

    pts: dict[str, list[tuple[int, int, float, list[float]]]] = {}
    for g in groups:
        o = _difficulty(g)
        if not o or o.get("kind") != kind:
            continue
        for a in g.arms:
            if a.primary.mean is not None:
                seeds = [a.by_seed[k] for k in sorted(a.by_seed)]
                pts.setdefault(a.method, []).append((o["seq_len"], o["n_pairs"], a.primary.mean, seeds))
    if len({(t, p) for v in pts.values() for t, p, _, _ in v}) < 2:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    n_methods = max(len(pts), 1)
    for ax, (axis, fixed, label) in zip(axes, ((1, 0, "key-value pairs"), (0, 1, "sequence length"))):
        for i, (m, v) in enumerate(pts.items()):
            # Methods side by side around each x (log axis: a multiplicative offset) so seeds stay visible.
            shift = 2 ** (0.06 * (i - (n_methods - 1) / 2))
            for f in sorted({p[fixed] for p in v}):
                line = sorted((p[axis], p[2], p[3]) for p in v if p[fixed] == f)
                if len(line) < 2:
                    continue
                xs, ys, seeds = zip(*line)
                (ln,) = ax.plot(
                    [x * shift for x in xs], ys, marker="o", label=f"{m} ({'length' if fixed == 0 else 'pairs'} {f})"
                )
                sx = [x * shift for x, ss in zip(xs, seeds) for _ in ss]
                ax.scatter(sx, [s for ss in seeds for s in ss], s=12, alpha=0.45, color=ln.get_color())
        ax.set_xscale("log", base=2)
        ticks = sorted({p[axis] for v in pts.values() for p in v})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_ylim(-0.02, 1.05)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("test answer accuracy")
    fig.suptitle(f"{kind}: accuracy by difficulty (line: mean over seeds; dots: each seed)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def probe_section(comparison: Comparison, plot: Path | None = None) -> list[str]:
    """The probe section of a report (empty when its comparison holds no probe table); the MQAR
    accuracy-by-difficulty plot is written to `plot` when there are difficulties to plot."""
    probe_groups = [g for g in comparison.groups if g.task == "probe"]
    if not probe_groups:
        return []
    out = ["## Probes: answer accuracy and steps to target", "", how_to_read("probes"), ""]
    for group in probe_groups:
        out += group_table(group) + [""]
    table = scaling_table(probe_groups)
    if table:
        out += table + [""]
        if plot is not None and scaling_plot(probe_groups, plot):
            out += [f"![accuracy by difficulty]({plot.name})", ""]
    return out


def probe_report(paths: Sequence[str | Path], plot: Path | None = None) -> str:
    """The probe section of the runs under `paths`, as Markdown (what `oelm report` adds)."""
    comparison = compare(load_runs(paths))
    out = probe_section(comparison, plot)
    if comparison.incomplete:
        out.append(f"{len(comparison.incomplete)} run(s) incomplete and not shown.")
    return "\n".join(out).rstrip() + "\n"
