"""The numbers of a stored run that no real run leaves non-finite, checked where a record is read.

oelm writes a non-finite value as null (JSON has no NaN) and names a non-finite metric in
results.json's `non_finite`; a run whose loss became NaN is an outcome, listed as collapsed
(records.run.classify), so the metrics (losses, accuracies, perplexities) are not checked here.
What no real run can record — a NaN or inf learning rate, a seed or parameter count that is not a
whole number, an inf step time, a NaN anywhere in the settings it ran with (TrainConfig refuses
one), its timing or its freeze audit — was put there by hand or by another tool; read as it is, it
would be grouped, averaged or compared as a real value (a NaN learning rate is the reports' mark of
"no learning rate"), or end a report in a traceback (`int(nan)`). It is refused here, naming the
file and the field.
"""

from __future__ import annotations

import math
from typing import Any

from oelm.utils.errors import UserError

# results.json keys of a run's setting and accounting (records.run.CommonResults), by the values a
# real run gives them; null is always allowed (not recorded, or not measured).
WHOLE_KEYS = ("seed",)  # a whole number of either sign
COUNT_KEYS = (
    "steps",
    "tokens_seen",
    "best_step",
    "trainable_params",
    "frozen_params",
    "world_size",
    "global_batch_size",
    "peak_memory_bytes",
    "diverged_at_step",
)  # whole numbers >= 0
AMOUNT_KEYS = ("total_wall_time", "mean_step_time", "median_step_time", "tokens_per_second")  # finite, >= 0
POSITIVE_KEYS = ("lr",)  # finite, > 0
# results.json metrics (by name) and the metrics a run names as its primary and selection metric:
# a number or null. A NaN loss is an outcome (written as null, named in `non_finite`); a string, a
# list or a boolean in a metric's place is not, and read as it is it would drop out of a mean as
# "not recorded" without a word.
METRIC_SUFFIXES = ("_loss", "_perplexity", "_accuracy", "_bits_per_byte", "_acc")
# Sections of a record that hold no metric: no non-finite number anywhere in them.
SECTIONS = ("results", "config", "timing", "audit")
# Keys of a freeze audit's totals (and of each role's) that count parameters.
_AUDIT_COUNTS = ("total", "trainable", "frozen")


def check_recorded_numbers(data: Any, section: str, where: str) -> None:
    """Refuse a number of a stored run's `section` (one of SECTIONS) that no real run records.

    results: the keys above, by their rule (metrics are left to classify); config, timing, audit: no
    NaN or inf anywhere (audit counts whole numbers too). `where` names the file (and the record).
    One UserError naming the file, the field and the value."""
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}; one of {SECTIONS}")
    if not isinstance(data, dict):
        return
    if section == "results":
        for keys, rule in (
            (WHOLE_KEYS, _whole),
            (COUNT_KEYS, _count),
            (AMOUNT_KEYS, _amount),
            (POSITIVE_KEYS, _positive),
        ):
            for key in keys:
                if key in data and data[key] is not None and (need := rule(data[key])):
                    _refuse(where, key, data[key], need)
        named = {data.get("primary_metric"), data.get("selection_metric")} - {None}
        for key, value in data.items():
            metric = key in named or (isinstance(key, str) and key.endswith(METRIC_SUFFIXES))
            if metric and value is not None and not _is_number(value) and not _non_finite_text(value):
                _refuse(where, key, value, "a number, or null where it was not measured")
        return
    for name, value in _numbers(data, ""):
        if not math.isfinite(value):
            _refuse(where, name, value, "a finite number")
    if section == "audit":
        totals = data.get("start", {}).get("totals") if isinstance(data.get("start"), dict) else data
        for name, value in _audit_counts(totals if isinstance(totals, dict) else {}):
            if value is not None and (need := _count(value)):
                _refuse(where, name, value, need)


def check_eval_step(line: dict[str, Any], where: str) -> None:
    """An eval line's `step` is a whole number >= 0 (it orders the validation curve)."""
    if "step" in line and (need := _count(line["step"])):
        _refuse(where, "step", line["step"], need)


def _numbers(value: Any, at: str) -> list[tuple[str, float]]:
    """(dotted key, value) of every float in a nested mapping or list."""
    if isinstance(value, float):
        return [(at, value)]
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in _numbers(v, f"{at}.{k}" if at else str(k))]
    if isinstance(value, (list, tuple)):
        return [hit for i, v in enumerate(value) for hit in _numbers(v, f"{at}[{i}]")]
    return []


def _audit_counts(totals: dict[str, Any]) -> list[tuple[str, Any]]:
    out = [(key, totals[key]) for key in _AUDIT_COUNTS if key in totals]
    roles = totals.get("by_role")
    if isinstance(roles, dict):
        for role, counts in roles.items():
            if isinstance(counts, dict):
                out += [(f"by_role.{role}.{k}", v) for k, v in counts.items() if k in _AUDIT_COUNTS]
    return out


def _non_finite_text(value: Any) -> bool:
    """'nan', 'inf', '-inf': how a run writes the non-finite loss it stopped at (diverged_loss)."""
    return isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf", "+inf")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _whole(value: Any) -> str:
    ok = _is_number(value) and math.isfinite(value) and float(value).is_integer()
    return "" if ok else "a whole number"


def _count(value: Any) -> str:
    return "" if not _whole(value) and value >= 0 else "a whole number >= 0"


def _amount(value: Any) -> str:
    return "" if _is_number(value) and math.isfinite(value) and value >= 0 else "a finite number >= 0"


def _positive(value: Any) -> str:
    return "" if _is_number(value) and math.isfinite(value) and value > 0 else "a finite number > 0"


def _refuse(where: str, name: str, value: Any, need: str) -> None:
    raise UserError(
        f"{where} records {name} = {value!r}, which no run records (it must be {need}; oelm writes a value it "
        "could not measure as null): the file was edited or written by another tool; restore it from the run's "
        "copy or git, or move that run out of the folders given"
    )
