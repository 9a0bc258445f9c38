"""Environment variables that oelm reads: one check each, where they enter (docs/inputs.md)."""

from __future__ import annotations

import math
import os

from oelm.utils.errors import UserError


def env_seconds(name: str, default: float, positive: bool = False) -> float:
    """A number of seconds from environment variable `name` (unset or empty: `default`).

    Anything but a finite number >= 0 (> 0 with `positive`: a timeout of 0 would fail every wait)
    is one UserError naming the variable, its value and the fix, before any work starts.
    """
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise UserError(
            f"environment variable {name}={raw!r} is not a number of seconds {bound}; set e.g. {name}={default:g} "
            "or unset it"
        )
    return value


def env_count(name: str, default: int) -> int:
    """A whole number >= 0 from environment variable `name` (unset or empty: `default`)."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise UserError(
            f"environment variable {name}={raw!r} is not a whole number >= 0; set e.g. {name}={default} or unset it"
        )
    return value
