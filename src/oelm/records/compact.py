"""The compact run record: one small, versioned, diff-friendly file per run, committed with results.

A run directory holds checkpoints, logs and event files that are never committed; its record
(RUN/record.json, in the sweep layout) keeps what every report, board and statistic reads: the
results, the config, the evaluation lines of the metrics stream, the per-item test values, the
freeze-audit summary and the timing summary, with a hash of the config and the code commit.

A stored board keeps all its runs' records in one file, BOARD/runs.jsonl.gz (`write_records`):
a header line, then one line per run holding its place in the sweep layout and its record; gzip
without a timestamp, so storing the same runs twice writes the same bytes. A record read from it
is the record.json a run directory would get, to the byte (`record_text`), so hashes over records
do not depend on the form they are kept in. `records.load.load_runs` reads both forms, and run
directories, one way.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from oelm.records.artifacts import AuditSummary, TimingStats
from oelm.records.layout import RUN_RECORD_FILE
from oelm.records.numbers import SECTIONS, check_eval_step, check_recorded_numbers
from oelm.records.run import RunRecord, RunResults, classify, normalize_results
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_bytes, atomic_write_text, clean_json, read_json_object

RECORD_FORMAT = "oelm run record"
RECORD_VERSION = 1
RECORDS_FILE = "runs.jsonl.gz"  # a stored board: every run's record, one per line
RECORDS_FORMAT = "oelm run records"
RECORDS_VERSION = 1
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
    return text if relative_to is None else relative_under(text, relative_to)


def relative_under(text: str, root: str | Path) -> str:
    """TEXT (a record, a sweep's YAML or JSON file, a planned config dumped as JSON) with every path
    under ROOT, as given or resolved, written relative to it, in plain or JSON-escaped form: what a
    committed record keeps, so that it names no machine's folders. The one rule for records and for
    the plans compared with them."""
    for base in {Path(root).as_posix(), Path(root).resolve().as_posix()}:
        for prefix in {base + "/", json.dumps(base + "/")[1:-1]}:
            text = text.replace(prefix, "")
    return text


def write_record(run: RunRecord, folder: str | Path, relative_to: str | Path | None = None) -> Path:
    """Write FOLDER/record.json for a run (atomically); returns its path."""
    path = Path(folder) / RUN_RECORD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, dump_record(run, relative_to))
    return path


def read_record(folder: str | Path) -> RunRecord:
    """The run a FOLDER/record.json describes, as a RunRecord like a run directory's."""
    folder = Path(folder)
    path = folder / RUN_RECORD_FILE
    raw = read_json_object(path, "it is written by scripts/store_records.py; restore it from git")
    return run_from_record(raw, folder, path)


def run_from_record(raw: dict[str, Any], folder: Path, where: Path) -> RunRecord:
    """A RunRecord from a record's mapping (`where` names the file in errors)."""
    if raw.get("format") != RECORD_FORMAT or not isinstance(raw.get("version"), int):
        raise UserError(
            f"{str(where)!r} is not an oelm run record (format {raw.get('format')!r}); remove or restore it"
        )
    if raw["version"] > RECORD_VERSION:
        raise UserError(
            f"{str(where)!r} is run-record version {raw['version']}, newer than this oelm reads "
            f"({RECORD_VERSION}); upgrade oelm"
        )
    for section in SECTIONS:
        check_recorded_numbers(raw.get(section), section, f"{str(where)!r} ({section} of run {folder.as_posix()})")
    evals = [line for line in raw.get("evals") or [] if isinstance(line, dict)]
    for line in evals:
        check_eval_step(line, f"{str(where)!r} (an eval line of run {folder.as_posix()})")
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
        _metrics=evals,
        _items=items if isinstance(items, dict) else {},
    )


def record_text(raw: dict[str, Any]) -> str:
    """A record's record.json text (what `dump_record` writes): the bytes a record's hash is taken over."""
    return json.dumps(raw, indent=1) + "\n"


def write_records(runs: Iterable[RunRecord], board: str | Path, relative_to: str | Path) -> Path:
    """Write BOARD/runs.jsonl.gz: every run's record, keyed by its place under `relative_to` (the
    sweep directory), in path order; atomically, and byte-identical for the same runs."""
    lines = []
    for run in runs:
        at = run.path.relative_to(relative_to).as_posix()
        lines.append((at, json.loads(dump_record(run, relative_to))))
    return write_raw_records(dict(sorted(lines)), board)


def write_raw_records(records: dict[str, dict[str, Any]], board: str | Path) -> Path:
    """Write BOARD/runs.jsonl.gz from records already in mapping form, keyed by place."""
    header = {"format": RECORDS_FORMAT, "version": RECORDS_VERSION, "runs": len(records)}
    body = [json.dumps(header)]
    body += [json.dumps({"at": at, "record": raw}, separators=(",", ":")) for at, raw in sorted(records.items())]
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", fileobj=buf, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(("\n".join(body) + "\n").encode("utf-8"))
    path = Path(board) / RECORDS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())
    return path


def read_records(board: str | Path) -> dict[str, dict[str, Any]]:
    """BOARD/runs.jsonl.gz as {place: record mapping} (fresh objects: a caller may edit them)."""
    return {at: json.loads(text) for at, text in _lines(Path(board)).items()}


def record_places(board: str | Path) -> list[str]:
    """The places (runs/<method>/<setting>/seed<N>) BOARD/runs.jsonl.gz holds."""
    return list(_lines(Path(board)))


def read_record_at(board: str | Path, at: str) -> dict[str, Any] | None:
    """The record of one place in BOARD/runs.jsonl.gz, or None (one line parsed, not the board)."""
    text = _lines(Path(board)).get(at)
    return None if text is None else json.loads(text)


def _lines(board: Path) -> dict[str, str]:
    path = board / RECORDS_FILE
    stat = path.stat()
    return _read_lines(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _read_lines(path: str, _mtime_ns: int, _size: int) -> dict[str, str]:
    """Each place's record as JSON text, read and checked once per file version (a report's walk
    and loads touch each board many times); one clear error for a damaged file."""
    fix = "it is written by scripts/store_records.py; restore it from git"
    try:
        lines = gzip.decompress(Path(path).read_bytes()).decode("utf-8").splitlines()
        header = json.loads(lines[0]) if lines else {}
        rows = [json.loads(line) for line in lines[1:]]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path!r} is not a readable records file ({e}); {fix}") from None
    if not isinstance(header, dict) or header.get("format") != RECORDS_FORMAT:
        raise UserError(f"{path!r} is not an oelm records file (its first line names no {RECORDS_FORMAT!r}); {fix}")
    if not isinstance(header.get("version"), int) or header["version"] > RECORDS_VERSION:
        raise UserError(
            f"{path!r} is records version {header.get('version')!r}, newer than this oelm reads; upgrade oelm"
        )
    bad = [i + 2 for i, r in enumerate(rows) if not (isinstance(r, dict) and isinstance(r.get("record"), dict))]
    if bad or header.get("runs") != len(rows):
        raise UserError(f"{path!r}: {header.get('runs')} runs declared, {len(rows)} lines, bad lines {bad[:5]}; {fix}")
    out = {str(r["at"]): json.dumps(r["record"]) for r in rows}
    if len(out) != len(rows) or any(Path(at).is_absolute() or ".." in Path(at).parts for at in out):
        raise UserError(f"{path!r}: a run's place repeats or leaves the board; {fix}")
    return out
