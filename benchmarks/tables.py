"""`vs_reference --table`: markdown tables of stored timed runs, as in docs/results/vs_reference.

One line per file, process and batch; each cell the median over rounds of the within-round ratio
with its 95% interval, the theoretical speed-up in parentheses. Only timed runs have ratios to
tabulate: the rows of `--count-ops` and `--profile-ops` are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from .arms import LOGITS, NOBIAS
from .harness import fmt_ci, fmt_pct


def without_logits(logits_row: dict) -> tuple[float | None, list | None]:
    """The baseline's speed over the baseline-logits arm's, with its interval: that arm's
    speedup_vs_baseline (baseline time / its time) inverted."""
    v, ci = logits_row.get("speedup_vs_baseline"), logits_row.get("speedup_vs_baseline_ci")
    return (1 / v if v else None), ([1 / ci[1], 1 / ci[0]] if ci and ci[0] else None)


TABLE_HEADER = (
    "| run | batch | baseline vs reference | baseline-nobias vs reference | loss without logits vs through "
    "logits | oelm-freeze vs baseline (theor.) | realized of FLOP saving | skipped GEMMs' share of step | "
    "saved of their time | oelm-qk-ffn vs baseline (theor.) | realized | A/A | baseline ms |"
)


def table(paths: list[Path]) -> list[str]:
    """Markdown lines summarizing timed JSON files: one line per file, process and batch, each ratio with
    its 95% interval (how the tables of docs/results/vs_reference are made from the stored rows)."""

    def ratio(v: float | None, ci: list | None, pct: bool = False) -> str:
        if v is None:
            return "n/a"
        value = fmt_pct(v) if pct else f"{v:.3f}"
        return f"{value} {fmt_ci(ci, 100 if pct else 1.0, '')}".rstrip()

    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    for path in paths:
        rows = json.loads(Path(path).read_text())
        if not isinstance(rows, list) or not rows or "speedup_vs_baseline" not in rows[0]:
            raise SystemExit(
                f"{path}: not the rows of a timed vs_reference run (--count-ops and --profile-ops "
                "files have no ratios to tabulate)"
            )
        for key in dict.fromkeys((r.get("process", 0), r["batch"]) for r in rows):
            arm = {r["name"]: r for r in rows if (r.get("process", 0), r["batch"]) == key}
            get = lambda name, field: arm.get(name, {}).get(field)  # noqa: E731
            fz, qk = arm.get("oelm-freeze", {}), arm.get("oelm-qk-ffn", {})
            cells = [
                f"{Path(path).stem}, {key[0] + 1}",
                str(key[1]),
                ratio(get("baseline", "vs_reference"), get("baseline", "vs_reference_ci")),
                ratio(get(NOBIAS, "vs_reference"), get(NOBIAS, "vs_reference_ci")),
                ratio(*without_logits(arm[LOGITS]) if LOGITS in arm else (None, None)),
                ratio(fz.get("speedup_vs_baseline"), fz.get("speedup_vs_baseline_ci"))
                + (f" ({fz['theoretical_speedup']:.3f})" if fz.get("theoretical_speedup") else ""),
                ratio(fz.get("saving_realized"), fz.get("saving_realized_ci"), pct=True),
                f"{100 * fz['skipped_work_share_of_baseline']:.2f}%"
                if fz.get("skipped_work_share_of_baseline")
                else "n/a",
                ratio(fz.get("skipped_time_saved"), fz.get("skipped_time_saved_ci"), pct=True),
                ratio(qk.get("speedup_vs_baseline"), qk.get("speedup_vs_baseline_ci"))
                + (f" ({qk['theoretical_speedup']:.3f})" if qk.get("theoretical_speedup") else ""),
                ratio(qk.get("saving_realized"), qk.get("saving_realized_ci"), pct=True),
                ratio(get("baseline-AA", "speedup_vs_baseline"), get("baseline-AA", "speedup_vs_baseline_ci")),
                f"{1e3 * get('baseline', 'step_time_median_s'):.0f}"
                if get("baseline", "step_time_median_s")
                else "n/a",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines
