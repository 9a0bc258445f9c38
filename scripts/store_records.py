"""Store a sweep's (or confirmation's) runs as compact run records, committed with the result.

Every finished run becomes one line of DST/runs.jsonl.gz (oelm.records.compact: results, config,
evaluation lines, per-item test values, audit and timing summaries, no weights), keyed by its place
runs/<method>/<setting>/seed<N>, beside the sweep's own sweep.yaml / plan.json / confirmation.*.
Runs already stored in DST are kept (a place stored twice must hold the same record). `oelm report
DST` and `oelm report --view board DST` rebuild the report or board from the committed records alone.

    python scripts/store_records.py runs/sweeps/twin-board docs/results/twin-board/records/pilot

A sweep too long for one machine's session moves on from its committed records: store its finished
runs as it goes, and on the next machine `--restore` writes each stored run back as
SWEEP/<place>/record.json, which `oelm sweep` reads as finished and
skips; storing the sweep again later gives those runs the same records, to the byte.

    python scripts/store_records.py --restore docs/results/NAME/records/pilot runs/sweeps/NAME
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

from oelm.records.compact import (
    RECORDS_FILE,
    RUN_RECORD_FILE,
    dump_record,
    read_records,
    record_text,
    relative_under,
    write_raw_records,
)
from oelm.records.layout import RUNS
from oelm.records.load import load_runs
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_text, load_yaml_text, writable_dir, write_error

TOP_FILES = ("sweep.yaml", "plan.json", "plan-commit.json", "confirmation.md", "confirmation.json")


def _top_texts(src: Path) -> dict[str, str]:
    """The sweep's own files (sweep.yaml, plan.json, ...) as DST will hold them."""
    texts = {}
    for name in TOP_FILES:
        if (src / name).is_file():
            # A spec run from another checkout records its config paths absolutely: keep them
            # repository-relative (from configs/ on), and paths under the sweep directory relative
            # to it (as the run records write them), so the records name no machine's folders.
            texts[name] = repo_relative(relative_under((src / name).read_text(encoding="utf-8"), src))
    return texts


def repo_relative(text: str) -> str:
    """Config paths in a file written from another checkout, repository-relative (from configs/ on)."""
    return re.sub(r"/\S*?/(configs/)", r"\1", text)


def _identity(texts: dict[str, str]) -> str:
    """Which sweep the top files say: sweep.yaml's name and the plan's content hash (a confirmation).
    A sweep stored again after its grid was extended keeps both, and may update its records."""
    name = plan = "none"
    if "sweep.yaml" in texts:
        name = str((load_yaml_text(texts["sweep.yaml"]) or {}).get("name"))
    if "plan.json" in texts:
        plan = hashlib.sha256(texts["plan.json"].encode()).hexdigest()[:12]
    return f"sweep {name}, plan {plan}"


def _stored_texts(dst: Path) -> dict[str, str]:
    return {n: (dst / n).read_text(encoding="utf-8") for n in TOP_FILES if (dst / n).is_file()}


def store(src: Path, dst: Path) -> int:
    """Write the records; returns the number of runs stored. Everything is checked before anything
    is written: a DST that holds another sweep (its sweep.yaml or plan differs) or other results at
    a place is refused and left as it was."""
    if not (src / RUNS).is_dir():
        raise UserError(f"{src} has no runs/ folder: give a directory `oelm sweep` or `oelm confirm run` wrote")
    texts = _top_texts(src)
    if (dst / RECORDS_FILE).is_file() and (theirs := _identity(_stored_texts(dst))) != (mine := _identity(texts)):
        raise UserError(f"{dst} holds another sweep's records ({theirs}, where {src} is {mine}); store elsewhere")
    runs = [r for r in load_runs([src / RUNS]) if r.finished]
    stored = read_records(dst) if (dst / RECORDS_FILE).is_file() else {}
    new = {run.path.relative_to(src).as_posix(): json.loads(dump_record(run, src)) for run in runs}
    clash = sorted(at for at in set(stored) & set(new) if stored[at] != new[at])
    if clash:
        raise UserError(f"{dst}: {len(clash)} run(s) already stored with other results ({clash[0]}); store elsewhere")
    _writable(dst, "records folder")
    for name, text in texts.items():
        atomic_write_text(dst / name, text)
    write_raw_records({**stored, **new}, dst)
    return len(runs)


def restore(stored: Path, dst: Path) -> int:
    """Write each run STORED holds as DST/<place>/record.json; returns the number of runs written.
    The sweep's own files are not written: `oelm sweep` writes its sweep.yaml from the spec it is
    given, and plans its grid extensions from the finished runs. A place DST already holds (a run directory,
    finished or not) is left as it is; one whose record differs from the stored one is refused, and
    everything is checked before anything is written."""
    if not (stored / RECORDS_FILE).is_file():
        raise UserError(f"{stored} holds no {RECORDS_FILE}: give a folder this script stored records into")
    records = read_records(stored)
    _writable(dst, "sweep folder")
    here = {at for at in records if (dst / at).exists()}
    clash = sorted(
        at
        for at in here
        if (dst / at / RUN_RECORD_FILE).is_file()
        and (dst / at / RUN_RECORD_FILE).read_text(encoding="utf-8") != record_text(records[at])
    )
    if clash:
        raise UserError(f"{dst}: {len(clash)} run(s) hold another record than {stored} ({clash[0]}); restore elsewhere")
    for at in sorted(set(records) - here):
        (dst / at).mkdir(parents=True)
        atomic_write_text(dst / at / RUN_RECORD_FILE, record_text(records[at]))
    return len(records) - len(here)


def _writable(dst: Path, what: str) -> None:
    """DST is a folder a file can be written in (made if missing), checked before any record is."""
    if dst.exists() and not dst.is_dir():
        raise UserError(f"{dst} is a file: give a folder for the {what} (or a new path)")
    writable_dir(dst, what, "give a folder you can write to")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="the sweep or confirmation directory (with --restore: the stored records)")
    p.add_argument("dst", type=Path, help="where the records go (e.g. docs/results/NAME/records/pilot)")
    p.add_argument("--restore", action="store_true", help="write stored records back into a sweep directory")
    args = p.parse_args(argv)
    try:
        if args.restore:
            print(f"{restore(args.src, args.dst)} run records restored -> {args.dst}")
            return 0
        print(f"{store(args.src, args.dst)} run records -> {args.dst}")
    except OSError as err:  # a place under DST that is a file, a disk filling up while writing
        print(f"store_records: error: {write_error(err.filename or args.dst, err)}", file=sys.stderr)
        return 2
    except UserError as err:
        print(f"store_records: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
