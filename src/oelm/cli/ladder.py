"""`oelm ladder RUNG_DIR... --out DIR`: the gap to the same-init twin against model size."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `ladder` subcommand."""
    p = subparsers.add_parser(
        "ladder",
        help="write ladder.md/.json + ladder.png: each frozen method's gap to its twin against model size",
        description="Each directory is one rung (one architecture at one size: a sweep or its committed "
        "records). Within a rung every frozen method is compared with its same-init trainable twin (the "
        "baseline where it has none), paired by seed, Holm over the rung; across rungs a weighted line of "
        "the gap on log10(parameters) per architecture and method, with the gap it predicts at 10x the "
        "largest rung, stated as an extrapolation.",
    )
    p.add_argument("rungs", nargs="*", metavar="RUNG_DIR", help="one sweep (or records) directory per size")
    p.add_argument("--out", default=None, help="output directory (e.g. docs/results/ladder)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the ladder and print each step's verdict and each trend."""
    from oelm.reports.ladder import write_ladder
    from oelm.utils.errors import UserError

    if not args.rungs or args.out is None:
        raise UserError("name the rung directories (one sweep per size) and --out DIR")
    path, ladder = write_ladder(args.rungs, args.out)
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
