"""Probe summary: per probe and method (at the LR chosen on validation), held-out answer accuracy
and the steps each seed needed to reach the target validation accuracy.

`python -m oelm.experiments.probes runs/probes/induction runs/probes/mqar [--out FILE]`; the
general comparison (gaps, paired p, curves) is `oelm report` on the same directories.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from oelm.experiments.aggregate import Arm, Group, compare
from oelm.experiments.records import load_runs

CURVE_STEPS = (100, 200, 400, 800)  # validation accuracy shown at these steps when logged


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ci(arm: Arm) -> str:
    p = arm.primary
    if p.mean is None:
        return "-"
    half = f" ± {p.half_width:.3f}" if p.half_width is not None else ""
    return f"{p.mean:.3f}{half} ({p.n})"


def _steps(arm: Arm) -> tuple[str, str]:
    """(seeds reaching the target, per-seed steps with the median of those that did)."""
    runs = sorted(arm.runs, key=lambda r: r.seed or 0)
    steps = [r.results.get("steps_to_target") for r in runs]
    hit = [s for s in steps if s is not None]
    per_seed = ", ".join("never" if s is None else str(s) for s in steps)
    median = f" (median {statistics.median(hit):g})" if hit else ""
    return f"{len(hit)}/{len(steps)}", per_seed + median


def _curve(arm: Arm, step: int) -> str:
    """Mean validation accuracy over seeds at a step (periodic evals), or '-'."""
    vals = [dict(r.eval_curve("accuracy")).get(step) for r in arm.runs]
    vals = [v for v in vals if v is not None]
    return f"{statistics.fmean(vals):.2f}" if vals else "-"


def group_table(group: Group) -> list[str]:
    """Markdown table of one probe."""
    runs = [r for arm in group.arms for r in arm.runs]
    target = runs[0].results.get("target_accuracy", 0.9) if runs else 0.9
    chance = runs[0].results.get("chance_accuracy") if runs else None
    steps = [s for s in CURVE_STEPS if any(dict(r.eval_curve("accuracy")).get(s) is not None for r in runs)]
    head = ["method", "lr (val)", "test answer acc ± 95% CI (n)", "test sequence acc",
            f"seeds reaching {target:.0%} val", f"steps to {target:.0%} val per seed"]
    head += [f"val acc @{s}" for s in steps]
    lines = [f"### {group.dataset} ({group.model}; chance {_fmt(chance)})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in group.arms:
        seqs = [r.results.get("test_sequence_accuracy") for r in arm.runs]
        seqs = [s for s in seqs if s is not None]
        hits, per_seed = _steps(arm)
        row = [arm.method, f"{arm.lr:g}" if arm.lr is not None else "-", _ci(arm),
               _fmt(statistics.fmean(seqs)) if seqs else "-", hits, per_seed]
        row += [_curve(arm, s) for s in steps]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def probe_report(paths: Sequence[str | Path]) -> str:
    """Markdown summary of every probe group found under the paths."""
    comparison = compare(load_runs(paths))
    out = ["## Probes: answer accuracy and steps to target", ""]
    for group in comparison.groups:
        if group.task != "probe":
            continue
        out += group_table(group) + [""]
    if comparison.incomplete:
        out.append(f"{len(comparison.incomplete)} run(s) incomplete and not shown.")
    return "\n".join(out).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print (or write) the probe summary."""
    parser = argparse.ArgumentParser(prog="python -m oelm.experiments.probes", description=__doc__)
    parser.add_argument("paths", nargs="+", help="sweep or run directories")
    parser.add_argument("--out", help="write the markdown here instead of stdout")
    args = parser.parse_args(argv)
    text = probe_report(args.paths)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
