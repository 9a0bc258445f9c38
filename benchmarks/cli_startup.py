"""How long `oelm` takes to answer `--help` and `--version`: each call a fresh process.

The arms are `oelm --version`, `oelm --help` and `oelm CMD --help` for every registered command
(`python -m oelm ...`, what the console script runs), with two references: `import oelm.cli`
alone and a bare interpreter (`python -c pass`), the floor no command can go under. Every round
runs each arm once, in a carryover-balanced order; each figure is the median over rounds with a
distribution-free 95% interval (none under 6 rounds), as wall time and as the child's CPU time
(user + system, steadier than wall time when other processes share the cores). Before timing,
one untimed run of each arm warms the file cache and lists the heavy packages it imported
(torch, transformers, ...): those are why a command is slow, and building the parser needs none.

    python -m benchmarks.cli_startup                                  # every command, 15 rounds
    python -m benchmarks.cli_startup --rounds 30 --json out.json      # docs/results/cli-startup
    python -m benchmarks.cli_startup --commands train compare --rounds 6
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from oelm import __version__
from oelm.cli import COMMANDS

from .harness import balanced_orders, machine, median_ci, write_rows

# Packages whose import alone takes a large share of the target or more (pydantic ~0.25 s on 2 cores);
# none is needed to build the parser.
HEAVY = ("torch", "transformers", "matplotlib", "scipy", "statsmodels", "numpy", "datasets", "peft", "pydantic")
# Run by the untimed warm-up call: the command itself, then the heavy packages it left in sys.modules.
PROBE = (
    "import sys\n"
    "from oelm.cli import main\n"
    "main(sys.argv[1:])\n"
    "heavy = {heavy}\n"
    "sys.stderr.write('\\nheavy: ' + ' '.join(m for m in heavy if m in sys.modules) + '\\n')\n"
)


class Arm:
    """One command line, run as a subprocess; wall and child CPU seconds kept per run."""

    def __init__(self, name: str, args: list[str], command: bool = True) -> None:
        self.name, self.args, self.command = name, args, command
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.heavy: list[str] | None = None

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "oelm", *self.args] if self.command else [sys.executable, *self.args]

    def run(self) -> None:
        """One timed run (output discarded); a failing command stops the benchmark."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"{self.name} exited {done.returncode}: {done.stderr.strip()[-500:]}")
        self.wall.append(wall)
        self.cpu.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))

    def probe(self) -> None:
        """The untimed warm-up: run once through PROBE and keep the heavy packages it imported."""
        if not self.command:
            subprocess.run(self.argv(), stdout=subprocess.DEVNULL, check=True)
            return
        code = PROBE.format(heavy=repr(HEAVY))
        done = subprocess.run([sys.executable, "-c", code, *self.args], capture_output=True, text=True)
        line = [x for x in done.stderr.splitlines() if x.startswith("heavy:")]
        if not line:
            raise SystemExit(f"{self.name}: the warm-up run failed: {done.stderr.strip()[-500:]}")
        self.heavy = line[-1].removeprefix("heavy:").split()


def arms(commands: list[str]) -> list[Arm]:
    """`--version`, `--help`, each command's `--help`, then the two references."""
    out = [Arm("oelm --version", ["--version"]), Arm("oelm --help", ["--help"])]
    out += [Arm(f"oelm {c} --help", [c, "--help"]) for c in commands]
    out += [Arm("import oelm.cli", ["-c", "import oelm.cli"], command=False)]
    out += [Arm("python -c pass", ["-c", "pass"], command=False)]
    return out


def summary(values: list[float]) -> dict[str, Any]:
    med, lo, hi = median_ci(values)
    return {"median": med, "ci": [lo, hi]}


def rows_of(items: list[Arm], rounds_done: int, target: float, load: list[float]) -> list[dict[str, Any]]:
    rows = []
    for a in items:
        wall = summary(a.wall)
        rows.append(
            {
                "name": a.name,
                "argv": ["python", *a.argv()[1:]],
                "reference": not a.command,
                "rounds": rounds_done,
                "wall_s": wall,
                "cpu_s": summary(a.cpu),
                "wall_times_s": a.wall,
                "heavy_imports": a.heavy,
                "under_target": None if not a.command else wall["median"] <= target,
                "target_s": target,
                "load_average_1min": load,  # at the start and after the last round
                **machine(),
            }
        )
    return rows


def fmt(x: dict[str, Any]) -> str:
    lo, hi = x["ci"]
    inner = f" [{lo:.3f}, {hi:.3f}]" if lo is not None else ""
    return f"{x['median']:.3f}{inner}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15, help="runs of every arm (6 or more give an interval)")
    p.add_argument(
        "--commands",
        nargs="+",
        default=None,
        metavar="CMD",
        help=f"time `oelm CMD --help` for these only (default: every command: {' '.join(COMMANDS)})",
    )
    p.add_argument("--target", type=float, default=0.5, help="seconds a command may take (default 0.5)")
    p.add_argument("--json", type=Path, help="write the rows here (rewritten after every round)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    unknown = sorted(set(args.commands or []) - set(COMMANDS))
    if unknown:
        p.error(f"unknown command(s) {', '.join(unknown)}; choose from {', '.join(COMMANDS)}")
    items = arms(args.commands or COMMANDS)
    load = [os.getloadavg()[0]]
    print(
        f"# oelm {__version__} start-up, each run a fresh process; {os.cpu_count()} CPUs, load average "
        f"{load[0]:.2f}; Python {platform.python_version()}; {args.rounds} rounds, carryover-balanced order",
        flush=True,
    )
    if load[0] > 0.5 * (os.cpu_count() or 1):
        print("# warning: the machine is busy; other processes' work lands in these times", flush=True)
    for a in items:
        a.probe()
    orders = balanced_orders(len(items))
    for r in range(args.rounds):
        for i in orders[r % len(orders)]:
            items[i].run()
        write_rows(args.json, rows_of(items, r + 1, args.target, [*load, os.getloadavg()[0]]))
    load.append(os.getloadavg()[0])
    rows = rows_of(items, args.rounds, args.target, load)
    write_rows(args.json, rows)
    width = max(len(a.name) for a in items)
    print(f"{'':<{width}}  wall s [95% interval]      cpu s [95% interval]      heavy imports")
    for row in rows:
        heavy = "-" if row["heavy_imports"] is None else " ".join(row["heavy_imports"]) or "none"
        print(f"{row['name']:<{width}}  {fmt(row['wall_s']):<24}  {fmt(row['cpu_s']):<24}  {heavy}")
    slow = [r["name"] for r in rows if r["under_target"] is False]
    worst = max((r for r in rows if not r["reference"]), key=lambda r: r["wall_s"]["median"])
    verdict = f"over {args.target:g} s: {', '.join(slow)}" if slow else f"every command under {args.target:g} s"
    print(
        f"slowest: {worst['name']} {worst['wall_s']['median']:.3f} s; {verdict} "
        f"(median wall time; load average {load[0]:.2f} -> {load[1]:.2f})",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
