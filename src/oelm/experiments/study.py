"""The original study's reported figures (kept in a config table) and study-config scales."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from oelm.errors import UserError

SCALES_KEY = "scales"
REPLACED_KEYS = ("prepare",)


def _norm(text: str) -> str:
    """Lower-case alphanumerics only, so 'WikiText-103' matches 'wikitext103'."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _family(model: str) -> str:
    """Model family used to tell the study's BERT runs from its GPT-classifier runs."""
    name = model.lower()
    return "bert" if any(k in name for k in ("bert", "minilm", "roberta")) else "gpt"


@dataclass(frozen=True)
class StudyNumbers:
    """The study's reported numbers: {experiment id: {dataset, method, task, model, value, ...}}."""

    entries: dict[str, dict[str, Any]]
    source: str

    @classmethod
    def load(cls, path: str | Path) -> StudyNumbers:
        """Read the table; UserError naming the file when it is missing or malformed."""
        from oelm.training.config import load_yaml

        path = Path(path)
        data = load_yaml(path)
        entries = data.get("experiments")
        if not isinstance(entries, dict):
            raise UserError(f"{path} needs a mapping 'experiments: {{ID: {{...}}}}'")
        for exp_id, entry in entries.items():
            missing = {"dataset", "method", "task", "model", "metric", "value"} - set(entry)
            if missing:
                raise UserError(f"{path}: experiment {exp_id} lacks {sorted(missing)}")
        return cls(entries=entries, source=str(data.get("source", path.name)))

    def lookup(self, task: str, dataset: str, model: str, method: str) -> dict[str, Any] | None:
        """The study's entry for this task/dataset/model family/method, with its id, or None."""
        data = _norm(dataset)
        for exp_id, entry in self.entries.items():
            if (
                entry["task"] == task
                and entry["method"] == method
                and _family(entry["model"]) == _family(model)
                and any(_norm(alias) in data for alias in _aliases(entry))
            ):
                return {"id": exp_id, **entry}
        return None


def _aliases(entry: dict[str, Any]) -> list[str]:
    """Names under which a dataset may be recorded."""
    return [entry["dataset"], *entry.get("aliases", [])]


def apply_scale(config: dict[str, Any], scale: str | None) -> dict[str, Any]:
    """The config with `scales[scale]` deep-merged over it, and the scales key removed."""
    scales = config.get(SCALES_KEY) or {}
    base = {k: copy.deepcopy(v) for k, v in config.items() if k != SCALES_KEY}
    if scale is None or scale == "full":
        return base
    if scale not in scales:
        known = ", ".join(["full", *scales]) or "full"
        raise UserError(f"unknown scale {scale!r}; this config has: {known}")
    override = scales[scale] or {}
    merged = deep_merge(base, override)
    for key in REPLACED_KEYS:  # a scale's data recipe stands alone: never mix two sources
        if key in override:
            merged[key] = copy.deepcopy(override[key])
    return merged


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of base with override merged in (nested mappings merged, other values replaced)."""
    out = copy.deepcopy(base)
    for key, val in (override or {}).items():
        if isinstance(val, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], val)
        else:
            out[key] = copy.deepcopy(val)
    return out


META_KEYS = ("study", "prepare")  # read by oelm.experiments, not by TrainConfig


def split_study_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainConfig keys, meta keys: study id/title and the data `prepare` recipe)."""
    train = {k: v for k, v in config.items() if k not in META_KEYS and k != SCALES_KEY}
    meta = {k: config[k] for k in META_KEYS if k in config}
    return train, meta
