"""The one re-apply path: put a recorded method back on a model that holds saved weights.

Re-applying never re-initializes saved weights: it re-attaches what the method adds (adapters,
whose saved values are then loaded by the caller), restores the freeze flags and the state.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from torch import nn

from oelm.core.freezing import apply_method
from oelm.core.methods import get_method
from oelm.core.record import RECORD_FORMAT, method_frozen
from oelm.core.state import MethodState, method_state
from oelm.core.targets import find_targets, unwrap
from oelm.utils.errors import UserError

log = logging.getLogger(__name__)


def _apply_keeping_weights(model: nn.Module, name: str, seed: int, options: dict[str, Any]) -> MethodState:
    """apply_method with the method's targets, flags and adapters but no re-init of saved weights."""
    method = get_method(name)
    opts = dict(options)
    if method.changes_qk:
        opts["qk_init"] = "keep"
    structural = dataclasses.replace(method, ffn_init="default")
    state = apply_method(model, structural, seed=seed, **opts)
    state.method, state.options = method, dict(options)
    return state


def reapply(model: nn.Module, record: dict[str, Any]) -> MethodState:
    """Restore a recorded method on a model holding the saved weights: same flags, nothing re-initialized.

    Tensors the method adds (adapters) are attached fresh: load their saved values afterwards
    (`from_pretrained` does), then call `check_frozen`.
    """
    if record.get("format") != RECORD_FORMAT:
        raise UserError(f"method record format {record.get('format')!r} is not {RECORD_FORMAT}; upgrade oelm")
    try:
        state = _apply_keeping_weights(model, record["method"], record["method_seed"], record["method_options"])
    except UserError as err:
        raise UserError(f"cannot re-apply the saved method: {err} (register a custom method before loading)") from None
    state.qk_init = record["qk_init"]
    state.inits = dict(record["inits"])
    state.orthogonal_heads = {k: int(v) for k, v in record["orthogonal_heads"].items()}
    _restore_flags(unwrap(model), record["frozen"], scheduled=state.method.schedule is not None)
    beyond = sorted(set(record["frozen"]) - set(method_frozen(model)))
    if beyond:  # records written before the frozen set was the method's: PEFT's or a user's freeze
        log.warning(
            "the method record also lists %d frozen tensor(s) the method does not freeze (e.g. %s); they are "
            "frozen as recorded. Re-save the model to record the method's freeze only",
            len(beyond),
            beyond[0],
        )
    return state


def carry_method(src: nn.Module, dst: nn.Module) -> MethodState:
    """Put src's method on dst, a converted copy (same layers, other family): flags only, no re-init."""

    s = method_state(src)
    if s is None:
        raise UserError("the source model has no method applied")
    d = _apply_keeping_weights(dst, s.method.name, s.seed, s.options)
    d.qk_init = s.qk_init
    # Projection and parameter names differ between families; layer index and role do not.
    src_params = {id(p): n for n, p in unwrap(src).named_parameters()}
    dst_params = {id(p): n for n, p in unwrap(dst).named_parameters()}
    proj, weight = {}, {}
    for la, lb in zip(find_targets(src).layers, find_targets(dst).layers):
        for (_, a), (_, b) in zip(la.by_role(), lb.by_role()):
            proj[a.name] = b.name
            weight[src_params[id(a.weight)]] = dst_params[id(b.weight)]
    d.orthogonal_heads = {proj[k]: v for k, v in s.orthogonal_heads.items()}
    d.inits = {weight.get(k, k): v for k, v in s.inits.items()}
    return d


def restore_flags(model: nn.Module, record: dict[str, Any]) -> None:
    """Set the freeze flags of a model the recorded method was applied to as the record says
    (a schedule's phase at saving); refuses a record that freezes other tensors than the method."""
    state = method_state(model)
    if state is None:
        raise UserError("no method was applied to this model (call oelm.apply_method first)")
    _restore_flags(unwrap(model), record["frozen"], scheduled=state.method.schedule is not None)


def _restore_flags(base: nn.Module, frozen: dict[str, str], scheduled: bool) -> None:
    """Freeze exactly the recorded tensors (a schedule's later phase may differ from its start).

    Records now hold the method's frozen tensors only; older ones may also list tensors frozen
    outside the method (PEFT's, embeddings), which are frozen as recorded.
    """
    params = dict(base.named_parameters())
    missing = sorted(set(frozen) - set(params))
    if missing:
        raise UserError(f"recorded frozen tensors missing from the model: {missing[:5]}; wrong model class?")
    # Only the method's own tensors can disagree with the record: a tensor the model class freezes
    # itself (e.g. sinusoidal position tables in some transformers releases) is not the method's.
    owned = set(method_frozen(base))
    for name in frozen:
        params[name].requires_grad_(False)
    extra = sorted(n for n in owned if n in params and n not in frozen)
    if extra and not scheduled:
        raise UserError(
            f"the method freezes tensors that were trainable when saved: {extra[:5]}; "
            "the folder mixes two models or the method's record changed"
        )
    for name in extra:  # a schedule had unfrozen them by the time of saving
        params[name].requires_grad_(True)
