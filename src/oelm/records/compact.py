"""The compact run record: one small, versioned, diff-friendly file per run, committed with results.

A run directory holds checkpoints, logs and event files that are never committed; its record
(RUN/record.json, in the sweep layout) keeps what every report, board and statistic reads: the
results, the config, the evaluation lines of the metrics stream, the per-item test values, the
freeze-audit summary and the timing summary, with a hash of the config and the code commit.
`records.load.load_runs` reads a folder of records exactly as it reads run directories.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from oelm.records.artifacts import AuditSummary, TimingStats
from oelm.records.run import RunRecord, RunResults, classify, normalize_results
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_text, clean_json, read_json_object

RECORD_FILE = "record.json"
RECORD_FORMAT = "oelm run record"
RECORD_VERSION = 1
FROM_RUN = "run directory"  # `source` of a record written from a finished run directory


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of a config mapping in canonical JSON (sorted keys)."""
    text = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_of(run: RunRecord) -> dict[str, Any]:
    """The compact record of a loaded run (directory or record)."""
    return {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "source": run.source,
        "path": run.path.as_posix(),
        "git_commit": run.results.get("git_commit"),
        "config_sha256": config_hash(run.config),
        "results": dict(run.results),
        "config": run.config,
        "evals": [line for line in run.metrics if line.get("kind") == "eval"],
        "test_items": run.test_items(),
        "audit": run.audit.to_dict() if run.audit is not None else None,
        "timing": dict(run.timing),
    }


def dump_record(run: RunRecord, relative_to: str | Path | None = None) -> str:
    """The record's text: one key per line, floats in their shortest exact form (a diff names what
    moved). Paths under `relative_to` (the sweep directory) are written relative to it, so a
    committed record names no machine's folders."""
    # Strict JSON: a non-finite value (a diverged run's losses) is null, as in results.json.
    text = json.dumps(clean_json(record_of(run)), indent=1, default=str, allow_nan=False) + "\n"
    if relative_to is not None:
        for root in {Path(relative_to).as_posix(), Path(relative_to).resolve().as_posix()}:
            text = text.replace(json.dumps(root + "/")[1:-1], "")
    return text


def write_record(run: RunRecord, folder: str | Path, relative_to: str | Path | None = None) -> Path:
    """Write FOLDER/record.json for a run (atomically); returns its path."""
    path = Path(folder) / RECORD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, dump_record(run, relative_to))
    return path


def read_record(folder: str | Path) -> RunRecord:
    """The run a FOLDER/record.json describes, as a RunRecord like a run directory's."""
    folder = Path(folder)
    path = folder / RECORD_FILE
    raw = read_json_object(path, "it is written by scripts/store_records.py; restore it from git")
    if raw.get("format") != RECORD_FORMAT or not isinstance(raw.get("version"), int):
        raise UserError(f"{str(path)!r} is not an oelm run record (format {raw.get('format')!r}); remove or restore it")
    if raw["version"] > RECORD_VERSION:
        raise UserError(
            f"{str(path)!r} is run-record version {raw['version']}, newer than this oelm reads "
            f"({RECORD_VERSION}); upgrade oelm"
        )
    results: RunResults = normalize_results(raw.get("results") or {})
    status, reason = classify(results)
    items = raw.get("test_items")
    return RunRecord(
        path=folder,
        status=status,
        results=results,
        config=dict(raw.get("config") or {}),
        timing=TimingStats(**(raw.get("timing") or {})),
        reason=reason,
        audit=AuditSummary.from_dict(raw.get("audit")),
        source=str(raw.get("source") or FROM_RUN),
        _metrics=[line for line in raw.get("evals") or [] if isinstance(line, dict)],
        _items=items if isinstance(items, dict) else {},
    )
