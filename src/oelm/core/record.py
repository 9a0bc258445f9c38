"""The method record (`oelm_method.json`): what was applied to a model, and re-applying it.

The record is written here (`method_record`, `write_record`, the save hook that HF models'
own `save_pretrained` calls) and read back by `oelm.core.restore.reapply`; these two modules are
the only places that know `MethodState`'s fields. `check_frozen` proves the frozen tensors of a
loaded model are bit-identical to what was saved.

The record's `frozen` set is the method's (`method_frozen`): its roles' projections in its layers,
as frozen now (a schedule's phase included). Tensors frozen by anything else (PEFT freezes every
base tensor, a user may freeze embeddings) are not the method's and are not recorded, so a
merged or reloaded model gets exactly the method's freeze back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from oelm import __version__
from oelm.core.audit import fingerprint
from oelm.core.state import method_state
from oelm.core.targets import find_targets, unwrap
from oelm.utils.errors import UserError
from oelm.utils.io import atomic_write_text, file_times, follow_umask

METHOD_RECORD_FILE = "oelm_method.json"
RECORD_FORMAT = 1
ADDED = "oelm_adapter"  # state-dict key part of tensors a method adds (oelm.core.targets.attach_adapter)


def method_record(model: nn.Module) -> dict[str, Any]:
    """What was applied: method, options, seed, qk_init, inits, and every frozen tensor's fingerprint."""

    state = method_state(model)
    if state is None:
        raise UserError("no method was applied to this model (call oelm.apply_method first)")
    frozen = {n: fingerprint(p) for n, p in method_frozen(model).items()}
    record = {
        "format": RECORD_FORMAT,
        "oelm_version": __version__,
        **json.loads(json.dumps(state.record())),  # method, method_options, method_seed
        "qk_init": state.qk_init,
        "family": state.family,
        "layers": list(state.layers),
        "inits": dict(state.inits),
        "orthogonal_heads": dict(state.orthogonal_heads),
        "frozen": frozen,
        "qk_tensors": {n: fingerprint(p) for n, p in qk_tensors(model).items() if n not in frozen},
    }
    record["identity"] = {field: _digest(record[field]) for field in _identity_fields(record, {})}
    return record


def qk_tensors(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every Q and K projection tensor of the model, in every layer, frozen or not, by plain name.

    The record fingerprints the ones it does not list as frozen too, so that a record copied from
    another model's folder (one that froze fewer tensors, e.g. a baseline's) is refused on loading
    instead of leaving the tensors these weights had frozen trainable.
    """
    base = unwrap(model)
    state = method_state(base)
    ids = {
        id(p)
        for layer in ((state and state.targets) or find_targets(base)).layers
        for role, proj in layer.by_role()
        if role in ("q", "k")
        for _, p in proj.params()
    }
    return {plain_name(n): p for n, p in base.named_parameters() if id(p) in ids}


# PEFT's tuner layers hold the module they wrap as `base_layer`; the record names tensors as in
# the model without adapters (what a merged save or a stock base model holds).
_PEFT_BASE = ".base_layer."


def plain_name(name: str) -> str:
    """A parameter name as in the model without PEFT adapters."""
    return name.replace(_PEFT_BASE, ".")


def method_frozen(model: nn.Module) -> dict[str, nn.Parameter]:
    """The tensors the method holds frozen now, by name (as in the model without PEFT adapters).

    These are the projections of the method's `freeze` roles in the layers it acts on, frozen at
    this moment: a schedule's phase counts (late-freeze before its switch and unfreeze after it
    hold none). Tensors frozen by anything else (PEFT, the user) are never included.
    """
    base = unwrap(model)
    state = method_state(base)
    if state is None:
        raise UserError("no method was applied to this model (call oelm.apply_method first)")
    method = state.method
    owned: set[int] = set()
    for layer in (state.targets or find_targets(base)).layers:
        if layer.index not in state.layers or (layer.kind == "cross" and not method.cross_attention):
            continue
        for role, proj in layer.by_role():
            if role in method.freeze:
                owned.update(id(p) for _, p in proj.params())
    return {plain_name(n): p for n, p in base.named_parameters() if id(p) in owned and not p.requires_grad}


# The fields that say what was applied; each is stored with a digest so that an edited record is
# refused naming the field. `frozen` holds the frozen tensors' fingerprints, which check_frozen
# compares with the weights: the record is tied to the weights it was written with.
IDENTITY_FIELDS = (
    "method",
    "method_options",
    "method_seed",
    "qk_init",
    "family",
    "layers",
    "inits",
    "orthogonal_heads",
    "frozen",
)
# Identity fields some records carry: `base_tensors`, the fingerprints of a PEFT adapter's base
# model tensors (oelm.hf.peft), which the adapter needs to be loaded onto unchanged.
# `qk_tensors`, the fingerprints of the Q/K tensors not in `frozen` (records since issue 40).
OPTIONAL_IDENTITY_FIELDS = ("base_tensors", "qk_tensors")


def _identity_fields(record: dict[str, Any], digests: dict[str, Any]) -> tuple[str, ...]:
    return IDENTITY_FIELDS + tuple(f for f in OPTIONAL_IDENTITY_FIELDS if f in record or f in digests)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def verify_identity(record: dict[str, Any], source: str) -> None:
    """Raise naming every identity field whose value no longer matches the digest written with it.

    Records written before digests existed (no `identity` key) are accepted as they are.
    """
    digests = record.get("identity")
    if digests is None:
        return
    if not isinstance(digests, dict):
        raise UserError(f"{source}: 'identity' is not a mapping; the file was edited: re-save the model")
    fields = _identity_fields(record, digests)
    changed = [f for f in fields if f not in record or digests.get(f) != _digest(record[f])]
    if changed:
        raise UserError(
            f"{source}: field(s) {', '.join(changed)} differ from the digests written with them: the file was "
            "edited after saving; restore it or re-save the model with oelm.save_pretrained"
        )


def frozen_mismatches(model: nn.Module, record: dict[str, Any]) -> list[str]:
    """Recorded frozen tensors that are missing from `model` or whose bytes differ from the record."""

    params = {plain_name(n): p for n, p in unwrap(model).named_parameters()}
    return sorted(n for n, fp in record["frozen"].items() if n not in params or fingerprint(params[n]) != fp)


def check_frozen(model: nn.Module, record: dict[str, Any]) -> None:
    """Raise unless every recorded frozen tensor is bit-identical to its saved fingerprint and the
    other Q/K tensors are those the record was written with (records that carry them)."""

    changed = frozen_mismatches(model, record)
    if changed:
        raise UserError(
            f"frozen tensors whose bytes differ from the saved fingerprints: {changed[:5]}; the folder "
            "was edited or mixes two models (loaded in another dtype than saved? then pass verify=False)"
        )
    params = {plain_name(n): p for n, p in unwrap(model).named_parameters()}
    other = sorted(
        n for n, fp in (record.get("qk_tensors") or {}).items() if n not in params or fingerprint(params[n]) != fp
    )
    if other:
        raise UserError(
            f"the method record ({record.get('method')!r}) does not describe these weights: Q/K tensors {other[:3]} "
            "differ from its fingerprints (the record was copied from another model's folder, or the weights were "
            "replaced after saving); re-save the model with oelm.save_pretrained, or load the weights with "
            "transformers and call oelm.apply_method"
        )


def write_record(model: nn.Module, folder: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Write `oelm_method.json` for `model` into `folder`; `extra`: optional identity fields to add."""

    record = method_record(model)
    unknown = sorted(set(extra or {}) - set(OPTIONAL_IDENTITY_FIELDS))
    if unknown:
        raise ValueError(f"not optional identity fields of a method record: {unknown}")
    for field, value in (extra or {}).items():
        record[field] = value
        record["identity"][field] = _digest(value)
    path = Path(folder) / METHOD_RECORD_FILE
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return path


def read_record(folder: str | Path) -> dict[str, Any] | None:
    """The method record saved in `folder`, or None."""
    path = Path(folder) / METHOD_RECORD_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{str(path)!r} is not valid JSON ({err}); re-save the model") from None
    if not isinstance(record, dict):
        raise UserError(f"{str(path)!r} is not a method record (not a JSON object); re-save the model")
    verify_identity(record, repr(str(path)))
    return record


class _SaveWithRecord:
    """The model class's save_pretrained, then oelm_method.json of `source` (the model itself, or
    the model under a wrapper such as a PEFT model); an object (not a closure or bound method) so
    that deepcopy rebinds it to the copy and pickling/torch.save of the model works."""

    def __init__(
        self, model: nn.Module, source: nn.Module | None = None, extra: Callable[[nn.Module], dict] | None = None
    ) -> None:
        self.model = model
        self.source = model if source is None else source
        self.extra = extra

    def __call__(self, save_directory: str | Path, *args: Any, **kwargs: Any) -> Any:
        before = file_times(save_directory)
        out = type(self.model).save_pretrained(self.model, save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True) and method_state(self.source) is not None:
            write_record(self.source, save_directory, None if self.extra is None else self.extra(self.model))
            follow_umask(save_directory, before=before)  # safetensors writes 0600; older files untouched
        return out


def install_save_hook(
    model: nn.Module, source: nn.Module | None = None, extra: Callable[[nn.Module], dict] | None = None
) -> None:
    """Make a Hugging Face model's own `save_pretrained` also write `oelm_method.json` (per instance).

    `source` is the model whose method is recorded when `model` wraps it (a PEFT model, whose
    save_pretrained writes the adapter only); by default the model itself. `extra(model)` gives
    optional identity fields to add (a module-level function, so the model still pickles).
    """
    base = unwrap(model)
    if callable(getattr(type(base), "save_pretrained", None)) and "save_pretrained" not in vars(base):
        base.save_pretrained = _SaveWithRecord(base, source, extra)
