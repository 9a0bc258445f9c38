"""The stability rule: whether a finished run diverged or spiked, decided from what its record holds.

A run is **unstable** when (checked in this order, validation only, never a held-out number):

1. its training loss became non-finite (results.json status "diverged": the loop stopped it);
2. its validation selection metric is non-finite;
3. a validation loss of its metrics stream (eval lines of the val split, key `loss`) is non-finite;
4. where the run selects on a loss (lower is better: language models): a validation loss exceeds
   SPIKE_FACTOR times the best validation loss the run had reached before that evaluation (a
   spike, recovered or not: the loss "far above its own best"); a record without eval lines (one
   rebuilt from a stored table) that keeps `final_val_loss` and `best_val_loss`: the final exceeds
   SPIKE_FACTOR times the best. Tasks that select on a higher-is-better metric (classifiers,
   probes) get the non-finite checks only: their validation loss rises with overconfidence while
   accuracy holds (seen in the stored IMDB records), and chance-level runs are already "collapsed".

Flagged runs are kept: the reports count them per arm and per learning rate and state how they
enter the statistics (reports.aggregate.INSTABILITY_POLICY); the LR rule avoids settings that hold
one, or whose next larger learning rate does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from oelm.records.run import DIVERGED, RunRecord

SPIKE_FACTOR = 1.5  # a validation loss above 1.5 x the run's best so far is a spike
RULE = (
    "a run is unstable when its training loss became non-finite, its validation selection metric is "
    "non-finite, a validation loss is non-finite, or (runs that select on a loss) a validation loss "
    f"exceeds {SPIKE_FACTOR:g} x the best validation loss the run had reached before it (the final one "
    f"included; records without curves: final_val_loss above {SPIKE_FACTOR:g} x best_val_loss)"
)


DIVERGED_KIND = "diverged"  # a non-finite value: the run cannot enter a mean
SPIKED = "spiked"  # finite, but far above its own best: it enters with its value


@dataclass(frozen=True)
class Instability:
    """What the rule found: its kind (DIVERGED_KIND or SPIKED) and the reason, in words."""

    kind: str
    reason: str


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _val_losses(run: RunRecord) -> list[tuple[int, Any]]:
    """(step, loss) of the run's validation eval lines in stream order, non-finite values kept."""
    return [
        (int(line.get("step") or 0), line["loss"])
        for line in run.metrics
        if line.get("kind") == "eval" and line.get("split", "val") == "val" and "loss" in line
    ]


def selects_on_loss(results: Any) -> bool:
    """Whether the run's selection metric is lower-is-better (as recorded; by its name for old records)."""
    recorded = results.get("higher_is_better")
    if isinstance(recorded, bool):
        return not recorded
    name = str(results.get("selection_metric") or "")
    return "loss" in name or "perplexity" in name


def instability(run: RunRecord, factor: float = SPIKE_FACTOR) -> Instability | None:
    """What makes a finished run unstable under the rule above; None when it is stable."""
    res = run.results
    if res.get("status") == DIVERGED:
        return Instability(
            DIVERGED_KIND, f"training loss {res.get('diverged_loss')} at step {res.get('diverged_at_step')}"
        )
    selection = res.get("selection_metric")
    if isinstance(selection, str) and res.get("selection_kept", True) and not _finite(res.get(selection)):
        return Instability(DIVERGED_KIND, f"{selection} is {res.get(selection)!r}")
    losses = _val_losses(run)
    for step, loss in losses:
        if not _finite(loss):
            return Instability(DIVERGED_KIND, f"validation loss {loss!r} at step {step}")
    if not selects_on_loss(res):
        return None
    best: float | None = None
    best_step = 0
    for step, loss in losses:
        if best is not None and loss > factor * best:
            why = f"validation loss {loss:.4g} at step {step} > {factor:g} x its best {best:.4g} (step {best_step})"
            return Instability(SPIKED, why)
        if best is None or loss < best:
            best, best_step = float(loss), step
    final, low = res.get("final_val_loss"), res.get("best_val_loss")
    if best is None and _finite(final) and _finite(low) and final > factor * low:
        return Instability(SPIKED, f"final_val_loss {final:.4g} > {factor:g} x best_val_loss {low:.4g}")
    return None
