"""Fold a results tree's per-run record.json files into one runs.jsonl.gz per stored board.

Each board (a folder holding runs/<method>/<setting>/seed<N>/record.json) gets BOARD/runs.jsonl.gz
with every record, and its record.json files are removed, only after each record read back from
the new file is byte-identical to the file it replaces (so the pilot hashes of confirmation plans,
taken over record.json bytes, still verify).

    python scripts/compact_records.py docs/results
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from oelm.records.compact import RECORDS_FILE, RUN_RECORD_FILE, read_records, record_text, write_raw_records
from oelm.records.layout import RUNS
from oelm.utils.errors import UserError


def boards(root: Path) -> dict[Path, list[Path]]:
    """Each board under root and its record.json files."""
    found: dict[Path, list[Path]] = {}
    for path in sorted(root.rglob(RUN_RECORD_FILE)):
        parts = path.parts
        if len(parts) < 6 or parts[-5] != RUNS:
            raise UserError(f"{path}: not in the sweep layout BOARD/runs/<method>/<setting>/seed<N>/{RUN_RECORD_FILE}")
        found.setdefault(Path(*parts[:-5]), []).append(path)
    return found


def compact(board: Path, files: list[Path]) -> int:
    texts = {f.parent.relative_to(board).as_posix(): f.read_text(encoding="utf-8") for f in files}
    stored = read_records(board) if (board / RECORDS_FILE).is_file() else {}
    write_raw_records({**stored, **{at: json.loads(t) for at, t in texts.items()}}, board)
    back = read_records(board)
    bad = [at for at, t in texts.items() if record_text(back[at]) != t]
    if bad:
        raise UserError(f"{board}: {len(bad)} record(s) would not read back byte-identical ({bad[0]}); nothing removed")
    for f in files:
        f.unlink()
        for d in list(f.parents)[:4]:  # seed<N>, setting, method, runs: empty folders go too
            if d == board or any(d.iterdir()):
                break
            d.rmdir()
    return len(files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path)
    args = p.parse_args(argv)
    total = 0
    for board, files in boards(args.root).items():
        total += compact(board, files)
        print(f"{board}: {len(files)} records -> {RECORDS_FILE}")
    print(f"{total} records folded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
