"""Every sweep spec under configs/sweeps validates, and the classifier-claim specs say what they claim."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from oelm.experiments.sweep import load_spec
from oelm.training.config import make_config

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))


@pytest.fixture(autouse=True)
def _pretend_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU presets name device cuda, checked up front: validate them here as if it were present."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


CLAIMS = {  # spec: (steps, max_length, train rows cap)
    "agnews-gpt-medium": (900, 128, None),
    "imdb-gpt-medium": (470, 256, None),
    "agnews-cpu": (300, 128, 2000),
    "imdb-cpu": (300, 256, 2000),
}


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_sweep_spec_validates(path: Path, tmp_path: Path) -> None:
    spec = load_spec(path, out=tmp_path / path.stem)  # validates every run's TrainConfig
    # A baseline arm, or (a decisive pilot) declared primary comparisons naming their references, or
    # (a rerun of one arm) a declared reference whose runs are stored elsewhere.
    declared_elsewhere = spec.baseline != "baseline" and spec.baseline not in spec.methods
    assert spec.runs() and ("baseline" in spec.methods or spec.primary or declared_elsewhere)
    for run in spec.runs():
        cfg = make_config(run.config)
        assert not str(cfg.data).startswith("/"), "no absolute paths in specs"


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_classifier_claim_specs(name: str, tmp_path: Path) -> None:
    steps, length, cap = CLAIMS[name]
    spec = load_spec(ROOT / "configs" / "sweeps" / f"{name}.yaml", out=tmp_path)
    cfgs = [make_config(r.config) for r in spec.runs()]
    assert {c.steps for c in cfgs} == {steps} and spec.seeds == [0, 1, 2]
    assert set(spec.methods) == {"baseline", "oelm-freeze"}
    opts = {
        (c.classification.max_length, c.classification.max_train, c.classification.epochs, c.classification.tokenizer)
        for c in cfgs
    }
    assert opts == {(length, cap, None, "gpt2:../shared/data/tokenizers/gpt2")}
    if name.endswith("gpt-medium"):  # the GPU presets of the H100 measurements
        assert {(c.model, c.dtype, c.device, c.batch_size) for c in cfgs} == {
            ("gpt-medium-512", "bfloat16", "cuda", 32)
        }
        assert all(a["lr"] == [1e-4, 3e-4, 1e-3] for a in spec.methods.values())
    else:
        assert {(c.model, c.device) for c in cfgs} == {("gpt-tiny", "cpu")}
    data_dir = Path(cfgs[0].classification.data_dir)
    assert not data_dir.is_absolute() and data_dir.parts[:3] == ("..", "shared", "data")
