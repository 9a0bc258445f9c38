"""Each input validated once per command (issue 50): `oelm train` validates its config and its method
once; `oelm confirm report`, which trains nothing, validates the plan's config once, not once per
planned run (tests/test_confirm.py counts it with count_validations; tests/test_records.py counts
the reads of sweep.yaml and results.json with count_reads; tests/test_export.py the checkpoint
resolutions and metadata reads of `oelm export` with count_calls)."""

from __future__ import annotations

import builtins
import collections
import io
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from oelm.cli import main
from oelm.core import methods
from oelm.experiments.resolve import resolve_config
from oelm.experiments.sweep import planned_identities, spec_from_dict
from oelm.training.config import TrainConfig
from test_sweep import TINY
from train_utils import one_thread, synthetic_lm_dir, tiny_config


class _CountingValidator:
    """TrainConfig's pydantic validator, counting every validation (construction, model_validate,
    an assignment): each passes through one of its validate_* methods."""

    def __init__(self, inner: Any, counts: collections.Counter) -> None:
        self._inner, self._counts = inner, counts

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not name.startswith("validate_"):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts["config"] += 1
            return attr(*args, **kwargs)

        return counted


def count_calls(
    monkeypatch: pytest.MonkeyPatch, home: ModuleType, names: dict[str, str], counts: collections.Counter
) -> collections.Counter:
    """Count every call of the functions `home` defines, keyed by names[function name], wherever a
    module of the package holds them (its own module included, for the calls made inside it)."""
    for function, key in names.items():
        original = getattr(home, function)

        def counting(*args: Any, _original: Any = original, _key: str = key, **kwargs: Any) -> Any:
            counts[_key] += 1
            return _original(*args, **kwargs)

        for name, module in list(sys.modules.items()):
            if name.startswith("oelm") and getattr(module, function, None) is original:
                monkeypatch.setattr(module, function, counting)
    return counts


def count_reads(monkeypatch: pytest.MonkeyPatch, names: set[str]) -> collections.Counter:
    """Every open-for-reading of a file with one of these names, counted by name."""
    counts: collections.Counter = collections.Counter()
    original = builtins.open

    def counting(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "r" in mode and Path(str(file)).name in names:
            counts[Path(str(file)).name] += 1
        return original(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    monkeypatch.setattr(io, "open", counting)
    return counts


def count_validations(monkeypatch: pytest.MonkeyPatch) -> collections.Counter:
    """Counts of TrainConfig validations ("config") and method-option validations ("method"), the
    latter wherever a module of the package holds validate_method_options."""
    counts: collections.Counter = collections.Counter()
    monkeypatch.setattr(
        TrainConfig, "__pydantic_validator__", _CountingValidator(TrainConfig.__pydantic_validator__, counts)
    )
    return count_calls(monkeypatch, methods, {"validate_method_options": "method"}, counts)


def test_train_validates_its_config_and_method_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`oelm train` resolved and validated the config, then train() validated it again, and the
    Trainer checked the method options a third time before applying them."""
    cfg = tiny_config(synthetic_lm_dir(tmp_path / "data"), tmp_path / "run", steps=2, warmup=0, eval_every=0)
    cfg["method"], cfg["method_options"] = "oelm-lowrank", {"rank": 2}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    counts = count_validations(monkeypatch)
    with one_thread():
        assert main(["train", str(config)]) == 0
    assert (tmp_path / "run" / "results.json").is_file()
    assert counts == {"config": 1, "method": 1}


def test_planned_identities_are_each_runs_validated_identity(tmp_path: Path) -> None:
    """The identities `confirm report` checks runs against, one config validated per grid point,
    equal each run's own validated config's identity: over arms with and without method options,
    a grid and a base that sets method options itself."""
    raw = {
        "name": "ids",
        "out": str(tmp_path / "sweep"),
        "config": {**TINY, "data": str(tmp_path / "data"), "method_options": {"layers": "lower-half"}},
        "methods": {
            "baseline": {"lr": [1e-3, 3]},
            "oelm-lowrank": {"lr": [3e-3], "method_options": {"rank": 2}},
            "oelm-freeze": {"lr": [3e-3]},
        },
        "seeds": [0, 1],
        "grid": {"warmup": [1, 2], "model_overrides": [{"n_layer": 1}, {"n_layer": 2}]},
        "max_extend": 0,
    }
    spec = spec_from_dict(raw)
    runs = spec.runs()
    assert len(runs) == 32
    expected = {str(Path(r.run_dir)): resolve_config(r.config).identity() for r in runs}
    assert planned_identities(spec) == expected
