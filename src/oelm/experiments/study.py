"""Pure data helpers of config resolution: study-config scales, deep merging, the study's meta keys.

No I/O and no validation: experiments.resolve, the one resolver, is their only caller.
"""

from __future__ import annotations

import copy
from typing import Any

from oelm.utils.errors import UserError

SCALES_KEY = "scales"
REPLACED_KEYS = ("prepare",)


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


META_KEYS = ("study", "prepare", "passes")  # read by oelm.experiments, not by TrainConfig


def split_study_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainConfig keys, meta keys: study id/title and the data `prepare` recipe)."""
    train = {k: v for k, v in config.items() if k not in META_KEYS and k != SCALES_KEY}
    meta = {k: config[k] for k in META_KEYS if k in config}
    return train, meta
