"""Rewrite the generated parts of docs/results/README.md (and README.md) from the stored records.

Every number inside a generated block is read from a report.json (written by `oelm report`,
`oelm sweep`, `oelm compare`) or a leaderboard.json (`oelm report --view board`) committed under docs/,
and formatted by oelm's own report formatters (`oelm.reports.tables`). The prose around the
blocks, and rows with no stored record, are hand-kept and say so.

    python scripts/results_tables.py            # rewrite the generated blocks in place
    python scripts/results_tables.py --check    # exit 1, naming the stale blocks, if a file is not current

A generated block is an opening comment, the text generated from it, and a closing comment:

    <!-- generated: KIND ARGS
    optional template (for KIND template)
    -->
    ...generated text: replaced on every run, never edit it by hand...
    <!-- /generated -->

KIND is one of
    template NAME    the template inside the comment, every {{RECORD [METHOD] FIELD}} filled in
    arms RECORD      one table per dataset of a report.json: every method at its chosen LR
    board RECORD     the ranking of a leaderboard.json, with its verdict
    reading RECORD   the plain-language paragraph(s) stored in a report.json
    records          an index of every report.json / leaderboard*.json under the file's folder
    ladder RECORD    the declared trend test of a ladder.json, a row per tested line, with the
                     scaling fit over size where the line has one

RECORD is a path relative to the markdown file's folder: a folder (meaning its report.json) or a
.json file, optionally with #DATASET to pick one table of a record holding several. FIELD, for a
METHOD of that table: metric (mean ± 95% CI over seeds), mean, gap (paired interval), p (raw and
Holm-adjusted with the number of comparisons m), verdict (worse / better (resolved), equivalent
within ±margin, unresolved (smallest detectable gap X at 80% power)), tost (the equivalence test),
mde (minimum detectable gap of the Holm-adjusted test), detectable (its number alone), eqpower (the
Holm-adjusted TOST's power at a true gap of 0), bound (the one-sided 95% upper bound of the gap), pair (its
declared primary comparison: gap, interval, other arm, verdict), needed (seeds
to detect the observed gap), points (accuracy difference), crossing (validation curves), lr, seeds,
ratio (step time), saving (theoretical FLOP saving), share (of the reference's saving, boards
only), state / comm (optimizer-state and all-reduce savings, boards only), twin (the gap to the
method's same-init trainable twin with its verdict, as the board computed it), noise / pairednoise (test-set noise over seed noise). Without METHOD: link, title,
reference (the arm every method of the table is compared with).

Nothing is computed here: every statistic (paired tests, Holm adjustment, equivalence tests,
verdicts) is the one `oelm report` / `oelm report --view board` stored, computed from the committed run
records (scripts/regenerate_results.py rebuilds those JSON files first).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from oelm.reports.aggregate import Arm, Group, Noise, Versus
from oelm.reports.comparison import read_page
from oelm.reports.stats import MARGIN, Decision, ItemsInterval, PairedTest, Power, Summary, summary_upper_bound
from oelm.reports.tables import (
    NA,
    fmt_gap,
    fmt_mde,
    fmt_num,
    fmt_p,
    fmt_paired_mean,
    fmt_saving,
    fmt_spec,
    fmt_summary,
    fmt_tost,
    fmt_verdict,
    fmt_versus_gap,
    md_table,
    pct_scale,
    verdict_text,
)
from oelm.utils.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = (
    "docs/results/README.md",
    "README.md",
    "docs/results/twin-board/README.md",
    "docs/results/twin-decisive/README.md",
    "docs/results/ladder/README.md",
    "docs/results/scale/README.md",
    "docs/results/scale-ladder/README.md",
    "docs/results/claims-ledger.md",
    "docs/results/regime-search/README.md",
)
CLOSE = "<!-- /generated -->"
BLOCK = re.compile(
    r"(?P<open><!-- generated: (?P<head>[^\n]*?)[ \t]*(?:-->|\n(?P<template>.*?)\n-->))\n"
    r"(?P<body>.*?)" + re.escape(CLOSE),
    re.S,
)
PLACEHOLDER = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")


class DocError(Exception):
    """A block or placeholder that cannot be filled (named in the message)."""


# ---------------------------------------------------------------- reading the stored records


def _summary(d: dict | None) -> Summary | None:
    """A stats.Summary from its to_dict() form."""
    if d is None:
        return None
    return Summary(d["n"], d.get("mean"), d.get("std"), d.get("ci_low"), d.get("ci_high"))


def _noise_record(d: dict | None) -> Noise | None:
    """An aggregate.Noise from report.json (which adds the derived ratio)."""
    return None if d is None else Noise(**{k: v for k, v in d.items() if k != "ratio"})


def _arm(d: dict) -> Arm:
    """An aggregate.Arm (the method's summary) from one arm of report.json or one entry of leaderboard.json."""
    return Arm(
        method=d["method"],
        lr=d.get("lr"),
        setting=d.get("setting"),
        cells=[],
        runs=[],
        primary=_summary(d["primary"]),
        by_seed={int(k): v for k, v in d.get("by_seed", {}).items()},
        step_time=Summary(1, d.get("mean_step_time"), None, None, None),
        tokens_per_second=Summary(1, d.get("tokens_per_second"), None, None, None),
        trainable_params=d.get("trainable_params"),
        frozen_params=d.get("frozen_params"),
        theoretical_saving=d.get("theoretical_saving"),
        noise=_noise_record(d.get("noise")),
        study=d.get("study"),
    )


def _versus(d: dict, reference: str | None) -> Versus:
    """An aggregate.Versus (the method against the table's reference) from the same stored arm or entry."""
    test, power = d.get("paired_test"), d.get("power")
    ratio = d.get("step_time_ratio")
    if isinstance(ratio, dict):  # leaderboard.json stores the ratio as a summary over seeds
        ratio = ratio.get("mean")
    return Versus(
        reference,
        gap=d.get("gap_percent"),
        gap_paired=_summary(d.get("gap_paired")),
        delta=d.get("delta"),
        test=PairedTest(**{**test, "seeds": tuple(test["seeds"])}) if test else None,
        power=Power(**power) if power else None,
        paired_noise=_noise_record(d.get("paired_noise")),
        step_time_ratio=ratio,
        gap_items=ItemsInterval(**d["gap_seeds_items"]) if d.get("gap_seeds_items") else None,
        decision=Decision(**d["decision"]) if d.get("decision") else None,
    )


@dataclass
class Table:
    """One dataset table of a record: the aggregate.Group plus what only the JSON keeps."""

    group: Group
    raw: dict  # the group (report.json) or table (leaderboard.json) as stored
    entries: dict[str, dict] = field(default_factory=dict)  # method -> its stored arm or entry

    def arm(self, method: str, where: str) -> Arm:
        """The arm of `method`, or an error naming the methods there are."""
        for a in self.group.arms:
            if a.method == method:
                return a
        have = ", ".join(a.method for a in self.group.arms)
        raise DocError(f"{where}: no method {method!r} in {self.group.title} (methods: {have})")

    @property
    def base(self) -> Arm | None:
        """The baseline's arm, where the table has one."""
        return next((a for a in self.group.arms if a.method == self.group.baseline), None)


@dataclass
class Record:
    """A stored report.json or leaderboard.json."""

    path: Path
    kind: str  # "report" or "leaderboard"
    tables: list[Table]
    raw: dict  # the page's sections
    command: str  # the command that wrote it ("" where a run wrote it)

    def table(self, dataset: str | None, where: str) -> Table:
        """The table of `dataset` (None: the only table)."""
        if dataset is None:
            if len(self.tables) != 1:
                names = ", ".join(t.group.dataset for t in self.tables)
                raise DocError(f"{where}: {self.path.name} holds {len(self.tables)} tables; add #DATASET ({names})")
            return self.tables[0]
        for t in self.tables:
            if t.group.dataset == dataset:
                return t
        raise DocError(f"{where}: no table for dataset {dataset!r} in {self.path}")


def load_record(path: Path) -> Record:
    """Read a report.json or leaderboard.json into oelm's own report objects."""
    try:
        page = read_page(path)
    except UserError as e:
        raise DocError(str(e)) from e
    if page["view"] not in ("report", "board"):
        raise DocError(f"{path}: a {page['view']!r} page; a block reads a report.json or a leaderboard.json")
    raw = page["sections"]
    leaderboard = page["view"] == "board"
    tables = []
    for g in raw["tables"] if leaderboard else raw["groups"]:
        entries = g["ranked"] + g["incomplete"] if leaderboard else g["arms"]
        fields = {
            "task": g["task"],
            "dataset": g["dataset"],
            "model": g["model"],
            "primary_metric": g["primary_metric"],
            "selection_metric": g.get("selection_metric", ""),
            "baseline": g.get("reference", g.get("baseline")),
            "direction": g.get("higher_is_better"),
        }
        group = Group(
            arms=[_arm(e) for e in entries],
            warnings=list(g.get("warnings", [])),
            margin=float(g.get("margin_percent", raw.get("margin_percent", MARGIN))),
            versus={e["method"]: _versus(e, fields["baseline"]) for e in entries},
            primary=tuple((str(a), str(b)) for a, b in g.get("primary") or []),
            **fields,
        )
        tables.append(Table(group, g, {e["method"]: e for e in entries}))
    return Record(path, "leaderboard" if leaderboard else "report", tables, raw, page["command"] or "")


class Records:
    """Records by their spec (`folder`, `file.json`, `folder#DATASET`), read once."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._cache: dict[Path, Record] = {}

    def get(self, spec: str, where: str) -> tuple[Record, Table | None, str]:
        """(record, its table when #DATASET was given or it has one, the path as written)."""
        rel, _, dataset = spec.partition("#")
        path = self.base / rel
        if path.is_dir():
            path = path / "report.json"
        if not path.is_file():
            raise DocError(f"{where}: no stored record at {rel!r} (looked for {path.name} under the records folder)")
        if path not in self._cache:
            self._cache[path] = load_record(path)
        record = self._cache[path]
        table = record.table(dataset or None, where) if dataset or len(record.tables) == 1 else None
        link = rel if rel.endswith(".json") else f"{rel.rstrip('/')}/report.json"
        return record, table, link


# ---------------------------------------------------------------- fields of one method


def _p(arm: Arm, table: Table) -> str:
    """'p = 0.0328, Holm p = 0.0656 (m = 2)' (fmt_p: the paired t-test of the per-seed gaps)."""
    return fmt_p(arm, table.group)


def _points(arm: Arm, table: Table) -> str:
    """Difference of the means in the metric's own units (accuracy points)."""
    base = table.base
    if base is None or arm.primary.mean is None or base.primary.mean is None:
        return NA
    diff = (arm.primary.mean - base.primary.mean) * pct_scale(table.group)
    return f"{diff:+.2f} points"


def _crossing(arm: Arm, table: Table) -> str:
    """Where the mean validation curves last crossed the baseline's (as report.json stores it)."""
    c = table.raw.get("crossings", {}).get(arm.method)
    if not c:
        return "no crossing of the validation curves"
    early, late = ("behind", "ahead") if c["ahead_at_end"] else ("ahead", "behind")
    return f"{early} on validation until step {c['last_other']:,}, {late} from step {c['first_final']:,}"


def _ratio(arm: Arm, table: Table) -> str:
    """Measured step time over the baseline's."""
    ratio = table.group.versus_of(arm.method).step_time_ratio
    return NA if ratio is None else f"{ratio:.2f}x"


def _share(arm: Arm, table: Table) -> str:
    """Share of the reference method's saving that this method keeps (leaderboards)."""
    share = table.entries[arm.method].get("saving_share")
    return NA if share is None else f"{share * 100:.0f}%"


def _entry_pct(key: str) -> Callable[[Arm, Table], str]:
    """A saving fraction a leaderboard stored for the method (optimizer state, all-reduce), in %."""

    def fmt(arm: Arm, table: Table) -> str:
        value = table.entries[arm.method].get(key)
        return NA if value is None else f"{value * 100:.2f}%"

    return fmt


def _twin(arm: Arm, table: Table) -> str:
    """The paired gap to the method's same-init trainable twin and its verdict, as the board computed them."""
    e = table.entries[arm.method]
    gap = e.get("twin_gap") or {}
    if e.get("twin") is None or gap.get("mean") is None:
        return NA
    ci = f" [{gap['ci_low']:+.2f}, {gap['ci_high']:+.2f}]" if gap.get("ci_low") is not None else ""
    return f"{gap['mean']:+.2f}%{ci} vs {e['twin']}: {e.get('twin_verdict')}"


def _noise(noise: Noise | None) -> str:
    """Test-set noise over seed noise (per arm, or of the paired gap)."""
    return NA if noise is None or noise.ratio is None else f"{noise.ratio:.2g}"


def _gap(arm: Arm, table: Table) -> str:
    """The gap with the interval its page reports: seeds x test examples for classifiers that
    stored per-example correctness (the page labels it), else the paired-by-seed interval."""
    vs = table.group.versus_of(arm.method)
    if arm.method != table.group.baseline and vs.mean_seed_gap is not None and vs.gap_items is not None:
        return fmt_versus_gap(vs, vs.gap_items)
    return fmt_gap(arm, table.group)


def _bound(arm: Arm, table: Table) -> str:
    """'+4.12%': the one-sided 95% upper bound of the mean per-seed gap (the cost is below it)."""
    gaps = table.group.versus_of(arm.method).gap_paired
    bound = None if gaps is None else summary_upper_bound(gaps)
    return NA if bound is None else f"{bound:+.2f}%"


def _pair(arm: Arm, table: Table) -> str:
    """The method's declared primary comparison (recomputed from the per-seed values, Holm over the
    primary family): 'gap [CI] vs OTHER: verdict'; n/a where the method is in no primary pair."""
    found = [(pair, vs) for pair, vs in table.group.primary_versus.items() if pair[0] == arm.method]
    if not found:
        return NA
    (_, other), vs = found[0]
    return f"{fmt_paired_mean(vs)} vs {other}: {verdict_text(vs.decision)}"


def _decision(arm: Arm, table: Table) -> Decision | None:
    """The verdict of the method against the table's reference (its mde is the Holm-level one)."""
    return table.group.versus_of(arm.method).decision


def _power(arm: Arm, table: Table) -> Power | None:
    """The power analysis of the method's paired gap to the table's reference."""
    return table.group.versus_of(arm.method).power


FIELDS: dict[str, Callable[[Arm, Table], str]] = {
    "metric": lambda a, t: fmt_summary(a.primary, pct_scale(t.group)),
    "mean": lambda a, t: fmt_num(None if a.primary.mean is None else a.primary.mean * pct_scale(t.group)),
    "gap": _gap,
    "p": _p,
    "verdict": lambda a, t: fmt_verdict(a, t.group),
    "tost": lambda a, t: fmt_tost(a, t.group),
    "mde": lambda a, t: fmt_mde(a, t.group),
    "bound": _bound,
    "pair": _pair,
    "eqpower": lambda a, t: NA if (d := _decision(a, t)) is None or d.tost_power is None else f"{d.tost_power:.0%}",
    "detectable": lambda a, t: NA if (d := _decision(a, t)) is None or d.mde is None else f"{d.mde:.2f}%",
    "needed": lambda a, t: (
        NA if (pw := _power(a, t)) is None or pw.seeds_for_observed is None else str(pw.seeds_for_observed)
    ),
    "points": _points,
    "crossing": _crossing,
    "lr": lambda a, t: NA if a.lr is None else f"{a.lr:g}",
    "seeds": lambda a, t: str(a.primary.n),
    "ratio": _ratio,
    "saving": lambda a, t: fmt_saving(a.theoretical_saving),
    "share": _share,
    "state": _entry_pct("optimizer_state_saving"),
    "comm": _entry_pct("allreduce_saving"),
    "twin": _twin,
    "noise": lambda a, t: _noise(a.noise),
    "pairednoise": lambda a, t: _noise(t.group.versus_of(a.method).paired_noise),
}


def fill(template: str, records: Records, where: str) -> str:
    """Replace every {{RECORD [METHOD] FIELD}} of `template`."""

    def one(m: re.Match) -> str:
        parts = m.group(1).split()
        here = f"{where}: {{{{{m.group(1)}}}}}"
        if len(parts) == 2:
            record, table, link = records.get(parts[0], here)
            if parts[1] == "link":
                return link
            if parts[1] == "title" and table is not None:
                return table.group.title
            if parts[1] == "reference" and table is not None:
                return str(table.group.baseline)
            raise DocError(f"{here}: a record-level field is link, title or reference (those two need one table)")
        if len(parts) != 3:
            raise DocError(f"{here}: expected {{{{RECORD METHOD FIELD}}}} or {{{{RECORD link}}}}")
        spec, method, name = parts
        if name not in FIELDS:
            raise DocError(f"{here}: unknown field {name!r} (fields: {', '.join(FIELDS)})")
        record, table, _ = records.get(spec, here)
        if table is None:
            table = record.table(None, here)
        return FIELDS[name](table.arm(method, here), table)

    return PLACEHOLDER.sub(one, template)


# ---------------------------------------------------------------- whole blocks


ARMS_HEADER = [
    "method",
    "LR (chosen on val)",
    "{metric} ± 95% CI (n)",
    "mean per-seed gap % [paired 95% CI] (+ = worse)",
    "p, Holm p (m comparisons)",
    "verdict",
    "min. detectable gap",
    "step time vs baseline",
    "FLOP saving",
]
BOARD_HEADER = [
    "rank",
    "method",
    "{metric} ± 95% CI (n)",
    "mean per-seed gap % [paired 95% CI]",
    "p, Holm p (m comparisons)",
    "verdict",
    "saving kept",
    "misses",
]


def _header(columns: Sequence[str], group: Group) -> list[str]:
    """Column titles naming the table's metric."""
    return [c.format(metric=group.primary_metric) for c in columns]


def arms_block(spec: str, records: Records, where: str) -> str:
    """Every table of a report.json: each method at its LR chosen on validation."""
    record, _, link = records.get(spec, where)
    out = []
    for t in record.tables:
        g = t.group
        rows = [
            [
                a.method,
                FIELDS["lr"](a, t),
                FIELDS["metric"](a, t),
                fmt_gap(a, g),
                fmt_p(a, g),
                fmt_verdict(a, g),
                fmt_mde(a, g),
                _ratio(a, t),
                fmt_saving(a.theoretical_saving),
            ]
            for a in g.arms
        ]
        out += [f"**{g.title}**, {g.primary_metric} (from [{link}]({link})), {_reference(t)}:", ""]
        out += [*md_table(_header(ARMS_HEADER, g), rows), ""]
    return "\n".join(out).rstrip()


def _reference(t: Table) -> str:
    """Which arm the table compares with, how it was chosen, and the Holm family's size."""
    g = t.group
    rule = t.raw.get("reference_rule") or "the record's --baseline"
    return (
        f"reference **{g.baseline}** ({rule}; m = {g.comparisons} comparison{'s' if g.comparisons != 1 else ''}, "
        "Holm-adjusted; "
        f"equivalence margin ±{g.margin:g}%)"
    )


def board_block(spec: str, records: Records, where: str) -> str:
    """The ranking of a leaderboard.json, with its verdict."""
    record, _, link = records.get(spec, where)
    if record.kind != "leaderboard":
        raise DocError(f"{where}: {link} is not a leaderboard.json")
    out = []
    for t in record.tables:
        g = t.group
        rows = []
        for a in g.arms:
            e = t.entries[a.method]
            misses = "meets the target" if e.get("meets_target") else "; ".join(e.get("misses") or []) or "—"
            rank = "incomplete" if e.get("incomplete") else str(e.get("rank", ""))
            cells = [FIELDS["metric"](a, t), fmt_gap(a, g), fmt_p(a, g), fmt_verdict(a, g), _share(a, t), misses]
            rows.append([rank, a.method, *cells])
        command = record.command
        out += [f"**{g.title}**, {g.primary_metric} (from [{link}]({link}); `{command}`), {_reference(t)}:", ""]
        out += [*md_table(_header(BOARD_HEADER, g), rows), "", str(t.raw.get("verdict", "")).strip(), ""]
    return "\n".join(out).rstrip()


def reading_block(spec: str, records: Records, where: str) -> str:
    """The plain-language paragraph(s) `oelm report` stored with the record."""
    record, table, _ = records.get(spec, where)
    tables = [table] if table is not None else record.tables
    if not all(t.raw.get("reading") for t in tables):
        raise DocError(f"{where}: {spec} stores no reading (written by a version of oelm report before it had one)")
    return "\n\n".join(t.raw["reading"] for t in tables)


def records_block(records: Records) -> str:
    """An index of every stored record under the records folder, with the README beside it."""
    paths = sorted(p for pat in ("report.json", "leaderboard*.json") for p in records.base.rglob(pat))
    rows = []
    for path in paths:
        rel = path.relative_to(records.base).as_posix()
        record, _, _ = records.get(rel, "records")
        beside = [path.with_suffix(".md")]  # what the same command wrote for reading
        if path.parent != records.base:
            beside.append(path.parent / "README.md")  # which command, spec and machine
        links = [f"[{p.name}]({p.relative_to(records.base).as_posix()})" for p in beside if p.is_file()]
        about = ", ".join(links) or NA
        for t in record.tables:
            base = t.base
            seeds = str(base.primary.n) if base is not None else NA
            rows.append([f"[{rel}]({rel})", about, t.group.title, str(len(t.group.arms)), seeds])
    return "\n".join(md_table(["record", "to read", "table", "methods", "seeds (baseline)"], rows))


LADDER_HEADER = [
    "family",
    "method vs control",
    "over",
    "rungs",
    "slope, % per decade [95% CI]",
    "verdict (Holm)",
    "refits without one rung keeping it",
    "parameters to match at the top rung [95% CI]",
    "fitted gap at 124M parameters [95% CI]",
    "fitted gap falls to 1% at",
]


def _fit_cells(fit: dict | None) -> list[str]:
    """The fit's multiplier, extrapolated gap and where that gap falls to 1%, as ladder.md prints them
    (3 significant digits; a fit stores no crossing (JSON null for inf) when none is below 10^12)."""
    if fit is None or fit.get("multiplier") is None:
        return [NA, NA, NA]

    def g(key: str, spec: str = ".3g") -> str:
        return fmt_spec(fit.get(key), spec)

    return [
        f"{g('multiplier')}x [{g('multiplier_low')}, {g('multiplier_high')}] at {fit['at']:,}",
        f"{g('predicted_gap', '+.3g')}% [{g('predicted_low', '+.3g')}, {g('predicted_high', '+.3g')}]",
        "not below 10^12 parameters" if fit.get("reach_1pct") is None else f"{g('reach_1pct')} parameters",
    ]


def ladder_block(spec: str, records: Records, where: str) -> str:
    """The declared trend test of a ladder.json: one row per tested line (a slope with an interval),
    each size line beside its scaling fit. Every number is the one ladder.md prints."""
    path = records.base / spec
    path = path / "ladder.json" if path.is_dir() else path
    try:
        page = read_page(path, "ladder")
    except UserError as e:
        raise DocError(f"{where}: {e}") from e
    data = page["sections"]
    twins = {(s["architecture"], s["method"]): s["twin"] for s in data["steps"]}
    fits = {(f["architecture"], f["method"], f["held"]): f for f in data["pair_fits"]}
    rows = []
    for t in sorted(
        data["trends"], key=lambda t: (t["architecture"], t["axis"] != "parameters", t["held"], t["method"])
    ):
        if t.get("slope") is None:
            continue  # too few weighed rungs: no test
        size = t["axis"] == "parameters"
        over = f"{'size' if size else 'data'} at {t['held']}"
        slope = f"{t['slope']:+.2f} [{t['slope_low']:+.2f}, {t['slope_high']:+.2f}]"
        keeps = t.get("loo_holds") or NA
        fit = fits.get((t["architecture"], t["method"], t["held"])) if size else None
        twin = twins.get((t["architecture"], t["method"]), NA)
        row = [t["architecture"], f"{t['method']} vs {twin}", over, str(t["rungs"]), slope, t["verdict"], keeps]
        rows.append(row + _fit_cells(fit))
    if not rows:
        raise DocError(f"{where}: {spec} holds no tested trend line")
    return "\n".join(md_table(LADDER_HEADER, rows))


def render_block(m: re.Match, records: Records, where: str) -> str:
    """The generated text of one block."""
    kind, _, args = m.group("head").strip().partition(" ")
    args = args.strip()
    where = f"{where} (block '{m.group('head').strip()}')"
    template = m.group("template")
    if kind == "template":
        if template is None:
            raise DocError(f"{where}: a template block needs its template inside the comment")
        return fill(template, records, where)
    if template is not None:
        raise DocError(f"{where}: only a template block has a body inside its comment")
    blocks = {"arms": arms_block, "board": board_block, "reading": reading_block, "ladder": ladder_block}
    if kind in blocks:
        if not args:
            raise DocError(f"{where}: name the record (a folder or .json file)")
        return blocks[kind](args, records, where)
    if kind == "records":
        return records_block(records)
    raise DocError(f"{where}: unknown block kind {kind!r} (template, arms, board, reading, records, ladder)")


def render_text(text: str, base: Path, where: str = "file") -> tuple[str, list[str]]:
    """The text with every generated block rewritten, and the heads of the blocks that changed."""
    records = Records(base)
    changed: list[str] = []

    def one(m: re.Match) -> str:
        body = "\n" + render_block(m, records, where).strip("\n") + "\n\n"
        if body != m.group("body"):
            changed.append(m.group("head").strip())
        return m.group("open") + "\n" + body + CLOSE

    new = BLOCK.sub(one, text)
    opened = text.count("<!-- generated:")
    if opened != len(BLOCK.findall(text)):
        raise DocError(f"{where}: {opened} '<!-- generated:' comments but not as many closed by '{CLOSE}'")
    return new, changed


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite (or with --check, verify) the generated blocks; 0 current, 1 stale, 2 error."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help=f"markdown files (default: {', '.join(DEFAULT_FILES)})")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is stale")
    parser.add_argument("--records", type=Path, help="resolve RECORD paths here instead of in each file's folder")
    args = parser.parse_args(argv)
    files = [Path(f) for f in args.files] or [ROOT / f for f in DEFAULT_FILES]
    stale = 0
    for path in files:
        try:
            text = path.read_text()
            new, changed = render_text(text, args.records or path.parent, where=path.name)
        except (OSError, DocError, KeyError, ValueError) as err:
            print(f"results_tables: error: {err}", file=sys.stderr)
            return 2
        shown = os.path.relpath(path)  # messages name the file as the user would
        if not changed:
            continue
        stale += 1
        if args.check:
            print(f"{shown}: stale generated blocks: {', '.join(changed)} (run python scripts/results_tables.py)")
        else:
            path.write_text(new)
            print(f"{shown}: rewrote {', '.join(changed)}")
    if args.check and not stale:
        print("generated blocks are current")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
