"""The one formatter of report cells and tables: numbers, summaries, gaps, p-values, savings,
power text, and the markdown and terminal tables they go into.

Every report, reading and board formats its cells through these functions and lays them out with
`md_table` (markdown) or `text_table` (terminal), so one figure reads the same wherever it appears.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from oelm.reports.aggregate import Arm, Group
from oelm.reports.stats import Summary

NA = "n/a"

# Column alignment, one letter per column: l(eft), r(ight), c(enter), or - (markdown: unmarked).
_MD_RULE = {"-": "---", "l": ":---", "r": "---:", "c": ":---:"}


def _aligns(align: str | None, n: int, default: str) -> str:
    """One alignment letter per column (all `default` when None); ValueError on a wrong length."""
    if align is None:
        return default * n
    if len(align) != n or set(align) - set(_MD_RULE):
        raise ValueError(f"align {align!r} needs one of -, l, r, c per column ({n} columns)")
    return align


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> list[str]:
    """A markdown table as lines: '| a | b |', the rule ('|---|---|' unless `align` marks it), the rows.

    Cells are written as given (str() of non-strings); every row must have the header's length.
    """
    n = len(header)
    rule = "|" + "".join(_MD_RULE[a] + "|" for a in _aligns(align, n, "-"))
    lines = ["| " + " | ".join(header) + " |", rule]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != n:
            raise ValueError(f"table row has {len(cells)} cells, its header {n}: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def text_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> list[str]:
    """A plain-text table for the terminal: padded columns two spaces apart, a rule under the header.

    A header cell may hold several lines (split at newlines) so that short numeric columns stay
    narrow; `align` takes l, r or c per column (default: all left). No line ends in spaces.
    """
    n = len(header)
    aligns = _aligns(align, n, "l").replace("-", "l")
    body = [[str(c) for c in row] for row in rows]
    if any(len(r) != n for r in body):
        raise ValueError(f"every table row needs {n} cells")
    heads = [h.split("\n") for h in header]
    depth = max(len(h) for h in heads)
    heads = [[""] * (depth - len(h)) + h for h in heads]  # multi-line headers sit on the rule
    widths = [max(len(x) for x in [*heads[i], *(r[i] for r in body)]) for i in range(n)]

    def line(cells: Sequence[str]) -> str:
        pad = {"l": str.ljust, "r": str.rjust, "c": str.center}
        return "  ".join(pad[a](c, w) for c, w, a in zip(cells, widths, aligns)).rstrip()

    out = [line([h[k] for h in heads]) for k in range(depth)]
    out.append("  ".join("─" * w for w in widths))
    return out + [line(r) for r in body]


def pct_scale(group: Group) -> float:
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


def significant(arm: Arm) -> bool:
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
    if pw.underpowered and not significant(arm):
        text += " **underpowered**"
    return text


def power_text(arm: Arm, group: Group, extend: str = SWEEP_EXTEND) -> str:
    """One sentence on what this comparison can resolve; never reads 'not significant' as 'equal'."""
    pw = arm.power
    if arm.method == group.baseline or pw is None:
        return ""
    if pw.mde is None or pw.sd_diff is None:
        return (
            f"{arm.method}: {pw.n} paired seed(s), too few for a power estimate (>= 2) or a "
            "test (>= 3): the gap is unmeasured, not zero."
        )
    if pw.sd_diff == 0:
        return (
            f"{arm.method}: the per-seed gaps are identical ({pw.observed:+.2f}%) over {pw.n} "
            "seeds, so the t-test is undefined; add seeds before reading it."
        )
    text = (
        f"{arm.method}: with {pw.n} seeds (paired SD of the gap {pw.sd_diff:.2f}%), the paired "
        f"t-test (two-sided, alpha {pw.alpha:g}, power {pw.power:g}) detects gaps of "
        f"±{pw.mde:.2f}% or more; observed {pw.observed:+.2f}%"
    )
    p = arm.test.p_value if arm.test else None
    p_text = "no p-value" if p is None else f"p = {p:.3g}"
    if significant(arm):
        return text + f", significant ({p_text})."
    if pw.underpowered:
        text += (
            f" ({p_text}). **Underpowered: this cannot distinguish a gap below {pw.mde:.2f}%**;"
            " a non-significant result here is not evidence of no difference."
        )
    else:
        text += f", not significant ({p_text}); that is not evidence of no difference."
    if pw.seeds_for_observed and pw.seeds_for_observed > pw.n:
        cmd = extend.format(seeds=seeds_arg(pw.seeds_for_observed))
        text += (
            f" Detecting a gap of {abs(pw.observed):.2f}% with power {pw.power:g} needs about "
            f"{pw.seeds_for_observed} seeds (`{cmd}` reuses the finished runs)."
        )
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


def fmt_ms(s: Summary) -> str:
    """Mean step time in milliseconds."""
    return NA if s.mean is None else f"{s.mean * 1000:.1f}"
