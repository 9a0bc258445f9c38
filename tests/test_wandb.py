"""Optional Weights & Biases logging: off by default, a clear error without the package, logs when asked."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from oelm.training.config import make_config
from oelm.training.loop import train
from oelm.utils.errors import UserError
from train_utils import one_thread, synthetic_lm_dir, tiny_config


class FakeRun:
    def __init__(self, **kwargs) -> None:
        self.kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, data, step=None) -> None:
        self.logged.append((step, data))

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    runs: list[FakeRun] = []
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    module.init = lambda **kw: runs.append(FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


def test_wandb_is_off_by_default_and_needs_the_package(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path / "data", tmp_path / "run")
    assert make_config(cfg).wandb is False
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(UserError, match=r"pip install 'oelm\[wandb\]'"):
        make_config({**cfg, "wandb": True})


def test_wandb_logs_train_and_eval_scalars_next_to_tensorboard(tmp_path, fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    cfg = tiny_config(
        data,
        tmp_path / "run",
        steps=6,
        eval_every=3,
        checkpoint_every=0,
        wandb=True,
        wandb_project="oelm-test",
        tensorboard=True,
    )
    with one_thread():
        train(cfg)
    (run,) = fake_wandb
    assert run.kwargs["project"] == "oelm-test" and run.kwargs["dir"] == str(tmp_path / "run")
    assert "mode" not in run.kwargs  # wandb reads WANDB_MODE (offline here) itself
    assert run.kwargs["config"]["method"] == "oelm-freeze" and run.finished
    keys = {k for _, d in run.logged for k in d}
    assert {"train/loss", "train/lr", "val/loss"} <= keys
    assert [s for s, d in run.logged if "val/loss" in d] == [3, 6]
    assert (tmp_path / "run" / "wandb_id.txt").read_text().strip() == run.kwargs["id"]
    assert any((tmp_path / "run" / "tb").iterdir())  # TensorBoard still written
