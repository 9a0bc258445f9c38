"""Distributed jobs check what every rank resumes and reads before the first step (issue 40, class 1)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pytest

from oelm.training.checkpoint import SHARD_DIGESTS, SHARDED, latest_checkpoint, remove_debris
from oelm.training.distributed import DistInfo, lost_peer, peer_text
from oelm.training.loop import train
from oelm.training.strategy import process_gone
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


def test_lost_peer_reads_only_a_collective_whose_peer_left() -> None:
    gloo = RuntimeError(
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:6556: "
        "Connection reset by peer. This is typically caused by a remote worker hanging"
    )
    assert lost_peer(gloo, DistInfo(rank=0, world=2)) == "Read error [127.0.0.1]:6556: Connection reset by peer"
    assert lost_peer(gloo, DistInfo()) is None  # no process group: not a peer's fault
    assert lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), DistInfo(rank=0, world=2)) is None
    assert peer_text(DistInfo(rank=1, world=2)) == "rank 0" and peer_text(DistInfo(rank=0, world=3)) == "another rank"


KILL_RANK1 = {  # rank 1 SIGKILLs itself at its 11th forward (mid-step) or entering its 2nd checkpoint save
    "step": "    from oelm.training.lm import LMTask\n    real, calls = LMTask.loss, []\n"
    "    def loss(self, model, batch):\n        calls.append(1)\n"
    "        if len(calls) == 11:\n            os.kill(os.getpid(), signal.SIGKILL)\n"
    "        return real(self, model, batch)\n    LMTask.loss = loss\n",
    "save": "    from oelm.training import strategy as S\n    calls = []\n"
    "    for cls in (S.DDPStrategy, S.FSDPStrategy):\n        real = cls.save_checkpoint\n"
    "        def save(self, *a, _real=real, **k):\n            calls.append(1)\n"
    "            if len(calls) == 2:\n                os.kill(os.getpid(), signal.SIGKILL)\n"
    "            return _real(self, *a, **k)\n        cls.save_checkpoint = save\n",
}


@pytest.mark.slow  # torchrun with two processes, twice: ~15 s
@pytest.mark.parametrize(("strategy", "where", "kept"), [("ddp", "step", 8), ("fsdp", "save", 4)])
def test_a_rank_killed_mid_step_or_mid_save_ends_the_job_in_one_line(tmp_path: Path, strategy, where, kept) -> None:
    """Rank 1 is SIGKILLed: rank 0 ends with one line naming the lost rank and --resume instead of a
    gloo traceback; the last complete checkpoint stays in place, no temporary folder is left, and
    the same command with --resume finishes the run."""
    hook = "    import os, signal\n" + KILL_RANK1[where]
    cfg = {"checkpoint_every": 4, "strategy": strategy}
    # torchrun SIGTERMs the surviving rank as soon as its monitor (every 0.1 s by default) sees
    # the dead one: on a loaded machine that can come before rank 0's next collective fails and it
    # reports. A 5 s monitor interval leaves rank 0 the time to say what happened (docs/training.md).
    slow_monitor = ("--monitor-interval", "5")
    done, _ = torchrun_with_rank1_hook(tmp_path, hook, steps=16, cfg_overrides=cfg, torchrun_args=slow_monitor)
    assert done.returncode != 0
    lines = [x for x in done.stderr.splitlines() if x.startswith("oelm: error:")]
    assert len(lines) == 1, done.stderr[-4000:]
    line = lines[0]
    assert "rank 0 of 2 lost rank 1" in line and "by peer" in line
    assert f"the last complete checkpoint, step_{kept:07d}, is in place" in line and "with --resume" in line
    assert "[rank0]: Traceback" not in done.stderr
    root = tmp_path / "ddp" / "checkpoints"
    assert latest_checkpoint(root).name == f"step_{kept:07d}"
    assert not [p.name for p in root.iterdir() if p.name.startswith(".tmp")]
    again, _ = torchrun_with_rank1_hook(tmp_path, "    pass\n", steps=16, cfg_overrides={**cfg, "resume": True})
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((tmp_path / "ddp" / "results.json").read_text())["steps"] == 16


def test_remove_debris_removes_only_what_a_killed_save_left(tmp_path: Path) -> None:
    """A save killed mid-way leaves `.tmp_step_N_<pid>` (or `_sharded`) and best/'s temp weights:
    removed, all of them or one process's; complete checkpoints and other files are never touched."""
    root = tmp_path / "checkpoints"
    kept = ["step_0000004/model.safetensors", "best/model.safetensors", "latest", ".tmp_notes/x"]
    debris = [".tmp_step_0000008_123/model.safetensors", ".tmp_step_0000008_sharded/dcp/__0_0.distcp"]
    debris += [".tmp_step_0000012_456/state.pt", "best/.model.safetensors.tmp123"]
    for name in kept + debris:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    # One process's: its folder, its best/ file and the sharded folder its job wrote into.
    assert sorted(remove_debris(root, pid=123)) == sorted(
        [".tmp_step_0000008_123", ".tmp_step_0000008_sharded", "best/.model.safetensors.tmp123"]
    )
    assert (root / ".tmp_step_0000012_456").is_dir()
    assert remove_debris(root) == [".tmp_step_0000012_456"]
    assert all((root / name).is_file() for name in kept)
    assert remove_debris(tmp_path / "none") == []


def test_process_gone_tells_a_reaped_or_zombie_rank_from_a_running_one() -> None:
    assert not process_gone(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while not process_gone(child.pid) and time.monotonic() < deadline:  # a zombie until reaped
        time.sleep(0.05)
    assert process_gone(child.pid)
    child.wait()
    assert process_gone(child.pid)


def test_a_resume_removes_the_temporary_folder_a_killed_save_left(tmp_path: Path) -> None:
    """A process killed mid-save leaves its temporary step folder (named by its pid, so no later save
    replaces it) and best/'s temp weights: the next start removes them, under the directory lock."""
    data = synthetic_lm_dir(tmp_path / "data")
    cfg = tiny_config(data, tmp_path / "run", steps=4, eval_every=4, checkpoint_every=4)
    with one_thread():
        train(cfg)
    root = tmp_path / "run" / "checkpoints"
    (root / ".tmp_step_0000008_99999").mkdir()
    (root / ".tmp_step_0000008_99999" / "model.safetensors").write_bytes(b"half")
    (root / "best" / ".model.safetensors.tmp99999").write_bytes(b"half")
    with one_thread():
        done = train({**cfg, "steps": 8, "resume": True, "allow_change": ["steps"]})
    assert done["steps"] == 8
    assert sorted(p.name for p in root.iterdir()) == ["best", "latest", "step_0000004", "step_0000008"]
    assert sorted(p.name for p in (root / "best").iterdir()) == ["model.safetensors"]


# SIGKILL itself: mid-save (inside the checkpoint's write, its temporary folder half written) or on
# entering the final evaluation (after the last step and its checkpoint).
KILL_AT = {
    "save": "    import torch\n    real, calls = torch.save, []\n"
    "    def save(obj, f, *a, **k):\n"
    "        if str(f).endswith('state.pt') and '.tmp' in str(f):\n            calls.append(1)\n"
    "            if len(calls) == 2:\n                os.kill(os.getpid(), signal.SIGKILL)\n"
    "        return real(obj, f, *a, **k)\n    torch.save = save\n",
    "final": "    from oelm.training.lm import LMTask\n    real = LMTask.evaluate\n"
    "    def evaluate(self, model, split, final):\n"
    "        if final:\n            os.kill(os.getpid(), signal.SIGKILL)\n"
    "        return real(self, model, split, final)\n    LMTask.evaluate = evaluate\n",
}
_REFERENCE: dict[str, dict] = {}  # uninterrupted results per strategy, shared by the cases below


@pytest.mark.slow  # torchrun with two processes, three times: ~40 s
@pytest.mark.parametrize(
    ("rank", "where", "strategy", "kept"),
    [(0, "save", "ddp", 4), (1, "final", "ddp", 16), (0, "final", "fsdp", 16)],
)
def test_a_rank_killed_mid_save_or_at_the_final_evaluation_ends_in_one_line_and_resumes(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, rank: int, where: str, strategy: str, kept: int
) -> None:
    """Rank 0 killed mid-save (its temporary folder half written) or either rank killed at the final
    evaluation: the survivor ends with one line naming the lost rank and --resume, no backend
    traceback; the last complete (or final) checkpoint stays, no temporary folder is left, no
    results.json is written from part of an evaluation, and --resume ends with the uninterrupted
    job's numbers."""
    cfg = {"checkpoint_every": 4, "eval_every": 4, "strategy": strategy}
    if strategy not in _REFERENCE:
        ref_dir = tmp_path_factory.mktemp(f"ref-{strategy}")
        ref, _ = torchrun_with_rank1_hook(ref_dir, "    pass\n", steps=16, cfg_overrides=cfg)
        assert ref.returncode == 0, ref.stderr[-2000:]
        _REFERENCE[strategy] = json.loads((ref_dir / "ddp" / "results.json").read_text())
    hook = "    import os, signal\n" + KILL_AT[where]
    slow_monitor = ("--monitor-interval", "5")  # see test_a_rank_killed_mid_step_or_mid_save_...
    done, _ = torchrun_with_rank1_hook(
        tmp_path, hook, steps=16, cfg_overrides=cfg, torchrun_args=slow_monitor, rank=rank
    )
    assert done.returncode != 0
    lines = [x for x in done.stderr.splitlines() if x.startswith("oelm: error:")]
    assert len(lines) == 1, done.stderr[-4000:]
    line = lines[0]
    assert f"rank {1 - rank} of 2 lost rank {rank}" in line and "by peer" in line and "with --resume" in line
    if where == "final":
        assert "during the final evaluation (after step 16 of 16)" in line
        assert "evaluates the final checkpoint without training again" in line
    if rank == 1:  # rank 0 survives and says what it keeps
        assert "the final checkpoint, step_0000016, is in place and results.json was not written" in line
    assert f"[rank{1 - rank}]: Traceback" not in done.stderr
    run = tmp_path / "ddp"
    assert latest_checkpoint(run / "checkpoints").name == f"step_{kept:07d}"
    assert not [p.name for p in (run / "checkpoints").rglob(".*tmp*")]
    assert not (run / "results.json").exists()
    again, _ = torchrun_with_rank1_hook(tmp_path, "    pass\n", steps=16, cfg_overrides={**cfg, "resume": True})
    assert again.returncode == 0, again.stderr[-2000:]
    got, expected = json.loads((run / "results.json").read_text()), _REFERENCE[strategy]
    for key in ("steps", "tokens_seen", "best_step", "best_val_loss", "val_loss", "test_loss"):
        assert got[key] == expected[key], key


def rank_lines(stderr: str, world: int = 2) -> list[list[str]]:
    """Each rank's stderr lines, read from torchrun's `--tee 2` output (every line `[defaultN]:...`)."""
    return [[x.split(":", 1)[1] for x in stderr.splitlines() if x.startswith(f"[default{r}]:")] for r in range(world)]


# One rank refuses during the start; every case: (rank 1's start-up hook, environment, the refusal).
ONE_RANK_REFUSES = {
    # A second job on a run directory whose first job still runs (this test holds its lock): rank 0
    # alone takes the lock, so rank 0 alone sees it held.
    "busy": ("    pass\n", {}, r"oelm: error: another training run \(pid \d+ on .*\) is using '.*ddp'; wait"),
    # Rank 1's node lacks the prepared data (another folder than rank 0's).
    "data missing": (
        "    import oelm.training.lm as L\n    real = L.read_lm_meta\n"
        "    L.read_lm_meta = lambda d: real(d.parent / 'not-prepared-here')\n",
        {},
        r"oelm: error: rank 1 of 2: .*not-prepared-here",
    ),
    # Rank 1 read data with another fingerprint (its prepared folder differs).
    "data fingerprint": (
        "    from oelm.training.lm import LMTask\n    real = LMTask.model_metadata\n"
        "    LMTask.model_metadata = lambda self: {**real(self), 'data_fingerprint': 'prepared-elsewhere'}\n",
        {},
        r"oelm: error: rank 1 disagrees with rank 0 before the first step on data_fingerprint",
    ),
    # A timeout of 0 s: refused on every rank before it joins (no group to agree in yet).
    "timeout": (
        "    pass\n",
        {"OELM_DIST_TIMEOUT_S": "0"},
        r"oelm: error: environment variable OELM_DIST_TIMEOUT_S='0'",
    ),
}


@pytest.mark.slow  # torchrun with two processes: ~10 s each
@pytest.mark.parametrize("case", list(ONE_RANK_REFUSES))
def test_a_refusal_on_one_rank_ends_every_rank_with_the_same_line(tmp_path: Path, case: str) -> None:
    """A refusal that one rank meets during the start (rank 0's directory lock held by another job,
    rank 1's data missing or different, a bad timeout) ends every rank with the same one line and
    exit code 2, and no rank with a gloo traceback (connection reset in a collective its peer left)."""
    from oelm.utils.lock import dir_lock

    hook, env, refusal = ONE_RANK_REFUSES[case]
    held = dir_lock(tmp_path / "ddp", "training run") if case == "busy" else nullcontext()
    with held:
        done, _ = torchrun_with_rank1_hook(tmp_path, hook, steps=4, torchrun_args=("--tee", "2"), **env)
    assert done.returncode != 0
    per_rank = rank_lines(done.stderr)  # (torchrun's own report ends in its ChildFailedError traceback)
    assert not [x for lines in per_rank for x in lines if "Traceback" in x], done.stderr[-4000:]
    assert "[rank0]:" not in done.stderr and "[rank1]:" not in done.stderr, done.stderr[-4000:]
    errors = [[x for x in lines if x.startswith("oelm:")] for lines in per_rank]
    assert all(len(e) == 1 for e in errors), done.stderr[-4000:]
    assert errors[0] == errors[1] and re.match(refusal, errors[0][0]), errors
    assert not (tmp_path / "ddp" / "results.json").exists()
    # torchrun's report names each rank's exit code: 2, the code of a refusal, on every rank.
    codes = dict(re.findall(r"rank\s*: (\d+) \(local_rank.*\n\s*exitcode\s*: (-?\d+)", done.stderr))
    assert codes == {"0": "2", "1": "2"}, done.stderr[-3000:]
