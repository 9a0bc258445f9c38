"""`oelm confirm plan SWEEP_DIR --seeds N --out DIR`, `oelm confirm run DIR` and `oelm confirm report DIR`:
claims on fresh seeds."""

from __future__ import annotations

import argparse

from oelm.cli import add_baseline_flag, add_executor_flags, add_margin_flag, executor_of


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `confirm` subcommand with its `plan` and `run` steps."""
    p = subparsers.add_parser(
        "confirm",
        help="confirm a board's claims on fresh seeds: fix a hashed plan, then run and judge it",
        description="Confirmation on fresh seeds. `plan` takes a finished pilot sweep's claims (every "
        "method whose verdict against the board's reference is resolved or equivalent, or --claims), "
        "fixes each arm at the LR the pilot's validation chose, picks N seeds the pilot never used and "
        "writes DIR/plan.json with a sha256 before anything runs. `run` refuses an edited plan or one that no "
        "git commit holds (commit a copy of plan.json first; the commit is recorded), trains "
        "exactly the planned runs (resumable) and reports each claim as confirmed or not confirmed on "
        "the fresh seeds only (same paired test, Holm over the claims, same margin).",
    )
    steps = p.add_subparsers(dest="step", metavar="STEP")
    plan = steps.add_parser("plan", help="write DIR/plan.json from a finished pilot sweep (runs nothing)")
    plan.add_argument("sweep", metavar="SWEEP_DIR", help="the pilot: a directory `oelm sweep` wrote")
    plan.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="fresh seeds to plan (at least 3; default: what the seed plan asks for, from the pilot's SD)",
    )
    plan.add_argument("--out", required=True, metavar="DIR", help="the confirmation's directory (outside the pilot)")
    plan.add_argument(
        "--claims",
        nargs="+",
        default=None,
        metavar="METHOD",
        help="confirm these methods' pilot verdicts (default: every resolved or equivalent one)",
    )
    plan.add_argument(
        "--all",
        dest="every",
        action="store_true",
        help="plan every ranked arm (the final comparison on fresh seeds; unresolved pilots make no claim)",
    )
    add_baseline_flag(
        plan, None, "the reference, as for `oelm report --view board` (default: the best-tuned trainable arm)"
    )
    plan.add_argument(
        "--primary",
        nargs="+",
        default=None,
        metavar="METHOD:OTHER",
        help="the primary comparisons, Holm over them only (default: the pilot sweep's declared `primary`)",
    )
    plan.add_argument(
        "--exclude-seeds-from",
        nargs="*",
        default=None,
        metavar="DIR",
        help="record folders whose runs under a planned configuration (same task, data, model, method, "
        "overrides and steps) make their seeds not fresh (default: docs/results of the pilot's repository; "
        "none: no folder)",
    )
    add_margin_flag(plan)
    plan.set_defaults(func=run_plan)
    run = steps.add_parser("run", help="check the plan's hash, train its runs, judge every claim")
    run.add_argument("dir", metavar="DIR", help="the directory holding plan.json")
    run.add_argument("--parallel", type=int, default=1, metavar="N", help="runs at once (subprocesses)")
    run.add_argument("--threads", type=int, default=None, metavar="T", help="torch threads per run")
    run.add_argument(
        "--uncommitted-plan",
        action="store_true",
        help="run a plan that no git commit holds (default: refused; the page then says the plan was not "
        "committed before the runs)",
    )
    add_executor_flags(run)
    run.set_defaults(func=run_run)
    report = steps.add_parser(
        "report", help="judge a finished confirmation again from its plan and run records (trains nothing)"
    )
    report.add_argument("dir", metavar="DIR", help="plan.json and runs/ (run directories or committed records)")
    report.add_argument("--out", default=None, metavar="OUT", help="write confirmation.* here (default: DIR)")
    report.set_defaults(func=run_report)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def run_plan(args: argparse.Namespace) -> int:
    """Write the plan and print what it fixed."""
    from oelm.experiments.confirm import write_plan

    primary = None if args.primary is None else [p.split(":", 1) for p in args.primary]
    path, plan = write_plan(
        args.sweep,
        args.out,
        args.seeds,
        args.claims,
        args.baseline,
        args.margin,
        args.every,
        primary,
        args.exclude_seeds_from,
    )
    print(f"plan {path} (sha256 {plan.sha256[:12]}): reference {plan.reference}, fresh seeds {plan.seeds}")
    for skipped in plan.skipped_seeds or []:
        print(f"  seed {skipped.seed} skipped: already run under a planned configuration in {', '.join(skipped.under)}")
    for claim in plan.claims:
        what = "claim" if claim.is_claim else "compare (no pilot claim)"
        print(f"  {what}: {claim.method} (lr {plan.arms[claim.method].lr:g}) {claim.wording}")
    if plan.primary:
        print(f"  primary family (Holm over these only): {', '.join(f'{a} vs {b}' for a, b in plan.primary)}")
    for entry in plan.seed_plan or []:
        print(f"  seeds, {entry.method} vs {entry.compared_with}: {entry.note}")
    print(f"next: oelm confirm run {args.out}")
    return 0


def run_run(args: argparse.Namespace) -> int:
    """Run the plan and print each claim's result."""
    from oelm.experiments.confirm import (
        CONFIRMED,
        NO_CLAIM,
        plan_commit_line,
        run_confirmation,
        summary_lines,
        verdict_warnings,
    )

    conf = run_confirmation(
        args.dir,
        parallel=args.parallel,
        threads=args.threads,
        executor=executor_of(args),
        uncommitted_plan=args.uncommitted_plan,
    )
    print(plan_commit_line(conf.plan_commit))
    print("\n".join(summary_lines(conf)))
    for warning in verdict_warnings(conf):  # what changes a verdict's meaning shows here, not only in the file
        print(f"warning: {warning}")
    ok = sum(c.result == CONFIRMED for c in conf.results)
    claims = sum(c.result != NO_CLAIM for c in conf.results)
    compared = (
        f"; {len(conf.results) - claims} arm(s) compared without a pilot claim" if claims < len(conf.results) else ""
    )
    print(f"{ok} of {claims} claim(s) confirmed{compared} -> {args.dir}/confirmation.md")
    failed = conf.outcome.failed if conf.outcome else []
    return 1 if failed else 0


def run_report(args: argparse.Namespace) -> int:
    """Re-judge a finished confirmation from its records and print each claim's result."""
    from oelm.experiments.confirm import report_confirmation, summary_lines, verdict_warnings

    conf = report_confirmation(args.dir, args.out)
    print("\n".join(summary_lines(conf)))
    for warning in verdict_warnings(conf):
        print(f"warning: {warning}")
    print(f"-> {args.out or args.dir}/confirmation.md")
    return 0
