"""`oelm leaderboard SWEEP_DIR... --out DIR`: rank every method of a sweep from its stored records.

Committed compact run records (docs/results/NAME/records) are read like run directories.
"""

from __future__ import annotations

import argparse

from oelm.cli import add_baseline_flag, add_margin_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `leaderboard` subcommand."""
    p = subparsers.add_parser(
        "leaderboard",
        help="write leaderboard.md/.json + pareto.png ranking the methods of stored sweeps",
        description="Read only stored run records and rank every method on its held-out metric "
        "(LR chosen on validation, as `oelm report`): mean ± 95% CI, paired gap to the reference "
        "(the best-tuned trainable arm unless --baseline names one) with its interval, p and Holm p, "
        "the verdict (worse / better (resolved), equivalent within ±MARGIN%, unresolved), minimum "
        "detectable gap, parameters, theoretical saving and its "
        "share of oelm-freeze's, step-time ratio, a verdict against the target and the Pareto "
        "front of gap against compute saved. Incomplete methods are listed, not ranked.",
    )
    p.add_argument("paths", nargs="*", metavar="SWEEP_DIR", help="sweep (or run) directories")
    p.add_argument("--out", default=None, help="output directory (e.g. docs/results)")
    add_baseline_flag(
        p,
        None,
        "the reference row every method is compared with (default: the best-tuned trainable arm, "
        "the best validation mean among complete methods that freeze nothing)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="only runs of these seeds (e.g. the seeds every method has, when the main comparison has more)",
    )
    add_margin_flag(p)
    p.set_defaults(func=run, margin=None)  # None: the board's confirmation plan's margin, else 1%


def run(args: argparse.Namespace) -> int:
    """Write the leaderboard and print the verdicts."""
    from oelm.reports.leaderboard import write_leaderboard
    from oelm.utils.errors import UserError

    if not args.paths or args.out is None:
        raise UserError("name the sweep (or record) directories and --out DIR (e.g. docs/results)")
    # None: the margin the board's confirmation plan fixed, else 1%
    path, boards = write_leaderboard(args.paths, args.out, args.baseline, seeds=args.seeds, margin=args.margin)
    print(f"{len(boards)} table(s) -> {path}")
    for board in boards:
        print(f"{board.group.title}: {board.verdict.replace('**', '')}")
        for warning in board.warnings:  # what changes a verdict's meaning shows here, not only in the file
            print(f"  warning: {warning}")
    return 0
