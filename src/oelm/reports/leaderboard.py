"""`oelm report --view board`: the boards of `oelm.reports.board` written out as leaderboard.md,
leaderboard.json and pareto.png.

Every cell comes from `oelm.reports.tables`; how to read the board is docs/reading.md#leaderboard,
which leaderboard.md names. Deterministic: no timestamps, sorted output, the command that
regenerates it first.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oelm.records.plan import ConfirmationPlan
from oelm.records.sweep import confirmation_plan, declared_margin
from oelm.reports import stats
from oelm.reports.aggregate import BASELINE, require_arm
from oelm.reports.board import REFERENCE, TARGET, Board, Entry, Target, build
from oelm.reports.comparison import page_json
from oelm.reports.reading import READING_PAGE, how_to_read
from oelm.reports.tables import (
    CONFIRM_PLAN,
    GAP_NAME,
    NA,
    bits_per_byte,
    bits_per_byte_head,
    bits_per_byte_key,
    family_lines,
    fmt_bits_per_byte,
    fmt_fixed,
    fmt_fraction,
    fmt_gap,
    fmt_int,
    fmt_interval,
    fmt_lr,
    fmt_mde,
    fmt_p,
    fmt_pct,
    fmt_sensitivity,
    fmt_summary,
    fmt_unstable,
    fmt_verdict,
    md_table,
    pct_scale,
    pilot_text,
    primary_table,
    protocol_lines,
    verdict_text,
)
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_bytes, atomic_write_json, atomic_write_text, writable_dir


def command_line(
    paths: Sequence[str | Path],
    out: str | Path,
    baseline: str | None,
    seeds: Sequence[int] | None = None,
    margin: float = stats.MARGIN,
) -> str:
    """The exact command that regenerates the leaderboard (paths relative to here when inside)."""

    def rel(p: str | Path) -> str:
        text = str(p)
        if os.path.isabs(text):
            rel_text = os.path.relpath(text)  # a committed report names no absolute path
            return text if rel_text.startswith("..") else rel_text
        return text

    parts = ["oelm", "report", "--view", "board", *(rel(p) for p in paths), "--out", rel(out)]
    if baseline:
        parts += ["--baseline", baseline]
    if seeds is not None:
        parts += ["--seeds", *(str(s) for s in seeds)]
    if margin != stats.MARGIN:
        parts += ["--margin", f"{margin:g}"]
    return " ".join(parts)


def _twin_cell(e: Entry) -> str:
    """Paired gap to the trainable twin with its interval and verdict, or —."""
    s = e.twin_gap
    if s is None or s.mean is None:
        return "—"
    return f"vs {e.twin}: {fmt_pct(s.mean)}{fmt_interval(s)}: {verdict_text(e.twin_decision)}"


def _params(e: Entry) -> str:
    """Trainable / frozen / added parameters."""
    return f"{fmt_int(e.arm.trainable_params)} / {fmt_int(e.arm.frozen_params)} / {fmt_int(e.added_params)}"


def _table(board: Board) -> list[str]:
    """Markdown rows of the ranked table."""
    g = board.group
    scale = pct_scale(g)
    direction = "higher" if g.higher_is_better else "lower"
    bpb = bits_per_byte_key(g)  # LM boards: bits per byte beside the perplexity
    head = [
        "rank",
        "method",
        "lr (chosen on val)",
        f"{g.primary_metric}: mean ± 95% CI (n seeds), {direction} is better",
        *([bits_per_byte_head(bpb)] if bpb else []),
        f"{GAP_NAME} vs {g.baseline or BASELINE} (%, + = worse) [paired 95% CI]",
        "p (paired t), Holm-adjusted",
        f"verdict vs {g.baseline or BASELINE}",
        "min. detectable gap",
        "unstable runs (chosen lr; all LRs)",
        "LR sensitivity",
    ]
    if board.twin:
        head.append(f"{GAP_NAME} vs its same-init trainable twin [paired 95% CI]: verdict")
    head += [
        "trainable / frozen / added params",
        "saving: training FLOPs",
        f"share of {REFERENCE}'s FLOP saving",
        "saving: optimizer state",
        "saving: bytes all-reduced per step",
        f"step-time ratio vs {g.baseline or BASELINE} (indicative)",
        "target",
    ]
    rows = []
    for e in board.ranked:
        is_base = e.method == g.baseline
        target = "—" if is_base else ("**meets**" if e.meets else "no")
        rows.append(
            [
                str(e.rank),
                e.method,
                fmt_lr(e.arm.lr),
                fmt_summary(e.arm.primary, scale),
                *([fmt_bits_per_byte(e.arm, bpb)] if bpb else []),
                fmt_gap(e.arm, g),
                fmt_p(e.arm, g) if not is_base else "—",
                fmt_verdict(e.arm, g),
                fmt_mde(e.arm, g, with_n=False),
                fmt_unstable(e.arm),
                fmt_sensitivity(e.arm),
                *([_twin_cell(e)] if board.twin else []),
                _params(e),
                fmt_fraction(e.saving),
                fmt_fraction(e.share, 0),
                fmt_fraction(e.state_saving),
                fmt_fraction(e.comm_saving),
                fmt_fixed(e.step_ratio, 2),
                target,
            ]
        )
    return md_table(head, rows)


def _unranked(board: Board, not_started: Sequence[str]) -> list[str]:
    """Methods listed apart: too few seeds or missing learning rates."""
    if not board.unranked and not not_started:
        return []
    scale = pct_scale(board.group)
    lines = [
        "### Incomplete (listed, not ranked)",
        "",
        "Fewer seeds than the other methods, or settings of the LR grid not finished: their "
        "numbers are not comparable yet.",
        "",
    ]
    rows = [
        [e.method, e.incomplete, fmt_summary(e.arm.primary, scale), fmt_gap(e.arm, board.group)] for e in board.unranked
    ]
    rows += [[m, "planned by the sweep, no finished run", NA, NA] for m in not_started]
    lines += md_table(["method", "why", f"{board.group.primary_metric} so far", f"{GAP_NAME} so far"], rows)
    return lines + [""]


def _pilot_lines(board: Board, confirm: str | ConfirmationPlan) -> list[str]:
    """Each ranked method's verdict as a pilot result: the fresh seeds a confirmation needs. Runs of
    a confirmation (its plan given) are not a pilot: each arm ran at the LR its pilot chose."""
    if isinstance(confirm, ConfirmationPlan):
        seeds = ", ".join(map(str, confirm.seeds))
        return [
            f"Confirmation results: these are the fresh seeds ({seeds}) of the plan `plan.json` (sha256 "
            f"{confirm.sha256[:12]}), fixed before they ran; every arm ran at the LR its pilot "
            f"(`{confirm.pilot.dir}`, seeds {', '.join(map(str, confirm.pilot.seeds))}) chose on validation, "
            "so no LR was chosen on these seeds and each verdict above is a confirmation result "
            "(`confirmation.md` beside the records judges the pilot's claims).",
            "",
        ]
    texts = []
    for e in board.ranked:
        if e.method != board.group.baseline and (t := pilot_text(e.arm, board.group, confirm)):
            texts.append(f"- {e.method}: {t}")
    if not texts:
        return []
    return [
        "Pilot results: these seeds also chose every LR on validation, so each verdict above is a pilot "
        "result; a confirmation on fresh seeds (`oelm confirm`) is sized by two different counts, each "
        "named: the seeds to detect the observed gap (a power estimate from the pilot's paired SD) and "
        "the seeds for 80% power at the margin that `oelm confirm plan` plans (from that SD's upper bound):",
        "",
        *texts,
        "",
    ]


def render(
    boards: Sequence[Board],
    not_started: Sequence[str],
    command: str,
    n_runs: int,
    target: Target = TARGET,
    confirm: str | ConfirmationPlan = CONFIRM_PLAN,
    source: str | None = None,
    pareto: str = "pareto.png",
) -> str:
    """leaderboard.md: the command first, then one ranked table per table of runs.

    `source` replaces the line saying where the numbers come from (a board re-rendered from stored
    JSON says so there); `pareto` is the figure's file name.
    """
    built = (
        f"Built from {n_runs} stored runs (run directories or committed run records) only: their results.json, "
        "timing_stats.json and freeze_audit.json (a committed record, one line of a board's runs.jsonl.gz, holds all three)."
    )
    lines = [
        "# Leaderboard",
        "",
        "Regenerate with:",
        "",
        "```",
        command,
        "```",
        "",
        built if source is None else source,
        "",
        f"**Target:** a variant with a {target.text()}.",
        "",
        how_to_read("leaderboard", f"step-time ratios are indicative only: {READING_PAGE}#step-times"),
        "",
    ]
    if not boards:
        lines += ["No finished runs: nothing to rank.", ""]
        lines += _unranked_only(not_started)
    for i, board in enumerate(boards):
        g = board.group
        lines += [f"## {g.title}: {g.primary_metric}", ""]
        m = g.comparisons
        lines += [
            f"Reference: **{g.baseline}** ({board.reference_rule}); {m} ranked method"
            f"{'s' if m != 1 else ''} compared with it (m = {m}, Holm-adjusted; equivalence margin "
            f"±{g.margin:g}%).",
            "",
            f"Target: {board.verdict}",
            "",
            *protocol_lines(g),
            f"- {family_lines(g)[0]}",
            "",
            *([*primary_table(g), ""] if g.primary_versus else []),
        ]
        if board.warnings:
            lines += [*(f"- **Warning:** {w}" for w in board.warnings), ""]
        lines += [*_table(board), ""]
        lines += _pilot_lines(board, confirm)
        lines += _unranked(board, not_started if i == 0 else [])
        front = ", ".join(board.front) if board.front else NA
        lines += [f"Pareto front (lower gap, higher theoretical saving; ranked methods): {front}.", ""]
        lines += [f"![gap against compute saved]({pareto})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _unranked_only(not_started: Sequence[str]) -> list[str]:
    """Planned methods listed when no table exists."""
    return [f"- {m}: planned by the sweep, no finished run" for m in not_started]


def _summary_json(s: stats.Summary | None) -> dict | None:
    """A Summary as a dict."""
    return None if s is None else s.to_dict()


def _entry_json(e: Entry, bpb: str | None = None) -> dict[str, Any]:
    """One row for leaderboard.json (`bpb`: the results key of bits per byte on an LM board)."""
    a, vs = e.arm, e.versus
    return {
        "rank": e.rank,
        "method": a.method,
        "lr": a.lr,
        "setting": a.setting,
        "primary": a.primary.to_dict(),
        **({"bits_per_byte": {"key": bpb, **bits_per_byte(a, bpb).to_dict()}} if bpb else {}),
        "by_seed": {str(k): v for k, v in sorted(a.by_seed.items())},
        "gap_percent": vs.gap,  # the gap of the means
        "mean_seed_gap_percent": vs.mean_seed_gap,  # the gap the page prints, ranks and checks the target with
        "gap_paired": _summary_json(vs.gap_paired),
        "paired_test": vs.test.to_dict() if vs.test else None,
        "power": vs.power.to_dict() if vs.power else None,
        "decision": vs.decision.to_dict() if vs.decision else None,
        "verdict": None if vs.decision is None else verdict_text(vs.decision),
        "lr_rule": a.lr_rule,
        "lr_sensitivity": a.sensitivity,
        "unstable": dict(zip(("flagged", "finished"), a.unstable_count())),
        "twin_gap": _summary_json(e.twin_gap),
        "twin_decision": e.twin_decision.to_dict() if e.twin_decision else None,
        "twin_verdict": None if e.twin_decision is None else verdict_text(e.twin_decision),
        "trainable_params": a.trainable_params,
        "frozen_params": a.frozen_params,
        "added_params": e.added_params,
        "theoretical_saving": e.saving,
        "saving_share": e.share,
        "optimizer_state_saving": e.state_saving,
        "allreduce_saving": e.comm_saving,
        "twin": e.twin,
        "step_time_ratio": e.step_ratio,
        "meets_target": e.meets,
        "misses": e.misses,
        "incomplete": e.incomplete or None,
    }


def to_json(
    boards: Sequence[Board],
    not_started: Sequence[str],
    command: str,
    target: Target = TARGET,
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """leaderboard.json: the same numbers as the markdown (`provenance`: what a re-rendered board was
    built from, kept for the next re-rendering)."""
    return {
        "command": command,
        **(provenance or {}),
        "target": {
            "max_gap_percent": target.max_gap,
            "max_upper_percent": target.max_upper,
            "min_saving_share": target.min_share,
            "reference": target.reference,
        },
        "tables": [
            {
                "task": b.group.task,
                "dataset": b.group.dataset,
                "model": b.group.model,
                "primary_metric": b.group.primary_metric,
                "higher_is_better": b.group.higher_is_better,
                "baseline": b.group.baseline,
                "reference": b.group.baseline,
                "reference_rule": b.reference_rule,
                "twin": b.twin,
                "margin_percent": b.group.margin,
                "comparisons": b.group.comparisons,
                "lr_rule": b.group.lr_rule,
                "primary": [list(p) for p in b.group.primary],
                "families": b.group.families,
                "verdict": b.verdict,
                "passing": b.passing,
                "closest": b.closest,
                "pareto_front": b.front,
                "warnings": b.warnings,
                "ranked": [_entry_json(e, bits_per_byte_key(b.group)) for e in b.ranked],
                "incomplete": [_entry_json(e, bits_per_byte_key(b.group)) for e in b.unranked],
            }
            for b in boards
        ],
        "not_started": list(not_started),
    }


def plot(boards: Sequence[Board], path: Path, target: Target = TARGET) -> Path:
    """pareto.png: gap (paired interval as error bars) against theoretical saving, front drawn."""
    import matplotlib  # heavy optional dependency: imported on use

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy optional dependency: imported on use

    n = max(1, len(boards))
    fig, axes = plt.subplots(1, n, figsize=(6.4 * n, 4.6), squeeze=False)
    for ax, board in zip(axes[0], boards):
        _plot_board(ax, board, target)
    if not boards:
        axes[0][0].text(0.5, 0.5, "no finished runs", ha="center", va="center")
    fig.tight_layout()

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})  # no version stamp
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _plot_board(ax: Any, board: Board, target: Target) -> None:
    """One table's scatter with error bars, labels, the Pareto front and the target's lines."""
    ref = next((e for e in board.ranked + board.unranked if e.method == target.reference), None)
    ref_saving = ref.saving if ref else None
    pts = [e for e in board.ranked if e.versus.reported_gap is not None and e.saving is not None]
    for e in pts:
        x, y = e.saving * 100, e.versus.reported_gap
        paired = e.versus.gap_paired
        has = paired is not None and paired.ci_low is not None
        err = [[max(0.0, y - paired.ci_low) if has else 0.0], [max(0.0, paired.ci_high - y) if has else 0.0]]
        color = "tab:green" if e.meets else ("black" if e.method == board.group.baseline else "tab:blue")
        ax.errorbar([x], [y], yerr=err, fmt="o", color=color, capsize=3, ms=5)
        ax.annotate(e.method, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    front = [e for m in board.front for e in pts if e.method == m]
    if len(front) > 1:
        ax.plot(
            [e.saving * 100 for e in front],
            [e.versus.reported_gap for e in front],
            "--",
            color="tab:red",
            alpha=0.7,
            label="Pareto front",
        )
    ax.axhline(0, color="black", linewidth=0.6)
    ax.axhline(target.max_gap, color="tab:green", linestyle=":", linewidth=1, label=f"target gap {target.max_gap:g}%")
    if ref_saving is not None:
        ax.axvline(
            ref_saving * 100 * target.min_share,
            color="tab:green",
            linestyle="-.",
            linewidth=1,
            label=f"{target.min_share * 100:g}% of {target.reference}'s saving",
        )
    ax.legend(fontsize=7, loc="upper left")
    ax.set_xlabel("compute saved: theoretical training-FLOP saving (%)")
    ax.set_ylabel(f"{GAP_NAME} vs {board.group.baseline or BASELINE} (reference; %, + = worse), paired 95% CI")
    ax.set_title(f"{board.group.title}: {board.group.primary_metric}", fontsize=9)
    ax.grid(alpha=0.3)


def board_margin(paths: Sequence[str | Path], margin: float | None) -> float:
    """The board's equivalence margin: the one its confirmation plan fixed (declared_margin), which
    --margin may repeat but not change; stats.MARGIN (or --margin) for a board without a plan."""
    declared = declared_margin(paths)
    if declared is None:
        return stats.MARGIN if margin is None else margin
    if margin is not None and margin != declared:
        raise UserError(
            f"--margin {margin:g}: the confirmation plan of this board fixed ±{declared:g}% before its runs, and "
            f"its confirmation page judges with it; one board uses one margin: drop --margin (or pass "
            f"--margin {declared:g})"
        )
    return declared


def write_leaderboard(
    paths: Sequence[str | Path],
    out: str | Path,
    baseline: str | None = None,
    target: Target = TARGET,
    seeds: Sequence[int] | None = None,
    margin: float | None = None,
) -> tuple[Path, list[Board]]:
    """Read the records under `paths`, write OUT/leaderboard.md, leaderboard.json and pareto.png.

    `margin` None: the margin a confirmation plan among `paths` fixed before its runs (board_margin),
    else stats.MARGIN; a margin other than the plan's is refused: one board, one margin.
    """
    if not paths:
        raise UserError("no sweep directory given; pass the directory `oelm sweep` wrote")
    margin = board_margin(paths, margin)
    boards, not_started, runs = build(paths, baseline, target, seeds, margin)
    if baseline is not None:  # named (--baseline): a name no table has is a typo
        require_arm([b.group for b in boards], baseline)
    out_dir = Path(out)
    command = command_line(paths, out_dir, baseline, seeds, margin)
    writable_dir(out_dir, "leaderboard folder", "pass --out with a writable folder (sweeps are only read)")
    plot(boards, out_dir / "pareto.png", target)
    atomic_write_json(out_dir / "leaderboard.json", page_json("board", to_json(boards, not_started, command, target)))
    sweep = Path(paths[0]).as_posix()
    confirm = f"oelm confirm plan {sweep} --seeds {{seeds}} --out {sweep}-confirm" + (
        f" --baseline {baseline}" if baseline else ""
    )
    plan = confirmation_plan(paths[0]) if len(paths) == 1 else None
    text = render(boards, not_started, command, len(runs), target, plan or confirm)
    atomic_write_text(out_dir / "leaderboard.md", text)
    return out_dir / "leaderboard.md", boards
