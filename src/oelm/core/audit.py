"""Per-tensor freeze audit: roles, trainable/frozen, inits, fingerprints, and the post-run check."""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from oelm.core.adapters import iter_adapters
from oelm.core.families import OWN_FAMILIES
from oelm.core.orthogonal import orthogonality_error
from oelm.core.state import method_state
from oelm.core.targets import find_targets, model_family, unwrap
from oelm.utils.errors import UserError

try:
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # a torch build without torch.distributed: no sharded parameters exist
    DTensor = distribute_tensor = None


def is_sharded(t: torch.Tensor) -> bool:
    """True for a DTensor (a parameter sharded by FSDP2's fully_shard)."""
    return DTensor is not None and isinstance(t, DTensor)


def full_value(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a sharded (DTensor) parameter gathered from every rank, else t itself.

    Gathering is a collective: with sharded parameters every rank must make the same calls in the
    same order (the audit, the schedule's switch and the freeze check all iterate by name).
    """
    return t.detach().full_tensor() if is_sharded(t) else t.detach()


@torch.no_grad()
def copy_full_(t: torch.Tensor, value: torch.Tensor) -> None:
    """Overwrite t with the whole tensor `value`: a sharded (DTensor) t takes its own shard of it."""
    if is_sharded(t):
        t.to_local().copy_(distribute_tensor(value.contiguous(), t.device_mesh, t.placements).to_local())
    else:
        t.copy_(value)


def fingerprint(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (dtype and shape included): equal iff bit-identical.

    A sharded (DTensor) tensor is hashed whole (gathered; a collective, see `full_value`), so its
    fingerprint equals the one taken before sharding exactly when every shard is unchanged.
    """
    if t.device.type == "meta":
        return "meta"  # no values to hash (parameter counting on the meta device)
    data = full_value(t).to("cpu").contiguous()
    h = hashlib.sha256(f"{data.dtype}{tuple(data.shape)}".encode())
    h.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return h.hexdigest()[:32]


def check_finite(model: nn.Module) -> None:
    """Raise naming the first tensor holding NaN or inf: nothing such a model produces (samples, an
    export) is a faithful result of the run."""
    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise UserError(
                f"tensor {name!r} holds {bad} non-finite value(s) (NaN or inf) of {t.numel()}; the run diverged "
                "at this checkpoint: use an earlier one (--checkpoint best or a step number)"
            )


@dataclass
class AuditRow:
    """One parameter tensor."""

    name: str
    shape: list[int]
    numel: int
    role: str
    trainable: bool
    init: str
    fingerprint: str | None = None


@dataclass
class Audit:
    """The audit of a model: rows, totals, the applied method and frozen-tensor fingerprints."""

    family: str
    method: str
    rows: list[AuditRow] = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # the method's validated options
    schedule: dict | None = None  # oelm.core.schedules.FreezeSchedule.summary() when the method has one

    @property
    def fingerprints(self) -> dict[str, str]:
        return {r.name: r.fingerprint for r in self.rows if r.fingerprint is not None}

    def to_dict(self) -> dict:
        out = {
            "family": self.family,
            "method": self.method,
            "options": self.options,
            "totals": self.totals,
            "rows": [asdict(r) for r in self.rows],
        }
        if self.schedule is not None:
            out["schedule"] = self.schedule
        return out

    def _row(self, name: str) -> AuditRow:
        return next(r for r in self.rows if r.name == name)

    def set_frozen(self, name: str, fp: str) -> None:
        """Record that a tensor became frozen (a schedule) with its fingerprint at that moment."""
        row = self._row(name)
        row.trainable, row.fingerprint = False, fp

    def set_trainable(self, name: str) -> None:
        """Record that a frozen tensor became trainable (a schedule): no longer fingerprinted."""
        row = self._row(name)
        row.trainable, row.fingerprint = True, None

    def table(self) -> str:
        """A plain-text table, one line per tensor, then the totals."""
        head = f"{'name':<58} {'shape':<16} {'role':<9} {'state':<9} init"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            state = "trainable" if r.trainable else "FROZEN"
            lines.append(f"{r.name:<58} {str(tuple(r.shape)):<16} {r.role:<9} {state:<9} {r.init}")
        t = self.totals
        lines.append("-" * len(head))
        lines.append(
            f"total {t['total']:,}  trainable {t['trainable']:,}  frozen {t['frozen']:,} "
            f"({100 * t['frozen_fraction']:.1f}%)  max orthogonality error {t['max_orthogonality_error']:.2e}"
        )
        if "q_identity" in t:
            n, absent = t["q_identity"]["layers"], t["q_identity"]["absent"]
            lines.append(f"W_Q = I in {n} layers: no Q projection, {absent:,} Q parameters absent (not counted above)")
        if "vocab_padding" in t:
            pad = t["vocab_padding"]
            lines.append(
                f"vocabulary padded from {pad['vocab_size']:,} to {pad['rows']:,} rows: {pad['params']:,} padding "
                "parameters (always zero, never trained) not counted above"
            )
        return "\n".join(lines)


def _roles(model: nn.Module) -> dict[int, str]:
    """Parameter id -> role for the Q/K/V/O/FFN projections."""
    roles: dict[int, str] = {}
    try:
        model_family(model)
    except UserError:
        return roles
    for layer in find_targets(model).layers:
        for role, proj in layer.by_role():
            for _, p in proj.params():
                roles[id(p)] = role
    return roles


def _other_roles(model: nn.Module) -> dict[int, str]:

    out: dict[int, str] = {}
    adapters = {id(a) for _, a in iter_adapters(model)}
    for module in model.modules():
        if id(module) in adapters:  # added by a method: its own role, whatever its class name
            out.update({id(p): "adapter" for p in module.parameters()})
            continue
        kind = None
        if isinstance(module, nn.Embedding):
            kind = "embedding"
        elif isinstance(module, nn.LayerNorm) or "norm" in type(module).__name__.lower():
            kind = "norm"
        if kind:
            for p in module.parameters(recurse=False):
                out[id(p)] = kind
    return out


def audit_model(model: nn.Module) -> Audit:
    """Audit every parameter tensor of a model (tied tensors once)."""
    base = unwrap(model)
    state = method_state(base)
    roles = {**_other_roles(base), **_roles(base)}
    try:
        family = model_family(base)
    except UserError:
        family = type(base).__name__
    audit = Audit(family, state.method.name if state else "none", options=dict(state.options) if state else {})
    default_init = "default" if family in OWN_FAMILIES else "model-default"
    padding = base.vocab_padding() if callable(getattr(base, "vocab_padding", None)) else {}
    for name, p in base.named_parameters(remove_duplicate=True):
        role = roles.get(id(p), "head")
        init = (state.inits.get(name) if state else None) or default_init
        if role == "adapter":
            init = f"{state.method.adapter} adapter" if state else "adapter"
        # Real parameters only: a padded vocabulary's rows (oelm.models.vocab) are noted in the totals.
        row = AuditRow(name, list(p.shape), p.numel() - padding.get(id(p), 0), role, p.requires_grad, init)
        if not p.requires_grad:
            row.fingerprint = fingerprint(p)
        audit.rows.append(row)
    audit.totals = _totals(audit.rows, base, state)
    if padding:
        cfg = base.config
        audit.totals["vocab_padding"] = {
            "vocab_size": cfg.vocab_size,
            "rows": cfg.padded_vocab,
            "params": sum(padding.values()),
        }
    return audit


def _totals(rows: list[AuditRow], model: nn.Module, state) -> dict:
    total = sum(r.numel for r in rows)
    frozen = sum(r.numel for r in rows if not r.trainable)
    return {
        "total": total,
        "trainable": total - frozen,
        "frozen": frozen,
        "frozen_fraction": frozen / total if total else 0.0,
        "max_orthogonality_error": max_orthogonality_error(model),
        "by_role": _by_role(rows),
        **_identity_q(model),
    }


def _identity_q(model: nn.Module) -> dict:
    """{"q_identity": {layers, absent}} for a model with W_Q = I (no Q projection, not a parameter), else {}."""
    try:
        layers = [layer for layer in find_targets(model).layers if layer.q is None]
    except UserError:
        return {}
    if not layers:
        return {}
    return {"q_identity": {"layers": len(layers), "absent": sum(a * b for a, b in (x.q_shape for x in layers))}}


def _by_role(rows: list[AuditRow]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        d = out.setdefault(r.role, {"trainable": 0, "frozen": 0})
        d["trainable" if r.trainable else "frozen"] += r.numel
    return out


def max_orthogonality_error(model: nn.Module) -> float:
    """Largest |W_h W_h^T - I| over all frozen orthogonal Q/K heads; 0 where there are none."""
    base = unwrap(model)
    state = method_state(base)
    if state is None or not state.orthogonal_heads:
        return 0.0
    worst = 0.0
    for layer in find_targets(base).layers:
        for proj in (p for p in (layer.q, layer.k) if p is not None):
            n_heads = state.orthogonal_heads.get(proj.name)
            if n_heads is None:
                continue
            if proj.weight.device.type == "meta":
                worst = max(worst, state.meta_orthogonality.get(proj.name, 0.0))
            else:
                worst = max(worst, orthogonality_error(full_value(proj.get()), n_heads))
    return worst


@dataclass
class AuditCheck:
    """The end-of-run check: frozen tensors bit-identical, optimizer holds exactly the trainable."""

    ok: bool
    problems: list[str]
    n_frozen_checked: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def verify_audit(
    model: nn.Module,
    audit: Audit,
    optimizer: torch.optim.Optimizer | None = None,
    skip: Collection[str] = (),
) -> AuditCheck:
    """Check fingerprints are unchanged, frozen tensors have no grad, and the optimizer's param set.

    `skip`: parameters whose fingerprint is not checked (e.g. tensors a schedule froze after the
    step these weights were saved at).
    """
    base = unwrap(model)
    params = dict(base.named_parameters(remove_duplicate=True))
    problems: list[str] = []
    for name, fp in audit.fingerprints.items():
        if name in skip:
            continue
        p = params.get(name)
        if p is None:
            problems.append(f"{name}: frozen tensor no longer exists")
            continue
        if p.requires_grad:
            problems.append(f"{name}: was frozen but requires_grad is now True")
        if p.grad is not None:
            problems.append(f"{name}: frozen tensor has a .grad")
        if fingerprint(p) != fp:
            problems.append(f"{name}: frozen tensor changed during training")
    if optimizer is not None:
        problems += _check_optimizer(params, optimizer)
    if audit.schedule is not None:
        problems += audit.schedule.get("problems", [])
    return AuditCheck(not problems, problems, len(audit.fingerprints))


def _check_optimizer(params: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer) -> list[str]:
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    problems = []
    for name, p in params.items():
        if p.requires_grad and id(p) not in held:
            problems.append(f"{name}: trainable but not in the optimizer")
        if not p.requires_grad and id(p) in held:
            problems.append(f"{name}: frozen but held by the optimizer")
        if not p.requires_grad and p in optimizer.state and optimizer.state[p]:
            problems.append(f"{name}: frozen but has optimizer state")
    extra = held - {id(p) for p in params.values()}
    if extra:
        problems.append(f"optimizer holds {len(extra)} tensors that are not parameters of the model")
    return problems
