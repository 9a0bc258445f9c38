"""The original study's reported figures (a config table), matched to our groups for reports."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oelm.training.config import load_yaml
from oelm.utils.errors import UserError


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
