"""`oelm sweep SPEC.yaml [--parallel N] [--seeds ...]`: methods x seeds x LRs, resumable."""

from __future__ import annotations

import argparse

from oelm.cli import add_executor_flags, executor_of


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `sweep` subcommand."""
    p = subparsers.add_parser(
        "sweep",
        help="train methods x seeds x learning rates with equal budgets, then write the report",
        description="Run every arm of a sweep spec (per-method LR grids, seeds, other fields) over "
        "one base config. Finished runs are skipped, unfinished ones resume; more seeds can be "
        "added later. Layout: OUT/runs/<method>/lr<lr>/seed<seed>/; report in OUT/report/.",
    )
    p.add_argument("spec", help="sweep spec YAML (see configs/sweeps/)")
    p.add_argument("--parallel", type=int, default=1, metavar="N", help="runs at once (subprocesses)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="T",
        help="torch threads per run (default: all cores, or cores // N with --parallel)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="replace the spec's seeds (extend a sweep)")
    p.add_argument(
        "--methods",
        nargs="+",
        default=None,
        metavar="M",
        help="train only these arms of the spec (e.g. the main comparison first); the "
        "report still covers every finished run in the sweep directory",
    )
    p.add_argument("--out", default=None, help="sweep directory (default: the spec's out)")
    p.add_argument("--no-report", action="store_true", help="train only; run `oelm report` later")
    p.add_argument("--dry-run", action="store_true", help="validate the spec and list the runs, train nothing")
    add_executor_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate the spec up front, then run the sweep."""
    from oelm.experiments.runner import run_sweep
    from oelm.experiments.sweep import dry_run, load_spec
    from oelm.reports.report import print_summary

    executor = executor_of(args)
    spec = load_spec(args.spec, seeds=args.seeds, out=args.out, methods=args.methods)
    if args.dry_run:
        for line in dry_run(spec.selected_runs()):
            print(line)
        return 0
    outcome = run_sweep(
        spec, parallel=args.parallel, report=not args.no_report, threads=args.threads, executor=executor
    )
    if outcome.comparison is not None:
        print_summary(outcome.comparison, spec.extend)
        print(f"report: {outcome.report}")
    print(
        f"{len(outcome.trained)} trained, {len(outcome.skipped)} already finished, "
        f"{len(outcome.failed)} failed in {outcome.wall_time:.0f} s"
    )
    return 1 if outcome.failed else 0
