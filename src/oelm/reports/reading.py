"""A plain-language reading of a comparison, generated from the stored records only.

What differed, by how much, how sure (paired interval, p, minimum detectable gap) and what it
cost or saved in time (measured step-time ratio next to the theoretical saving).
"""

from __future__ import annotations

from collections.abc import Mapping

from oelm.reports import stats
from oelm.reports.aggregate import Arm, Comparison, Crossing, Group, Noise, Versus, crossing
from oelm.reports.tables import (
    GAP_NAME,
    MEANS_NAME,
    fmt_num,
    fmt_p,
    fmt_saving,
    observed_seeds_text,
    pct_scale,
    verdict_text,
)

SMALL_NOISE = 0.5  # test SE below half the seed SD: the test set adds little to the seed spread
# How to read each output (what the columns mean, how a verdict is reached) is one page of docs,
# a section per output; an output names its section instead of carrying the text.
READING_PAGE = "docs/reading.md"


def how_to_read(section: str, note: str = "") -> str:
    """The line an output prints for its reading guide: 'How to read these numbers: docs/reading.md#SECTION'."""
    return f"How to read these numbers: {READING_PAGE}#{section}" + (f" ({note})" if note else "") + "."


def paired_noise_text(group: Group) -> str:
    """Whether the test set's noise in each gap (paired by window) is small next to seed noise."""
    parts = []
    for arm in group.arms:
        nz = group.versus_of(arm.method).paired_noise
        if nz is None:
            continue
        text = (
            f"{arm.method} - {group.baseline}: standard error of the {nz.metric} "
            f"{fmt_num(nz.test_se, 3)} over {nz.test_size:,} {nz.unit or 'item'}s"
        )
        if nz.ratio is None:
            parts.append(text + " (one seed: no seed spread to compare it with)")
            continue
        verdict = "small next to" if nz.ratio < SMALL_NOISE else "NOT small next to"
        advice = ": a larger test split would sharpen this gap" if nz.ratio >= SMALL_NOISE else ""
        parts.append(
            f"{text}, {verdict} the standard deviation over seeds of that difference "
            f"({fmt_num(nz.seed_sd, 3)}; ratio {nz.ratio:.2f}){advice}"
        )
    if not parts:
        return ""
    return (
        "Test-set noise in the gap (every arm reads the same test items, so the test set's "
        "noise in a gap is that of the per-item differences): " + "; ".join(parts) + "."
    )


def noise_text(group: Group) -> str:
    """Whether the test set's own noise is small next to the spread between seeds."""
    base = next((a for a in group.arms if a.method == group.baseline), None)
    arm = (
        base
        if base is not None and base.noise is not None
        else next((a for a in group.arms if a.noise is not None), None)
    )
    if arm is None:
        return ""
    nz: Noise = arm.noise
    size = (
        f" over {nz.test_size:,} test {'windows' if nz.metric == 'test_loss' else 'examples'}" if nz.test_size else ""
    )
    kind = "standard error" if nz.metric == "test_loss" else "binomial standard error"
    text = f"Test-set noise ({arm.method}): the {kind} of {nz.metric}{size} is {fmt_num(nz.test_se, 3)}"
    paired = paired_noise_text(group)
    if nz.ratio is None:
        text += "; with one seed there is no seed spread to compare it with."
    else:
        verdict = "small next to" if nz.ratio < SMALL_NOISE else "NOT small next to"
        text += f", {verdict} the standard deviation over seeds ({fmt_num(nz.seed_sd, 3)}; ratio {nz.ratio:.2f})"
        if nz.ratio >= SMALL_NOISE:
            # Paired by window, most of that noise cancels out of a gap; say so where measured.
            text += (
                ": it moves each arm's own number, while the gaps are paired item by item"
                if paired
                else ": a larger test split would sharpen the comparison"
            )
        text += "."
    return f"{text} {paired}" if paired else text


def _lr_list(group: Group) -> str:
    """Each method's chosen learning rate."""
    return ", ".join(f"{a.method} {a.lr:g}" for a in group.arms if a.lr is not None)


def budget(group: Group) -> str:
    """Steps, batch and sequence length as recorded by the chosen runs ('' without runs)."""
    run = next((r for a in group.arms for r in a.runs), None)
    if run is None:
        return ""
    steps, batch = run.results.get("steps"), run.field("batch_size", int)
    seq = run.field(group.facts.length_key, int)
    parts = [f"{steps} steps" if steps else "", f"batch {batch}" if batch else "", f"length {seq}" if seq else ""]
    return ", ".join(p for p in parts if p)


def _sureness(arm: Arm, group: Group) -> str:
    """How sure, in the fixed vocabulary: the interval, p with its Holm adjustment, the verdict."""
    vs = group.versus_of(arm.method)
    paired, pw, d = vs.gap_paired, vs.power, vs.decision
    bits = []
    if paired is not None and paired.ci_low is not None:
        bits.append(f"paired 95% interval {paired.ci_low:+.2f}% to {paired.ci_high:+.2f}%")
    if d is not None and d.p is not None:
        bits.append(f"{fmt_p(arm, group)} over {d.n} seeds")
    text = f" ({'; '.join(bits)})" if bits else ""
    text += f": {verdict_text(d)}"
    if d is None or d.p is None:
        return text + "; the gap is unmeasured, not zero"
    if d.verdict == stats.UNRESOLVED:
        seeds = observed_seeds_text(pw) if pw is not None else ""
        more = f" (pilot: {pw.n} seeds; {seeds}; see `oelm confirm plan`)" if pw is not None and seeds else ""
        return text + f", not evidence that the methods are equal (nor equivalent within ±{d.margin:g}%){more}"
    return text


def _time(arm: Arm, vs: Versus) -> str:
    """Measured step-time ratio (to the reference) next to the theoretical FLOP saving."""
    saving = fmt_saving(arm.theoretical_saving)
    theory = (
        f"a theoretical saving of {saving} of training FLOPs" if saving != "n/a" else "no recorded theoretical saving"
    )
    if vs.step_time_ratio is None:
        return f"its step time was not measured against the baseline's ({theory})"
    r = vs.step_time_ratio
    # Runs of a sweep are timed one after another, often on a shared machine, with no A/A floor
    # and no interval: the ratio is indicative, never a finding (benchmarks/ measures speed).
    return (
        f"its mean step time was {r:.2f}x the baseline's ({arm.step_time.mean * 1000:.1f} vs "
        f"{arm.step_time.mean / r * 1000:.1f} ms; indicative only: runs timed apart, without an interval "
        f"or an A/A floor; `python -m benchmarks.vs_reference` measures speed side by side), against {theory}"
    )


def _arm_sentence(arm: Arm, base: Arm, group: Group, scale: float, cross: Crossing | None) -> str:
    """One method against the reference."""
    vs = group.versus_of(arm.method)
    gap = vs.reported_gap
    if gap is None or arm.primary.mean is None:
        return f"{arm.method} has no finished runs to compare."
    direction = "worse" if gap > 0 else "better"
    name = GAP_NAME if vs.mean_seed_gap is not None else MEANS_NAME
    return (
        f"{arm.method} reached {group.primary_metric} {fmt_num(arm.primary.mean * scale)} against "
        f"{_ref(base, group)}'s {fmt_num(base.primary.mean * scale)}, {abs(gap):.2f}% {direction} as "
        f"the {name}{_sureness(arm, group)}; {_time(arm, vs)}.{_crossing(arm, cross)}"
    )


def _ref(base: Arm, group: Group) -> str:
    """How the reading names the reference: 'the baseline', or the reference method by name."""
    return "the baseline" if base.method == "baseline" else f"the reference {base.method}"


def _crossing(arm: Arm, c: Crossing | None) -> str:
    """Where the validation curves cross: the sign of the gap depends on the budget."""
    if c is None:
        return ""
    early, late = ("behind", "ahead") if c.ahead_at_end else ("ahead of", "behind")
    return (
        f" On validation (mean over seeds) {arm.method} was {early} the baseline until step "
        f"{c.last_other:,} and {late} from step {c.first_final:,} on: the sign of this gap "
        "depends on the training budget."
    )


def reading(group: Group, budget_text: str | None = None, crossings: Mapping[str, Crossing] | None = None) -> str:
    """One paragraph: what differed, by how much, how sure, what it cost or saved in time.

    By default the budget and crossings are read from the arms' runs.
    """
    base = next((a for a in group.arms if a.method == group.baseline), None)
    if base is None or base.primary.mean is None:
        return (
            f"In plain words: {group.title} has no finished baseline, so nothing here says "
            "whether a method helped or hurt."
        )
    scale = pct_scale(group)
    n = base.primary.n
    spent = budget(group) if budget_text is None else budget_text
    head = (
        f"In plain words: on {group.dataset} with {group.model} ({spent + ', ' if spent else ''}"
        f"{n} seed{'s' if n != 1 else ''}, every method at its own learning rate chosen on "
        f"validation: {_lr_list(group)}), "
    )
    others = [a for a in group.arms if a is not base]

    def cross(arm: Arm) -> Crossing | None:
        return crossing(arm, base, group) if crossings is None else crossings.get(arm.method)

    body = " ".join(_arm_sentence(a, base, group, scale, cross(a)) for a in others) or "only the reference ran."
    noise = noise_text(group)
    return head + body + (f" {noise}" if noise else "")


def reading_lines(comparison: Comparison) -> list[str]:
    """The closing section of a report: one paragraph per table (the quickstart has one)."""
    paragraphs = [reading(g) for g in comparison.groups] or [
        "In plain words: no run finished, so there is nothing to read yet."
    ]
    lines = ["## Reading", ""]
    for p in paragraphs:
        lines += [p, ""]
    return lines[:-1]
