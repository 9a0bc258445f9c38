"""Loading runs: run directories and compact run records, found under any folder, read one way."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from oelm.records.artifacts import read_audit, read_timing
from oelm.records.compact import RECORD_FILE, read_record
from oelm.records.run import RESULTS_FILE, RunRecord, RunResults, classify, read_results, read_run_config
from oelm.records.sweep import SWEEP_FILE
from oelm.utils.errors import UserError

_RUN_MARKERS = (RESULTS_FILE, "config.yaml", "metrics.jsonl", RECORD_FILE)
_SKIP_DIRS = {"checkpoints", "tb", "__pycache__", "report"}


def load_run(path: str | Path) -> RunRecord:
    """Load one run: its directory, or its compact record where the directory holds only that."""
    path = Path(path)
    if (path / RECORD_FILE).is_file() and not (path / RESULTS_FILE).is_file():
        return read_record(path)
    results = read_results(path)
    status, reason = classify(results)
    return RunRecord(
        path=path,
        status=status,
        results=results or RunResults(),
        config=read_run_config(path / "config.yaml"),
        timing=read_timing(path),
        reason=reason,
        audit=read_audit(path),
    )


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories (holding results.json, config.yaml, metrics.jsonl or a record.json) under the paths."""
    found: list[Path] = []
    for root in paths:
        root = Path(root)
        if not root.exists():
            raise UserError(f"{root} does not exist; pass a run directory or a sweep directory")
        found.extend(_walk(root))
    return sorted(set(found))


def _walk(root: Path) -> list[Path]:
    """Depth-first search that stops at the first run directory on each branch."""
    if not root.is_dir():
        return []
    if any((root / m).is_file() for m in _RUN_MARKERS) and not (root / SWEEP_FILE).is_file():
        return [root]
    out: list[Path] = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and child.name not in _SKIP_DIRS and not child.name.startswith("."):
            out.extend(_walk(child))
    return out


def load_runs(paths: Iterable[str | Path]) -> list[RunRecord]:
    """Load every run (directory or compact record) found under the paths; UserError if there is none."""
    paths = list(paths)
    dirs = find_run_dirs(paths)
    if not dirs:
        shown = ", ".join(str(p) for p in paths)
        raise UserError(
            f"no run directories under {shown}; a run directory holds results.json, "
            "config.yaml, metrics.jsonl or a committed record.json (pass the run or the sweep directory)"
        )
    return [load_run(d) for d in dirs]
