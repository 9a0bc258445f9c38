"""What may differ between the runs of one comparison: decided here, checked before any statistic.

A table compares arms on one protocol. Its runs may differ only in the method and the method's
options (between arms), the learning rate and the other fields a setting name carries (between
settings), and the seed. Everything else their configs record (budget, model and its size, data,
schedule, evaluation) must agree, and each run is one (method, setting, seed): `check_protocol`
refuses a table that breaks either rule, naming the field, its values, a run of each and the fix.
The fields that change how a run is executed but not what it computes (RUNTIME) never count.

A config records its fields as the oelm that wrote it knew them: a field that one run's config
lacks (written before the field existed) is not a difference.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from oelm.records.layout import parse_run_path
from oelm.records.run import RunRecord
from oelm.utils.errors import UserError

# Fields that change how a run is executed or written but not what it computes; a resumed run may
# differ from the stored one in these without being "a different run" (training.config uses this).
RUNTIME_FIELDS = frozenset(
    {
        "out",
        "resume",
        "overwrite",
        "device",
        "strategy",  # same computation either way; its checkpoint format is checked on resume
        "compile",
        "compile_mode",
        "progress",
        "tensorboard",
        "log_every",
        "allow_change",
        "wandb",
        "wandb_project",
    }
)
# ... plus the per-run bookkeeping a sweep sets: neither counts when tables are compared.
RUNTIME = RUNTIME_FIELDS | {"checkpoint_every", "keep_last"}
SEED_FIELDS = ("seed", "data_seed")  # differ between the seeds of one setting
ARM_FIELDS = ("method", "method_options")  # differ between arms
LR_FIELD = "lr"  # differs between settings (with the fields a setting name carries)
SHOWN = 3  # differing fields named in one message
# Mappings whose keys are free-form (set or left at the preset's / method's default): a key one run
# sets and another leaves out is a difference.
FREEFORM = ("model_overrides", "method_options")
NOT_SET = "(not set)"


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A config as {dotted key: canonical JSON of its value}, runtime fields left out."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if not prefix and key in RUNTIME:
            continue
        if isinstance(value, dict) and value:
            flat.update(flat_config(value, f"{name}."))
        else:
            flat[name] = json.dumps(value, sort_keys=True, default=str)
    return flat


def config_differences(planned: dict[str, Any], stored: dict[str, Any]) -> list[str]:
    """The fields (dotted) in which a run stored with config `stored` was trained otherwise than
    `planned` (a config or TrainConfig.identity()): the one stored-against-planned check, used by
    `oelm train`'s run directory (training.rundir), a sweep's stale run folders and a confirmation's
    runs (experiments.sweep.RunSpec). Runtime fields never count (RUNTIME), nor a top-level field the
    stored config lacks (written before the field existed); values compare as canonical JSON."""
    theirs, mine = flat_config(stored), flat_config(planned)
    tops = {_top(k) for k in theirs}
    keys = {k for k in set(mine) | set(theirs) if _top(k) in tops}
    return sorted(k for k in keys if mine.get(k) != theirs.get(k))


def run_identity(run: RunRecord) -> dict[str, str]:
    """What a run computed, flat (flat_config): its config, with the method options as results.json
    records them (validated, defaults filled in) where it does."""
    config = dict(run.config)
    options = run.results.get("method_options")
    if isinstance(options, dict):
        config["method_options"] = options
    return flat_config(config)


def _top(key: str) -> str:
    return key.split(".", 1)[0]


def _named_by_setting(key: str, setting: str) -> bool:
    """Whether a setting name (lr<lr>_<field><value>...) carries the field `key` or a field above it."""
    parts = key.split(".")
    return any(f"_{'.'.join(parts[:i])}" in setting for i in range(1, len(parts) + 1))


def _differences(runs: Sequence[RunRecord], keep: Any) -> dict[str, dict[str, list[RunRecord]]]:
    """Per dotted key that `keep(run, key)` admits: its values and the runs holding each, for the
    keys whose runs hold two values or more. A run whose config lacks a top-level field is left out
    of that field (written before it existed); inside a free-form mapping (FREEFORM) a key one run
    sets and another leaves out is a difference (NOT_SET)."""
    flats = [(run, run_identity(run)) for run in runs]
    keys = sorted({k for _, flat in flats for k in flat})
    keys = [k for k in keys if not any(o.startswith(f"{k}.") for o in keys)]  # an empty mapping beside a set one
    values: dict[str, dict[str, list[RunRecord]]] = defaultdict(lambda: defaultdict(list))
    for run, flat in flats:
        tops = {_top(k) for k in flat}
        for key in keys:
            if not keep(run, key):
                continue
            if key in flat:
                values[key][flat[key]].append(run)
            elif _top(key) in FREEFORM and _top(key) in tops:
                values[key][NOT_SET].append(run)
    return {k: dict(v) for k, v in values.items() if len(v) > 1}


def _describe(diff: dict[str, dict[str, list[RunRecord]]]) -> str:
    """'steps (40: 6 run(s), e.g. A; 80: 3 run(s), e.g. B)' for the first SHOWN fields."""
    parts = []
    for key, by_value in list(diff.items())[:SHOWN]:
        shown = "; ".join(
            f"{value}: {len(runs)} run(s), e.g. {runs[0].path}"
            for value, runs in sorted(by_value.items(), key=lambda kv: -len(kv[1]))
        )
        parts.append(f"{key} ({shown})")
    more = f" and {len(diff) - SHOWN} more field(s)" if len(diff) > SHOWN else ""
    return "; ".join(parts) + more


def _layout_disagreement(run: RunRecord) -> str:
    """What a run's directory in the sweep layout says that its own record contradicts ('' if none):
    a run copied or moved into another run's place."""
    key = parse_run_path(run.path)
    if key is None:
        return ""
    said = []
    if run.method is not None and run.method != key.method:
        said.append(f"its folder says method {key.method}, its record {run.method}")
    if run.seed is not None and run.seed != key.seed:
        said.append(f"its folder says seed {key.seed}, its record {run.seed}")
    if run.lr is not None and key.lr is not None and float(f"{run.lr:g}") != key.lr:
        said.append(f"its folder says lr {key.lr:g}, its record {run.lr:g}")
    return ", ".join(said)


def check_protocol(title: str, runs: Sequence[RunRecord]) -> None:
    """Refuse a table whose runs are not one protocol: a run in another run's folder, one run
    counted twice (a copy, under any folder name), seeds of one setting that differ in anything but
    the seed, or arms that differ in anything but method, options, LR, setting and seed.
    One UserError naming the field, its values, a run holding each and the fix."""
    for run in runs:
        if said := _layout_disagreement(run):
            raise UserError(
                f"{run.path} sits in another run's place ({said}): a run copied or moved into the sweep "
                "layout is counted under the wrong arm, setting or seed. Move it back or remove it"
            )
    _check_duplicates(title, runs)
    cells: dict[tuple[str, str], list[RunRecord]] = defaultdict(list)
    for run in runs:
        cells[(run.method or "?", run.setting)].append(run)
    for (method, setting), members in sorted(cells.items()):
        diff = _differences(members, lambda _run, key: _top(key) not in SEED_FIELDS)
        if diff:
            raise UserError(
                f"the seeds of {method} {setting} in {title} were trained under different settings: "
                f"{_describe(diff)}. Seeds of one setting may differ only in the seed (was the sweep spec edited "
                "between two runs of one sweep directory?): move the runs of each setting to a sweep directory of "
                "their own, or rerun the odd ones under the others' settings"
            )
    diff = _differences(
        runs,
        lambda run, key: (
            _top(key) not in (*SEED_FIELDS, *ARM_FIELDS, LR_FIELD) and not _named_by_setting(key, run.setting)
        ),
    )
    diff.pop("data", None) if _fingerprinted(runs) else None
    if diff:
        raise UserError(
            f"the runs of {title} differ in {_describe(diff)}: one comparison needs one budget, model, data "
            "and evaluation (only the method and its options, the LR and other swept fields, and the seed may "
            "differ). Report runs of one protocol together (pass those sweep directories apart), or rerun the "
            "odd ones with the others' settings"
        )


def _fingerprinted(runs: Iterable[RunRecord]) -> bool:
    """Every run records its data's fingerprint: the data is compared by it (check_same_data), not by
    the folder it was read from (which may move)."""
    return all(r.results.get("data_fingerprint") for r in runs)


def _check_duplicates(title: str, runs: Sequence[RunRecord]) -> None:
    """Refuse two runs that are one run: the same (method, setting, seed), or the same config in
    everything but where it was written (a copy left under another folder name)."""
    seen: dict[tuple, RunRecord] = {}
    for run in runs:
        flat = run_identity(run)
        idents = [("slot", run.method, run.setting, run.seed)]
        if run.seed is not None and "seed" in flat and "method" in flat:
            idents.append(("config", json.dumps(flat, sort_keys=True)))
        for ident in idents:
            if ident in seen and not _same_place(seen[ident], run):
                first = seen[ident]
                named = first if parse_run_path(first.path) is not None else run  # the one in the layout
                raise UserError(
                    f"two runs of {title} are {named.method} {named.setting} seed {named.seed}: {first.path} and "
                    f"{run.path}; each seed counts once. Remove the copy, or pass each sweep directory once"
                )
            seen.setdefault(ident, run)


def _same_place(a: RunRecord, b: RunRecord) -> bool:
    """Whether two loaded runs are the one folder (a path passed twice loads once; kept for safety)."""
    return Path(a.path).resolve() == Path(b.path).resolve()
