"""TrainConfig: the validated description of one training run (YAML + flags + key=value)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from oelm.data.synthetic import ProbeOptions  # probe task options (issue 11 section 4)
from oelm.errors import UserError

# Fields that change how a run is executed or written but not what it computes; a resumed run may
# differ from the stored one in these without being "a different run".
RUNTIME_FIELDS = frozenset(
    {"out", "resume", "overwrite", "device", "compile", "progress", "tensorboard", "log_every"}
)


class ClassificationOptions(BaseModel):
    """Options of the classification task (owned by that task; extend here)."""

    model_config = ConfigDict(extra="forbid")

    dataset: str | None = None  # overrides `data` (which holds the dataset name for this task)
    data_dir: str | None = None  # local files in the official layout (or CSV/TSV/JSONL for "local")
    eval_dataset: str | None = None  # report on another dataset, e.g. train mnli, eval xnli-en
    eval_data_dir: str | None = None
    num_labels: int | None = Field(default=None, ge=2)
    max_length: int | None = Field(default=None, gt=0)
    causal: bool = False
    tokenizer: str = "gpt2"  # our GPT models only; HF models use their own tokenizer
    text_fields: list[str] | None = Field(default=None, min_length=1, max_length=2)
    label_field: str | None = None
    split_seed: int = 0  # carved validation/held-out splits; fixed across seeds and methods
    val_fraction: float = Field(default=0.05, gt=0, lt=1)
    max_train: int | None = Field(default=None, gt=0)
    max_eval: int | None = Field(default=None, gt=0)
    epochs: float | None = Field(default=None, gt=0)  # sets steps from the train split's size
    evals_per_epoch: int = Field(default=0, ge=0)  # > 0 sets eval_every from the epoch length
    eval_batch_size: int | None = Field(default=None, gt=0)
    padding_side: Literal["right", "left"] = "right"
    options: dict[str, Any] = Field(default_factory=dict)


class TrainConfig(BaseModel):
    """Everything one training run needs; validated before any work starts."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    task: Literal["lm", "classification", "probe"] = "lm"
    data: str = Field(description="LM data directory (train.bin/val.bin/meta.json) or dataset spec")
    model: str = "gpt-tiny"
    model_overrides: dict[str, Any] = Field(default_factory=dict)
    method: str = "baseline"
    method_options: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    data_seed: int | None = None  # data order; defaults to seed so all methods see the same batches

    steps: int = Field(default=1000, gt=0)
    batch_size: int = Field(default=16, gt=0)  # per rank and micro-step
    grad_accum: int = Field(default=1, gt=0)
    seq_len: int | None = Field(default=None, gt=1)  # None: the model's context length

    lr: float = Field(default=6e-4, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    warmup: int = Field(default=100, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = Field(default=0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)
    clip: float = Field(default=1.0, ge=0)  # 0 disables clipping

    eval_every: int = Field(default=100, ge=0)  # 0: only at the end
    eval_batches: int = Field(default=20, gt=0)
    final_eval_batches: int | None = Field(default=None, gt=0)  # None: the whole split
    checkpoint_every: int = Field(default=500, ge=0)  # 0: only at the end
    keep_last: int = Field(default=2, gt=0)
    log_every: int = Field(default=10, gt=0)
    timing_warmup: int = Field(default=5, ge=0)

    out: str | None = None
    resume: bool = False
    overwrite: bool = False
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    compile: bool = False
    progress: bool = True
    tensorboard: bool = True

    classification: ClassificationOptions | None = None
    probe: ProbeOptions | None = None  # task probe: synthetic MQAR / induction (oelm.data.synthetic)

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        from oelm.methods import list_methods

        names = [_method_name(m) for m in list_methods()]
        if value not in names:
            hint = _closest(value, names)
            raise ValueError(f"unknown method {value!r}{hint}; known methods: {', '.join(names)}")
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str, info: ValidationInfo) -> str:
        from oelm.models.gpt import PRESETS

        # Classification also takes Hugging Face names/folders, resolved by that task's validate().
        if value not in PRESETS and info.data.get("task") != "classification":
            hint = _closest(value, list(PRESETS))
            raise ValueError(f"unknown model preset {value!r}{hint}; presets: {', '.join(PRESETS)}")
        return value

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if value != "auto" and value.split(":")[0] not in {"cpu", "cuda", "mps"}:
            raise ValueError(f"unknown device {value!r}; use auto, cpu, cuda or cuda:N")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite are exclusive; pick one")
        if self.warmup >= self.steps and self.schedule != "constant" and self.warmup > 0:
            raise ValueError(
                f"warmup ({self.warmup}) must be smaller than steps ({self.steps}); lower --warmup"
            )
        return self

    def identity(self) -> dict[str, Any]:
        """The fields that define what the run computes (for comparing with a stored run)."""
        return {k: v for k, v in self.model_dump(mode="json").items() if k not in RUNTIME_FIELDS}

    def run_dir(self) -> Path:
        """The run directory, defaulting to runs/<task>-<model>-<method>-s<seed>."""
        return Path(self.out or f"runs/{self.task}-{self.model}-{self.method}-s{self.seed}")


def _method_name(method: Any) -> str:
    return method if isinstance(method, str) else str(getattr(method, "name", method))


def _closest(value: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _check_keys(raw: dict[str, Any], model: type[BaseModel], prefix: str = "") -> None:
    """Raise one UserError per unknown key, suggesting the closest field name."""
    fields = model.model_fields
    for key, value in raw.items():
        if key not in fields:
            hint = _closest(key, list(fields))
            raise UserError(f"unknown config key {prefix + key!r}{hint}")
        sub = fields[key].annotation
        nested = _nested_model(sub)
        if nested is not None and isinstance(value, dict):
            _check_keys(value, nested, prefix=f"{prefix}{key}.")


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    for arg in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b=value` into (["a", "b"], parsed YAML value)."""
    if "=" not in text:
        raise UserError(f"override {text!r} is not key=value (e.g. lr=3e-4, model_overrides.n_layer=2)")
    key, value = text.split("=", 1)
    if not key:
        raise UserError(f"override {text!r} has an empty key")
    parsed = yaml.safe_load(value) if value != "" else ""
    return key.split("."), parsed


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of raw with `key=value` overrides applied (dots reach nested fields)."""
    out = _deep_copy(raw)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UserError(f"override {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in raw.items()}


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML config file into a dict (an empty file gives {})."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file {str(p)!r} not found (the file does not exist); check the path")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise UserError(f"config file {str(p)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {str(p)!r} must hold a mapping of keys to values")
    return data


def make_config(raw: TrainConfig | dict[str, Any], overrides: list[str] | None = None) -> TrainConfig:
    """Validate a dict (or re-validate a TrainConfig with overrides) into a TrainConfig."""
    if isinstance(raw, TrainConfig):
        raw = raw.model_dump()
    raw = apply_overrides(raw, overrides or [])
    _check_keys(raw, TrainConfig)
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as err:
        raise UserError(_format_validation(err)) from None


def _format_validation(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            msg = f"required (set {loc}=... or its flag)"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "invalid config: " + "; ".join(lines)


def dump_config(cfg: TrainConfig) -> str:
    """The resolved config as YAML text (what RUN/config.yaml holds)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
