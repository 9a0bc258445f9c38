"""`oelm finetune-board SWEEP_DIR... --out DIR`: frozen Q/K against the fine-tuning field.

Reads stored run records (run directories or committed records) of a classification sweep
whose arms include full fine-tuning (`baseline`) and writes board.md, board.json and pareto.png.
"""

from __future__ import annotations

import argparse

from oelm.cli import add_baseline_flag, add_margin_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `finetune-board` subcommand."""
    p = subparsers.add_parser(
        "finetune-board",
        help="write board.md/.json + pareto.png: fine-tuning arms against full fine-tuning in accuracy points",
        description="Read only stored run records of a classification sweep and compare every arm "
        "(frozen Q/K, its controls, LoRA, BitFit, LN tuning, (IA)^3, ...) with full fine-tuning: LR "
        "chosen on validation, held-out accuracy with a seeds x test-examples Student-t interval, the "
        "difference in accuracy points, Holm-adjusted verdicts (equivalence within ±MARGIN points by "
        "TOST), trainable parameters, AdamW state, step time, dominance, and a Pareto figure.",
    )
    p.add_argument("paths", nargs="*", metavar="SWEEP_DIR", help="sweep (or record) directories")
    p.add_argument("--out", default=None, help="output directory (e.g. docs/results/finetune-sst2)")
    add_baseline_flag(p, "baseline", "the full fine-tuning arm every other arm is compared with (default: baseline)")
    add_margin_flag(p, points=0.5)  # = oelm.reports.finetune.MARGIN_POINTS, the field's scale
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the board and print each arm's verdict."""
    from oelm.reports.finetune import write_board
    from oelm.utils.errors import UserError

    if not args.paths or args.out is None:
        raise UserError("name the sweep (or record) directories and --out DIR (e.g. docs/results/finetune-sst2)")
    if not args.margin > 0:
        raise UserError(f"--margin must be positive (accuracy points), got {args.margin}")
    path, boards = write_board(args.paths, args.out, args.baseline, args.margin)
    print(f"{len(boards)} table(s) -> {path}")
    for board in boards:
        print(board.title)
        for row in board.rows:
            diff = "" if row.diff is None else f" {row.diff:+.2f} points"
            print(f"  {row.method}:{diff} {row.verdict}")
        for warning in board.warnings:
            print(f"  warning: {warning}")
    return 0
