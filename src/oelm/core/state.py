"""What `apply_method` did to a model: the `MethodState` it records on the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from oelm.core.methods import Method
from oelm.core.targets import ModelTargets, unwrap

# Attribute on the model recording what was applied, read by the audit.
STATE_ATTR = "_oelm_method_state"


@dataclass
class MethodState:
    """What apply_method did: the method, its options, the seed, per-parameter init and frozen flags."""

    method: Method
    seed: int
    qk_init: str | None
    family: str
    options: dict[str, Any] = field(default_factory=dict)  # validated, defaults filled in
    layers: list[int] = field(default_factory=list)  # layer indices the method touched
    inits: dict[str, str] = field(default_factory=dict)  # parameter name -> init used
    orthogonal_heads: dict[str, int] = field(default_factory=dict)  # frozen orthogonal weight -> n_heads
    # For weights on the meta device (parameter counting without memory): the orthogonality
    # error of the values that were written, in the parameter's dtype.
    meta_orthogonality: dict[str, float] = field(default_factory=dict)
    scheduled: list[str] = field(default_factory=list)  # projection names a schedule switches
    # Fraction of training steps the scheduled projections spend frozen: from the option f until
    # oelm.core.schedules.FreezeSchedule knows the step count.
    scheduled_frozen_fraction: float = 0.0
    # The model's targets, found once by apply_method and reused by the audit, FLOP accounting,
    # schedules and saving (the search also splits GPT-2's fused projection, so it runs once).
    targets: ModelTargets | None = field(default=None, repr=False, compare=False)
    # A fine-tuning method's summary (oelm.core.tuning.apply_tuning): kind, head, trainable tensors.
    tuning: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        """The method and its options, as stored in checkpoints (enough to re-apply it)."""
        return {"method": self.method.name, "method_options": dict(self.options), "method_seed": self.seed}


def method_state(model: nn.Module) -> MethodState | None:
    """The MethodState recorded by apply_method, if any."""
    return getattr(unwrap(model), STATE_ATTR, None)
