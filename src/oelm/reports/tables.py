"""The one formatter of report cells and tables: numbers, summaries, gaps, p-values, savings,
power text, and the markdown and terminal tables they go into.

Every report, reading and board formats its cells through these functions and lays them out with
`md_table` (markdown) or `text_table` (terminal), so one figure reads the same wherever it appears.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from oelm.records.stability import RULE as STABILITY_RULE
from oelm.reports import stats
from oelm.reports.aggregate import INSTABILITY_POLICY, Arm, Group, LrCell, Versus, gap_by_seed, lr_rule_text
from oelm.reports.stats import Decision, Summary

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


def fmt_spec(x: float | None, spec: str = ".4g") -> str:
    """A number formatted by the format spec `spec` ('+.3g'), n/a for None, 'never' for inf (a
    fitted crossing that does not come)."""
    if x is None:
        return NA
    return "never" if math.isinf(x) else format(x, spec)


def fmt_fixed(x: float | None, digits: int = 3, missing: str = NA) -> str:
    """A number with `digits` decimals ('0.984'), or `missing` (None or not finite)."""
    if x is None or not math.isfinite(x):
        return missing
    return f"{x:.{digits}f}"


def fmt_pct(x: float | None, digits: int = 2) -> str:
    """A signed percentage already in percent ('+1.50%'): a gap, an interval's end; or n/a."""
    return NA if x is None else f"{x:+.{digits}f}%"


def fmt_fraction(x: float | None, digits: int = 2) -> str:
    """A fraction shown as a percentage ('3.90%'; negative: a cost, not a saving), or n/a."""
    return NA if x is None else f"{x * 100:.{digits}f}%"


def fmt_interval(s: Summary | stats.ItemsInterval | None) -> str:
    """' [-0.50, +1.20]': the 95% interval of a summary of signed percentages, or '' without one."""
    if s is None or s.ci_low is None:
        return ""
    return f" [{s.ci_low:+.2f}, {s.ci_high:+.2f}]"


def fmt_mean_pm(s: Summary, digits: int = 3, n: bool = False, missing: str = NA) -> str:
    """'mean ± half-width' at `digits` decimals (the ± part only with an interval; ' (n)' with `n`),
    or `missing` without a mean. `fmt_summary` is the significant-figure form of a metric cell."""
    if s.mean is None:
        return missing
    text = fmt_fixed(s.mean, digits)
    if s.half_width is not None:
        text += f" ± {fmt_fixed(s.half_width, digits)}"
    return f"{text} ({s.n})" if n else text


def fmt_lr(lr: float | None, missing: str = NA) -> str:
    """A learning rate as given ('0.003', '1e-05'), or `missing`."""
    return missing if lr is None else f"{lr:g}"


def fmt_summary(s: Summary, scale: float = 1.0) -> str:
    """'mean ± half-width (n=k)'; the interval is shown as undefined when n < 2."""
    if s.n == 0 or s.mean is None:
        return NA
    if s.half_width is None:
        return f"{fmt_num(s.mean * scale)} ± n/a (n={s.n})"
    return f"{fmt_num(s.mean * scale)} ± {fmt_num(s.half_width * scale, 2)} (n={s.n})"


GAP_NAME = "mean per-seed gap"  # the quantity every page prints as its gap (Versus.mean_seed_gap)
MEANS_NAME = "gap of the means"  # another quantity (Versus.gap): printed only where no seed pairs
NO_PAIRS = f"{MEANS_NAME}; no paired seeds"  # the label of that fallback


def fmt_versus_gap(vs: Versus, interval: Summary | stats.ItemsInterval | None = None) -> str:
    """'+4.12% [+0.72, +7.51]': the one gap every page prints for a comparison, the mean per-seed %
    gap (Versus.reported_gap), beside its paired 95% interval (or `interval`, the seeds x test items
    one, whose mean is the same quantity); the gap of the means, labelled so, where no seed pairs."""
    if vs.mean_seed_gap is not None:
        return fmt_pct(vs.mean_seed_gap) + fmt_interval(vs.gap_paired if interval is None else interval)
    return NA if vs.gap is None else f"{fmt_pct(vs.gap)} ({NO_PAIRS})"


def fmt_gap(arm: Arm, group: Group) -> str:
    """The comparison's gap cell (fmt_versus_gap); '0 (reference)' for the reference itself."""
    if arm.method == group.baseline:
        return "0 (reference)"
    return fmt_versus_gap(group.versus_of(arm.method))


def fmt_gap_interval(arm: Arm, group: Group) -> str:
    """The gap with the interval a report shows, saying what noise it includes.

    Classifiers whose runs stored per-example test correctness: the Student-t interval over seeds x
    test examples ('seeds + test examples', stats.paired_items_gap, whose mean is the mean per-seed
    gap); other classifier records: the paired-by-seed interval, labelled 'seeds only' (the test
    set's noise is not in it). LMs: fmt_gap (seeds).
    """
    vs = group.versus_of(arm.method)
    if arm.method == group.baseline or vs.mean_seed_gap is None:
        return fmt_gap(arm, group)
    if vs.gap_items is not None:
        return f"{fmt_versus_gap(vs, vs.gap_items)} (seeds + test examples)"
    if group.facts.item_noise_interval and vs.gap_paired is not None and vs.gap_paired.ci_low is not None:
        return f"{fmt_gap(arm, group)} (seeds only)"
    return fmt_gap(arm, group)


def _pval(p: float | None) -> str:
    """A p-value in three significant figures, or n/a."""
    return NA if p is None else f"{p:.3g}"


def fmt_holm(d: Decision) -> str:
    """'p = 0.012, Holm p = 0.048 (m = 4)': a decision's paired t-test, raw and Holm-adjusted."""
    return f"p = {_pval(d.p)}, Holm p = {_pval(d.holm_p)} (m = {d.m})"


def fmt_p(arm: Arm, group: Group) -> str:
    """'p = 0.012, Holm p = 0.048 (m = 4)': the paired t-test of the per-seed gaps, raw and adjusted.

    m is the number of comparisons against the reference in this table (the Holm family).
    """
    if arm.method == group.baseline:
        return "—"
    vs = group.versus_of(arm.method)
    d = vs.decision
    if d is None or d.p is None:
        n = d.n if d is not None else (vs.gap_paired.n if vs.gap_paired else 0)
        why = "identical per-seed gaps" if n >= stats.MIN_PAIRED_SEEDS else f"{n} paired seeds; needs >= 3"
        return f"n/a ({why})"
    text = fmt_holm(d)
    if vs.test is not None and vs.test.wilcoxon_p is not None:
        text += f"; Wilcoxon {vs.test.wilcoxon_p:.3g}"
    return text


def fmt_tost(arm: Arm, group: Group) -> str:
    """'TOST p = 0.004, Holm p = 0.012 (m = 4)': the equivalence test within ±margin, raw and adjusted."""
    if arm.method == group.baseline:
        return "—"
    d = group.versus_of(arm.method).decision
    if d is None or d.tost_p is None:
        return NA
    return f"TOST p = {_pval(d.tost_p)}, Holm p = {_pval(d.tost_holm_p)} (m = {d.m})"


def verdict_text(d: Decision | None) -> str:
    """The one wording of a comparison's verdict, from the fixed vocabulary:

    'worse (resolved)', 'better (resolved)', 'equivalent within ±M%' or
    'unresolved (smallest detectable gap X% at 80% power)', followed by '[primary]' or
    '[exploratory]' where the table declared a primary family. Every report, reading, board and
    generated doc words a comparison through this function.
    """
    if d is None:
        return "unresolved (smallest detectable gap n/a at 80% power: no reference to compare with)"
    label = f" [{d.family}]" if d.family else ""  # the Holm family, where a primary one was declared
    if d.verdict in (stats.WORSE, stats.BETTER):
        return f"{d.verdict} (resolved){label}"
    if d.verdict == stats.EQUIVALENT:
        return f"equivalent within ±{d.margin:g}%{label}"
    power = f"{d.power * 100:g}% power"
    if d.mde is not None:
        holm = ", Holm-adjusted" if d.m > 1 else ""
        return f"unresolved (smallest detectable gap {d.mde:.2f}% at {power}{holm}){label}"
    why = "identical per-seed gaps" if d.n >= stats.MIN_PAIRED_SEEDS else f"{d.n} paired seed(s), a test needs 3"
    return f"unresolved (smallest detectable gap n/a at {power}: {why}){label}"


def fmt_verdict(arm: Arm, group: Group) -> str:
    """The verdict of an arm against the table's reference ('reference' for the reference itself)."""
    if arm.method == group.baseline:
        return "reference"
    if group.baseline is None:
        return NA
    return verdict_text(group.versus_of(arm.method).decision)


# The command that plans a confirmation of a pilot on fresh seeds ({seeds}: how many). Sweeps and
# `oelm compare` fill in their own directories; a bare `oelm report` shows the placeholders.
CONFIRM_PLAN = "oelm confirm plan SWEEP_DIR --seeds {seeds} --out CONFIRM_DIR"
SWEEP_EXTEND = CONFIRM_PLAN  # the name callers used when this command added seeds to the pilot


def plan_family_size(arm: Arm, group: Group) -> int:
    """The m of the Holm family `oelm confirm plan` tests this comparison in on fresh seeds: the
    declared primary comparisons present, else the pilot's claims (comparisons whose verdict is
    resolved or equivalent) or, for an arm with no claim (the plan's `--all`), every comparison
    with the reference that has a verdict."""
    if group.primary_versus:
        return len(group.primary_versus)
    decided = [vs.decision for m, vs in group.versus.items() if m != group.baseline and vs.decision is not None]
    d = group.versus_of(arm.method).decision
    if d is None or d.verdict == stats.UNRESOLVED:
        return max(1, len(decided))
    return max(1, sum(x.verdict != stats.UNRESOLVED for x in decided))


def margin_plan(arm: Arm, group: Group) -> stats.MarginSeeds | None:
    """Seeds for 80% power at ±margin of the arm's comparison, as `oelm confirm plan` plans them
    (stats.margin_seeds over the pilot's per-seed gaps, at the plan's Holm level); None for the
    reference or a table without one."""
    base = next((a for a in group.arms if a.method == group.baseline), None)
    if base is None or arm is base:
        return None
    d = group.versus_of(arm.method).decision
    margin = d.margin if d is not None else group.margin
    gaps = list(gap_by_seed(arm, base, group.higher_is_better).values())
    return stats.margin_seeds(gaps, margin, plan_family_size(arm, group))


def observed_seeds_text(pw: stats.Power) -> str:
    """'about 4 fresh seeds would detect ...': the seeds to detect the observed gap
    (Power.seeds_for_observed), worded as the power estimate it is; '' without one."""
    if pw.seeds_for_observed is None or pw.observed is None or pw.sd_diff is None:
        return ""
    return (
        f"seeds to detect the observed gap: about {pw.seeds_for_observed} fresh seeds would detect a true mean "
        f"per-seed gap of {fmt_pct(pw.observed)} with {pw.power:.0%} power (paired t, two-sided alpha {pw.alpha:g}) "
        f"were the pilot's paired SD ({pw.sd_diff:.2f}%) the true one: a power estimate, not a promise"
    )


def margin_seeds_text(plan: stats.MarginSeeds) -> str:
    """'seeds for 80% power at ±1% (the seed plan of `oelm confirm plan`): 287 ...'; '' without a count."""
    if plan.needed is None or plan.sd_upper is None:
        return ""
    return (
        f"seeds for {plan.power:.0%} power at ±{plan.margin:g}% (the seed plan of `oelm confirm plan`: paired t at "
        f"the Holm level alpha/m = {plan.alpha:.3g}, from the one-sided {stats.SD_CONFIDENCE:.0%} upper bound "
        f"{plan.sd_upper:.2f}% of the pilot's SD): {plan.needed}"
    )


def pilot_text(arm: Arm, group: Group, confirm: str = CONFIRM_PLAN) -> str:
    """'pilot: n seeds (LRs chosen on them); ...' with the two seed counts and the `oelm confirm plan` call.

    The sweep's seeds chose every LR on validation, so its verdicts are pilot results. Two different
    counts, each named: the seeds to detect the observed gap (stats.observed_gap_seeds, the pilot's
    SD taken as true: a power estimate) and the seeds for 80% power at ±margin that `oelm confirm
    plan` plans (stats.margin_seeds, from the SD's upper bound). '' without a power analysis
    (fewer than 2 paired seeds).
    """
    vs = group.versus_of(arm.method)
    pw, d = vs.power, vs.decision
    if arm.method == group.baseline or pw is None or pw.sd_diff is None:
        return ""
    plan = margin_plan(arm, group)
    n_gap, n_margin = pw.seeds_for_observed, None if plan is None else plan.needed
    needs = [t for t in (observed_seeds_text(pw), "" if plan is None else margin_seeds_text(plan)) if t]
    if not needs:
        return f"pilot: {pw.n} seeds (LRs chosen on them)."
    n_plan = min(n for n in (n_gap, n_margin) if n is not None)  # the smaller count, named by the text
    cmd = confirm.format(seeds=n_plan)
    if d is None or d.verdict == stats.UNRESOLVED:
        # No pilot claim: a plain plan refuses ("no claim to confirm"); --all compares every arm afresh.
        cmd += " --all"
    short = (
        "; a plan with fewer seeds than the seed plan's states its claim as a bound"
        if n_margin is not None and n_plan is not None and n_plan < n_margin
        else ""
    )
    return f"pilot: {pw.n} seeds (LRs chosen on them); {'; '.join(needs)}{short}: `{cmd}`."


def resolved(arm: Arm, group: Group) -> bool:
    """Whether the Holm-adjusted paired test resolves the gap (verdict worse or better)."""
    d = group.versus_of(arm.method).decision
    return d is not None and d.verdict in (stats.WORSE, stats.BETTER)


def fmt_mde(arm: Arm, group: Group, with_n: bool = True) -> str:
    """Minimum detectable gap of the test the verdict uses (paired t at the Holm level alpha/m,
    power 0.8), with the number of paired seeds unless `with_n` is False (a table whose n is in
    another column)."""
    if arm.method == group.baseline:
        return "—"
    vs = group.versus_of(arm.method)
    pw, d = vs.power, vs.decision
    if d is None or d.mde is None:
        return f"n/a ({pw.n if pw else 0} paired seeds)"
    return f"±{d.mde:.2f}% (n={d.n})" if with_n else f"±{d.mde:.2f}%"


def power_text(arm: Arm, group: Group, extend: str = CONFIRM_PLAN) -> str:
    """One line per comparison: its verdict, what the pilot's seeds can resolve, and how many fresh
    seeds a confirmation needs (`pilot_text`; `extend` is the `oelm confirm plan` call).

    Never reads an unresolved gap as 'equal': only the equivalence test makes that claim.
    """
    vs = group.versus_of(arm.method)
    pw = vs.power
    if arm.method == group.baseline or pw is None:
        return ""
    head = f"{arm.method}: {fmt_verdict(arm, group)}"
    if pw.mde is None or pw.sd_diff is None:
        return (
            f"{head}; {pw.n} paired seed(s), too few for a power estimate (>= 2) or a test (>= 3): "
            "the gap is unmeasured, not zero."
        )
    pilot = pilot_text(arm, group, extend)
    if pw.sd_diff == 0:
        return (
            f"{head}; the per-seed gaps are identical ({fmt_pct(vs.mean_seed_gap)}) over {pw.n} seeds, so "
            f"the t-test is undefined. {pilot}"
        )
    d = vs.decision
    mde, level = (d.mde, d.mde_alpha) if d is not None and d.mde is not None else (pw.mde, pw.alpha)
    holm = (
        f"alpha {pw.alpha:g}/{d.m} = {level:.3g} for Holm over {d.m}"
        if d is not None and d.m > 1
        else f"alpha {level:g}"
    )
    text = (
        f"{head}; {fmt_p(arm, group)}. With {pw.n} seeds (paired SD of the gap {pw.sd_diff:.2f}%), "
        f"the paired t-test (two-sided, {holm}, power {pw.power:g}) detects gaps of "
        f"±{mde:.2f}% or more; observed {GAP_NAME} {fmt_pct(vs.mean_seed_gap)}."
    )
    if d is not None and d.tost_power is not None and d.verdict in (stats.UNRESOLVED, stats.EQUIVALENT):
        text += (
            f" The equivalence test (TOST within ±{d.margin:g}%, at that level) had {d.tost_power:.0%} power "
            "to show equivalence had the true gap been 0."
        )
    if d is not None and d.verdict == stats.UNRESOLVED:
        text += (
            f" Unresolved is not evidence of no difference: only the equivalence test (TOST within "
            f"±{d.margin:g}%) makes that claim."
        )
    return f"{text} {pilot}" if pilot else text


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


def fmt_unstable(arm: Arm) -> str:
    """'1 of 4 (1 spiked); 3 of 12 over all LRs': unstable runs at the chosen setting, then over every setting."""
    cell = arm.chosen_cell
    here = NA if cell is None else cell.unstable_text()
    flagged, finished = arm.unstable_count()
    return f"{here}; {flagged} of {finished} over all LRs" if len(arm.cells) > 1 else here


def fmt_sensitivity(arm: Arm) -> str:
    """The arm's LR sensitivity (loss units) over its grid and how many of its LRs pass the stability
    check ('0.036 (3 LRs, 2 stable)'), or why there is none: a method that narrows the stable range shows it."""
    stable = f", {sum(not why for why in arm.rejected.values())} stable" if arm.rejected else ""
    if arm.sensitivity is not None:
        return f"{arm.sensitivity:.3f} ({len(arm.cells)} LRs{stable})"
    if len(arm.cells) < 2:
        return f"{NA} (one LR)"
    return f"{NA} (no validation losses; {len(arm.cells)} LRs{stable})"


PERPLEXITY = "perplexity"  # an LM table's primary metric: {split}_perplexity
BPB_SUFFIX = "bits_per_byte"  # results key {split}_bits_per_byte: one scale across tokenizers


def bits_per_byte_key(group: Group) -> str | None:
    """The results key of bits per byte on the primary metric's split ('test_bits_per_byte' beside
    'test_perplexity'), or None for a table whose primary metric is not a perplexity."""
    metric = group.primary_metric
    if not metric.endswith(PERPLEXITY):
        return None
    return metric[: -len(PERPLEXITY)] + BPB_SUFFIX


def bits_per_byte(arm: Arm, key: str) -> Summary:
    """The arm's bits per byte over its chosen setting's seeds (the Student-t interval of the primary
    metric); n = 0 where no run recorded it (records written before `oelm prepare` counted bytes)."""
    values = [r.results.get(key) for r in arm.runs]
    return stats.summarize([float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)])


def fmt_bits_per_byte(arm: Arm, key: str) -> str:
    """'1.234 ± 0.012 (n=3)', or 'n/a (not recorded)' for runs that predate bits per byte."""
    s = bits_per_byte(arm, key)
    return fmt_summary(s) if s.n else f"{NA} (not recorded)"


def bits_per_byte_head(key: str) -> str:
    """The column header of bits per byte on the key's split."""
    return f"{key.split('_')[0]} bits per byte (comparable across tokenizers): mean ± 95% CI (n)"


def fmt_lr_check(cell: LrCell, arm: Arm) -> str:
    """Whether the robust LR rule's stability check passes a setting, or why not (shown under either
    rule; '—' for a single setting)."""
    if not arm.rejected:
        return "—"
    return arm.rejected.get(cell.setting) or "passes"


def protocol_lines(group: Group) -> list[str]:
    """The rules a table's numbers were chosen and counted by, stated in every report and board."""
    cap = f"{group.loss_cap:.4g}" if group.loss_cap is not None else "not stored (no validation curves)"
    return [
        f"- {lr_rule_text(group.lr_rule)}.",
        f"- Stability rule: {STABILITY_RULE}. {INSTABILITY_POLICY}.",
        "- LR sensitivity (Wortsman et al. 2023): E over the arm's LRs of min(L(lr), L0) - L*, with L(lr) the "
        "mean final validation loss of its seeds, L0 the highest first validation loss of the table's runs "
        f"(here {cap}; a diverged run counts as L0) and L* the smallest of them; 0 = insensitive.",
    ]


def family_lines(group: Group) -> list[str]:
    """Which Holm family each comparison was decided in, in words (every report and board states it)."""
    if not group.primary:
        return [
            "No primary family was declared (a sweep spec's or confirmation plan's `primary`): Holm runs over "
            f"every comparison with the reference (m = {group.comparisons})."
        ]
    pairs = group.primary_versus
    declared = ", ".join(f"{m} vs {r}" for m, r in group.primary)
    if not pairs:
        return [
            f"The declared primary comparisons ({declared}) are not in this table: every comparison here is "
            f"exploratory (m = {group.comparisons}, Holm over them)."
        ]
    shown = ", ".join(f"{m} vs {r}" for m, r in pairs)
    explore = group.families.get(stats.EXPLORATORY, 0)
    return [
        f"Primary family, declared before the runs: {shown} (m = {len(pairs)}, Holm over them only; "
        "verdicts marked [primary]). Every other comparison is exploratory: its own Holm family "
        f"(m = {explore} against the reference), verdicts marked [exploratory]."
    ]


def fmt_paired_mean(vs: Versus) -> str:
    """'+4.12% [+3.22, +5.01]': the mean per-seed gap of a comparison with its paired interval."""
    return fmt_versus_gap(vs)


def primary_table(group: Group) -> list[str]:
    """Markdown rows of the declared primary comparisons (those not against the reference too)."""
    rows = []
    for (method, ref), vs in group.primary_versus.items():
        gap = fmt_paired_mean(vs)
        d = vs.decision
        holm = fmt_holm(d) if d is not None and d.p is not None else NA
        rows.append([method, ref, gap, holm, verdict_text(d)])
    head = [
        "method",
        "compared with",
        "mean per-seed gap % (+ = worse) [paired 95% CI]",
        "p, Holm over the primary family",
        "verdict",
    ]
    return md_table(head, rows)
