"""The one config resolver: what the user wrote -> a validated TrainConfig, for train, sweep and compare.

Every run's config takes the same one-way path, through this module only:

    source (YAML file, study config or mapping; a compare preset arrives as a sweep spec's
    `config:` mapping) -> its scale -> command-line flags -> overrides (a mapping, or key=value
    items) -> a sweep run's grid values and per-run fields -> one validation (TrainConfig +
    method options).

Callers (cli.train, experiments.sweep, experiments.compare) ask here and nowhere below:
experiments.study holds the pure data helpers (scales, the study keys) and
training.config the TrainConfig model; only this module calls them. Nothing else applies
overrides.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

from oelm.experiments.study import META_KEYS, SCALES_KEY, apply_scale, split_study_config
from oelm.training.config import TrainConfig, apply_dotted, apply_mapping, apply_overrides, make_config
from oelm.utils.errors import UserError
from oelm.utils.io import read_yaml

Source = str | os.PathLike | dict[str, Any] | None


@dataclass
class Resolved:
    """A validated config, the dict it came from, and the study meta (data `prepare` recipe, id)."""

    config: TrainConfig
    raw: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """The fields that define what the run computes (TrainConfig.identity)."""
        return self.config.identity()


def read_file(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML mapping from a file: a config, a sweep spec or a compare preset (UserError if not)."""
    return read_yaml(path, "config file")


def _read_source(source: Source, scale: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainConfig keys, study meta) of a source; study configs get their scale applied."""
    if source is None:
        if scale is not None:
            raise UserError(
                "--scale needs a study config file, e.g. oelm train configs/study/gpt-01.yaml --scale smoke"
            )
        return {}, {}
    data = copy.deepcopy(source) if isinstance(source, dict) else read_file(source)
    if not any(k in data for k in (*META_KEYS, SCALES_KEY)):
        if scale is not None:
            name = "the config" if isinstance(source, dict) else str(source)
            raise UserError(f"--scale {scale} given, but {name} has no 'scales' section")
        return data, {}
    return split_study_config(apply_scale(data, scale))


def resolve_raw(
    source: Source = None,
    scale: str | None = None,
    flags: dict[str, Any] | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config dict, study meta) with scale, flags and overrides applied, not yet validated."""
    raw, meta = _read_source(source, scale)
    raw = apply_dotted(raw, flags or {})
    if isinstance(overrides, dict):
        raw = apply_mapping(raw, overrides, "overrides")
    elif overrides:
        raw = apply_overrides(raw, list(overrides))
    return raw, meta


def run_raw(base: dict[str, Any], grid: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """One sweep run's config dict: the sweep's resolved base, its grid values merged in, then the
    per-run fields (method, lr, seed, out, resume; the arm's method_options) set as whole values."""
    raw = apply_mapping(base, grid, "grid")
    raw.update(copy.deepcopy(fields))
    return raw


def resolve_config(
    source: Source = None,
    scale: str | None = None,
    flags: dict[str, Any] | None = None,
    overrides: list[str] | dict[str, Any] | None = None,
) -> Resolved:
    """Resolve and validate one run's config (UserError naming the problem and the fix)."""
    raw, meta = resolve_raw(source, scale, flags, overrides)
    study_id = (meta.get("study") or {}).get("id")
    if study_id and not raw.get("out"):
        raw["out"] = study_run_dir(str(study_id), scale, raw)
    cfg = make_config(raw)
    return Resolved(cfg, raw, meta)


def study_run_dir(study_id: str, scale: str | None, raw: dict[str, Any]) -> str:
    """A study config's default run folder, one per experiment, scale, method and seed:
    runs/study/<id>-<scale>-<method>-s<seed> (e.g. runs/study/gpt-02-smoke-oelm-freeze-s0), so that
    two study configs never share the folder that TrainConfig's default would give them both."""
    name = f"{study_id.lower()}-{scale or 'full'}-{raw.get('method', 'baseline')}-s{raw.get('seed', 0)}"
    return f"runs/study/{name}"
