"""Run records: the results.json schema, a run's status, and loading run directories.

The one place that says what results.json holds (RunResults, written by training.results) and
whether a run is finished and usable (`classify`; `run_status` / `run_finished` for a directory,
RunRecord.status for a loaded one). The training loop, sweeps and reports all ask here.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

import yaml

from oelm.records.artifacts import AuditSummary, TimingStats
from oelm.records.layout import RUN_RECORD_FILE, parse_run_path
from oelm.records.numbers import check_eval_step, check_recorded_numbers
from oelm.utils.errors import UserError
from oelm.utils.io import load_yaml_text, read_json

RESULTS_FILE = "results.json"  # written last and atomically: its status "complete" marks a finished run
# Of results.json. 2: `method` only (version 1 also wrote `model_type`, the study's name for it),
# `final_split`, `test_source` and the validation window counts; `normalize_results` reads
# version-1 records into the version-2 names, so every stored run still loads.
SCHEMA_VERSION = 2

# Statuses of a run. Only COMPLETE runs are averaged; every status but INCOMPLETE is finished.
COMPLETE = "complete"  # also results.json's "status" value of a finished run
INCOMPLETE = "incomplete"
COLLAPSED = "collapsed"
INVALID = "invalid"  # finished, but its freeze check failed: the arm did not run the method
# results.json's "status" of a run stopped because its training loss became non-finite: finished,
# never averaged (classified COLLAPSED, like a run that diverged on validation).
DIVERGED = "diverged"


class CommonResults(TypedDict, total=False):
    """The keys every run's results.json starts with, in this order (training.results writes them)."""

    schema_version: int  # SCHEMA_VERSION
    status: str  # COMPLETE
    task: str
    method: str
    method_options: dict[str, Any]  # validated, defaults filled in
    model: str
    dataset: str
    seed: int
    lr: float
    steps: int
    tokens_seen: int
    best_val_loss: float
    best_step: int | None
    total_wall_time: float
    mean_step_time: float | None
    median_step_time: float | None
    tokens_per_second: float | None
    peak_memory_bytes: int | None
    trainable_params: int | None
    frozen_params: int | None
    freeze_check: dict[str, Any]  # {"ok": bool, ...}
    git_commit: str | None
    device: str
    world_size: int
    global_batch_size: int
    data_fingerprint: str | None  # of the prepared data / examples read; reports refuse mixing two


class RunResults(CommonResults, total=False):
    """results.json: the common keys, then the task's (every task sets the three metric keys).

    total=False: older records may lack keys, and a task adds keys of its own (docs/architecture.md
    lists them); these are the ones the status decision and the reports rely on.
    """

    primary_metric: str  # the key reported, e.g. "test_perplexity"
    selection_metric: str  # the key learning rates are chosen on (validation), e.g. "best_val_loss"
    higher_is_better: bool  # direction of both metrics
    collapsed: bool  # chance-level validation predictions (part of selection)
    heldout_collapsed: bool  # the same on held-out data (information only)
    # Which split the final numbers are on: "test" when the data has a test split, else "val"
    # (then the primary metric is a validation metric and `final_perplexity` is null).
    final_split: str
    # Where the test split came from: TEST_OFFICIAL, TEST_HOLDOUT (carved from the training data
    # by a seed) or TEST_UNKNOWN (records written before it was recorded); null without a test split.
    test_source: str | None
    val_windows: int  # LM: validation windows read (the selection set)
    val_windows_all: int  # LM: non-overlapping windows in the whole validation split
    val_subset: bool  # LM: the selection set is evenly spaced windows, not the whole split
    tokenizer: str  # LM: the prepared data's tokenizer (byte, gpt2, ...); absent in older records
    # False only in a compact record rebuilt from a stored table whose run directories are lost:
    # the selection value was not kept (the setting is the one the lost runs chose on validation).
    selection_kept: bool
    # The metric keys whose value was NaN or inf (written as null, JSON has no NaN); absent if none.
    non_finite: list[str]


TEST_OFFICIAL = "official split"
TEST_HOLDOUT = "held-out documents of the train split (seeded), not an official test split"
TEST_UNKNOWN = "not recorded (record predates test_source)"
# Keys of schema version 1 and what they are now (normalize_results maps them on reading).
RENAMED_KEYS = {"model_type": "method"}


COMMON_KEYS: tuple[str, ...] = tuple(CommonResults.__annotations__)
# The test metric per item (LM window losses, classifier per-example correctness) in a fixed order.
TEST_ITEMS_FILE = "test_items.json"


@dataclass
class RunRecord:
    """One run directory as stored: its results, config, metrics stream and status."""

    path: Path
    status: str  # classify's: COMPLETE, INCOMPLETE, COLLAPSED or INVALID
    results: RunResults = field(default_factory=RunResults)
    config: dict[str, Any] = field(default_factory=dict)
    timing: TimingStats = field(default_factory=TimingStats)
    reason: str = ""
    audit: AuditSummary | None = None  # of freeze_audit.json
    # Where the record came from: "run directory", or what a compact record says it was built from.
    source: str = "run directory"
    _metrics: list[dict[str, Any]] | None = field(default=None, repr=False)
    _items: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        """Whether the run finished (it may still be excluded as collapsed or invalid)."""
        return self.status != INCOMPLETE

    @property
    def method(self) -> str | None:
        """Method name: results, else config, else the sweep layout."""
        return self.field("method", str)

    @property
    def seed(self) -> int | None:
        """Seed: results, else config, else the sweep layout."""
        return self.field("seed", int)

    @property
    def lr(self) -> float | None:
        """Peak learning rate: results, else config, else the sweep layout."""
        return self.field("lr", float)

    @property
    def setting(self) -> str:
        """Hyper-parameter setting: the sweep's setting directory, else 'lr<lr>'."""
        key = parse_run_path(self.path)
        if key is not None:
            return key.setting
        return f"lr{self.lr:g}" if self.lr is not None else "lr?"

    @property
    def dataset(self) -> str:
        """Dataset name as recorded (config fallback), '?' when unknown."""
        return str(self.field("dataset", str) or "?")

    @property
    def task(self) -> str:
        """'lm' or 'classification' ('?' when unknown)."""
        return str(self.field("task", str) or "?")

    @property
    def model(self) -> str:
        """Model name as recorded."""
        return str(self.field("model", str) or "?")

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """Lines of metrics.jsonl (loaded on first use; a torn last line is ignored)."""
        if self._metrics is None:
            self._metrics = read_metrics(self.path / "metrics.jsonl")
        return self._metrics

    def test_items(self) -> dict[str, Any] | None:
        """{"metric", "unit", "values"}: the test metric per item in a fixed order, else None."""
        if self._items is None:
            data = read_json_mapping(self.path / TEST_ITEMS_FILE)
            ok = isinstance(data, dict) and isinstance(data.get("values"), list) and data.get("metric")
            self._items = data if ok else {}
        return self._items or None

    def eval_curve(self, key: str, split: str = "val") -> list[tuple[int, float]]:
        """(step, value) pairs of eval lines of one split that carry `key`."""
        out = []
        for line in self.metrics:
            if line.get("kind") == "eval" and line.get("split", "val") == split and key in line:
                val = line[key]
                if isinstance(val, (int, float)) and math.isfinite(val):
                    out.append((int(line["step"]), float(val)))
        return out

    def field(self, name: str, cast: type) -> Any:
        """Look a field up in results, then the config, then the sweep directory layout."""
        for source in (self.results, self.config):
            val = _dig(source, name)
            if val is not None:
                try:
                    return cast(val)
                except (TypeError, ValueError):
                    return None
        key = parse_run_path(self.path)
        value = getattr(key, name, None) if key is not None else None
        return None if value is None else cast(value)


def _dig(source: dict[str, Any], name: str) -> Any:
    """A key at the top level or one level down (configs group keys into sections)."""
    if name in source and not isinstance(source[name], dict):
        return source[name]
    for val in source.values():
        if isinstance(val, dict) and name in val and not isinstance(val[name], dict):
            return val[name]
    return None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Parse a metrics.jsonl file; unreadable lines (a crash mid-write) are skipped."""
    if not path.is_file():
        return []
    lines = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            if obj.get("kind") == "eval":
                check_eval_step(obj, f"{str(path)!r} line {n}")
            lines.append(obj)
    return lines


def read_json_mapping(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file, or None if absent or unreadable."""
    obj = read_json(path)
    return obj if isinstance(obj, dict) else None


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """A YAML mapping from a file (the strict loader), or {} if absent or unreadable."""
    try:
        obj = load_yaml_text(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return obj if isinstance(obj, dict) else {}


def read_run_config(path: Path) -> dict[str, Any]:
    """A run's config.yaml as a mapping ({} where there is none). A file that is there but cannot be
    read (not valid YAML, not UTF-8, not a mapping) is refused, naming it: a run whose settings are
    unknown would pass every comparison check (records.comparable) and be pooled with the others."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        why = " ".join(str(err).split())[:160]
    else:
        try:
            obj = load_yaml_text(text)
        except yaml.YAMLError as err:
            why = " ".join(str(err).split())[:160]
        else:
            if obj is None or isinstance(obj, dict):
                check_recorded_numbers(obj, "config", repr(str(path)))
                return obj or {}
            why = f"it holds a YAML {type(obj).__name__}, not a mapping of settings"
    raise UserError(
        f"{str(path)!r} cannot be read ({why}): that run's settings are unknown, so it cannot be compared "
        "with the others; restore the file from a copy, or move that run out of the folders given"
    )


def read_results(run_dir: str | Path) -> RunResults | None:
    """A run directory's results.json in today's names (normalize_results), or None when absent.
    One that is there but is no JSON object (damaged, or edited by hand) is refused by name: read
    as absent, its run would pass for unfinished and a sweep would train it again beside it.

    Each version of the file is read once per process (a sweep asks whether a run is finished,
    plans its extensions and reports it; results.json is written by an atomic rename, so a new
    version has a new inode and modification time): every caller gets its own copy.

    A directory holding only a compact record (RUN/record.json, restored from committed records by
    scripts/store_records.py --restore) is read as that record's results: a run finished on another
    machine, which a sweep skips and reports as finished."""
    for name, record in ((RESULTS_FILE, False), (RUN_RECORD_FILE, True)):
        path = Path(run_dir) / name
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):  # not there (or a file where the folder goes)
            continue
        raw = _read_results_file(str(path), st.st_ino, st.st_mtime_ns, st.st_size, record)
        return normalize_results(copy.deepcopy(raw))
    return None


def forget_read_results() -> None:
    """Forget every results.json read so far (a long-lived process, or a test of the reads)."""
    _read_results_file.cache_clear()


@functools.lru_cache(maxsize=4096)
def _read_results_file(path: str, _ino: int, _mtime_ns: int, _size: int, record: bool = False) -> dict[str, Any]:
    fix = "oelm train writes it when a run ends: restore it, or remove the run directory to train it again"
    raw = read_json(path, fix)
    if record:  # a compact record: its results section (records.compact checks the rest on loading)
        if not isinstance(raw, dict) or not isinstance(raw.get("results"), dict):
            raise UserError(f"{path!r} is not an oelm run record with results; {fix}")
        raw = raw["results"]
    if not isinstance(raw, dict):
        raise UserError(f"{path!r} holds a JSON {type(raw).__name__}, not an object; {fix}")
    check_recorded_numbers(raw, "results", repr(path))
    return raw


def normalize_results(raw: dict[str, Any]) -> RunResults:
    """results.json of any schema version in the names of SCHEMA_VERSION (a new dict; the file is
    left as it is). The one compatibility reader: every report, sweep and board reads through it.

    Version 1 wrote `model_type` (= method): read as `method` where that is missing, then dropped.
    It had no `final_split`: LM records wrote `final_perplexity` = test perplexity when the data had
    a test split, else the *validation* perplexity; here it is kept only for a test split, and
    `final_split` says which split the final numbers are on. Its test split's origin was not
    recorded (`test_source`: TEST_UNKNOWN).
    """
    out = dict(raw)
    for old, new in RENAMED_KEYS.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    if out.get("task") == "lm" or "val_perplexity" in out:
        has_test = out.get("test_loss") is not None or out.get("test_perplexity") is not None
        out.setdefault("final_split", "test" if has_test else "val")
        if out["final_split"] != "test":
            out["final_perplexity"] = None
        out.setdefault("test_source", TEST_UNKNOWN if has_test else None)
    elif out.get("task") == "classification":
        out.setdefault("final_split", "test")
        out.setdefault("test_source", TEST_UNKNOWN)
    return cast(RunResults, out)


def classify(results: RunResults | dict[str, Any] | None) -> tuple[str, str]:
    """Status of a run from its results.json: (status, reason), decided on validation only.

    A failed freeze check comes first (the arm did not run its method, whatever else happened);
    then divergence (a non-finite validation selection metric) and collapse (chance-level
    validation accuracy). Held-out numbers never change the status: they are what is reported.
    """
    if results is None:
        return INCOMPLETE, "no results.json"
    if results.get("status") == DIVERGED:
        return COLLAPSED, (
            f"training loss became {results.get('diverged_loss')} at step {results.get('diverged_at_step')} "
            "(diverged in training, stopped there)"
        )
    if results.get("status") != COMPLETE:
        return INCOMPLETE, f"status is {results.get('status')!r}"
    check = results.get("freeze_check")
    if isinstance(check, dict) and check.get("ok") is False:
        return INVALID, "freeze check failed: the run did not train its method as specified"
    selection = results.get("selection_metric")
    value = results.get(selection) if isinstance(selection, str) else None
    kept = results.get("selection_kept", True)  # False: a record rebuilt from a stored table
    if selection and kept and (not isinstance(value, (int, float)) or not math.isfinite(value)):
        return COLLAPSED, f"{selection} is {value!r} (diverged on validation)"
    if results.get("collapsed") is True:
        return COLLAPSED, "collapsed: true (chance-level validation predictions)"
    return COMPLETE, ""


def is_finished(results: RunResults | dict[str, Any] | None) -> bool:
    """Whether results.json marks a finished run: any status but INCOMPLETE (the same decision)."""
    return isinstance(results, dict) and classify(results)[0] != INCOMPLETE


def run_status(run_dir: str | Path) -> tuple[str, str]:
    """(status, reason) of a run directory, from its results.json."""
    return classify(read_results(run_dir))


def run_finished(run_dir: str | Path) -> bool:
    """Whether run_dir holds a finished run (sweeps skip it; reports list it as finished)."""
    return run_status(run_dir)[0] != INCOMPLETE


def heldout_note(results: RunResults | dict[str, Any]) -> str:
    """What is wrong with a run's held-out numbers ('' if nothing): information, never selection."""
    if results.get("heldout_collapsed") is True:
        return "chance-level held-out predictions (heldout_collapsed: true)"
    primary = results.get("primary_metric")
    value = results.get(primary) if isinstance(primary, str) else None
    if primary and value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value)):
        return f"{primary} is {value!r}"
    non_finite = results.get("non_finite") or []
    if isinstance(primary, str) and (primary in non_finite or (primary in results and value is None)):
        # JSON has no NaN: a non-finite metric is written as null (and named in `non_finite`).
        return f"{primary} is not a finite number (null in results.json: NaN or inf when computed)"
    return ""
