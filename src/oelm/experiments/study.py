"""Pure data helpers of config resolution: study-config scales and the study's meta keys.

No I/O and no validation: experiments.resolve, the one resolver, is their only caller.
"""

from __future__ import annotations

import copy
from typing import Any

from oelm.training.config import apply_mapping
from oelm.utils.errors import UserError

SCALES_KEY = "scales"
REPLACED_KEYS = ("prepare",)


def apply_scale(config: dict[str, Any], scale: str | None) -> dict[str, Any]:
    """The config with `scales[scale]` merged over it (training.config.apply_mapping), the scales key removed."""
    scales = config.get(SCALES_KEY) or {}
    base = {k: copy.deepcopy(v) for k, v in config.items() if k != SCALES_KEY}
    if scale is None or scale == "full":
        return base
    if scale not in scales:
        known = ", ".join(["full", *scales]) or "full"
        raise UserError(f"unknown scale {scale!r}; this config has: {known}")
    override = scales[scale] or {}
    merged = apply_mapping(base, override, f"scale {scale!r}")
    for key in REPLACED_KEYS:  # a scale's data recipe stands alone: never mix two sources
        if key in override:
            merged[key] = copy.deepcopy(override[key])
    return merged


META_KEYS = ("study", "prepare", "passes")  # read by oelm.experiments, not by TrainConfig


def split_study_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainConfig keys, meta keys: study id/title and the data `prepare` recipe)."""
    train = {k: v for k, v in config.items() if k not in META_KEYS and k != SCALES_KEY}
    meta = {k: config[k] for k in META_KEYS if k in config}
    return train, meta
