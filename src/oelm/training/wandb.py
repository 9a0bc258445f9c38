"""Optional Weights & Biases logging next to TensorBoard (off unless a run sets `wandb: true`).

wandb reads WANDB_MODE itself, so WANDB_MODE=offline writes the run under RUN_DIR/wandb for a
later `wandb sync`, and WANDB_MODE=disabled turns it into a no-op. Install with `oelm[wandb]`.
"""

from __future__ import annotations

import importlib.util
import math
import uuid
from pathlib import Path
from typing import Any

from oelm.utils.errors import UserError

ID_FILE = "wandb_id.txt"  # a resumed run continues the same wandb run


def require_wandb() -> None:
    """Raise the install hint when wandb is asked for but not installed."""
    if importlib.util.find_spec("wandb") is None:
        raise UserError("wandb: true needs the wandb package: pip install 'oelm[wandb]' (or set wandb: false)")


class WandbLogger:
    """Scalars to a wandb run, with TensorBoard's `scalars(prefix, values, step)` / `close()` interface."""

    def __init__(self, run_dir: Path, config: dict[str, Any], project: str | None = None) -> None:
        require_wandb()
        import wandb  # heavy optional dependency: imported on use

        id_path = Path(run_dir) / ID_FILE
        run_id = id_path.read_text().strip() if id_path.is_file() else uuid.uuid4().hex[:12]
        id_path.write_text(run_id + "\n")
        self._run = wandb.init(
            project=project or "oelm",
            name=Path(run_dir).name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
        )

    def scalars(self, prefix: str, values: dict[str, Any], step: int) -> None:
        """Log each finite numeric value as prefix/name at `step`."""
        data = {
            f"{prefix}/{k}": v
            for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        if data:
            self._run.log(data, step=step)

    def close(self) -> None:
        """Finish the wandb run."""
        if self._run is not None:
            self._run.finish()
            self._run = None


class FanOut:
    """Send every call to several loggers (TensorBoard and wandb)."""

    def __init__(self, *loggers: Any) -> None:
        self.loggers = loggers

    def scalars(self, prefix: str, values: dict[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.scalars(prefix, values, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
