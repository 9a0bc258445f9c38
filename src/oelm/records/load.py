"""Loading runs: run directories and compact run records, found under any folder, read one way.

A stored board's runs live in one file (BOARD/runs.jsonl.gz); each run keeps its place in the
sweep layout (BOARD/runs/<method>/<setting>/seed<N>) as a path that names no folder on disk, and
every function here takes such a path as it takes a run directory."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from oelm.records.artifacts import read_audit, read_timing
from oelm.records.compact import (
    RECORDS_FILE,
    RUN_RECORD_FILE,
    read_record,
    read_record_at,
    run_from_record,
)
from oelm.records.compact import (
    record_places as places,
)
from oelm.records.run import RESULTS_FILE, RunRecord, RunResults, classify, read_results, read_run_config
from oelm.records.sweep import SWEEP_FILE
from oelm.utils.errors import UserError

_RUN_MARKERS = (RESULTS_FILE, "config.yaml", "metrics.jsonl", RUN_RECORD_FILE)
_SKIP_DIRS = {"checkpoints", "tb", "__pycache__", "report"}


def load_run(path: str | Path) -> RunRecord:
    """Load one run: its directory, its compact record where the directory holds only that, or its
    line in a stored board's records file."""
    path = Path(path)
    if not path.exists() and (raw := stored_record(path)) is not None:
        return run_from_record(raw, path, _board_of(path)[0] / RECORDS_FILE)  # type: ignore[index]
    if (path / RUN_RECORD_FILE).is_file() and not (path / RESULTS_FILE).is_file():
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


def _board_of(path: Path) -> tuple[Path, str] | None:
    """The stored board whose records file holds the place `path` (no folder on disk), and the place."""
    for board in list(path.parents)[:6]:
        if (board / RECORDS_FILE).is_file():
            return board, path.relative_to(board).as_posix()
    return None


def stored_record(path: str | Path) -> dict | None:
    """The record mapping of a run kept in a stored board's records file, or None."""
    found = _board_of(Path(path))
    return None if found is None else read_record_at(*found)


def find_run_dirs(paths: Iterable[str | Path], missing_ok: bool = False) -> list[Path]:
    """Runs under the paths: directories holding results.json, config.yaml, metrics.jsonl or a
    record.json, and the places a stored board's records file holds (a path inside a board too)."""
    found: list[Path] = []
    for root in paths:
        root = Path(root)
        if not root.exists():
            board = _board_of(root)
            if board is not None:
                prefix = board[1] + "/"
                found.extend(board[0] / at for at in places(board[0]) if (at + "/").startswith(prefix))
                continue
            if missing_ok:
                continue
            raise UserError(f"{root} does not exist; pass a run directory or a sweep directory")
        found.extend(_walk(root))
    return sorted(set(found))


def _walk(root: Path) -> list[Path]:
    """Depth-first search that stops at the first run directory on each branch."""
    if not root.is_dir():
        return []
    if any((root / m).is_file() for m in _RUN_MARKERS) and not (root / SWEEP_FILE).is_file():
        return [root]
    out: list[Path] = [root / at for at in places(root)] if (root / RECORDS_FILE).is_file() else []
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
            "config.yaml, metrics.jsonl or a committed record.json, or a board holds runs.jsonl.gz (pass the run "
            "or the sweep directory)"
        )
    return [load_run(d) for d in dirs]
