"""Distributed jobs check what every rank resumes and reads before the first step (issue 40, class 1)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from oelm.training.checkpoint import SHARD_DIGESTS, SHARDED
from oelm.training.loop import train
from oelm.utils.errors import UserError
from test_train_ddp import torchrun_with_rank1_hook
from train_utils import one_thread, synthetic_lm_dir, tiny_config


def test_a_sharded_checkpoint_with_a_shard_of_another_step_or_none_is_refused(tmp_path: Path) -> None:
    """FSDP over a group of one writes step_4 and step_8; a shard of step_4 copied into step_8, or a
    shard removed, is named before anything loads, and the checkpoint it came from stays as it was."""
    data = synthetic_lm_dir(tmp_path / "data")
    cfg = tiny_config(data, tmp_path / "run", steps=8, eval_every=4, checkpoint_every=4, strategy="fsdp")
    with one_thread():
        train(cfg)
    root = tmp_path / "run" / "checkpoints"
    shard = "__0_0.distcp"
    assert (root / "step_0000008" / SHARDED / SHARD_DIGESTS).is_file()
    for broken in ("mixed", "missing"):
        shutil.copytree(tmp_path / "run", tmp_path / broken)
        target = tmp_path / broken / "checkpoints" / "step_0000008" / SHARDED / shard
        if broken == "mixed":
            shutil.copyfile(tmp_path / broken / "checkpoints" / "step_0000004" / SHARDED / shard, target)
        else:
            target.unlink()
        before = sorted(p.name for p in (tmp_path / broken / "checkpoints").iterdir())
        match = "is not the one written at step 8" if broken == "mixed" else f"lacks the shard {shard}"
        with pytest.raises(UserError, match=match), one_thread():
            train({**cfg, "out": str(tmp_path / broken), "steps": 12, "resume": True, "allow_change": ["steps"]})
        assert sorted(p.name for p in (tmp_path / broken / "checkpoints").iterdir()) == before
    # The untouched run resumes.
    with one_thread():
        done = train({**cfg, "steps": 12, "resume": True, "allow_change": ["steps"]})
    assert done["steps"] == 12


@pytest.mark.slow  # torchrun with two processes
def test_ranks_that_read_different_data_stop_before_the_first_step_naming_the_rank(tmp_path: Path) -> None:
    """Rank 1 reads data with another fingerprint (a node whose prepared folder differs): the job ends
    with one line naming rank 1, the fact and the fix; nothing is trained, no results.json."""
    done, _ = torchrun_with_rank1_hook(
        tmp_path,
        "    from oelm.training.lm import LMTask\n"
        "    real = LMTask.model_metadata\n"
        "    def model_metadata(self):\n"
        "        return {**real(self), 'data_fingerprint': 'prepared-elsewhere'}\n"
        "    LMTask.model_metadata = model_metadata\n",
        steps=20,
    )
    assert done.returncode != 0
    assert "rank 1 disagrees with rank 0 before the first step on data_fingerprint" in done.stderr
    assert "prepare it once on a shared file system" in done.stderr
    assert not (tmp_path / "ddp" / "results.json").exists()
