"""`oelm report PATH... [--view VIEW] [--out DIR]`: one command for every comparison page.

Every page compares arms with a control from stored run records; `--view` picks the page:

- `report` (default): each sweep's arms against the baseline, LR sensitivity, curves, costs;
- `board`: every method ranked against a reference, with a target and a Pareto front;
- `finetune`: fine-tuning arms against full fine-tuning in accuracy points, with their costs;
- `ladder`: each frozen method's gap to its twin against model size (one path per rung), with fits;
- `confirmation`: a confirmation folder's fresh seeds judged against its plan (= `oelm confirm report`).

Each writes its page (report.md, leaderboard.md, board.md or ladder.md), its JSON and figures,
and every JSON carries the same `comparison` block (oelm.reports.comparison): one row per arm
against its control, one format for every view. A folder of committed compact records
(docs/results/NAME/records) is read like run directories.
"""

from __future__ import annotations

import argparse

from oelm.cli import add_baseline_flag, add_margin_flag

VIEWS = ("report", "board", "finetune", "ladder", "confirmation")
# The commands the views replaced: refused with a one-line hint naming the view (issue 50).
REPLACED = {"leaderboard": "board", "finetune-board": "finetune", "ladder": "ladder"}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand (and the one-line refusals of the commands it replaced)."""
    p = subparsers.add_parser(
        "report",
        help="write a comparison page (report, board, fine-tuning board or ladder) from stored records",
        description="Read only stored run records (results.json, metrics.jsonl, or committed compact "
        "records) and write one comparison page: mean ± 95%% CI over seeds, each arm's LR chosen on "
        "validation, paired gaps to the control with Holm-adjusted verdicts. --view report (default): "
        "each sweep's arms against --baseline; board: every method ranked against a reference with a "
        "target and a Pareto front; finetune: fine-tuning arms against full fine-tuning in accuracy "
        "points with costs; ladder: each path one rung, every frozen method against its same-init twin "
        "across sizes, with trend tests and scaling fits; confirmation: one confirmation folder's fresh seeds "
        "judged against its committed plan (what `oelm confirm report` writes).",
    )
    p.add_argument("paths", nargs="*", help="run, sweep or record directories (ladder: one per rung)")
    p.add_argument("--view", choices=VIEWS, default="report", help="which page to write (default: report)")
    p.add_argument("--out", default=None, help="output directory (default: FIRST_PATH/report)")
    add_baseline_flag(
        p,
        None,
        "the control arm every other arm is compared with (default: baseline; board view: the best-tuned "
        "trainable arm; ladder view: each method's same-init twin, not settable)",
    )
    p.add_argument(
        "--study-numbers",
        default=None,
        help="report view: YAML of the original study's reported figures (e.g. configs/study/study_numbers.yaml)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="board view: only runs of these seeds (e.g. the seeds every method has)",
    )
    add_margin_flag(
        p,
        text="equivalence margin: a difference is called 'equivalent within ±MARGIN' only when the TOST "
        "(Holm-adjusted) shows it lies inside; in %% of the control's metric (default 1; board view: its "
        "confirmation plan's margin, else 1), in accuracy points for the finetune view (default 0.5)",
    )
    p.set_defaults(func=run, margin=None)  # None: the view's default (see view_margin)
    for old, view in REPLACED.items():
        # No prefix characters: every word after the old name is taken as is, so any flags it was
        # given reach the refusal instead of an "unrecognized arguments" error.
        stub = subparsers.add_parser(old, add_help=False, prefix_chars="\x00")
        stub.add_argument("rest", nargs="*")
        stub.set_defaults(func=_replaced(old, view))


def _replaced(old: str, view: str):  # noqa: ANN202 (a closure over the names)
    def refuse(args: argparse.Namespace) -> int:
        from oelm.utils.errors import UserError

        raise UserError(f"`oelm {old}` is now `oelm report --view {view}` (same flags, same page); run that")

    return refuse


def view_margin(args: argparse.Namespace) -> float | None:
    """The equivalence margin: --margin, else the view's default (report: 1%; board: the board's
    confirmation plan's margin, else 1%; finetune: 0.5 accuracy points; ladder: none)."""
    from oelm.reports.finetune import MARGIN_POINTS
    from oelm.reports.stats import MARGIN
    from oelm.utils.errors import UserError

    if args.margin is not None and not args.margin > 0:
        raise UserError(f"--margin must be positive, got {args.margin:g}")
    if args.margin is not None:
        return args.margin
    return {"report": MARGIN, "board": None, "finetune": MARGIN_POINTS}.get(args.view)


def _refuse_foreign_flags(args: argparse.Namespace) -> None:
    """A flag another view reads would be silently ignored: refuse it, naming the view that reads it."""
    from oelm.utils.errors import UserError

    foreign = {
        "--study-numbers": (args.study_numbers is not None, ("report",)),
        "--seeds": (args.seeds is not None, ("board",)),
        "--baseline": (args.baseline is not None, ("report", "board", "finetune")),
        "--margin": (args.margin is not None, ("report", "board", "finetune")),
    }
    if args.view == "confirmation" and len(args.paths) > 1:
        raise UserError(f"--view confirmation judges one confirmation folder; name one (got {len(args.paths)})")
    for flag, (given, views) in foreign.items():
        if given and args.view not in views:
            raise UserError(f"{flag} is read by the {'/'.join(views)} view, not by --view {args.view}; drop it")


def run(args: argparse.Namespace) -> int:
    """Write the chosen view and print what it found."""
    from oelm.utils.errors import UserError

    if not args.paths:
        raise UserError("name the run, sweep or record directories to report on (e.g. docs/results/quickstart/records)")
    _refuse_foreign_flags(args)
    margin = view_margin(args)
    views = {
        "report": _report,
        "board": _board,
        "finetune": _finetune,
        "ladder": _ladder,
        "confirmation": _confirmation,
    }
    return views[args.view](args, margin)


def _report(args: argparse.Namespace, margin: float) -> int:
    from oelm.reports.report import write_report

    path, comparison = write_report(
        args.paths,
        args.out,
        args.baseline or "baseline",
        args.study_numbers,
        margin=margin,
        named_baseline=args.baseline is not None,
    )
    print(f"{len(comparison.groups)} table(s) from {comparison.n_runs} run(s) -> {path}")
    for group in comparison.groups:  # what changes a verdict's meaning shows here, not only in the file
        for warning in group.warnings:
            print(f"warning ({group.title}): {warning}")
    if comparison.incomplete:
        print(f"{len(comparison.incomplete)} incomplete run(s) listed, not averaged")
    return 0


def _out(args: argparse.Namespace) -> str:
    from pathlib import Path

    return args.out if args.out is not None else str(Path(args.paths[0]) / "report")


def _board(args: argparse.Namespace, margin: float | None) -> int:
    from oelm.reports.leaderboard import write_leaderboard

    path, boards = write_leaderboard(args.paths, _out(args), args.baseline, seeds=args.seeds, margin=margin)
    print(f"{len(boards)} table(s) -> {path}")
    for board in boards:
        print(f"{board.group.title}: {board.verdict.replace('**', '')}")
        for warning in board.warnings:  # what changes a verdict's meaning shows here, not only in the file
            print(f"  warning: {warning}")
    return 0


def _finetune(args: argparse.Namespace, margin: float) -> int:
    from oelm.reports.finetune import write_board

    path, boards = write_board(args.paths, _out(args), args.baseline or "baseline", margin)
    print(f"{len(boards)} table(s) -> {path}")
    for board in boards:
        print(board.title)
        for row in board.rows:
            diff = "" if row.diff is None else f" {row.diff:+.2f} points"
            print(f"  {row.method}:{diff} {row.verdict}")
        for warning in board.warnings:
            print(f"  warning: {warning}")
    return 0


def _ladder(args: argparse.Namespace, margin: None) -> int:
    from oelm.reports.ladder import write_ladder

    path, ladder = write_ladder(args.paths, _out(args))
    print(f"{len(ladder.steps)} step(s) -> {path}")
    for warning in ladder.warnings:  # what changes a verdict's meaning shows here, not only in the file
        print(f"  warning: {warning}")
    for s in ladder.steps:
        gap = "n/a" if s.gap is None else f"{s.gap:+.2f}%"
        print(f"  {s.architecture} {s.params} {s.method} vs {s.twin}: {gap} {s.verdict}")
    for t in ladder.trends:
        if t.slope is not None:
            print(
                f"  trend {t.architecture} {t.method} over {t.axis}{f' at {t.held}' if t.held else ''}: "
                f"{t.slope:+.2f}% per decade [{t.slope_low:+.2f}, {t.slope_high:+.2f}]: {t.verdict}"
            )
    return 0


def _confirmation(args: argparse.Namespace, margin: None) -> int:
    """The confirmation view: `oelm confirm report DIR [--out]`, the same page and the same lines."""
    from oelm.cli.confirm import run_report

    return run_report(argparse.Namespace(dir=args.paths[0], out=args.out))
