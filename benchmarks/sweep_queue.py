"""Wall time of `oelm sweep --parallel N`: the work queue against the old up-front dealing.

Both arms run the same small sweep from an empty sweep directory through `run_sweep` (data
prepared once, untimed; `--parallel 2 --threads 1` by default; no report), with the same worker
processes (experiments/dispatch.py). They differ only in which run a free worker takes:

- `round-robin`: the dealing `oelm sweep --parallel` used before the queue: the pending runs dealt
  `pending[i::N]` to the N workers up front, each worker training its share in the sweep's order,
  then idling while another still has runs (kept here only, as `RoundRobin`);
- `queue`: today's `RunQueue`: a free worker takes the longest expected pending run.

The board has unequal settings: every arm (`baseline`, `oelm-freeze`, one LR each) crosses
`grid: {steps: [S, 3S]}`, so a long run is 3x a short one. The sweep's seed-major order puts the
grid innermost, so with two workers the old dealing gives every long run to the same worker,
which is what any 2-valued innermost grid did with `--parallel 2`. Each round runs both arms, in
a carryover-balanced order; the figure is the median over rounds of the within-round ratio
queue / round-robin with its distribution-free 95% interval (6 rounds or more), beside each
arm's median wall time, its workers' CPU time (the same work in both arms, whatever the load) and
its worker occupancy (the runs' own training time over N x wall).

    python -m benchmarks.sweep_queue                              # 6 rounds, about 7 minutes on 2 cores
    python -m benchmarks.sweep_queue --rounds 8 --json out.json   # docs/results/sweep-queue
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from oelm import __version__
from oelm.experiments.dispatch import RunQueue
from oelm.experiments.prepare import ensure_lm_data
from oelm.experiments.runner import run_sweep
from oelm.experiments.sweep import RunSpec, spec_from_dict

from .harness import balanced_orders, machine, median_ci, paired_ratio, write_rows

ARMS = ("round-robin", "queue")


class RoundRobin(RunQueue):
    """The old dealing: runs dealt to the workers in turn up front, each worker's share in order.

    Runs added later (a grid extension) are dealt on in turn; the old sweep dealt them as a new
    phase after every run had finished (this benchmark's board does not extend: max_extend 0).
    """

    def __init__(self, runs: Iterable[RunSpec], finished: Iterable[RunSpec] = (), slots: int = 1) -> None:
        self.shares: list[list[RunSpec]] = [[] for _ in range(slots)]
        self.turn = 0
        super().__init__(runs, finished, slots)

    def __len__(self) -> int:
        return sum(len(s) for s in self.shares)

    def add(self, runs: Iterable[RunSpec]) -> None:
        for run in runs:
            self.shares[self.turn].append(run)
            self.turn = (self.turn + 1) % self.slots

    def take(self, slot: int) -> RunSpec | None:
        share = self.shares[slot]
        return share.pop(0) if share else None


QUEUES: dict[str, type[RunQueue]] = {"round-robin": RoundRobin, "queue": RunQueue}


def board(data: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The sweep spec: two arms, one LR each, `seeds` seeds, a steps grid of S and long x S."""
    return {
        "name": "sweep-queue",
        "out": str(out),
        "config": {
            "task": "lm",
            "data": str(data),
            "model": "gpt-tiny",
            "model_overrides": {"n_layer": args.layers, "d_model": args.width, "n_head": 2},
            "batch_size": args.batch,
            "seq_len": args.seq,
            "warmup": 1,
            "eval_every": 0,
            "eval_batches": 2,
            "final_eval_batches": 2,
            "checkpoint_every": 0,
            "device": "cpu",
            "tensorboard": False,
            "log_every": 10,
            "timing_warmup": 1,
        },
        "methods": {"baseline": {"lr": [1e-3]}, "oelm-freeze": {"lr": [3e-3]}},
        "grid": {"steps": [args.steps, args.long * args.steps]},
        "seeds": list(range(args.seeds)),
        "max_extend": 0,
    }


class Arm:
    """One dealing; a fresh sweep directory per round, wall time and occupancy kept per round."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.wall: list[float] = []
        self.cpu: list[float] = []  # the workers' CPU seconds (user + system): the work, whatever the load
        self.occupancy: list[float] = []
        self.order: list[list[str]] = []  # per round, the runs each worker trained, in order

    def run(self, root: Path, data: Path, args: argparse.Namespace) -> None:
        out = root / f"sweep-{self.name}"
        shutil.rmtree(out, ignore_errors=True)
        spec = spec_from_dict(board(data, out, args))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        outcome = run_sweep(
            spec,
            parallel=args.parallel,
            threads=args.threads,
            progress=False,
            report=False,
            queue_class=QUEUES[self.name],
        )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the sweep waited for its workers
        self.cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        if outcome.failed or len(outcome.trained) != len(spec.runs()):
            raise SystemExit(f"{self.name}: {len(outcome.failed)} run(s) failed: {outcome.failed[:1]}")
        busy = sum(json.loads((r.run_dir / "results.json").read_text())["total_wall_time"] for r in outcome.trained)
        self.wall.append(wall)
        self.occupancy.append(busy / (args.parallel * wall))
        self.order.append(worker_orders(out / "logs"))
        shutil.rmtree(out, ignore_errors=True)


def worker_orders(logs: Path) -> list[str]:
    """Per worker log, the runs it trained ("== RUN_DIR" lines), as method/setting/seed."""
    orders = []
    for log in sorted(logs.glob("worker*.log")):
        runs = [line[3:].strip() for line in log.read_text().splitlines() if line.startswith("== ")]
        orders.append(" ".join("/".join(Path(r).parts[-3:]) for r in runs))
    return orders


def summary(values: list[float]) -> dict[str, Any]:
    med, lo, hi = median_ci(values)
    return {"median": med, "ci": [lo, hi]}


def rows_of(arms: list[Arm], rounds: int, args: argparse.Namespace, load: list[float]) -> list[dict[str, Any]]:
    by = {a.name: a for a in arms}
    ratio, lo, hi = paired_ratio(by["queue"].wall, by["round-robin"].wall)
    shape = {
        "parallel": args.parallel,
        "threads": args.threads,
        "runs": 2 * 2 * args.seeds,
        "steps": [args.steps, args.long * args.steps],
        "seeds": args.seeds,
        "model": {"n_layer": args.layers, "d_model": args.width, "batch_size": args.batch, "seq_len": args.seq},
    }
    rows = [
        {
            "name": a.name,
            "rounds": rounds,
            "wall_s": summary(a.wall),
            "wall_times_s": a.wall,
            "cpu_s": summary(a.cpu),
            "occupancy": summary(a.occupancy),
            "worker_runs": a.order,
            **shape,
            **machine(),
            "load_average_1min": load,  # at the start and after the last round
        }
        for a in arms
    ]
    rows.append(
        {
            "name": "queue / round-robin",
            "rounds": rounds,
            "wall_ratio": {"median": ratio, "ci": [lo, hi]},
            "round_ratios": [q / r for q, r in zip(by["queue"].wall, by["round-robin"].wall)],
            **shape,
            **machine(),
            "load_average_1min": load,  # at the start and after the last round
        }
    )
    return rows


def fmt(x: dict[str, Any], digits: int = 2) -> str:
    lo, hi = x["ci"]
    inner = f" [{lo:.{digits}f}, {hi:.{digits}f}]" if lo is not None else ""
    return f"{x['median']:.{digits}f}{inner}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6, help="sweeps per arm (6 or more give an interval)")
    p.add_argument("--parallel", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument("--seeds", type=int, default=2, help="seeds per arm (runs: 2 arms x 2 steps x seeds)")
    p.add_argument("--steps", type=int, default=60, help="steps of a short run (default 60)")
    p.add_argument("--long", type=int, default=3, help="a long run's steps over a short one's (default 3)")
    p.add_argument("--layers", type=int, default=2, help="n_layer of the model (default 2)")
    p.add_argument("--width", type=int, default=64, help="d_model of the model (default 64)")
    p.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    p.add_argument("--seq", type=int, default=128, help="sequence length (default 128)")
    p.add_argument("--json", type=Path, help="write the rows here (rewritten after every round)")
    p.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = p.parse_args(argv)
    if min(args.rounds, args.parallel, args.threads, args.seeds, args.steps, args.long) < 1:
        p.error("--rounds, --parallel, --threads, --seeds, --steps and --long must be at least 1")
    root = Path(tempfile.mkdtemp(prefix="oelm-sweep-queue-", dir=args.workdir))
    try:
        data = root / "data"
        ensure_lm_data({"source": "builtin:tales", "tokenizer": "byte", "max_docs": 400}, data)
        arms = [Arm(name) for name in ARMS]
        load = [os.getloadavg()[0]]
        runs = 2 * 2 * args.seeds
        print(
            f"# oelm {__version__}: {runs} runs (steps {args.steps} and {args.long * args.steps}) with "
            f"--parallel {args.parallel} --threads {args.threads}; {os.cpu_count()} CPUs, load average "
            f"{load[0]:.2f}; {args.rounds} rounds, carryover-balanced order",
            flush=True,
        )
        orders = balanced_orders(len(arms))
        for r in range(args.rounds):
            for i in orders[r % len(orders)]:
                arms[i].run(root, data, args)
            print(f"round {r + 1}: " + ", ".join(f"{a.name} {a.wall[-1]:.1f} s" for a in arms), flush=True)
            write_rows(args.json, rows_of(arms, r + 1, args, [*load, os.getloadavg()[0]]))
        load.append(os.getloadavg()[0])
        rows = rows_of(arms, args.rounds, args, load)
        write_rows(args.json, rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for row in rows[:-1]:
        print(
            f"{row['name']:<12} wall s {fmt(row['wall_s'])}   workers' CPU s {fmt(row['cpu_s'])}   "
            f"worker occupancy {fmt(row['occupancy'])}"
        )
        print(f"{'':<12} workers' runs (last round): {' | '.join(row['worker_runs'][-1])}")
    ratio = rows[-1]["wall_ratio"]
    print(
        f"queue / round-robin wall time: {fmt(ratio, 3)} (median over {args.rounds} rounds, 95% interval; "
        f"load average {load[0]:.2f} -> {load[1]:.2f})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
