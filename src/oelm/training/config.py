"""TrainConfig: the validated description of one training run (YAML + flags + key=value)."""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from oelm.core.methods import list_methods, validate_method_options
from oelm.data.synthetic import ProbeOptions  # probe task options (issue 11 section 4)
from oelm.models.catalog import PRESETS, is_llama_preset
from oelm.records.comparable import RUNTIME_FIELDS
from oelm.training.distributed import fsdp_available
from oelm.training.wandb import require_wandb
from oelm.utils.errors import UserError
from oelm.utils.io import load_yaml_text, read_yaml

# An AdamW beta: torch raises deep in the first step for one outside [0, 1).
Beta = Annotated[float, Field(ge=0, lt=1)]


class ClassificationOptions(BaseModel):
    """Options of the classification task (owned by that task; extend here)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    dataset: str | None = Field(None, description="dataset name; overrides `data` for this task")
    data_dir: str | None = Field(
        None, description="local files in the official layout (or CSV/TSV/JSONL for dataset 'local')"
    )
    eval_dataset: str | None = Field(None, description="report on another dataset, e.g. train mnli, eval xnli-en")
    eval_data_dir: str | None = Field(None, description="local files of the eval dataset")
    num_labels: int | None = Field(None, ge=2, description="number of labels (default: the dataset's)")
    max_length: int | None = Field(None, gt=0, description="truncate inputs to this many tokens")
    causal: bool = Field(False, description="GPT classifier with a causal mask (pool the last token)")
    tokenizer: str = Field("gpt2", description="tokenizer of our GPT models (HF models use their own)")
    text_fields: list[str] | None = Field(
        None, min_length=1, max_length=2, description="text column(s) of a local table (one or two)"
    )
    label_field: str | None = Field(None, description="label column of a local table")
    split_seed: int = Field(0, description="seed of carved validation/held-out splits (fixed across seeds and methods)")
    val_fraction: float = Field(0.05, gt=0, lt=1, description="fraction of train carved out for validation")
    split_fractions: tuple[float, float, float] = Field(
        (0.8, 0.1, 0.1),
        description="train / validation / held-out shares of a dataset with one labelled split (e.g. XNLI-en dev)",
    )
    max_train: int | None = Field(None, gt=0, description="use at most this many training examples")
    max_eval: int | None = Field(None, gt=0, description="use at most this many evaluation examples")
    epochs: float | None = Field(None, gt=0, description="set steps from the train split's size")
    evals_per_epoch: int = Field(0, ge=0, description="> 0 sets eval_every from the epoch length")
    eval_batch_size: int | None = Field(None, gt=0, description="evaluation batch size (default: batch_size)")
    padding_side: Literal["right", "left"] = Field("right", description="where padding goes")

    @field_validator("split_fractions")
    @classmethod
    def _shares(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if min(value) <= 0 or abs(sum(value) - 1.0) > 1e-6:
            raise ValueError(
                f"must be three positive shares (train, validation, held-out) summing to 1, got {list(value)}; "
                "e.g. [0.5, 0.1, 0.4]"
            )
        return value


class TrainConfig(BaseModel):
    """Everything one training run needs; validated before any work starts."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    task: Literal["lm", "classification", "probe"] = Field("lm", description="what to train")
    data: str = Field(description="LM data directory (train.bin/val.bin/meta.json) or classification dataset name")
    model: str = Field(
        "gpt-tiny", description="our preset (gpt-*, llama-*), or (classification) a Hugging Face name or folder"
    )
    model_overrides: dict[str, Any] = Field(
        default_factory=dict, description="model config fields to change (GPTConfig or LlamaConfig)"
    )
    method: str = Field("baseline", description="training method (see `oelm methods`)")
    method_options: dict[str, Any] = Field(default_factory=dict, description="options of the method")
    seed: int = Field(0, description="seed of initialization (and data order unless data_seed)")
    data_seed: int | None = Field(
        None, description="seed of the data order (default: seed, same batches for all methods)"
    )

    steps: int = Field(1000, gt=0, description="optimizer steps")
    batch_size: int = Field(16, gt=0, description="sequences per rank and micro-step")
    grad_accum: int = Field(1, gt=0, description="micro-steps per optimizer step")
    seq_len: int | None = Field(None, gt=1, description="tokens per sequence (default: the model's context length)")

    lr: float = Field(6e-4, gt=0, description="peak learning rate")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final learning rate as a fraction of lr")
    warmup: int = Field(100, ge=0, description="linear warmup steps")
    schedule: Literal["cosine", "linear", "constant"] = Field("cosine", description="decay after warmup")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay (matrices only)")
    betas: tuple[Beta, Beta] = Field((0.9, 0.95), description="AdamW betas, each in [0, 1)")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    clip: float = Field(1.0, ge=0, description="gradient-norm clipping (0 disables it)")
    layer_lr_decay: float = Field(
        1.0, gt=0, le=1, description="LR x decay**(layers above this one): layer-wise LR; 1 = off"
    )

    eval_every: int = Field(100, ge=0, description="validate every N steps (0: only at the end)")
    eval_batches: int = Field(20, gt=0, description="batches per periodic validation")
    final_eval_batches: int | None = Field(
        None, gt=0, description="batches of the final evaluation (default: the whole split)"
    )
    checkpoint_every: int = Field(500, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep_last: int = Field(2, gt=0, description="step checkpoints kept (best/ is kept apart)")
    log_every: int = Field(10, gt=0, description="log training loss every N steps")
    timing_warmup: int = Field(5, ge=0, description="first steps left out of the timing statistics")

    out: str | None = Field(
        None,
        description="run directory (default: runs/<task>-<model>-<method>-s<seed>; a study config's: runs/study/<id>-<scale>-<method>-s<seed>)",
    )
    resume: bool = Field(False, description="continue the unfinished run in --out (or reuse a finished one)")
    allow_change: list[str] = Field(
        default_factory=list,
        description="with --resume: keys that may differ from the stored run, comma-separated (e.g. lr,steps)",
    )
    overwrite: bool = Field(False, description="replace whatever run --out holds")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="data parallelism under torchrun: ddp (replicated model) or fsdp (FSDP2: parameters, "
        "gradients and optimizer state sharded per transformer block; sharded checkpoints)",
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="autocast dtype")
    compile: bool = Field(False, description="torch.compile the model")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None = Field(
        None, description="torch.compile mode (needs --compile); reduce-overhead records CUDA graphs (static shapes)"
    )
    progress: bool = Field(True, description="show a progress bar")
    tensorboard: bool = Field(True, description="write TensorBoard events to RUN/tb")
    wandb: bool = Field(
        False, description="also log to Weights & Biases (pip install 'oelm[wandb]'; WANDB_MODE is respected)"
    )
    wandb_project: str | None = Field(None, description="Weights & Biases project (default: oelm)")

    classification: ClassificationOptions | None = Field(None, description="classification task options")
    probe: ProbeOptions | None = Field(None, description="probe task options: synthetic MQAR / induction")

    # The method options as this config's validation checked them (validate_method_options: types
    # checked, defaults filled in), with the (method, options) they belong to: the Trainer applies
    # these rather than checking the same options again (method_settings).
    _method_settings: tuple[str, str, dict[str, Any]] | None = PrivateAttr(None)

    @field_validator("allow_change", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):  # --allow-change lr,steps
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:

        names = [_method_name(m) for m in list_methods()]
        if value not in names:
            hint = _closest(value, names)
            raise ValueError(f"unknown method {value!r}{hint}; known methods: {', '.join(names)}")
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str, info: ValidationInfo) -> str:

        # Classification also takes Hugging Face names/folders, resolved by that task's validate().
        if value not in PRESETS and info.data.get("task") != "classification":
            hint = _closest(value, list(PRESETS))
            raise ValueError(f"unknown model preset {value!r}{hint}; presets: {', '.join(PRESETS)}")
        if is_llama_preset(value) and info.data.get("task") == "classification":
            raise ValueError(
                f"{value} is a language model (our Llama family has no classifier); use a gpt-* preset or a "
                "Hugging Face model for classification, or task lm / probe"
            )
        return value

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if value != "auto" and value.split(":")[0] not in {"cpu", "cuda", "mps"}:
            raise ValueError(f"unknown device {value!r}; use auto, cpu, cuda or cuda:N")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:

        settings = validate_method_options(self.method, self.method_options)  # typos fail before any run dir
        self._method_settings = (self.method, _options_key(self.method_options), settings)
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite are exclusive; pick one")
        if self.compile_mode is not None and not self.compile:
            raise ValueError(f"compile_mode={self.compile_mode!r} needs compile=true; set both")
        if self.wandb:
            require_wandb()
        if self.strategy == "fsdp" and not fsdp_available():
            raise ValueError(
                "strategy fsdp needs torch.distributed.fsdp.fully_shard (FSDP2, torch >= 2.6 with "
                "torch.distributed); install such a torch or use --strategy ddp"
            )
        if self.strategy == "fsdp" and self.compile:
            raise ValueError("strategy fsdp does not support compile yet; drop --compile or use --strategy ddp")
        if self.warmup >= self.steps and self.schedule != "constant" and self.warmup > 0:
            raise ValueError(f"warmup ({self.warmup}) must be smaller than steps ({self.steps}); lower --warmup")
        return self

    def method_settings(self) -> dict[str, Any]:
        """The method's options, validated (defaults filled in): those this config's validation
        computed, checked again only where method or method_options changed without validation
        since (model_copy with an update)."""
        held = self._method_settings
        if held is None or held[:2] != (self.method, _options_key(self.method_options)):
            settings = validate_method_options(self.method, self.method_options)
            held = self._method_settings = (self.method, _options_key(self.method_options), settings)
        return copy.deepcopy(held[2])

    def identity(self) -> dict[str, Any]:
        """The fields that define what the run computes (for comparing with a stored run)."""
        return {k: v for k, v in self.model_dump(mode="json").items() if k not in RUNTIME_FIELDS}

    def run_dir(self) -> Path:
        """The run directory, defaulting to runs/<task>-<model>-<method>-s<seed>."""
        return Path(self.out or f"runs/{self.task}-{self.model}-{self.method}-s{self.seed}")


def _options_key(options: dict[str, Any]) -> str:
    """method_options as canonical JSON: what the validated settings were computed from."""
    return json.dumps(options, sort_keys=True, default=str)


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
    try:  # the strict loader of config files: no duplicate keys, no alias bombs
        parsed = load_yaml_text(value) if value != "" else ""
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())[:160]
        raise UserError(f"override {text!r}: the value is not valid YAML ({detail})") from None
    return key.split("."), parsed


def set_dotted(raw: dict[str, Any], path: list[str], value: Any, given: str) -> None:
    """Set one field in place, dots reaching nested sections (a missing or null section is made):
    the one setter of every dotted key, whether it came as `key=value`, a flag or a study key.
    `given`: how the user wrote it, for the error when a part of the path is not a section."""
    node = raw
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UserError(f"{given}: {part!r} is not a section (it holds {child!r}); set {part} itself instead")
        node = child
    node[path[-1]] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of raw with `key=value` overrides applied (dots reach nested fields)."""
    out = _deep_copy(raw)
    for text in overrides:
        path, value = parse_override(text)
        set_dotted(out, path, value, f"override {text!r}")
    return out


def apply_dotted(raw: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of raw with each dotted field of `values` set (None means: not given), through
    the same setter as `key=value` overrides (command-line flags arrive so)."""
    out = _deep_copy(raw)
    for dotted, value in values.items():
        if value is not None:
            set_dotted(out, dotted.split("."), value, f"{dotted}={value!r}")
    return out


def apply_mapping(raw: dict[str, Any], mapping: dict[str, Any], given: str) -> dict[str, Any]:
    """Return a copy of raw with a mapping of fields merged in (a study scale, a sweep's `overrides:`
    or grid values), through the same setter and in the same syntax as `key=value` overrides: each
    leaf sets its dotted path (nested or written with dots), so sections merge field by field. An
    empty section only makes the section where none is. `given`: where the mapping came from."""
    out = _deep_copy(raw)
    for path, value in _leaves(mapping or {}, []):
        where = f"{given}: {'.'.join(path)}={value!r}"
        if value == {}:
            node = out
            for part in path:  # make the section where it is missing, keep one that is there
                child = node.get(part)
                if child is None:
                    child = node[part] = {}
                if not isinstance(child, dict):
                    raise UserError(
                        f"{where}: {part!r} is not a section (it holds {child!r}); set {part} itself instead"
                    )
                node = child
        else:
            set_dotted(out, path, copy.deepcopy(value), where)
    return out


def _leaves(mapping: dict[str, Any], prefix: list[str]) -> Iterator[tuple[list[str], Any]]:
    """(path, value) of every leaf of a nested mapping; an empty mapping is a leaf. A dotted key is
    a path, as on the command line: `model_overrides.n_layer: 4` is `{model_overrides: {n_layer: 4}}`."""
    for key, value in mapping.items():
        path = [*prefix, *str(key).split(".")]
        if isinstance(value, dict) and value:
            yield from _leaves(value, path)
        else:
            yield path, value


def _deep_copy(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in raw.items()}


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML config file into a dict (an empty file gives {})."""
    return read_yaml(path, "config file")


def make_config(raw: TrainConfig | dict[str, Any], overrides: list[str] | None = None) -> TrainConfig:
    """Validate a dict (or re-validate a TrainConfig with overrides) into a TrainConfig; a TrainConfig
    without overrides is already validated (by its construction) and comes back as it is."""
    if isinstance(raw, TrainConfig):
        if not overrides:
            return raw
        raw = raw.model_dump()
    raw = apply_overrides(raw, overrides or [])
    _check_keys(raw, TrainConfig)
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as err:
        raise UserError(format_validation(err)) from None


def format_validation(
    err: ValidationError, what: str = "config", missing: str = "required (set {loc}=... or its flag)"
) -> str:
    """A pydantic error as one line: 'invalid WHAT: field: problem; ...' (`missing`: the problem of
    a required field left out, {loc} its name)."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            msg = missing.format(loc=loc)
        lines.append(f"{loc}: {msg}" if loc else msg)
    return f"invalid {what}: " + "; ".join(lines)


# The first line of RUN/config.yaml: the digest of the run's identity as written, so that a resume
# can tell a file edited afterwards (its settings would no longer be what the checkpoints ran).
DIGEST_LINE = "# oelm train wrote this file; identity sha256 {} (an edit is refused on --resume)\n"
_DIGEST = re.compile(r"\A# oelm train wrote this file; identity sha256 ([0-9a-f]{64})\b")


def identity_digest(identity: dict[str, Any]) -> str:
    """sha256 of a config identity (TrainConfig.identity(), or a stored config without runtime fields)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def written_digest(text: str) -> str | None:
    """The identity digest config.yaml's first line records (None: a file written before it did)."""
    match = _DIGEST.match(text)
    return match.group(1) if match else None


def dump_config(cfg: TrainConfig) -> str:
    """The resolved config as YAML text (what RUN/config.yaml holds), its identity digest first."""
    return DIGEST_LINE.format(identity_digest(cfg.identity())) + yaml.safe_dump(
        cfg.model_dump(mode="json"), sort_keys=False
    )
