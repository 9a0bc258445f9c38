"""The run-directory layout of a sweep, built and parsed here only.

SWEEP/runs/<method>/<setting>/seed<seed>, where the setting names the LR and any other swept
field (`lr0.003`, `lr0.003_batch_size16`), so settings that share an LR stay apart.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUNS = "runs"  # SWEEP/runs/: the folder the run directories sit under
# A run directory's compact record (records.compact); a directory holding only this file is a
# finished run restored from committed records (scripts/store_records.py --restore).
RUN_RECORD_FILE = "record.json"
_SEED = re.compile(r"^seed(?P<seed>-?\d+)$")
_SETTING_LR = re.compile(r"^lr(?P<lr>[0-9.eE+-]+?)(?:_|$)")


@dataclass(frozen=True)
class RunKey:
    """Where a run sits in a sweep: its method, setting and seed (the LR when the setting names one)."""

    method: str
    setting: str
    seed: int
    lr: float | None = None

    def path(self, sweep_dir: str | Path) -> Path:
        """The run directory of this key under a sweep directory."""
        return Path(sweep_dir) / RUNS / self.method / self.setting / f"seed{self.seed}"


def tag(value: Any) -> str:
    """A grid value as it appears in a setting name."""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in text)


def setting_name(lr: float, extra: dict[str, Any] | None = None) -> str:
    """The setting directory of an LR and the other swept fields: lr<lr>[_<field><value>...]."""
    return f"lr{lr:g}" + "".join(f"_{k}{tag(v)}" for k, v in (extra or {}).items())


def setting_lr(setting: str) -> float | None:
    """The LR a setting name carries, or None."""
    found = _SETTING_LR.match(setting)
    if found is None:
        return None
    with contextlib.suppress(ValueError):  # named like an LR but not one
        return float(found["lr"])
    return None


def parse_run_path(path: str | Path) -> RunKey | None:
    """The key of a run directory in the layout (.../runs/<method>/<setting>/seed<N>, the setting
    naming an LR), or None when the path is not laid out so."""
    parts = Path(path).parts
    if len(parts) < 4 or parts[-4] != RUNS:
        return None
    method, setting, leaf = parts[-3:]
    seed = _SEED.match(leaf)
    lr = setting_lr(setting)
    if seed is None or lr is None:
        return None
    return RunKey(method, setting, int(seed["seed"]), lr)
