"""Freeze schedules driven by the training loop's step: late freeze and progressive unfreeze.

The projections a method lists under `freeze` switch once, before optimizer step
`round(f * steps)`: late-freeze makes them frozen (keeping or re-orthogonalizing the learned
values), unfreeze makes them trainable. The audit follows: a late-frozen tensor is fingerprinted
at the switch and must stay bit-identical to the end; an unfrozen one must be bit-identical at
the switch to its starting fingerprint. `state_dict()` goes into checkpoints so a resumed run
is in exactly the same phase.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from oelm.core import orthogonal as ortho
from oelm.core.audit import Audit, copy_full_, fingerprint, full_value
from oelm.core.state import method_state
from oelm.core.targets import Proj, find_targets, unwrap


def switch_step(f: float, total_steps: int) -> int:
    """The step count after which a schedule switches: before optimizer step `switch_step + 1`."""
    return round(f * total_steps)


def saved_before_switch(step: int, at_step: int) -> bool:
    """Whether weights saved at `step` predate a switch at `at_step`.

    The switch runs after the evaluation (and best/ save) at `at_step`, so those are before it.
    """
    return step <= at_step


class FreezeSchedule:
    """The switch of a method's scheduled projections at one step of a run of `total_steps`."""

    def __init__(self, model: nn.Module, total_steps: int) -> None:
        self.model = unwrap(model)
        self.state = method_state(self.model)
        self.kind: str = self.state.method.schedule
        self.total_steps = total_steps
        self.at_step = switch_step(self.state.options["f"], total_steps)
        self.on_freeze = self.state.options.get("on_freeze", "keep")
        self.switched = False
        self.problems: list[str] = []
        self.fingerprints: dict[str, str] = {}  # late-freeze: parameter -> fingerprint at the switch
        frozen_steps = total_steps - self.at_step if self.kind == "late-freeze" else self.at_step
        self.state.scheduled_frozen_fraction = min(max(frozen_steps, 0), total_steps) / total_steps
        # The scheduled tensors by parameter name, resolved now: a wrapper that later replaces the
        # parameter objects (FSDP2's fully_shard) keeps the names, so the switch finds the current ones.
        ids = {id(p): n for n, p in self.model.named_parameters(remove_duplicate=True)}
        self.scheduled: list[tuple[Proj, int, list[str]]] = []
        names = set(self.state.scheduled)
        for layer in find_targets(self.model).layers:
            for role, proj in layer.by_role():
                if proj.name in names:
                    heads = layer.n_heads if role == "q" else layer.n_kv_heads
                    self.scheduled.append((proj, heads, [ids[id(p)] for _, p in proj.params()]))

    def _projections(self) -> list[tuple[Proj, int, list[tuple[str, nn.Parameter]]]]:
        """(projection, its head count, its (name, current parameter) pairs) per scheduled projection."""
        now = dict(self.model.named_parameters(remove_duplicate=True))
        return [(proj, heads, [(n, now[n]) for n in names]) for proj, heads, names in self.scheduled]

    def update(self, step: int, audit: Audit) -> bool:
        """Switch if `step` optimizer steps are done and it is time; True when it switched."""
        if self.switched or step < self.at_step:
            return False
        for proj, n_heads, params in self._projections():
            if self.kind == "late-freeze":
                self._freeze(proj, n_heads, params, audit)
            else:
                self._unfreeze(proj, params, audit)
        self.switched = True
        audit.schedule = self.summary()
        return True

    def _freeze(self, proj: Proj, n_heads: int, params: list[tuple[str, nn.Parameter]], audit: Audit) -> None:
        if self.on_freeze == "reorthogonalize":
            _reorthogonalize(params[0][1], proj.transposed, n_heads)
            self.state.orthogonal_heads[proj.name] = n_heads
        _set_trainable(params, False)
        for name, p in params:
            fp = fingerprint(p)
            self.fingerprints[name] = fp
            audit.set_frozen(name, fp)

    def _unfreeze(self, proj: Proj, params: list[tuple[str, nn.Parameter]], audit: Audit) -> None:
        for name, p in params:
            expected = audit.fingerprints.get(name)
            if expected is not None and fingerprint(p) != expected:
                self.problems.append(f"{name}: changed before its unfreeze step {self.at_step}")
            audit.set_trainable(name)
        self.state.orthogonal_heads.pop(proj.name, None)
        _set_trainable(params, True)

    def frozen_after(self, step: int) -> set[str]:
        """Parameters this schedule froze after weights saved at `step` were taken (their values
        there are from the trainable phase)."""
        if self.kind == "late-freeze" and self.switched and saved_before_switch(step, self.at_step):
            return set(self.fingerprints)
        return set()

    def summary(self) -> dict[str, Any]:
        """What the audit records about the schedule."""
        return {
            "kind": self.kind,
            "at_step": self.at_step,
            "total_steps": self.total_steps,
            "frozen_fraction": self.state.scheduled_frozen_fraction,
            "switched": self.switched,
            "on_freeze": self.on_freeze if self.kind == "late-freeze" else None,
            "projections": list(self.state.scheduled),
            "problems": list(self.problems),
        }

    def state_dict(self) -> dict[str, Any]:
        """The phase and the checks so far (stored in checkpoints)."""
        return {"switched": self.switched, "problems": list(self.problems), "fingerprints": dict(self.fingerprints)}

    def load_state_dict(self, sd: dict[str, Any], audit: Audit) -> None:
        """Return to a stored phase (after the checkpoint's weights are loaded)."""
        self.problems = list(sd["problems"])
        if not sd["switched"]:
            return
        for proj, n_heads, params in self._projections():
            if self.kind == "late-freeze":
                _set_trainable(params, False)
                if self.on_freeze == "reorthogonalize":
                    self.state.orthogonal_heads[proj.name] = n_heads
                for name, _ in params:
                    audit.set_frozen(name, sd["fingerprints"][name])
            else:
                for name, _ in params:
                    audit.set_trainable(name)
                self.state.orthogonal_heads.pop(proj.name, None)
                _set_trainable(params, True)
        self.fingerprints = dict(sd["fingerprints"])
        self.switched = True
        audit.schedule = self.summary()


def _set_trainable(params: list[tuple[str, nn.Parameter]], trainable: bool) -> None:
    """Put a projection's current parameters in or out of the optimization (a frozen one has no grad)."""
    for _, p in params:
        p.requires_grad_(trainable)
        if not trainable:
            p.grad = None


@torch.no_grad()
def _reorthogonalize(weight: nn.Parameter, transposed: bool, n_heads: int) -> None:
    """Replace a weight by the QR of each of its head blocks, whole or sharded (DTensor) alike."""
    full = full_value(weight)  # every rank gathers the same tensor and computes the same result
    w = full.T if transposed else full
    new = ortho.orthogonalize_pretrained(w, n_heads).to(full.dtype)
    new = new.T if transposed else new
    copy_full_(weight, new)


def make_schedule(model: nn.Module, total_steps: int) -> FreezeSchedule | None:
    """The schedule of the method applied to `model`, or None when it has none."""
    state = method_state(model)
    if state is None or state.method.schedule is None:
        return None
    return FreezeSchedule(model, total_steps)
