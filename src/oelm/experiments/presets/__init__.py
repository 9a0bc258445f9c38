"""The comparison regimes shipped with the package: `<name>.yaml` here, read by `oelm.experiments.compare`.

Kept apart from that module so that `oelm compare --help` can name them without importing it (and
with it torch, pydantic and the statistics).
"""

from __future__ import annotations

from pathlib import Path

PRESET_DIR = Path(__file__).parent
DEFAULT_PRESET = "quick"


def preset_names() -> list[str]:
    """Presets shipped with the package."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
