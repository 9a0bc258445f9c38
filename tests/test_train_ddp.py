"""DDP: two gloo processes under torchrun match one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from oelm.training.checkpoint import WEIGHTS
from oelm.training.loop import train
from train_utils import one_thread, synthetic_lm_dir, tiny_config, torchrun_train


@pytest.mark.slow  # torchrun starts two Python processes
# oelm-unfreeze: Q/K join the optimizer and DDP mid-run (the wrapper is rebuilt at the switch).
@pytest.mark.parametrize("method", ["oelm-freeze", "oelm-unfreeze"])
def test_two_process_gloo_matches_single_process(tmp_path: Path, method: str) -> None:
    data = synthetic_lm_dir(tmp_path / "data")
    cfg = tiny_config(data, tmp_path / "ddp", steps=12, batch_size=4, eval_every=6, checkpoint_every=0, method=method)
    done = torchrun_train(cfg, tmp_path / "ddp.yaml", 2)
    assert done.returncode == 0, done.stderr[-3000:]
    with one_thread():
        single = train({**cfg, "out": str(tmp_path / "single"), "batch_size": 8})

    ddp = json.loads((tmp_path / "ddp" / "results.json").read_text())
    timing = json.loads((tmp_path / "ddp" / "timing_stats.json").read_text())
    if method == "oelm-freeze":  # measured by DDP's comm hook: exactly the trainable gradients
        assert timing["allreduce_bytes_per_step"] == timing["gradient_bytes_per_step"]
        assert timing["gradient_bytes_per_step"] == 4 * ddp["trainable_params"]  # float32, frozen Q/K excluded
    assert ddp["world_size"] == 2 and ddp["global_batch_size"] == single["global_batch_size"] == 8
    assert ddp["tokens_seen"] == single["tokens_seen"]
    assert ddp["freeze_check"]["ok"] and ddp["best_step"] == single["best_step"]
    assert ddp["val_loss"] == pytest.approx(single["val_loss"], rel=1e-4)
    # Per-window test losses gathered from both ranks land in the single process's window order.
    items = [json.loads((tmp_path / d / "test_items.json").read_text())["values"] for d in ("ddp", "single")]
    assert len(items[0]) == len(items[1]) > 1 and items[0] == pytest.approx(items[1], rel=1e-4, abs=1e-5)
    a = load_file(tmp_path / "ddp" / "checkpoints" / "step_0000012" / WEIGHTS)
    b = load_file(tmp_path / "single" / "checkpoints" / "step_0000012" / WEIGHTS)
    # A schedule that unfreezes Q/K mid-run starts their AdamW state then: its first update is
    # lr * g / (|g| + eps), so a gradient entry near eps (1e-8) whose rounding differs (DDP averages
    # two ranks' gradients, the single process sums one batch) can move by a good part of lr. So
    # there: every entry within 2 lr (a sign flip), and all but a handful within 1e-5; elsewhere
    # every entry within 1e-5.
    for k in a:
        if method == "oelm-unfreeze":
            diff = (a[k] - b[k]).abs()
            assert float(diff.max()) <= 2 * cfg["lr"], k
            assert int((diff > 1e-5 + 1e-4 * b[k].abs()).sum()) <= max(2, diff.numel() // 1000), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")

    def losses(run: Path) -> list[tuple[str, int, float]]:
        recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [(r["kind"], r["step"], r["loss"]) for r in recs]

    for (k1, s1, l1), (k2, s2, l2) in zip(losses(tmp_path / "ddp"), losses(tmp_path / "single"), strict=True):
        assert (k1, s1) == (k2, s2) and l1 == pytest.approx(l2, rel=1e-4)


def torchrun_with_rank1_hook(
    tmp_path: Path,
    hook_body: str,
    steps: int,
    cfg_overrides: dict | None = None,
    torchrun_args: tuple[str, ...] = (),
    rank: int = 1,
    **env: str,
) -> tuple[subprocess.CompletedProcess, float]:
    """`oelm train` under torchrun (2 processes) with `hook_body` run in rank `rank` (default 1) at
    start-up (through sitecustomize: no hook in oelm). Returns the finished process and its wall time."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(f"import os\nif os.environ.get('RANK') == '{rank}':\n" + hook_body)
    data = synthetic_lm_dir(tmp_path / "data")
    cfg = tiny_config(data, tmp_path / "ddp", steps=steps, batch_size=4, eval_every=0, checkpoint_every=0)
    cfg.update(cfg_overrides or {})
    config_file = tmp_path / "ddp.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *torchrun_args]
    cmd += ["-m", "oelm", "train", str(config_file), "--no-progress"]
    paths = os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": paths, **env}
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=300)
    return done, time.monotonic() - start


@pytest.mark.slow  # torchrun with two processes, one of which fails: ~10 s
def test_a_failing_rank_ends_the_whole_job_within_seconds_with_its_error(tmp_path: Path) -> None:
    """Rank 1 raises at its third step: it must leave at once instead of waiting in a barrier that
    rank 0, inside an all-reduce, never reaches."""
    done, elapsed = torchrun_with_rank1_hook(
        tmp_path,
        "    from oelm.training.lm import LMTask\n"
        "    real, calls = LMTask.loss, []\n"
        "    def loss(self, model, batch):\n"
        "        calls.append(1)\n"
        "        if len(calls) == 3:\n"
        "            raise RuntimeError('injected failure on rank 1')\n"
        "        return real(self, model, batch)\n"
        "    LMTask.loss = loss\n",
        steps=200,
    )
    assert done.returncode != 0 and "injected failure on rank 1" in done.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f} s to end after rank 1 failed"
    assert not (tmp_path / "ddp" / "results.json").exists()


@pytest.mark.slow  # torchrun with two processes: ~10 s
def test_fsdp_ranks_that_do_not_share_the_run_directory_stop_with_a_clear_error(tmp_path: Path) -> None:
    """Rank 1 is made blind to rank 0's files (as on another node without a shared file system):
    under --strategy fsdp every rank writes and reads sharded checkpoints there, so every rank
    stops at start-up with one clear error naming the way out, instead of failing later."""
    done, elapsed = torchrun_with_rank1_hook(
        tmp_path,
        "    import pathlib\n"
        "    real = pathlib.Path.is_file\n"
        "    pathlib.Path.is_file = lambda self: False if self.name == 'config.yaml' and self.parent.name == 'ddp' "
        "else real(self)\n",
        steps=4,
        cfg_overrides={"strategy": "fsdp"},
        OELM_FS_WAIT_S="1",
    )
    assert done.returncode != 0 and elapsed < 60
    assert "1 of 2 ranks cannot see the run directory" in done.stderr and "do not share a file system" in done.stderr
    assert "--strategy ddp" in done.stderr
    assert not (tmp_path / "ddp" / "results.json").exists()


# Rank 1 on "another node": its run directory is another (empty) folder, and any read of rank 0's
# checkpoint files or the run plan in rank 1 fails loudly.
BLIND_RANK1 = """\
    import pathlib
    import oelm.training.checkpoint as ckpt
    import oelm.training.config as config
    import oelm.training.loop as loop
    view = pathlib.Path(os.environ["RANK1_VIEW"])
    config.TrainConfig.run_dir = lambda self: view
    def refuse(*args, **kwargs):
        raise RuntimeError("rank 1 read what rank 0 wrote")
    for name in ("load_state", "load_weights", "read_metadata", "checkpoint_metadata", "weights_step",
                 "load_whole_weights", "load_sharded_checkpoint", "latest_checkpoint", "list_steps"):
        setattr(ckpt, name, refuse)
    loop.plan_run = refuse
"""


@pytest.mark.slow  # torchrun with two processes, twice: ~25 s
def test_ddp_needs_no_shared_run_directory_rank0_reads_and_broadcasts(tmp_path: Path) -> None:
    """Under DDP only rank 0 opens the run directory: the run plan, the resume checkpoint (state
    and weights) and best/ for the final evaluation reach rank 1 by broadcast. A run whose rank 1
    sees another, empty directory trains, is resumed and evaluates as one process does."""
    view = tmp_path / "rank1_view"
    view.mkdir()
    common = {"eval_every": 3, "checkpoint_every": 3, "schedule": "constant"}  # 6 + 6 steps = 12 steps
    done, _ = torchrun_with_rank1_hook(
        tmp_path, BLIND_RANK1, steps=6, cfg_overrides=common, RANK1_VIEW=str(view), OELM_DIST_TIMEOUT_S="60"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "ddp" / "results.json").is_file()
    more = {**common, "resume": True, "allow_change": ["steps"]}
    done, _ = torchrun_with_rank1_hook(
        tmp_path, BLIND_RANK1, steps=12, cfg_overrides=more, RANK1_VIEW=str(view), OELM_DIST_TIMEOUT_S="60"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not any(view.iterdir())  # rank 1 wrote nothing of its own either
    cfg = yaml.safe_load((tmp_path / "ddp.yaml").read_text())
    with one_thread():
        single = train({**cfg, "out": str(tmp_path / "single"), "batch_size": 8, "resume": False})
    ddp = json.loads((tmp_path / "ddp" / "results.json").read_text())
    assert ddp["world_size"] == 2 and ddp["steps"] == 12 and ddp["freeze_check"]["ok"]
    # resumed at step 6 (rank 1 restored from rank 0's broadcast), best/ broadcast for the final eval
    assert ddp["best_step"] == single["best_step"]
    assert ddp["val_loss"] == pytest.approx(single["val_loss"], rel=1e-4)
    assert ddp["test_loss"] == pytest.approx(single["test_loss"], rel=1e-4)
    logs = [(tmp_path / run / "metrics.jsonl").read_text().splitlines() for run in ("ddp", "single")]
    for a, b in zip(*logs, strict=True):
        a, b = json.loads(a), json.loads(b)
        assert (a["kind"], a["step"]) == (b["kind"], b["step"]) and a["loss"] == pytest.approx(b["loss"], rel=1e-4)
