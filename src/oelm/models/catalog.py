"""Our named language models, both families: the presets, a config by name, building, metadata.

`PRESETS` holds every name `oelm train --model` takes for language modelling (gpt-* and
llama-*); a run's checkpoint stores its config under the family's key (`gpt_config` or
`llama_config`), which `config_from_meta` reads back.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from torch import nn

from oelm.models.gpt import GPT, GPTConfig, gpt_config
from oelm.models.gpt import PRESETS as GPT_PRESETS
from oelm.models.llama import PRESETS as LLAMA_PRESETS
from oelm.models.llama import Llama, LlamaConfig, llama_config
from oelm.utils.errors import UserError

ModelConfig = GPTConfig | LlamaConfig

PRESETS: dict[str, ModelConfig] = {**GPT_PRESETS, **LLAMA_PRESETS}
# The checkpoint-metadata / saved-folder key of each family's config.
CONFIG_KEYS: dict[type, str] = {GPTConfig: "gpt_config", LlamaConfig: "llama_config"}


def is_llama_preset(name: str) -> bool:
    """Whether `name` is one of the Llama-style presets."""
    return name in LLAMA_PRESETS


def preset_config(preset: str, **overrides: Any) -> ModelConfig:
    """The config of any of our presets, fields overridden (None values ignored)."""
    if preset in LLAMA_PRESETS:
        return llama_config(preset, **overrides)
    if preset in GPT_PRESETS:
        return gpt_config(preset, **overrides)
    raise UserError(f"unknown model preset {preset!r}; choose one of: {', '.join(PRESETS)}")


def build_lm(cfg: ModelConfig) -> nn.Module:
    """A freshly initialized causal LM of the config's family."""
    return Llama(cfg) if isinstance(cfg, LlamaConfig) else GPT(cfg)


def config_key(cfg: ModelConfig) -> str:
    """The metadata key a config is stored under (`gpt_config` / `llama_config`)."""
    return CONFIG_KEYS[type(cfg)]


def config_meta(cfg: ModelConfig) -> dict[str, dict[str, Any]]:
    """{key: fields} of a config, as checkpoints and saved folders store it."""
    return {config_key(cfg): dataclasses.asdict(cfg)}


def config_from_meta(meta: dict[str, Any]) -> ModelConfig | None:
    """The config a checkpoint's metadata or saved folder holds (fields as a dict or a JSON string), or None."""
    for cls, key in CONFIG_KEYS.items():
        if key in meta:
            fields = meta[key]
            return cls(**(json.loads(fields) if isinstance(fields, str) else fields))
    return None
