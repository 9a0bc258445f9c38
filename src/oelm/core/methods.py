"""The method registry: each method is a small record of data, applied by `oelm.core.freezing`.

A record says which roles (q, k, v, o, ffn) are initialized how and frozen, on which layers, on
what schedule, and which adapter (a small trainable module from `oelm.core.adapters`) it adds. Its
typed options (with defaults) are validated by `validate_method_options` before any run starts.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, replace
from typing import Any

from oelm.core.adapters import adapter_class
from oelm.utils.errors import UserError

QK_INITS = (
    "default",
    "headwise-orthogonal",
    "global-orthogonal",
    "normal",
    "scaled-random",
    "torch-default",
    "identity",
    "mimetic",
    "fan-in-normal",  # N(0, qk_std^2), qk_std defaulting to 1/sqrt(fan_in): width-scaled
)
FFN_INITS = ("default", "orthogonal")
ROLES = ("q", "k", "v", "o", "ffn")
# How Q/K of a *pretrained* model are treated when the method re-initializes them.
PRETRAINED_QK = ("reinit", "orthogonalize", "keep")
LAYER_SELECTIONS = ("all", "lower-half", "upper-half", "every-other")
# late-freeze: the frozen roles train until step f*steps, then freeze; unfreeze: the reverse.
SCHEDULES = ("late-freeze", "unfreeze")
# Fine-tuning methods of the field (oelm.core.tuning): they choose every trainable tensor themselves.
TUNES = ("lora", "ia3", "bitfit", "ln")


@dataclass(frozen=True)
class Option:
    """One typed method option: name, default, type and (optional) choices or bounds."""

    name: str
    default: Any
    kind: str  # "int" | "float" | "str" | "layers"
    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None  # inclusive
    high: float | None = None  # inclusive

    def coerce(self, method: str, value: Any) -> Any:
        """The value converted to this option's type, or a UserError naming the fix."""
        where = f"method {method!r}: method_options.{self.name}"
        if self.kind == "layers":
            return _coerce_layers(where, value)
        if value is None and self.default is None:
            return None
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "str": isinstance(value, str),
        }[self.kind]
        if not ok:
            raise UserError(f"{where} must be {self.kind}, got {value!r} ({self.help})")
        value = float(value) if self.kind == "float" else value
        if self.choices is not None and value not in self.choices:
            raise UserError(f"{where} must be one of {list(self.choices)}, got {value!r}")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise UserError(f"{where} must lie in [{self.low}, {self.high}], got {value!r}")
        return value


def _coerce_layers(where: str, value: Any) -> str | list[int]:
    """A layer selection name or a sorted list of distinct indices."""
    if isinstance(value, str) and value in LAYER_SELECTIONS:
        return value
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    ):
        return sorted(set(value))
    raise UserError(f"{where} must be one of {list(LAYER_SELECTIONS)} or a list of layer indices, got {value!r}")


# Options every method takes.
COMMON_OPTIONS = (
    Option("qk_init", None, "str", "pretrained models: how their Q/K meet the method's init", PRETRAINED_QK),
    Option(
        "layers", "all", "layers", "the layers the method touches: all, lower-half, upper-half, every-other or [i, ...]"
    ),
)
F_OPTION = Option("f", 0.5, "float", "fraction of the steps at which the schedule switches", low=0.0, high=1.0)
ON_FREEZE_OPTION = Option(
    "on_freeze",
    "keep",
    "str",
    "at the freeze step: keep the learned Q/K or re-orthogonalize each head",
    ("keep", "reorthogonalize"),
)
RANK_OPTION = Option("rank", 8, "int", "rank r of the trainable update x A^T B^T", low=1)
# Options of the published identity-Q recipe (Karbevski & Mijoski 2025): the attention scale halved
# and weight decay lowered from 0.1 to 0.03 for that arm.
ATTN_SCALE_OPTION = Option(
    "attn_scale", 0.5, "float", "multiplier on the attention scale 1/sqrt(head_dim)", low=1e-3, high=1e3
)
WEIGHT_DECAY_OPTION = Option(
    "weight_decay", 0.03, "float", "AdamW weight decay of this arm, in place of the run's weight_decay", low=0.0
)
QK_STD_OPTION = Option(
    "qk_std", None, "float", "std of the random Q/K entries (default 1/sqrt(fan_in) = 1/sqrt(d_model))", low=1e-6
)
# LoRA as Hu et al. 2021 ran it on RoBERTa-base (GLUE): r = 8 on W_q and W_v, alpha = r.
LORA_OPTIONS = (
    Option("rank", 8, "int", "LoRA rank r", low=1),
    Option("alpha", 8.0, "float", "LoRA alpha (the update is scaled by alpha / r)", low=0.0),
    Option("dropout", 0.0, "float", "dropout on the LoRA branch's input", low=0.0, high=1.0),
    Option("targets", "q,v", "str", "comma-separated roles that get LoRA: q, k, v, o, ffn, ffn-down"),
)
# (IA)^3 as Liu et al. 2022 place it: rescale keys, values and the FFN's inner activations.
IA3_OPTIONS = (Option("targets", "k,v,ffn-down", "str", "comma-separated roles that get (IA)^3 vectors"),)


@dataclass(frozen=True)
class Method:
    """How roles are initialized and frozen, where, when, and what small module is added."""

    name: str
    summary: str
    qk_init: str = "default"
    freeze: frozenset[str] = frozenset()  # roles out of the optimization (q, k, v, o, ffn)
    init: frozenset[str] = frozenset({"q", "k"})  # the roles qk_init re-initializes
    ffn_init: str = "default"
    layers: str | tuple[int, ...] = "all"  # default of the `layers` option
    adapter: str | None = None  # an adapter kind of oelm.core.adapters, on the projections its class names
    schedule: str | None = None  # kind in SCHEDULES, acting on the roles in `freeze`
    options: tuple[Option, ...] = ()  # method-specific options (beyond COMMON_OPTIONS)
    normal_std: float = 0.02
    # Q/K width as a fraction of the model width ("thin keys"); < 1 changes the architecture, so
    # the model must be built with it (oelm's trainers pass it to our GPT as qk_dim).
    qk_ratio: float = 1.0
    # Encoder-decoders: whether the roles act on the decoder's cross attention too (Q/K, V, O); with
    # False its cross attention keeps its default init and trains, and the roles act on self attention.
    cross_attention: bool = True
    # W_Q = I with the Q projection removed (no weight, no matmul): switched on through the model's
    # `q_identity` config flag (oelm.core.freezing); changes the architecture, like qk_ratio.
    q_identity: bool = False
    # A fine-tuning method of the field (TUNES): it sets every requires_grad itself (see oelm.core.tuning).
    tune: str | None = None
    # Frozen roles keep their biases trainable (only the weights leave the optimization).
    bias_trainable: bool = False

    def __post_init__(self) -> None:
        checks = [
            (self.qk_init in QK_INITS, f"qk_init {self.qk_init!r} not in {QK_INITS}"),
            (self.ffn_init in FFN_INITS, f"ffn_init {self.ffn_init!r} not in {FFN_INITS}"),
            (set(self.freeze) <= set(ROLES), f"freeze {sorted(self.freeze)} not within {ROLES}"),
            (set(self.init) <= {"q", "k"}, f"init {sorted(self.init)} not within ('q', 'k')"),
            (self.schedule in (None, *SCHEDULES), f"schedule {self.schedule!r} not in {SCHEDULES}"),
            (not self.schedule or self.freeze, "a schedule needs roles in `freeze` to act on"),
            (0.0 < self.qk_ratio <= 1.0, f"qk_ratio {self.qk_ratio} not in (0, 1]"),
            (
                not self.q_identity or ("q" not in self.freeze and not (self.changes_qk and "q" in self.init)),
                "q_identity removes Q: nothing to initialize or freeze there",
            ),
            (self.tune in (None, *TUNES), f"tune {self.tune!r} not in {TUNES}"),
            (
                not self.tune or not (self.freeze or self.changes_qk or self.adapter or self.schedule),
                "a fine-tuning method (tune) chooses its trainable tensors itself: no freeze, init, adapter or schedule",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise UserError(f"method {self.name!r}: {msg}")
        object.__setattr__(self, "freeze", frozenset(self.freeze))
        object.__setattr__(self, "init", frozenset(self.init))

    @property
    def changes_qk(self) -> bool:
        return self.qk_init != "default"

    @property
    def freeze_qk(self) -> bool:
        """Whether Q or K is (at some point) frozen."""
        return bool(self.freeze & {"q", "k"})

    @property
    def freeze_ffn(self) -> bool:
        return "ffn" in self.freeze

    def all_options(self) -> tuple[Option, ...]:
        """Every option this method takes: the common ones (with this record's defaults), then its own."""
        common = tuple(
            Option(o.name, list(self.layers) if isinstance(self.layers, tuple) else self.layers, o.kind, o.help)
            if o.name == "layers"
            else o
            for o in COMMON_OPTIONS
        )
        return common + self.options

    def to_dict(self) -> dict:
        d = asdict(self)
        d["freeze"], d["init"] = sorted(self.freeze), sorted(self.init)
        d["options"] = {o.name: o.default for o in self.all_options()}
        return d


_REGISTRY: dict[str, Method] = {}


def register_method(method: Method, overwrite: bool = False) -> Method:
    """Add a method to the registry (a new variant is a new record, not new model code)."""
    if method.name in _REGISTRY and not overwrite:
        raise UserError(f"method {method.name!r} is already registered")
    _REGISTRY[method.name] = method
    return method


HW = "headwise-orthogonal"
QK = frozenset({"q", "k"})
for _m in (
    # The study's methods.
    Method("baseline", "full training: default init, everything trainable"),
    Method("oelm-freeze", "head-wise orthogonal Q/K, frozen", HW, QK),
    Method("oelm-random", "random normal N(0, 0.02) Q/K, frozen (the study's ablation)", "normal", QK),
    Method(
        "oelm-random-scaled",
        "unit-norm random rows for Q/K, frozen: same scale as orthogonal, no orthogonality",
        "scaled-random",
        QK,
    ),
    Method("oelm-global", "globally orthogonal Q/K (one QR per matrix), frozen", "global-orthogonal", QK),
    Method("oelm-nofreeze", "head-wise orthogonal Q/K init, trainable", HW),
    # Trainable baselines at other Q/K inits (the controls a frozen init is compared against).
    Method(
        "baseline-scaled",
        "unit-norm random Q/K rows (the orthogonal init's scale), trainable: the scale-matched baseline",
        "scaled-random",
    ),
    Method("baseline-torch", "Q/K at PyTorch's nn.Linear default U(+-1/sqrt(d)), trainable", "torch-default"),
    Method(
        "oelm-qk-ffn",
        "head-wise orthogonal Q/K and orthogonal FFN, all frozen",
        HW,
        QK | {"ffn"},
        ffn_init="orthogonal",
    ),
    Method("ffn-only", "FFN frozen at its default init, Q/K trainable", freeze=frozenset({"ffn"})),
    # Role subsets.
    Method("oelm-freeze-q", "head-wise orthogonal Q, frozen; K default init, trainable", HW, {"q"}, {"q"}),
    Method("oelm-freeze-k", "head-wise orthogonal K, frozen; Q default init, trainable", HW, {"k"}, {"k"}),
    # Trainable additions on frozen orthogonal Q/K.
    Method(
        "oelm-temp", "oelm-freeze + a trainable logit temperature per head (n_head per layer)", HW, QK, adapter="temp"
    ),
    Method("oelm-gain", "oelm-freeze + a trainable gain per Q dimension (d_model per layer)", HW, QK, adapter="gain"),
    Method("oelm-qknorm", "oelm-freeze + per-head RMSNorm on q and k with trainable gains", HW, QK, adapter="qknorm"),
    Method(
        "oelm-lowrank",
        "oelm-freeze + a trainable rank-r update of each frozen Q/K (B zero-init)",
        HW,
        QK,
        adapter="lowrank",
        options=(RANK_OPTION,),
    ),
    Method("oelm-qbias", "oelm-freeze + a trainable bias on Q (d_model per layer, init 0)", HW, QK, adapter="qbias"),
    # Schedules.
    Method(
        "oelm-late-freeze",
        "orthogonal Q/K train for the first fraction f of steps, then freeze",
        HW,
        QK,
        schedule="late-freeze",
        options=(F_OPTION, ON_FREEZE_OPTION),
    ),
    # The same schedule switched early: Q/K learn their patterns in the first fifth of training,
    # then freeze, so the method keeps 80% of oelm-freeze's Q/K weight-gradient saving.
    Method(
        "oelm-early-freeze",
        "orthogonal Q/K train for the first fraction f (0.2) of steps, then freeze",
        HW,
        QK,
        schedule="late-freeze",
        options=(replace(F_OPTION, default=0.2), ON_FREEZE_OPTION),
    ),
    Method(
        "oelm-unfreeze",
        "frozen orthogonal Q/K become trainable from fraction f of the steps",
        HW,
        QK,
        schedule="unfreeze",
        options=(F_OPTION,),
    ),
    # Layer subsets.
    Method(
        "oelm-lower-half", "frozen orthogonal Q/K in the lower half of the layers only", HW, QK, layers="lower-half"
    ),
    Method(
        "oelm-upper-half", "frozen orthogonal Q/K in the upper half of the layers only", HW, QK, layers="upper-half"
    ),
    Method("oelm-alternate", "frozen orthogonal Q/K in every other layer (0, 2, ...)", HW, QK, layers="every-other"),
    # Variants from the literature.
    # Karbevski & Mijoski 2025 (arXiv 2510.23912) fix W_Q to the identity and retune the attention
    # scale; here the scale is a trainable logit temperature per head (the temp adapter).
    Method(
        "oelm-identity-q",
        "W_Q fixed to the identity (frozen), K trainable at its default init, a trainable temperature per head",
        "identity",
        {"q"},
        {"q"},
        adapter="temp",
    ),
    # Trockman & Kolter 2023: Q_h^T K_h ~ alpha Z + beta I per head (attention like a pretrained
    # model's at step 0), then frozen.
    # As published (arXiv 2510.23912): W_Q = I with the Q matmul removed (no weight, no FLOPs), K
    # trainable at its default init, the attention scale halved and weight decay 0.03 for this arm.
    # Unlike oelm-identity-q (a frozen identity inside the QKV GEMM and a trainable temperature).
    Method(
        "identity-q",
        "W_Q = I as published: no Q projection or matmul, attention scale x attn_scale (0.5), weight decay 0.03",
        q_identity=True,
        options=(ATTN_SCALE_OPTION, WEIGHT_DECAY_OPTION),
    ),
    # Dong, Noci, Khodak & Li 2025 (arXiv 2506.01115, "Frozen-QK"): Q and K random N(0, 1/d_model)
    # (width-scaled) and frozen; V, O and the MLP train. And its same-init trainable twin.
    Method(
        "frozen-qk",
        "random Q/K N(0, 1/d_model) (width-scaled), frozen: Frozen-QK as published",
        "fan-in-normal",
        QK,
        options=(QK_STD_OPTION,),
    ),
    Method(
        "frozen-qk-nofreeze",
        "random Q/K N(0, 1/d_model), trainable: frozen-qk's same-init twin",
        "fan-in-normal",
        options=(QK_STD_OPTION,),
    ),
    Method("oelm-mimetic", "mimetic Q/K init (Q_h^T K_h ~ 0.7 Z + 0.7 I per head), frozen", "mimetic", QK),
    Method("oelm-mimetic-nofreeze", "mimetic Q/K init, trainable: oelm-mimetic's same-init twin", "mimetic"),
    # Thin keys (arXiv 2603.04427): Q and K at a quarter of the model width (scores in d_head / 4
    # dimensions), V and O unchanged; frozen head-wise orthogonal, and its trainable twin.
    Method("oelm-thin-keys", "Q/K at d_model / 4 (thin keys), head-wise orthogonal, frozen", HW, QK, qk_ratio=0.25),
    Method(
        "oelm-thin-keys-nofreeze",
        "Q/K at d_model / 4 (thin keys), head-wise orthogonal init, trainable: oelm-thin-keys' twin",
        HW,
        qk_ratio=0.25,
    ),
    # Controls for fine-tuning a pretrained model: what freezing Q/K costs without the study's QR,
    # which of Q and K matters, and whether any equal share of frozen weights costs the same.
    Method("freeze-qk", "Q/K frozen as they are (pretrained weights kept; no re-init)", freeze=QK),
    Method("freeze-k", "K frozen as it is (pretrained weights kept), Q trainable", freeze=frozenset({"k"})),
    Method(
        "freeze-qk-weights",
        "Q/K weights frozen as they are, their biases trainable",
        freeze=QK,
        bias_trainable=True,
    ),
    Method(
        "freeze-vo",
        "V and O frozen as they are: the equal-share control (as many weights as Q/K in a BERT-style layer)",
        freeze=frozenset({"v", "o"}),
    ),
    # The fine-tuning field (oelm.core.tuning): each trains its own tensors and the task head.
    Method(
        "lora",
        "LoRA (Hu et al. 2021, via PEFT): rank-r updates on W_q and W_v, backbone frozen",
        tune="lora",
        options=LORA_OPTIONS,
    ),
    Method(
        "ia3",
        "(IA)^3 (Liu et al. 2022, via PEFT): learned scales on K, V and the FFN, backbone frozen",
        tune="ia3",
        options=IA3_OPTIONS,
    ),
    Method("bitfit", "BitFit (Ben Zaken et al. 2022): only the biases train", tune="bitfit"),
    Method("ln-tuning", "LayerNorm tuning (Zhao et al. 2023): only the norms' gains and biases train", tune="ln"),
):
    register_method(_m)


def qk_dim_for(method: str | Method, d_model: int, n_head: int) -> int | None:
    """The Q/K width a method needs in a model of width d_model (None: the model's own)."""
    m = get_method(method)
    if m.qk_ratio == 1.0:
        return None
    qk_dim = round(d_model * m.qk_ratio)
    if qk_dim < n_head or qk_dim % n_head:
        raise UserError(
            f"method {m.name!r} needs Q/K at {m.qk_ratio:g} x d_model = {d_model * m.qk_ratio:g}, which is not a "
            f"positive multiple of n_head={n_head}; use a wider model or fewer heads"
        )
    return qk_dim


def twin_of(method: str | Method) -> str | None:
    """The registered same-init trainable twin of a method that freezes Q/K (None: no such record).

    The twin starts Q/K exactly as the method does (same init, same roles, same width) and
    freezes, schedules and adds nothing, so the gap between them is what freezing costs at that init.
    """
    m = get_method(method)
    if not m.freeze_qk or not m.changes_qk:
        return None
    for other in _REGISTRY.values():
        if (
            not other.freeze
            and other.adapter is None
            and other.schedule is None
            and other.layers == "all"
            and (other.qk_init, other.init, other.qk_ratio, other.normal_std)
            == (m.qk_init, m.init, m.qk_ratio, m.normal_std)
        ):
            return other.name
    return None


def get_method(name: str | Method) -> Method:
    """Look up a registered method by name (a Method passes through)."""
    if isinstance(name, Method):
        return name
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UserError(
            f"unknown method {name!r}; registered methods: {', '.join(_REGISTRY)} (see `oelm methods`)"
        ) from None


def list_methods() -> list[Method]:
    """All registered methods, in registration order."""
    return list(_REGISTRY.values())


def validate_method_options(method_name: str | Method, options: dict[str, Any] | None) -> dict[str, Any]:
    """All options of a method with defaults filled in and types checked; UserError names a bad key."""
    m = get_method(method_name)
    if m.adapter is not None:
        adapter_class(m.adapter)  # UserError listing the kinds
    spec = {o.name: o for o in m.all_options()}
    options = dict(options or {})
    for key in options:
        if key not in spec:
            match = difflib.get_close_matches(key, list(spec), n=1, cutoff=0.5)
            hint = f" (did you mean {match[0]!r}?)" if match else ""
            raise UserError(
                f"unknown method option {key!r} for method {m.name!r}{hint}; "
                f"valid options: {', '.join(spec)} (set as method_options.KEY=VALUE)"
            )
    return {name: o.coerce(m.name, options.get(name, o.default)) for name, o in spec.items()}


def select_layers(selection: str | list[int], n_layers: int) -> list[int]:
    """Layer indices of a selection (all, lower-half, upper-half, every-other or explicit list)."""
    if isinstance(selection, str):
        half = n_layers // 2
        picks = {
            "all": range(n_layers),
            "lower-half": range(half),
            "upper-half": range(half, n_layers),
            "every-other": range(0, n_layers, 2),
        }[selection]
        return list(picks)
    bad = [i for i in selection if not 0 <= i < n_layers]
    if bad:
        raise UserError(f"method_options.layers {bad} out of range for a model of {n_layers} layers")
    return list(selection)
