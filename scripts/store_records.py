"""Copy a sweep's (or confirmation's) run records, without checkpoints, into the repository.

The small files a report or board is built from (results, config, timing, freeze audit, per-window
test losses) and the sweep's own sweep.yaml / plan.json / confirmation.*; never weights, logs or
TensorBoard events. Absolute paths to a checkout's configs/ in the
sweep record become repository-relative. The copy keeps the layout, so `oelm leaderboard DST` rebuilds the board from
the committed records alone.

    python scripts/store_records.py runs/sweeps/twin-board docs/results/twin-board/records/pilot
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

RUN_FILES = ("config.yaml", "results.json", "timing_stats.json", "freeze_audit.json", "test_items.json")
TOP_FILES = ("sweep.yaml", "plan.json", "confirmation.md", "confirmation.json")


def store(src: Path, dst: Path) -> int:
    """Copy the records; returns the number of run directories copied."""
    if not (src / "runs").is_dir():
        raise SystemExit(f"{src} has no runs/ folder: give a directory `oelm sweep` or `oelm confirm run` wrote")
    dst.mkdir(parents=True, exist_ok=True)
    for name in TOP_FILES:
        if (src / name).is_file():
            # A spec run from another checkout records its config paths absolutely: keep them
            # repository-relative (from configs/ on) so the records name no machine's folders.
            text = (src / name).read_text(encoding="utf-8")
            (dst / name).write_text(re.sub(r"/\S*?/(configs/)", r"\1", text), encoding="utf-8")
    n = 0
    for results in sorted((src / "runs").rglob("results.json")):
        run = results.parent
        out = dst / run.relative_to(src)
        out.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            if (run / name).is_file():
                shutil.copy2(run / name, out / name)
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="the sweep or confirmation directory")
    p.add_argument("dst", type=Path, help="where the records go (e.g. docs/results/NAME/records/pilot)")
    args = p.parse_args(argv)
    print(f"{store(args.src, args.dst)} run records -> {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
