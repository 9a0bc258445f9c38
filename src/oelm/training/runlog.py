"""Run-directory streams: metrics.jsonl, TensorBoard, and the git commit (atomic files: oelm.utils.io)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

from oelm.utils.io import clean_json


class MetricsLog:
    """Append-only metrics.jsonl; `offset()` is the byte position a checkpoint records."""

    def __init__(self, path: Path, truncate_to: int | None = None, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        self._fh = None
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered so that `tail -f` and a crash both see whole lines up to the last step.
        if truncate_to is None:
            self._fh = open(path, "w", buffering=1)  # noqa: SIM115  (held open for the run; close() closes it)
        else:
            # Lines written after the checkpoint we resume from are replayed; drop them.
            self._fh = open(path, "a+", buffering=1)  # noqa: SIM115  (as above)
            self._fh.truncate(truncate_to)
            self._fh.seek(truncate_to)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as a JSON line."""
        if self._fh is not None:
            self._fh.write(json.dumps(clean_json(record)) + "\n")

    def offset(self) -> int:
        """Flush and return the current byte size of the stream."""
        if self._fh is None:
            return 0
        self._fh.flush()
        os.fsync(self._fh.fileno())
        return self._fh.tell()

    def close(self) -> None:
        """Flush and close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class TensorBoard:
    """Thin SummaryWriter wrapper that is a no-op when disabled (non-zero ranks, tests)."""

    def __init__(self, logdir: Path | None, purge_step: int | None = None) -> None:
        self._writer = None
        if logdir is not None:
            from torch.utils.tensorboard import SummaryWriter  # heavy optional dependency: imported on use

            # purge_step drops events logged after the checkpoint a resumed run restarts from.
            self._writer = SummaryWriter(str(logdir), purge_step=purge_step)

    def scalars(self, prefix: str, values: dict[str, Any], step: int) -> None:
        """Log each finite numeric value as prefix/name."""
        if self._writer is None:
            return
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self._writer.add_scalar(f"{prefix}/{name}", value, step)

    def close(self) -> None:
        """Flush and close the writer."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def git_commit(start: Path | None = None) -> str | None:
    """The current git commit of the source tree (with '+dirty' when modified), or None."""
    cwd = str(start or Path(__file__).resolve().parent)
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha or None
