"""`oelm compare`: quickstart comparison of baseline, oelm-freeze and oelm-random tiny GPTs."""

from __future__ import annotations

import argparse

from oelm.experiments.compare import DEFAULT_LRS, DEFAULT_METHODS, DEFAULT_OUT


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `compare` subcommand."""
    p = subparsers.add_parser(
        "compare",
        help="quickstart: train tiny GPTs under each method with equal budgets and compare them",
        description="Prepare the data (default: the built-in Python-docs corpus, byte tokenizer) "
        "into OUT/data, train every method x LR x seed with the same steps and data order, choose "
        "each method's LR on validation, print the table and write OUT/report/report.md. "
        "Re-running continues where it stopped.",
    )
    p.add_argument("--data", default="builtin:python-docs", help="LM source for `prepare_lm` (file, folder, builtin:..., hub name)")
    p.add_argument("--tokenizer", default="byte", help="tokenizer spec (byte, gpt2, ...)")
    p.add_argument("--model", default="gpt-tiny", help="GPT preset")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), help="methods to compare")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (3+ give paired p-values)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps per run (equal for all)")
    p.add_argument("--lrs", type=float, nargs="+", default=list(DEFAULT_LRS), help="LR grid of every method")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--parallel", type=int, default=None, metavar="N",
                   help="runs at once (default on CPU: min(4, cores), one thread each)")
    p.add_argument("--threads", type=int, default=None, metavar="T", help="torch threads per run (default 1 on CPU)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the comparison and print its table."""
    from oelm.experiments.compare import run_compare
    from oelm.experiments.report import print_summary

    outcome = run_compare(
        parallel=args.parallel, threads=args.threads, out=args.out, data=args.data, tokenizer=args.tokenizer,
        model=args.model, methods=args.methods, seeds=args.seeds, steps=args.steps, lrs=args.lrs,
        batch_size=args.batch_size, seq_len=args.seq_len, device=args.device,
    )
    if outcome.comparison is not None:
        print_summary(outcome.comparison)
    print(f"report: {outcome.report}  ({len(outcome.trained)} trained, {len(outcome.skipped)} reused, "
          f"{len(outcome.failed)} failed, {outcome.wall_time:.0f} s)")
    return 1 if outcome.failed else 0
