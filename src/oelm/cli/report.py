"""`oelm report RUN_OR_SWEEP_DIR... [--out DIR]`: tables and figures from stored run records.

`oelm report --from-json REPORT_JSON [--out DIR]` re-renders a stored report.json alone (its run
directories may be gone) with today's statistics and wording.
"""

from __future__ import annotations

import argparse

from oelm.cli import add_margin_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` subcommand."""
    p = subparsers.add_parser(
        "report",
        help="write report.md (+ PNGs) from stored run or sweep directories",
        description="Read only stored run records (results.json, metrics.jsonl) and write "
        "report.md, report.json and figures: mean ± 95%% CI over seeds, LR chosen on "
        "validation, gaps and paired tests vs the baseline, collapsed/incomplete runs listed. "
        "With --from-json, re-render a stored report.json instead (no run directory needed): "
        "the comparisons are recomputed from its per-seed values.",
    )
    p.add_argument("paths", nargs="*", help="run directories or sweep directories (searched recursively)")
    p.add_argument(
        "--from-json",
        default=None,
        metavar="REPORT_JSON",
        help="re-render this stored report.json with today's statistics and wording (instead of PATHS)",
    )
    p.add_argument("--out", default=None, help="output directory (default: FIRST_PATH/report; the JSON's folder)")
    p.add_argument(
        "--baseline",
        default=None,
        help="method the others are compared to (default: baseline; with --from-json, the stored reference)",
    )
    p.add_argument(
        "--study-numbers",
        default=None,
        help="YAML of the original study's reported figures (e.g. configs/study/study_numbers.yaml)",
    )
    add_margin_flag(p)
    p.set_defaults(func=run, margin=None)  # None: 1%, or the stored margin with --from-json


def run(args: argparse.Namespace) -> int:
    """Write the report and print where it is."""
    from oelm.reports.report import write_report, write_report_from_json
    from oelm.reports.stats import MARGIN
    from oelm.utils.errors import UserError

    if args.from_json is not None:
        if args.paths or args.study_numbers:
            raise UserError(
                "--from-json re-renders one stored report.json: pass no run directories and no "
                "--study-numbers with it (its study numbers are those it stored)"
            )
        path, comparison = write_report_from_json(args.from_json, args.out, args.baseline, args.margin)
        print(f"{len(comparison.groups)} table(s) re-rendered from {args.from_json} -> {path}")
        return 0
    if not args.paths:
        raise UserError("name the run or sweep directories to report on, or a stored report.json with --from-json")
    margin = MARGIN if args.margin is None else args.margin
    path, comparison = write_report(
        args.paths, args.out, args.baseline or "baseline", args.study_numbers, margin=margin
    )
    print(f"{len(comparison.groups)} table(s) from {comparison.n_runs} run(s) -> {path}")
    if comparison.incomplete:
        print(f"{len(comparison.incomplete)} incomplete run(s) listed, not averaged")
    return 0
