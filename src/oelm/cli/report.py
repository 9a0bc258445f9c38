"""`oelm report RUN_OR_SWEEP_DIR... [--out DIR]`: tables and figures from stored run records.

A folder of committed compact records (docs/results/NAME/records) is read like run directories.
"""

from __future__ import annotations

import argparse

from oelm.cli import add_baseline_flag, add_margin_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand."""
    p = subparsers.add_parser(
        "report",
        help="write report.md (+ PNGs) from stored run or sweep directories",
        description="Read only stored run records (results.json, metrics.jsonl) and write "
        "report.md, report.json and figures: mean ± 95%% CI over seeds, LR chosen on "
        "validation, gaps and paired tests vs the baseline, collapsed/incomplete runs listed. "
        "Committed compact run records (a board's runs.jsonl.gz, or record.json) are read like run directories.",
    )
    p.add_argument("paths", nargs="*", help="run, sweep or record directories (searched recursively)")
    p.add_argument("--out", default=None, help="output directory (default: FIRST_PATH/report)")
    add_baseline_flag(p, None, "method the others are compared to (default: baseline)")
    p.add_argument(
        "--study-numbers",
        default=None,
        help="YAML of the original study's reported figures (e.g. configs/study/study_numbers.yaml)",
    )
    add_margin_flag(p)
    p.set_defaults(func=run, margin=None)  # None: 1%


def run(args: argparse.Namespace) -> int:
    """Write the report and print where it is."""
    from oelm.reports.report import write_report
    from oelm.reports.stats import MARGIN
    from oelm.utils.errors import UserError

    if not args.paths:
        raise UserError("name the run, sweep or record directories to report on (e.g. docs/results/quickstart/records)")
    margin = MARGIN if args.margin is None else args.margin
    path, comparison = write_report(
        args.paths, args.out, args.baseline or "baseline", args.study_numbers, margin=margin
    )
    print(f"{len(comparison.groups)} table(s) from {comparison.n_runs} run(s) -> {path}")
    for group in comparison.groups:  # what changes a verdict's meaning shows here, not only in the file
        for warning in group.warnings:
            print(f"warning ({group.title}): {warning}")
    if comparison.incomplete:
        print(f"{len(comparison.incomplete)} incomplete run(s) listed, not averaged")
    return 0
