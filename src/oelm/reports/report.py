"""`oelm report`: read stored run records only and write report.md, report.json and PNGs."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from oelm.records.load import load_runs
from oelm.records.run import RunRecord
from oelm.records.stability import RULE as STABILITY_RULE
from oelm.records.sweep import (
    SweepRecord,
    declared_extensions,
    declared_lr_rule,
    declared_primary,
    sweep_records,
)
from oelm.reports import plots
from oelm.reports.aggregate import (
    BASELINE,
    INSTABILITY_POLICY,
    Arm,
    Comparison,
    Group,
    Versus,
    compare,
    crossing,
    lr_rule_text,
    metric_label,
    require_arm,
    split_text,
)
from oelm.reports.comparison import page_json
from oelm.reports.probes import probe_section
from oelm.reports.reading import budget, how_to_read, noise_text, reading, reading_lines
from oelm.reports.stats import MARGIN
from oelm.reports.study_compare import study_rows, study_section, study_summary
from oelm.reports.study_numbers import StudyNumbers
from oelm.reports.tables import (
    CONFIRM_PLAN,
    GAP_NAME,
    NA,
    bits_per_byte,
    bits_per_byte_head,
    bits_per_byte_key,
    family_lines,
    fmt_bits_per_byte,
    fmt_gap,
    fmt_gap_interval,
    fmt_int,
    fmt_lr_check,
    fmt_mde,
    fmt_ms,
    fmt_p,
    fmt_saving,
    fmt_sensitivity,
    fmt_summary,
    fmt_tost,
    fmt_unstable,
    fmt_verdict,
    md_table,
    pct_scale,
    power_text,
    primary_table,
    protocol_lines,
    text_table,
    verdict_text,
)
from oelm.utils.io import atomic_write_text, writable_dir


def _main_table(group: Group, scale: float) -> list[str]:
    """Markdown rows of a dataset's main table (LM tables: bits per byte beside the perplexity, since
    perplexities of different tokenizers are not comparable and bits per byte are; n/a where not recorded)."""
    unit = " (%)" if scale == 100.0 else ""
    bpb = bits_per_byte_key(group)
    sel_dir = "higher" if group.higher_is_better else "lower"  # one direction per task
    head = [
        "method",
        f"setting chosen on val ({group.lr_rule} rule on {group.selection_metric}, {sel_dir} is better)",
        f"{metric_label(group.primary_metric, group.splits)}{unit}: mean ± 95% CI (n seeds)",
        *([bits_per_byte_head(bpb)] if bpb else []),
        f"{GAP_NAME} vs {group.baseline or BASELINE}, % of the reference (+ = worse) [paired 95% CI"
        + (": what noise it includes]" if group.facts.item_noise_interval else "]"),
    ]
    if group.higher_is_better:
        head.append(f"Δ {group.primary_metric} (points{unit}, + = better)")
    head += [
        "p (paired t of the per-seed gaps), Holm-adjusted",
        f"equivalence (TOST within ±{group.margin:g}%), Holm-adjusted",
        "verdict",
        "min. detectable gap (paired t at the Holm level α/m, power 0.8)",
        "unstable runs (chosen setting; all LRs)",
        "LR sensitivity",
        "step time (ms)",
        "tokens/s",
        "step-time ratio vs reference (measured)",
        "theoretical saving",
        "trainable / frozen params",
    ]
    rows = []
    for arm in group.arms:
        vs = group.versus_of(arm.method)
        cells = [
            arm.method,
            NA if arm.setting is None else arm.setting,
            fmt_summary(arm.primary, scale),
            *([fmt_bits_per_byte(arm, bpb)] if bpb else []),
            fmt_gap_interval(arm, group),
        ]
        if group.higher_is_better:
            cells.append(NA if vs.delta is None else f"{vs.delta * scale:+.2f}")
        cells += [
            fmt_p(arm, group),
            fmt_tost(arm, group),
            fmt_verdict(arm, group),
            fmt_mde(arm, group),
            fmt_unstable(arm),
            fmt_sensitivity(arm),
            fmt_ms(arm.step_time),
            NA if arm.tokens_per_second.mean is None else f"{arm.tokens_per_second.mean:,.0f}",
            NA if vs.step_time_ratio is None else f"{vs.step_time_ratio:.3f}",
            fmt_saving(arm.theoretical_saving),
            f"{fmt_int(arm.trainable_params)} / {fmt_int(arm.frozen_params)}",
        ]
        rows.append(cells)
    return md_table(head, rows)


def _lr_table(group: Group) -> list[str]:
    """Markdown rows of the learning-rate sweep on validation (the selection evidence)."""
    head = [
        "method",
        "setting",
        f"{group.selection_metric} (val): mean ± 95% CI (n)",
        "seed spread (range / mean)",
        "unstable runs",
        "excluded runs",
        "robust rule's stability check",
        "chosen",
    ]
    rows = []
    for arm in group.arms:
        for cell in arm.cells:
            excluded = ", ".join(f"seed {r.seed}: {r.status}" for r in cell.excluded) or "—"
            chosen = "**yes**" if cell.setting == arm.setting else ""
            spread = NA if cell.spread is None else f"{cell.spread:.1%}"
            rows.append(
                [
                    arm.method,
                    cell.setting,
                    fmt_summary(cell.selection),
                    spread,
                    cell.unstable_text(),
                    excluded,
                    fmt_lr_check(cell, arm),
                    chosen,
                ]
            )
    return md_table(head, rows)


def _slug(text: str) -> str:
    """File-name-safe version of a table title."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80] or "table"


def reference_line(group: Group) -> str:
    """Which arm every method is compared with, and the size of the Holm family."""
    if group.baseline is None:
        return ""
    m = group.comparisons
    return (
        f"Reference: **{group.baseline}**; every other method is compared with it ({m} comparison"
        f"{'s' if m != 1 else ''} with a test: p-values Holm-adjusted over their family (below); "
        f"equivalence within ±{group.margin:g}% by TOST, Holm-adjusted likewise)."
    )


def _group_section(group: Group, out: Path, index: int, extend: str = CONFIRM_PLAN) -> list[str]:
    """Markdown of one dataset table with its LR sweep, warnings and figures."""
    scale = pct_scale(group)
    lines = [f"## {group.title}", ""]
    lines.append(
        f"Primary metric `{group.primary_metric}` (held-out split where the data has one). "
        f"Each method's LR is chosen on validation (`{group.selection_metric}`) by the rule below; "
        "the primary metric is then reported for that LR only."
    )
    if splits := split_text(group.splits):
        lines[-1] += " " + splits
    lines += ["", *protocol_lines(group), ""]
    if ref := reference_line(group):
        lines += [ref, ""]
    lines += [*family_lines(group), ""]
    if group.primary_versus:
        lines += ["### Primary comparisons", "", *primary_table(group), ""]
    lines += [f"> **Warning:** {w}" for w in group.warnings]
    lines += [
        f"> **Held-out information** (not used for any choice): `{r.path.as_posix()}` "
        f"({r.method} {r.setting} seed {r.seed}): {note}"
        for r, note in group.heldout_notes
    ]
    lines += ["", *_main_table(group, scale), ""]

    if noise := noise_text(group):
        lines += [noise, ""]
    power = [t for a in group.arms if (t := power_text(a, group, extend))]
    if power:
        lines += ["### Verdicts and power", "", *[f"- {t}" for t in power], ""]
    lines += study_section(group)
    lines += ["### Learning-rate sweep (validation)", ""]
    lines += _lr_table(group)
    slug = f"{index:02d}-{_slug(group.title)}"
    curves = plots.plot_curves(group, out / f"curves-{slug}.png")
    gaps = plots.plot_gaps(group, out / f"gaps-{slug}.png")
    sensitivity = plots.plot_lr_sensitivity(group, out / f"lr-{slug}.png")
    lines.append("")
    if sensitivity:
        lines.append(f"![validation metric against learning rate, every seed]({sensitivity.name})")
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
        lines.append(f"- `{run.path.as_posix()}`: {run.method} lr={run.lr} seed={run.seed}: {run.reason}")
    return lines + [""]


def render(
    comparison: Comparison,
    out: Path,
    sources: Sequence[str],
    extend: str = CONFIRM_PLAN,
    intro: Sequence[str] | None = None,
) -> str:
    """The full markdown report; writes the figures into `out`. `intro` replaces the line saying
    where the numbers come from (a report re-rendered from stored JSON says so there)."""
    lines = ["# OELM comparison report", ""]
    if intro is None:
        lines.append(
            f"Generated by `oelm report` from {comparison.n_runs} stored runs (run directories or committed run "
            "records) under "
            + ", ".join(f"`{s}`" for s in sources)
            + ". Every number is computed from their results.json / metrics.jsonl (a committed record, one line "
            "of a board's runs.jsonl.gz, holds both)."
        )
    else:
        lines += list(intro)
    lines += ["", how_to_read("report"), ""]
    for i, group in enumerate(comparison.groups):
        lines += _group_section(group, out, i, extend) + [""]
    lines += _runs_list(
        "Excluded runs (failed freeze check, diverged or collapsed on validation)",
        comparison.excluded,
        "These runs finished but are **not** in any mean above, except a seed at chance level at its arm's "
        "chosen setting: that seed is what the arm gave, and it is kept, at its held-out result.",
    )
    lines += _runs_list(
        "Incomplete runs",
        comparison.incomplete,
        "No results.json with status complete: listed, never averaged.",
    )
    return "\n".join(lines).rstrip() + "\n"


def _arm_json(arm: Arm, vs: Versus, bpb: str | None = None) -> dict[str, Any]:
    """Numbers of one arm and its comparison with the reference for report.json (`bpb`: the results
    key of bits per byte in an LM table; its summary has n = 0 where the runs did not record it)."""
    return {
        "method": arm.method,
        "lr": arm.lr,
        "setting": arm.setting,
        "primary": arm.primary.to_dict(),
        **({"bits_per_byte": {"key": bpb, **bits_per_byte(arm, bpb).to_dict()}} if bpb else {}),
        "by_seed": {str(k): v for k, v in sorted(arm.by_seed.items())},
        "gap_percent": vs.gap,  # the gap of the means
        "mean_seed_gap_percent": vs.mean_seed_gap,  # the gap the page prints beside its paired interval
        "gap_paired": vs.gap_paired.to_dict() if vs.gap_paired else None,
        "gap_seeds_items": vs.gap_items.to_dict() if vs.gap_items else None,
        "delta": vs.delta,
        "paired_test": vs.test.to_dict() if vs.test else None,
        "power": vs.power.to_dict() if vs.power else None,
        "decision": vs.decision.to_dict() if vs.decision else None,
        "verdict": None if vs.decision is None else verdict_text(vs.decision),
        "mean_step_time": arm.step_time.mean,
        "tokens_per_second": arm.tokens_per_second.mean,
        "step_time_ratio": vs.step_time_ratio,
        "theoretical_saving": arm.theoretical_saving,
        "trainable_params": arm.trainable_params,
        "frozen_params": arm.frozen_params,
        "study": arm.study,
        "noise": None if arm.noise is None else {**asdict(arm.noise), "ratio": arm.noise.ratio},
        "paired_noise": None
        if vs.paired_noise is None
        else {**asdict(vs.paired_noise), "ratio": vs.paired_noise.ratio},
        "lr_rule": arm.lr_rule,
        "lr_sensitivity": arm.sensitivity,
        "unstable": dict(zip(("flagged", "finished"), arm.unstable_count())),
        "lr_sweep": [
            {
                "setting": c.setting,
                "lr": c.lr,
                "selection": c.selection.to_dict(),
                "seed_spread": c.spread,
                "runs": [str(r.path) for r in c.runs],
                "excluded": [str(r.path) for r in c.excluded],
                "unstable": [{"path": str(r.path), "kind": f.kind, "reason": f.reason} for r, f in c.unstable],
                "stability_check": arm.rejected.get(c.setting),
            }
            for c in arm.cells
        ],
    }


def _reading(group: Group) -> str:
    """The plain-language paragraph of a table (also in report.json)."""

    return reading(group)


def _crossings_json(group: Group) -> dict[str, Any]:
    """Per method: where its mean validation curve last crossed the baseline's (if it did)."""
    base = next((a for a in group.arms if a.method == group.baseline), None)
    if base is None:
        return {}
    return {a.method: asdict(c) for a in group.arms if a is not base and (c := crossing(a, base, group))}


def to_json(comparison: Comparison, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Machine-readable form of the report (the same numbers as the markdown).

    `provenance` (what it was built from: `n_runs`, `sources`, a re-rendering's `command`) goes first.
    """
    return {
        **(provenance or {}),
        "margin_percent": comparison.margin,
        "test_scale": "per-seed % gap to the reference (the paired interval's quantity)",
        "groups": [
            {
                "task": g.task,
                "dataset": g.dataset,
                "model": g.model,
                "primary_metric": g.primary_metric,
                "selection_metric": g.selection_metric,
                "baseline": g.baseline,
                "reference": g.baseline,
                "higher_is_better": g.higher_is_better,
                "margin_percent": g.margin,
                "splits": g.splits,
                "comparisons": g.comparisons,
                "lr_rule": g.lr_rule,
                "lr_rule_text": lr_rule_text(g.lr_rule),
                "stability_rule": STABILITY_RULE,
                "instability_policy": INSTABILITY_POLICY,
                "loss_cap": g.loss_cap,
                "primary": [list(p) for p in g.primary],
                "families": g.families,
                "primary_comparisons": [
                    {
                        "method": m,
                        "compared_with": r,
                        "gap_paired": vs.gap_paired.to_dict() if vs.gap_paired else None,
                        "decision": vs.decision.to_dict() if vs.decision else None,
                        "verdict": verdict_text(vs.decision),
                    }
                    for (m, r), vs in g.primary_versus.items()
                ],
                "budget": budget(g),
                "warnings": g.warnings,
                "heldout_notes": [{"path": str(r.path), "note": n} for r, n in g.heldout_notes],
                "reading": _reading(g),
                "arms": [_arm_json(a, g.versus_of(a.method), bits_per_byte_key(g)) for a in g.arms],
                "crossings": _crossings_json(g),
                "study": [r.to_dict() for r in study_rows(g)],  # the study's runs beside ours (study_compare)
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
    extend: str = CONFIRM_PLAN,
    epilogue: Callable[[Comparison], list[str]] | None = None,
    margin: float = MARGIN,
    lr_rule: str | None = None,
    sweep: SweepRecord | None = None,
    named_baseline: bool = False,
) -> tuple[Path, Comparison]:
    """Load run records under `paths`, write OUT/report.md + report.json + PNGs; return both.

    `named_baseline`: the caller named `baseline` (refused when no table has it).
    `lr_rule`: how each arm's setting is chosen (None: the sweep record's, else robust). `sweep`:
    the sweep's record as the caller holds it in memory (`oelm sweep`), else read from `paths`.

    `extend` is the command that adds seeds (quoted by the power section); `epilogue` returns
    lines appended at the very end of report.md (computed from the same comparison; default: the
    plain-language reading of every table).
    """
    if epilogue is None:
        epilogue = reading_lines
    study = StudyNumbers.load(study_numbers) if study_numbers else None
    runs = load_runs(paths)
    records = sweep_records(paths) if sweep is None else [sweep]
    comparison = compare(
        runs,
        baseline=baseline,
        study=study,
        margin=margin,
        extensions=declared_extensions(records),
        lr_rule=lr_rule or declared_lr_rule(records),
        primary=[tuple(p) for p in declared_primary(paths, records)],
    )
    if named_baseline:  # the user named it (--baseline): a name no table has is a typo
        require_arm(comparison.groups, baseline)
    out_dir = writable_dir(  # after every check: a refused report leaves no folder behind
        Path(out) if out else Path(paths[0]) / "report",
        "report folder",
        "pass --out with a writable folder (run directories are only read)",
    )
    text = render(comparison, out_dir, [str(p) for p in paths], extend)
    probe_lines = probe_section(comparison, out_dir / "scaling.png")  # switched on by probe tables
    if probe_lines:
        text = text.rstrip() + "\n\n" + "\n".join(probe_lines).rstrip() + "\n"
    if epilogue is not None:
        text = text.rstrip() + "\n\n" + "\n".join(epilogue(comparison)).rstrip() + "\n"
    _write_atomic(out_dir / "report.md", text)
    provenance = {"n_runs": comparison.n_runs, "sources": [Path(p).as_posix() for p in paths]}
    _write_atomic(
        out_dir / "report.json",
        json.dumps(page_json("report", to_json(comparison, provenance)), indent=2, default=str),
    )
    return out_dir / "report.md", comparison


def shown_path(path: str | Path) -> str:
    """A path as a committed file names it: relative to here when inside, with forward slashes."""
    text = str(path)
    if os.path.isabs(text):
        rel = os.path.relpath(text)
        text = text if rel.startswith("..") else rel
    return Path(text).as_posix()


SUMMARY_WIDTH = 100  # what `oelm compare` / `oelm sweep` print fits a terminal this wide
SUMMARY_MORE = "report.md adds step times, tokens/s, parameters, the study's numbers and the LR sweep"


def summary_table(group: Group) -> list[str]:
    """A table's main numbers as terminal lines, at most SUMMARY_WIDTH columns for usual names.

    The columns are those a reader needs to judge the comparison; the minimum detectable gap is
    in the power lines printed under it, and step times, throughput, parameters and the LR sweep
    are in report.md.
    """
    scale = pct_scale(group)
    unit = " (%)" if scale == 100.0 else ""
    head = [
        "method",
        "setting\n(val)",
        f"{group.primary_metric}{unit}\nmean ± 95% CI (n)",
        "mean per-seed gap %\n+ = worse [95% CI]",
        f"Holm p\n(m = {group.comparisons})",
        "time\nratio",
        "FLOP\nsaving",
    ]
    rows = []
    for arm in group.arms:
        vs = group.versus_of(arm.method)
        d = vs.decision
        if d is not None and d.p is not None:
            p = f"{d.holm_p:.2g}"  # the raw p is in the verdict line under the table
        else:
            p = "—" if arm.method == group.baseline else NA
        rows.append(
            [
                arm.method,
                arm.setting or NA,
                fmt_summary(arm.primary, scale),
                fmt_gap(arm, group),
                p,
                NA if vs.step_time_ratio is None else f"{vs.step_time_ratio:.2f}",
                fmt_saving(arm.theoretical_saving),
            ]
        )
    return text_table(head, rows, align="llllrrr")


def print_summary(comparison: Comparison, extend: str = CONFIRM_PLAN) -> None:
    """The main numbers of every table on the console, for `oelm sweep` / `oelm compare`.

    Fits SUMMARY_WIDTH columns: the table keeps the headline columns (summary_table) and report.md
    holds the rest. On a terminal long lines wrap at its width; piped or written to a file, every
    line is one line (soft wrap: no hard breaks, no trailing padding), for grep and diff.
    """
    from rich.console import Console  # heavy optional dependency: imported on use
    from rich.markup import escape  # heavy optional dependency: imported on use

    console = Console()
    if not console.is_terminal:
        console = Console(width=SUMMARY_WIDTH, soft_wrap=True)
    for group in comparison.groups:
        console.print(group.title, style="bold", markup=False, highlight=False, soft_wrap=True)
        if ref := reference_line(group):
            console.print(ref.replace("**", ""), markup=False, highlight=False)
        for line in [*summary_table(group), *study_summary(group)]:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        for warning in group.warnings:
            console.print(f"[yellow]warning:[/] {escape(warning)}")
        for arm in group.arms:
            if text := power_text(arm, group, extend):
                console.print(f"[cyan]verdict:[/] {escape(text.replace('**', ''))}")
    if comparison.groups:
        console.print(SUMMARY_MORE, markup=False, highlight=False)
    if comparison.excluded or comparison.incomplete:
        console.print(
            f"{len(comparison.excluded)} excluded and {len(comparison.incomplete)} "
            "incomplete run(s) are listed in the report, not averaged"
        )
