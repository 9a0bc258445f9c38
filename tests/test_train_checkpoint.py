"""Checkpoint files: atomic step directories, retention, best, and what a half-written one leaves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from oelm.training import checkpoint as ckpt
from oelm.utils.errors import UserError


class Tied(nn.Module):
    """Two modules sharing a weight, like the GPT's wte / lm_head."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)
        self.b.weight = self.a.weight


def test_save_prune_latest_and_reload(tmp_path: Path) -> None:
    model = Tied()
    for step in (5, 10, 15):
        ckpt.save_checkpoint(tmp_path, step, model, {"step": step}, {"note": {"x": 1}}, keep_last=2)
    assert [s for s, _ in ckpt.list_steps(tmp_path)] == [10, 15]
    assert (tmp_path / "latest").read_text().strip() == "step_0000015"
    # A kill during a save leaves only a hidden temp directory, which is never picked up.
    (tmp_path / ".tmp_step_0000020_123").mkdir()
    (tmp_path / "step_0000025").mkdir()  # no files: incomplete, ignored
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_0000015"
    assert ckpt.load_state(tmp_path / "step_0000015") == {"step": 15}
    other = Tied()
    meta = ckpt.load_weights(other, tmp_path / "step_0000015" / ckpt.WEIGHTS)
    assert torch.equal(other.a.weight, model.a.weight) and other.b.weight is other.a.weight
    assert meta["step"] == "15" and meta["note"] == '{"x": 1}'


def test_numpy_scalars_in_a_tasks_state_are_saved_as_python_numbers(tmp_path: Path) -> None:
    """state.pt is read weights-only, which refuses numpy objects: a metric kept as np.float64 made
    every later checkpoint of a fine-tuning run unloadable. The writer stores plain numbers."""
    import numpy as np

    state = {"best_val_loss": np.float64(0.76), "data": {"history": [{"loss": np.float64(0.7), "n": np.int64(3)}]}}
    state["data"]["pair"] = (np.float32(1.5), "x")
    ckpt.save_checkpoint(tmp_path, 1, Tied(), state, {}, keep_last=1)
    loaded = ckpt.load_state(tmp_path / "step_0000001")  # weights-only
    assert loaded == {"best_val_loss": 0.76, "data": {"history": [{"loss": 0.7, "n": 3}], "pair": (1.5, "x")}}
    assert type(loaded["best_val_loss"]) is float and type(loaded["data"]["history"][0]["n"]) is int


def test_best_and_resolve(tmp_path: Path) -> None:
    model = Tied()
    ckpt.save_checkpoint(tmp_path / "checkpoints", 3, model, {}, {}, keep_last=1)
    with pytest.raises(UserError, match="no 'best' checkpoint.*--checkpoint last"):
        ckpt.resolve_checkpoint(tmp_path, "best")  # no silent fallback to the latest step
    assert ckpt.resolve_checkpoint(tmp_path, "last").parent.name == "step_0000003"
    with pytest.raises(UserError, match="steps saved: 3"):
        ckpt.resolve_checkpoint(tmp_path, "7")
    ckpt.save_best(tmp_path / "checkpoints", model, {"val_loss": 1.5})
    assert ckpt.resolve_checkpoint(tmp_path, "best").parent.name == "best"
    assert ckpt.resolve_checkpoint(tmp_path, "3").parent.name == "step_0000003"
    assert not list((tmp_path / "checkpoints" / "best").glob(".*"))  # no temp file left behind


def test_rng_state_roundtrip(tmp_path: Path) -> None:
    import random

    import numpy as np

    torch.save(ckpt.rng_state(), tmp_path / "rng.pt")
    a = (torch.rand(3), np.random.rand(3), random.random())
    ckpt.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))  # plain data, safe to load
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


@pytest.mark.parametrize(
    "failure",
    [
        OSError(28, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0"),
    ],
)
@pytest.mark.parametrize("where", ["weights", "state", "best"])
def test_a_full_disk_leaves_no_debris_and_the_last_checkpoint_intact(
    failure: Exception, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Tied()
    ckpt.save_checkpoint(tmp_path, 5, model, {"step": 5}, {}, keep_last=2)
    ckpt.save_best(tmp_path, model, {"step": "5"})
    before = sorted(p.name for p in tmp_path.rglob("*"))
    saved = model.a.weight.detach().clone()

    def full(*args, **kwargs):
        raise failure

    monkeypatch.setattr(
        ckpt, "save_model" if where != "state" else "torch", full if where != "state" else _TorchFull(failure)
    )
    with torch.no_grad():
        model.a.weight.add_(1.0)
    with pytest.raises(
        UserError,
        match=r"could not write a checkpoint .*MiB are free; the last complete checkpoint step_0000005 is intact",
    ):
        if where == "best":
            ckpt.save_best(tmp_path, model, {"step": "10"})
        else:
            ckpt.save_checkpoint(tmp_path, 10, model, {"step": 10}, {}, keep_last=2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no .tmp_ folders or files left
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_0000005"
    other = Tied()
    ckpt.load_weights(other, tmp_path / "step_0000005" / ckpt.WEIGHTS)
    assert torch.equal(other.a.weight, saved)


class _TorchFull:
    """torch with a save that fails like a full disk."""

    def __init__(self, failure: Exception) -> None:
        self.failure = failure

    def __getattr__(self, name: str):
        return getattr(torch, name)

    def save(self, *args, **kwargs):
        raise self.failure


def test_a_write_failure_that_is_not_a_full_disk_says_what_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Tied()
    ckpt.save_checkpoint(tmp_path, 5, model, {"step": 5}, {}, keep_last=2)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ckpt, "save_model", denied)
    with pytest.raises(UserError) as err:
        ckpt.save_checkpoint(tmp_path, 10, model, {"step": 10}, {}, keep_last=2)
    assert "Permission denied" in str(err.value) and "free" not in str(err.value)
    assert not list(tmp_path.glob(".tmp_*"))
