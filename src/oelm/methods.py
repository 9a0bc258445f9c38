"""The method registry: each method is a small record of data, applied by `oelm.freezing`."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from oelm.errors import UserError

QK_INITS = ("default", "headwise-orthogonal", "global-orthogonal", "normal", "scaled-random")
FFN_INITS = ("default", "orthogonal")
# How Q/K of a *pretrained* model are treated when the method re-initializes them.
PRETRAINED_QK = ("reinit", "orthogonalize", "keep")


@dataclass(frozen=True)
class Method:
    """How Q/K and FFN are initialized and what is frozen; no model code."""

    name: str
    summary: str
    qk_init: str = "default"
    freeze_qk: bool = False
    ffn_init: str = "default"
    freeze_ffn: bool = False
    normal_std: float = 0.02

    def __post_init__(self) -> None:
        if self.qk_init not in QK_INITS:
            raise UserError(f"method {self.name!r}: qk_init {self.qk_init!r} not in {QK_INITS}")
        if self.ffn_init not in FFN_INITS:
            raise UserError(f"method {self.name!r}: ffn_init {self.ffn_init!r} not in {FFN_INITS}")

    @property
    def changes_qk(self) -> bool:
        return self.qk_init != "default"

    def to_dict(self) -> dict:
        return asdict(self)


_REGISTRY: dict[str, Method] = {}


def register_method(method: Method, overwrite: bool = False) -> Method:
    """Add a method to the registry (a new variant is a new record, not new model code)."""
    if method.name in _REGISTRY and not overwrite:
        raise UserError(f"method {method.name!r} is already registered")
    _REGISTRY[method.name] = method
    return method


for _m in (
    Method("baseline", "full training: default init, everything trainable"),
    Method("oelm-freeze", "head-wise orthogonal Q/K, frozen", "headwise-orthogonal", True),
    Method("oelm-random", "random normal N(0, 0.02) Q/K, frozen (the study's ablation)", "normal", True),
    Method(
        "oelm-random-scaled",
        "unit-norm random rows for Q/K, frozen: same scale as orthogonal, no orthogonality",
        "scaled-random",
        True,
    ),
    Method("oelm-global", "globally orthogonal Q/K (one QR per matrix), frozen", "global-orthogonal", True),
    Method("oelm-nofreeze", "head-wise orthogonal Q/K init, trainable", "headwise-orthogonal", False),
    Method(
        "oelm-qk-ffn",
        "head-wise orthogonal Q/K and orthogonal FFN, all frozen",
        "headwise-orthogonal",
        True,
        "orthogonal",
        True,
    ),
    Method("ffn-only", "FFN frozen at its default init, Q/K trainable", freeze_ffn=True),
):
    register_method(_m)


def get_method(name: str | Method) -> Method:
    """Look up a registered method by name (a Method passes through)."""
    if isinstance(name, Method):
        return name
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UserError(
            f"unknown method {name!r}; registered methods: {', '.join(_REGISTRY)} "
            "(see `oelm methods`)"
        ) from None


def list_methods() -> list[Method]:
    """All registered methods, in registration order."""
    return list(_REGISTRY.values())
