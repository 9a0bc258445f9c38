"""`oelm compare [--preset quick|full|FILE.yaml]`: the quickstart comparison of methods."""

from __future__ import annotations

import argparse

from oelm.cli import add_executor_flags, executor_of
from oelm.experiments.presets import DEFAULT_PRESET, preset_names


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `compare` subcommand."""
    p = subparsers.add_parser(
        "compare",
        help="quickstart: train GPTs under each method with equal budgets and compare them",
        description="Run a comparison regime stored as a preset (data, tokenizer, hold-outs, model, "
        "budget, per-method LR grids, seeds): prepare the data into OUT/data, train every method x "
        "LR x seed with the same steps and data order, choose each method's LR on validation, print "
        "the table and a plain-language reading, and write OUT/report/report.md. Presets: 'quick' "
        "(default; gpt-narrow, offline, about 7 minutes on 2 idle CPU cores), 'full' (gpt-medium-512, one "
        "GPU, bf16), or any sweep spec file (the presets are sweep specs). Options below replace the preset's values. "
        "Re-running continues where it stopped; more --seeds extend it.",
    )
    p.add_argument(
        "--preset", default=DEFAULT_PRESET, help=f"{' | '.join(preset_names())} | PATH.yaml (default {DEFAULT_PRESET})"
    )
    p.add_argument("--data", default=None, help="LM source (file, folder, builtin:..., hub name)")
    p.add_argument("--tokenizer", default=None, help="tokenizer spec (byte, gpt2, ...)")
    p.add_argument("--model", default=None, help="GPT preset")
    p.add_argument(
        "--methods", nargs="+", default=None, help="methods to compare (a subset of the preset's, or any with --lrs)"
    )
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="seeds (3+ give paired p-values; more extend a finished comparison)",
    )
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (equal for all)")
    p.add_argument(
        "--lrs",
        type=float,
        nargs="+",
        default=None,
        help="one LR grid for every method (replaces the per-method grids)",
    )
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--device", default=None)
    p.add_argument(
        "--parallel",
        type=int,
        default=None,
        metavar="N",
        help="runs at once (default on CPU: min(4, cores), one thread each)",
    )
    p.add_argument("--threads", type=int, default=None, metavar="T", help="torch threads per run (default 1 on CPU)")
    p.add_argument(
        "--out",
        default=None,
        help="output directory (default: the spec's out, runs/compare/<preset> for the shipped ones)",
    )
    add_executor_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the comparison; print its table, then end with the plain-language reading."""
    from oelm.experiments.compare import FLAG_FIELDS, load_compare, run_compare
    from oelm.reports.reading import reading
    from oelm.reports.report import print_summary

    flags = {k: getattr(args, k) for k in FLAG_FIELDS}
    spec = load_compare(args.preset, out=args.out, methods=args.methods, lrs=args.lrs, **flags)
    outcome = run_compare(spec, parallel=args.parallel, threads=args.threads, executor=executor_of(args))
    if outcome.comparison is not None:
        print_summary(outcome.comparison, spec.extend)
    print(
        f"report: {outcome.report}  ({len(outcome.trained)} trained, {len(outcome.skipped)} reused, "
        f"{len(outcome.failed)} failed, {outcome.wall_time:.0f} s)"
    )
    if outcome.comparison is not None:
        for group in outcome.comparison.groups:  # the output ends with the reading
            print()
            print(reading(group))
    return 1 if outcome.failed else 0
