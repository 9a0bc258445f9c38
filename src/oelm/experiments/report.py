"""`oelm report`: read stored run records only and write report.md, report.json and PNGs."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from dataclasses import asdict
from typing import Any

from oelm.experiments import plots
from oelm.experiments.aggregate import BASELINE, Arm, Comparison, Group, compare, crossing
from oelm.experiments.records import RunRecord, load_runs
from oelm.experiments.stats import Summary
from oelm.experiments.study import StudyNumbers
from oelm.io import atomic_write_text

NA = "n/a"


def _pct_scale(group: Group) -> float:
    """Accuracy stored as a fraction is shown in percent; other metrics as stored."""
    if not group.higher_is_better:
        return 1.0
    values = [v for a in group.arms for v in a.by_seed.values()]
    return 100.0 if values and max(values) <= 1.0 else 1.0


def fmt_num(x: float | None, digits: int = 4) -> str:
    """A number with `digits` significant figures (at least 2 decimals above 1), or n/a."""
    if x is None or not math.isfinite(x):
        return NA
    if abs(x) >= 1:
        return f"{x:.{max(2, digits - len(str(int(abs(x)))))}f}"
    return f"{x:.{digits}g}"


def fmt_summary(s: Summary, scale: float = 1.0) -> str:
    """'mean ± half-width (n=k)'; the interval is shown as undefined when n < 2."""
    if s.n == 0 or s.mean is None:
        return NA
    if s.half_width is None:
        return f"{fmt_num(s.mean * scale)} ± n/a (n={s.n})"
    return f"{fmt_num(s.mean * scale)} ± {fmt_num(s.half_width * scale, 2)} (n={s.n})"


def fmt_gap(arm: Arm, group: Group) -> str:
    """Gap of the means in %, with the paired-by-seed 95% interval when there is one."""
    if arm.method == group.baseline:
        return "0 (reference)"
    if arm.gap is None:
        return NA
    text = f"{arm.gap:+.2f}%"
    paired = arm.gap_paired
    if paired is not None and paired.ci_low is not None:
        text += f" [{paired.ci_low:+.2f}, {paired.ci_high:+.2f}]"
    return text


def fmt_p(arm: Arm, group: Group) -> str:
    """Paired t-test p-value (Wilcoxon too when there are enough seeds)."""
    if arm.method == group.baseline:
        return "—"
    test = arm.test
    if test is None:
        paired = arm.gap_paired.n if arm.gap_paired else 0
        return f"n/a ({paired} paired seeds; needs >= 3)"
    p = NA if test.p_value is None else f"{test.p_value:.3g}"
    text = f"{p} (t, n={test.n})"
    if test.wilcoxon_p is not None:
        text += f"; Wilcoxon {test.wilcoxon_p:.3g}"
    return text


SWEEP_EXTEND = "oelm sweep SPEC.yaml --seeds {seeds}"  # how a report's reader adds seeds


def seeds_arg(n: int) -> str:
    """Seeds 0..n-1 as `--seeds` arguments (a `seq` call when the list is long)."""
    return " ".join(str(i) for i in range(n)) if n <= 8 else f"$(seq 0 {n - 1})"


def _significant(arm: Arm) -> bool:
    """Whether the paired t-test rejects equal means at the power analysis' alpha."""
    test, pw = arm.test, arm.power
    return bool(test and test.p_value is not None and pw and test.p_value < pw.alpha)


def fmt_mde(arm: Arm, group: Group) -> str:
    """Minimum detectable gap at this number of seeds, flagged when the observed gap is below it."""
    if arm.method == group.baseline:
        return "—"
    pw = arm.power
    if pw is None or pw.mde is None:
        return f"n/a ({pw.n if pw else 0} paired seeds)"
    text = f"±{pw.mde:.2f}% (n={pw.n})"
    if pw.underpowered and not _significant(arm):
        text += " **underpowered**"
    return text


def power_text(arm: Arm, group: Group, extend: str = SWEEP_EXTEND) -> str:
    """One sentence on what this comparison can resolve; never reads 'not significant' as 'equal'."""
    pw = arm.power
    if arm.method == group.baseline or pw is None:
        return ""
    if pw.mde is None or pw.sd_diff is None:
        return (f"{arm.method}: {pw.n} paired seed(s), too few for a power estimate (>= 2) or a "
                "test (>= 3): the gap is unmeasured, not zero.")
    if pw.sd_diff == 0:
        return (f"{arm.method}: the per-seed gaps are identical ({pw.observed:+.2f}%) over {pw.n} "
                "seeds, so the t-test is undefined; add seeds before reading it.")
    text = (f"{arm.method}: with {pw.n} seeds (paired SD of the gap {pw.sd_diff:.2f}%), the paired "
            f"t-test (two-sided, alpha {pw.alpha:g}, power {pw.power:g}) detects gaps of "
            f"±{pw.mde:.2f}% or more; observed {pw.observed:+.2f}%")
    p = arm.test.p_value if arm.test else None
    p_text = "no p-value" if p is None else f"p = {p:.3g}"
    if _significant(arm):
        return text + f", significant ({p_text})."
    if pw.underpowered:
        text += (f" ({p_text}). **Underpowered: this cannot distinguish a gap below {pw.mde:.2f}%**;"
                 " a non-significant result here is not evidence of no difference.")
    else:
        text += f", not significant ({p_text}); that is not evidence of no difference."
    if pw.seeds_for_observed and pw.seeds_for_observed > pw.n:
        cmd = extend.format(seeds=seeds_arg(pw.seeds_for_observed))
        text += (f" Detecting a gap of {abs(pw.observed):.2f}% with power {pw.power:g} needs about "
                 f"{pw.seeds_for_observed} seeds (`{cmd}` reuses the finished runs).")
    return text


def fmt_saving(value: Any) -> str:
    """Theoretical saving as recorded: a fraction is shown as a percentage."""
    if value is None:
        return NA
    if isinstance(value, (int, float)):
        return f"{value * 100:.1f}%" if abs(value) <= 1 else f"{value:.1f}%"
    if isinstance(value, dict):
        for key in ("training_flops_saving", "saving", "fraction", "train"):
            if isinstance(value.get(key), (int, float)):
                return fmt_saving(value[key])
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def saving_fraction(value: Any) -> float | None:
    """A recorded theoretical saving as a fraction (a number > 1 is read as a percentage)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) / 100 if abs(value) > 1 else float(value)
    if isinstance(value, dict):
        for key in ("training_flops_saving", "saving", "fraction", "train"):
            if key in value:
                return saving_fraction(value[key])
    return None


def fmt_int(x: Any) -> str:
    """An integer with thousands separators, or n/a."""
    return f"{int(x):,}" if isinstance(x, (int, float)) and not isinstance(x, bool) else NA


def _ms(s: Summary) -> str:
    """Mean step time in milliseconds."""
    return NA if s.mean is None else f"{s.mean * 1000:.1f}"


def _study_cell(arm: Arm) -> str:
    """The study's reported number for this arm, with its experiment id."""
    if not arm.study:
        return NA
    return f"{arm.study['value']} {arm.study.get('unit', '')} ({arm.study['id']})".replace("  ", " ")


def _main_table(group: Group, scale: float) -> list[str]:
    """Markdown rows of a dataset's main table."""
    unit = " (%)" if scale == 100.0 else ""
    sel_dir = "higher" if group.higher_is_better else "lower"  # one direction per task
    head = [
        "method",
        f"setting chosen on val (best mean {group.selection_metric}, {sel_dir} is better)",
        f"{group.primary_metric}{unit}: mean ± 95% CI (n seeds)",
        f"gap vs {group.baseline or BASELINE}, % of baseline (+ = worse) [paired 95% CI]",
    ]
    if group.higher_is_better:
        head.append(f"Δ {group.primary_metric} (points{unit}, + = better)")
    head += [
        "p (paired by seed)",
        "min. detectable gap (paired t, α=0.05, power 0.8)",
        "step time (ms)",
        "tokens/s",
        "step-time ratio vs baseline (measured)",
        "theoretical saving",
        "trainable / frozen params",
        "study (reported)",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in group.arms:
        cells = [
            arm.method,
            NA if arm.setting is None else arm.setting,
            fmt_summary(arm.primary, scale),
            fmt_gap(arm, group),
        ]
        if group.higher_is_better:
            cells.append(NA if arm.delta is None else f"{arm.delta * scale:+.2f}")
        cells += [
            fmt_p(arm, group),
            fmt_mde(arm, group),
            _ms(arm.step_time),
            NA if arm.tokens_per_second.mean is None else f"{arm.tokens_per_second.mean:,.0f}",
            NA if arm.step_time_ratio is None else f"{arm.step_time_ratio:.3f}",
            fmt_saving(arm.theoretical_saving),
            f"{fmt_int(arm.trainable_params)} / {fmt_int(arm.frozen_params)}",
            _study_cell(arm),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _lr_table(group: Group) -> list[str]:
    """Markdown rows of the learning-rate sweep on validation (the selection evidence)."""
    rows = [
        f"| method | setting | {group.selection_metric} (val): mean ± 95% CI (n) | excluded runs | chosen |",
        "|---|---|---|---|---|",
    ]
    for arm in group.arms:
        for cell in arm.cells:
            excluded = ", ".join(f"seed {r.seed}: {r.status}" for r in cell.excluded) or "—"
            chosen = "**yes**" if cell.setting == arm.setting else ""
            rows.append(
                f"| {arm.method} | {cell.setting} | {fmt_summary(cell.selection)} | {excluded} | {chosen} |"
            )
    return rows


def _slug(text: str) -> str:
    """File-name-safe version of a table title."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80] or "table"


def _group_section(group: Group, out: Path, index: int, extend: str = SWEEP_EXTEND) -> list[str]:
    """Markdown of one dataset table with its LR sweep, warnings and figures."""
    scale = _pct_scale(group)
    lines = [f"## {group.title}", ""]
    lines.append(
        f"Primary metric `{group.primary_metric}` (held-out split where the data has one). "
        f"Each method's LR is the one whose mean `{group.selection_metric}` over seeds is best "
        "on validation; the primary metric is then reported for that LR only."
    )
    lines.append("")
    lines += [f"> **Warning:** {w}" for w in group.warnings]
    lines += [
        f"> **Held-out information** (not used for any choice): `{r.path.as_posix()}` "
        f"({r.method} {r.setting} seed {r.seed}): {note}"
        for r, note in group.heldout_notes
    ]
    lines += ["", *_main_table(group, scale), ""]
    from oelm.experiments.reading import noise_text  # reading builds on this module

    if noise := noise_text(group):
        lines += [noise, ""]
    power = [t for a in group.arms if (t := power_text(a, group, extend))]
    if power:
        lines += ["### Power", "", *[f"- {t}" for t in power], ""]
    lines += ["### Learning-rate sweep (validation)", ""]
    lines += _lr_table(group)
    slug = f"{index:02d}-{_slug(group.title)}"
    curves = plots.plot_curves(group, out / f"curves-{slug}.png")
    gaps = plots.plot_gaps(group, out / f"gaps-{slug}.png")
    lines.append("")
    if curves:
        lines.append(f"![validation curves]({curves.name})")
    if gaps:
        lines.append(f"![gaps vs baseline]({gaps.name})")
    return lines


def _runs_list(title: str, runs: Sequence[RunRecord], note: str) -> list[str]:
    """A section listing runs that are not averaged."""
    if not runs:
        return []
    lines = [f"## {title}", "", note, ""]
    for run in runs:
        lines.append(
            f"- `{run.path.as_posix()}`: {run.method} lr={run.lr} seed={run.seed}: {run.reason}"
        )
    return lines + [""]


READING_NOTES = [
    "How to read: mean ± half-width of the two-sided 95% Student-t interval over seeds "
    "(n/a when n = 1). Gaps are relative to the baseline's mean, in % of the baseline, "
    "signed so that + means worse (perplexity: (m/b - 1)·100; accuracy: (b - m)/b·100); "
    "the bracket is the 95% interval of the per-seed gaps, paired by seed. p-values come from "
    "a paired t-test over seeds both arms share (>= 3 seeds; Wilcoxon signed-rank too at >= 6). "
    "The minimum detectable gap is the smallest |mean paired gap| that this paired t-test "
    "(two-sided, alpha 0.05) finds with probability 0.8 at this number of seeds, from the "
    "observed SD of the per-seed gaps (noncentral t); an observed gap below it is flagged "
    "underpowered: not significant then means 'cannot tell', never 'no difference'. "
    "The step-time ratio is measured (method / baseline mean step time); the theoretical "
    "saving is what the run recorded (n/a when it did not). 'study (reported)' is the original "
    "study's own number at its own scale, copied from configs/study/study_numbers.yaml; it is "
    "not computed here.",
]


def render(comparison: Comparison, out: Path, sources: Sequence[str], extend: str = SWEEP_EXTEND) -> str:
    """The full markdown report; writes the figures into `out`."""
    lines = ["# OELM comparison report", ""]
    lines.append(
        f"Generated by `oelm report` from {comparison.n_runs} stored run directories under "
        + ", ".join(f"`{s}`" for s in sources)
        + ". Every number is computed from their results.json / metrics.jsonl."
    )
    lines += ["", *READING_NOTES, ""]
    for i, group in enumerate(comparison.groups):
        lines += _group_section(group, out, i, extend) + [""]
    lines += _runs_list(
        "Excluded runs (failed freeze check, diverged or collapsed on validation)",
        comparison.excluded,
        "These runs finished but are **not** in any mean above.",
    )
    lines += _runs_list(
        "Incomplete runs",
        comparison.incomplete,
        "No results.json with status complete: listed, never averaged.",
    )
    return "\n".join(lines).rstrip() + "\n"


def _arm_json(arm: Arm) -> dict[str, Any]:
    """Numbers of one arm for report.json."""
    return {
        "method": arm.method,
        "lr": arm.lr,
        "setting": arm.setting,
        "primary": arm.primary.to_dict(),
        "by_seed": {str(k): v for k, v in sorted(arm.by_seed.items())},
        "gap_percent": arm.gap,
        "gap_paired": arm.gap_paired.to_dict() if arm.gap_paired else None,
        "delta": arm.delta,
        "paired_test": arm.test.to_dict() if arm.test else None,
        "power": arm.power.to_dict() if arm.power else None,
        "mean_step_time": arm.step_time.mean,
        "tokens_per_second": arm.tokens_per_second.mean,
        "step_time_ratio": arm.step_time_ratio,
        "theoretical_saving": arm.theoretical_saving,
        "trainable_params": arm.trainable_params,
        "frozen_params": arm.frozen_params,
        "study": arm.study,
        "noise": None if arm.noise is None else {**asdict(arm.noise), "ratio": arm.noise.ratio},
        "paired_noise": None if arm.paired_noise is None else {**asdict(arm.paired_noise),
                                                               "ratio": arm.paired_noise.ratio},
        "lr_sweep": [
            {"setting": c.setting, "lr": c.lr, "selection": c.selection.to_dict(), "runs": [str(r.path) for r in c.runs],
             "excluded": [str(r.path) for r in c.excluded]}
            for c in arm.cells
        ],
    }


def _reading(group: Group) -> str:
    """The plain-language paragraph of a table (also in report.json)."""
    from oelm.experiments.reading import reading

    return reading(group)


def _crossings_json(group: Group) -> dict[str, Any]:
    """Per method: where its mean validation curve last crossed the baseline's (if it did)."""
    base = next((a for a in group.arms if a.method == group.baseline), None)
    if base is None:
        return {}
    return {a.method: asdict(c) for a in group.arms if a is not base and (c := crossing(a, base, group))}


def to_json(comparison: Comparison) -> dict[str, Any]:
    """Machine-readable form of the report (the same numbers as the markdown)."""
    return {
        "groups": [
            {
                "task": g.task, "dataset": g.dataset, "model": g.model,
                "primary_metric": g.primary_metric, "selection_metric": g.selection_metric,
                "baseline": g.baseline, "warnings": g.warnings,
                "heldout_notes": [{"path": str(r.path), "note": n} for r, n in g.heldout_notes],
                "reading": _reading(g),
                "arms": [_arm_json(a) for a in g.arms],
                "crossings": _crossings_json(g),
            }
            for g in comparison.groups
        ],
        "excluded": [{"path": str(r.path), "reason": r.reason} for r in comparison.excluded],
        "incomplete": [{"path": str(r.path), "reason": r.reason} for r in comparison.incomplete],
    }


_write_atomic = atomic_write_text  # a crash never leaves half a report


def write_report(
    paths: Sequence[str | Path],
    out: str | Path | None = None,
    baseline: str = BASELINE,
    study_numbers: str | Path | None = None,
    extend: str = SWEEP_EXTEND,
    epilogue: Callable[[Comparison], list[str]] | None = None,
) -> tuple[Path, Comparison]:
    """Load run records under `paths`, write OUT/report.md + report.json + PNGs; return both.

    `extend` is the command that adds seeds (quoted by the power section); `epilogue` returns
    lines appended at the very end of report.md (computed from the same comparison; default: the
    plain-language reading of every table).
    """
    if epilogue is None:
        from oelm.experiments.reading import reading_lines  # reading builds on this module

        epilogue = reading_lines
    study = StudyNumbers.load(study_numbers) if study_numbers else None
    runs = load_runs(paths)
    out_dir = Path(out) if out else Path(paths[0]) / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    comparison = compare(runs, baseline=baseline, study=study)
    text = render(comparison, out_dir, [str(p) for p in paths], extend)
    if epilogue is not None:
        text = text.rstrip() + "\n\n" + "\n".join(epilogue(comparison)).rstrip() + "\n"
    _write_atomic(out_dir / "report.md", text)
    _write_atomic(out_dir / "report.json", json.dumps(to_json(comparison), indent=2, default=str))
    return out_dir / "report.md", comparison


def print_summary(comparison: Comparison, extend: str = SWEEP_EXTEND) -> None:
    """The main numbers of every table on the console (rich), for `oelm sweep` / `oelm compare`."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        console = Console(width=160)
    for group in comparison.groups:
        scale = _pct_scale(group)
        table = Table(title=group.title, title_justify="left")
        for col in ("method", "setting (val)", f"{group.primary_metric} ± 95% CI (n)",
                    "gap % (+ = worse)", "p (paired)", "min. detectable gap", "ms/step",
                    "ratio vs base", "FLOP saving"):
            table.add_column(col)
        for arm in group.arms:
            table.add_row(
                arm.method, arm.setting or NA, fmt_summary(arm.primary, scale), fmt_gap(arm, group),
                fmt_p(arm, group).split(" (")[0] if arm.test else ("—" if arm.method == group.baseline else NA),
                fmt_mde(arm, group).replace("**", ""),
                _ms(arm.step_time),
                NA if arm.step_time_ratio is None else f"{arm.step_time_ratio:.2f}",
                fmt_saving(arm.theoretical_saving),
            )
        console.print(table)
        for warning in group.warnings:
            console.print(f"[yellow]warning:[/] {escape(warning)}")
        for arm in group.arms:
            if text := power_text(arm, group, extend):
                console.print(f"[cyan]power:[/] {escape(text.replace('**', ''))}")
    if comparison.excluded or comparison.incomplete:
        console.print(f"{len(comparison.excluded)} excluded and {len(comparison.incomplete)} "
                      "incomplete run(s) are listed in the report, not averaged")
