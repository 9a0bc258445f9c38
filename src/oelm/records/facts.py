"""What a report needs to know about a task, recorded with each run (results.json's `reporting`).

A task plug-in declares its facts once (`Task.reporting`, training/task.py) and every run writes
them into results.json, so reports read them from the records and never branch on a task's name:
adding a task touches no report code. Records written before the key existed get the facts of
their task from LEGACY (the three tasks of that time).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ReportingFacts:
    """How a task's runs are reported."""

    curve_metric: str = "loss"  # the eval-line key of validation curves
    curve_label: str = "validation loss"  # its axis label
    item_unit: str = "item"  # what one test item is (LM window, classifier example)
    length_key: str = "seq_len"  # the config/results key of the sequence length in the budget line
    # Whether the gap's interval may carry the test set's noise (a paired bootstrap over per-item
    # 0/1 correctness): tables then say what noise each interval includes.
    item_noise_interval: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The facts as results.json stores them."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> ReportingFacts | None:
        """Facts from results.json's `reporting` (None when absent or not a mapping)."""
        if not isinstance(raw, Mapping):
            return None
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


LM = ReportingFacts(item_unit="window")
CLASSIFICATION = ReportingFacts(
    curve_metric="accuracy",
    curve_label="validation accuracy",
    item_unit="example",
    length_key="max_length",
    item_noise_interval=True,
)
PROBE = ReportingFacts(curve_metric="accuracy", curve_label="validation accuracy", item_unit="window")
# The facts of records written before results.json carried `reporting`, by their task.
LEGACY: dict[str, ReportingFacts] = {"lm": LM, "classification": CLASSIFICATION, "probe": PROBE}


def facts_of(task: str, results: Iterable[Mapping[str, Any]] = ()) -> ReportingFacts:
    """The facts the runs recorded (the first that did), else their task's legacy facts, else the defaults."""
    for res in results:
        found = ReportingFacts.from_dict(res.get("reporting"))
        if found is not None:
            return found
    return LEGACY.get(task, ReportingFacts())
