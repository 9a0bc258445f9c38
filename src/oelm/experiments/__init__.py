"""Experiments: sweeps, the quickstart `compare`, probes, leaderboard, confirmation, the config resolver."""

from __future__ import annotations

import importlib
import importlib.util


def __getattr__(name: str):
    # Submodules load on first attribute access: `oelm.experiments.X` works after a bare `import oelm`.
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
