"""The original study's figures beside ours, only where they are comparable.

The study's numbers (`configs/study/study_numbers.yaml`) are single runs at its own scale. Two of
its figures can sit beside ours: its gap (an arm against the study's own reference run, in % of
it, signed like ours: + = worse), which is unit-free; and its value, only in the units ours is in
(a perplexity only for the same tokenizer: per-token perplexities of two tokenizers are different
units; accuracies are percent either way). Anything else is labelled not comparable, never placed
side by side.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from oelm.reports import stats
from oelm.reports.aggregate import Arm, Group
from oelm.reports.tables import NA, fmt_gap, fmt_pct, fmt_summary, fmt_verdict, md_table, pct_scale, text_table

TOKENIZERS = {"gpt2": "GPT-2 BPE", "byte": "byte-level"}
SECTION = "Beside the original study"


def tokenizer_label(name: str | None) -> str:
    """'GPT-2 BPE', 'byte-level', or the recorded name."""
    return TOKENIZERS.get(name or "", name or "unknown")


@dataclass(frozen=True)
class StudyRow:
    """One arm beside the study's run of the same method."""

    method: str
    study_id: str
    study_run: str  # "GPT-02 (gpt-medium-512, lr 0.001, 100,000 steps)"
    study_value: str  # "4.69 PPL, GPT-2 BPE"
    comparable: bool  # the study's value and ours are in the same units
    ours: str  # our value in those units, or 'not comparable (why)'
    why: str  # why the values are not comparable ('' when they are)
    study_gap: float | None  # % of the study's reference (+ = worse); None for the reference
    reference_id: str | None  # the study's run the gap is taken against
    our_gap: str
    verdict: str
    inside: bool | None  # the study's gap lies inside our paired 95% interval

    def to_dict(self) -> dict[str, Any]:
        """The row for report.json."""
        return asdict(self)


def _our_tokenizer(arm: Arm) -> str | None:
    """The tokenizer every run of the arm recorded, or None (not recorded, or mixed)."""
    names = {r.results.get("tokenizer") for r in arm.runs}
    return names.pop() if len(names) == 1 else None


def _units(entry: dict[str, Any], arm: Arm) -> str:
    """Why the study's value and ours are not in the same units ('' when they are)."""
    if "perplexity" not in str(entry.get("metric", "")).lower():
        return ""
    theirs, ours = entry.get("tokenizer"), _our_tokenizer(arm)
    if theirs is None:
        return "the study's tokenizer is not recorded: perplexity units unknown"
    if ours is None:
        return "our runs did not record their tokenizer: perplexity units unknown"
    if ours != theirs:
        return f"different units: ours is {tokenizer_label(ours)} perplexity, the study's {tokenizer_label(theirs)}"
    return ""


def _study_run(entry: dict[str, Any]) -> str:
    """'GPT-02 (gpt-medium-512, lr 0.001, 100,000 steps)': the study's run and its settings."""
    parts = [str(entry["model"])]
    if entry.get("lr") is not None:
        parts.append(f"lr {float(entry['lr']):g}")
    if entry.get("steps") is not None:
        parts.append(f"{int(entry['steps']):,} steps")
    if entry.get("epochs") is not None:
        parts.append(f"{entry['epochs']} epochs")
    return f"{entry['id']} ({', '.join(parts)})"


def _study_value(entry: dict[str, Any]) -> str:
    """'4.69 PPL, GPT-2 BPE' or '85.7 % (best validation accuracy)'."""
    unit = str(entry.get("unit", "")).strip()
    text = f"{entry['value']} {unit}".strip() if unit != "%" else f"{entry['value']}%"
    if entry.get("tokenizer"):
        text += f", {tokenizer_label(entry['tokenizer'])}"
    if "perplexity" not in str(entry["metric"]).lower():
        text += f" ({entry['metric']})"
    return text


def study_rows(group: Group) -> list[StudyRow]:
    """The table's arms that the study also ran, each beside the study's run."""
    ref = next((a for a in group.arms if a.method == group.baseline), None)
    ref_entry = ref.study if ref is not None else None
    scale = pct_scale(group)
    rows = []
    for arm in group.arms:
        entry = arm.study
        if not entry:
            continue
        why = _units(entry, arm)
        ours = f"not comparable ({why})"
        if not why:
            ours = fmt_summary(arm.primary, scale) + (" %" if scale == 100.0 else "")
            if tok := _our_tokenizer(arm):
                ours += f", {tokenizer_label(tok)}"
        gap = None
        if arm is not ref and ref_entry and float(ref_entry["value"]) != 0:
            gap = stats.relative_gap(float(entry["value"]), float(ref_entry["value"]), group.higher_is_better)
        paired = group.versus_of(arm.method).gap_paired if arm is not ref else None
        inside = None
        if gap is not None and paired is not None and paired.ci_low is not None and math.isfinite(gap):
            inside = paired.ci_low <= gap <= paired.ci_high
        rows.append(
            StudyRow(
                method=arm.method,
                study_id=str(entry["id"]),
                study_run=_study_run(entry),
                study_value=_study_value(entry),
                comparable=not why,
                ours=ours,
                why=why,
                study_gap=gap,
                reference_id=None if ref_entry is None or arm is ref else str(ref_entry["id"]),
                our_gap=fmt_gap(arm, group),
                verdict=fmt_verdict(arm, group),
                inside=inside,
            )
        )
    return rows


def _study_gap(row: StudyRow) -> str:
    if row.reference_id is None:
        return "0 (reference)" if row.study_gap is None and row.verdict == "reference" else NA
    return f"{fmt_pct(row.study_gap)} ({row.study_id} vs {row.reference_id})"


def _inside(row: StudyRow) -> str:
    if row.inside is None:
        return "—" if row.verdict == "reference" else NA
    return "yes" if row.inside else "no"


INTRO = (
    "The study's figures (its reports, as copied into the `--study-numbers` file) are single runs at its own scale, one fixed learning rate per arm, "
    "not computed here. Set beside ours: its gap (each arm against the study's own reference run, % of "
    "it, + = worse, like ours) and our gap with our verdict; its value sits beside ours only in the same "
    "units (a perplexity only for the same tokenizer)."
)


def study_section(group: Group) -> list[str]:
    """report.md's section: the study's runs beside ours (empty when the study ran none of the arms)."""
    rows = study_rows(group)
    if not rows:
        return []
    head = [
        "method",
        "study's run (single run)",
        "study's value",
        "ours, in the same units",
        "study's gap vs its reference (+ = worse)",
        "our mean per-seed gap [paired 95% CI]",
        "our verdict",
        "study's gap inside our interval",
    ]
    body = [
        [r.method, r.study_run, r.study_value, r.ours, _study_gap(r), r.our_gap, r.verdict, _inside(r)] for r in rows
    ]
    return [f"### {SECTION}", "", INTRO, "", *md_table(head, body), ""]


def study_summary(group: Group) -> list[str]:
    """Terminal lines: the study's gap beside ours and the verdict, then its values where comparable."""
    rows = study_rows(group)
    if not rows:
        return []
    head = ["method", "study's gap\n(+ = worse)", "our gap\n[paired 95% CI]", "our verdict"]
    body = [[r.method, _study_gap(r), r.our_gap, r.verdict.split(" (")[0]] for r in rows]
    lines = ["beside the study (its single runs at its own scale):", *text_table(head, body, align="llll")]
    lines += [f"  {r.method}: study {r.study_value} ({r.study_id}); ours {r.ours}" for r in rows if r.comparable]
    for why in dict.fromkeys(r.why for r in rows if not r.comparable):
        values = "; ".join(f"{r.study_id} {r.study_value}" for r in rows if r.why == why)
        lines.append(f"  the study's values ({values}) are not comparable with ours ({why})")
    return lines
