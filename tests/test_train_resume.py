"""Exact resume: SIGKILL a run after a checkpoint, resume, and match an uninterrupted run bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from oelm.training.checkpoint import WEIGHTS, read_metadata
from oelm.training.checkpoint import step_dir_name as ckpt_dir
from oelm.training.loop import train
from oelm.utils.errors import UserError
from train_utils import max_logged_step, one_thread, sigkill_then_resume, synthetic_lm_dir, tiny_config, wait_for

TIMING_KEYS = {"step_time"}  # wall-clock values legitimately differ between runs


def metrics_without_timing(run: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in rec.items() if k not in TIMING_KEYS} for rec in lines]


@pytest.mark.slow  # two subprocess runs plus a reference run: ~10 s idle, more on a busy machine
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    data = synthetic_lm_dir(tmp_path / "data")
    # Dropout draws from the global torch RNG, so RNG restore is exercised too.
    overrides = {"n_layer": 1, "d_model": 64, "n_head": 4, "block_size": 32, "dropout": 0.1}
    cfg = tiny_config(
        data,
        tmp_path / "ref",
        steps=30,
        model_overrides=overrides,
        checkpoint_every=10,
        eval_every=5,
        keep_last=3,
        grad_accum=2,
    )
    # One thread here and in the subprocesses: same kernels and reduction order, and no
    # oversubscription when the test suite runs next to other work on a small machine.
    with one_thread():
        reference = train(cfg)

    run = tmp_path / "killed"
    # Kill after the first checkpoint, once metrics lines beyond it exist (so truncation matters).
    sigkill_then_resume(cfg, run, tmp_path / "config.yaml", checkpoint_step=10, past_step=13)

    a = load_file(tmp_path / "ref" / "checkpoints" / "step_0000030" / WEIGHTS)
    b = load_file(run / "checkpoints" / "step_0000030" / WEIGHTS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metrics_without_timing(run) == metrics_without_timing(tmp_path / "ref")
    resumed = json.loads((run / "results.json").read_text())
    for key in ("best_val_loss", "best_step", "val_loss", "test_loss", "tokens_seen", "freeze_check"):
        assert resumed[key] == reference[key], key
    timing = json.loads((run / "timing_stats.json").read_text())
    assert timing["step_time"]["count"] + timing["step_time"]["warmup_excluded"] == 30


def _kept_run(tmp_path: Path, name: str, **overrides) -> tuple[dict, Path]:
    """A run stopped after 4 of 8 steps: its checkpoint at step 4 stays, results.json is removed."""
    data = synthetic_lm_dir(tmp_path / "data")
    cfg = tiny_config(data, tmp_path / name, steps=4, checkpoint_every=4, eval_every=4, **overrides)
    with one_thread():
        train(cfg)
    (tmp_path / name / "results.json").unlink()
    return {**cfg, "steps": 4}, tmp_path / name


@pytest.mark.parametrize(
    "other,field",
    [
        ({"method": "baseline"}, "method"),
        ({"seed": 1}, "method_seed"),
        ({"method_options": {"f": 0.25}}, "method_options"),
    ],
)
def test_resume_refuses_a_checkpoint_of_another_method_naming_the_field(
    tmp_path: Path, other: dict, field: str
) -> None:
    method = "oelm-late-freeze" if field == "method_options" else "oelm-freeze"
    cfg, run = _kept_run(tmp_path, "mine", method=method)
    _, foreign = _kept_run(tmp_path, "foreign", **{"method": method, **other})
    step = run / "checkpoints" / "step_0000004"
    (step / WEIGHTS).write_bytes((foreign / "checkpoints" / "step_0000004" / WEIGHTS).read_bytes())
    with pytest.raises(UserError, match=rf"trained with {field} = .*configured with {field} = "), one_thread():
        train({**cfg, "resume": True})


def test_resume_refuses_a_checkpoint_whose_frozen_tensors_were_edited(tmp_path: Path) -> None:
    cfg, run = _kept_run(tmp_path, "mine", method="oelm-freeze")
    path = run / "checkpoints" / "step_0000004" / WEIGHTS
    meta = read_metadata(path)
    weights = load_file(path)
    name = next(k for k in weights if k.endswith("q_proj.weight"))
    weights[name] = weights[name] + 1e-3
    save_file(weights, path, metadata=meta)  # same method metadata, other frozen bytes
    with (
        pytest.raises(UserError, match=r"does not belong to this run: .*q_proj.weight: frozen tensor changed"),
        one_thread(),
    ):
        train({**cfg, "resume": True})


@pytest.mark.slow  # a subprocess run, interrupted, then resumed, plus a reference run: ~15 s
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_checkpoints_says_how_to_resume_and_resumes_exactly(signum: int, tmp_path: Path) -> None:
    data = synthetic_lm_dir(tmp_path / "data")
    overrides = {"n_layer": 1, "d_model": 64, "n_head": 4, "block_size": 32}
    cfg = tiny_config(
        data, tmp_path / "ref", steps=400, model_overrides=overrides, checkpoint_every=1000, eval_every=100
    )
    with one_thread():
        train(cfg)
    run = tmp_path / "stopped"
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump({**cfg, "out": str(run), "log_every": 1}))
    cmd = [sys.executable, "-m", "oelm", "train", str(config_file)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wait_for(lambda: max_logged_step(run) >= 5, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    lines = [x for x in err.decode().splitlines() if x.strip() and "it/s" not in x and "|" not in x]
    assert proc.returncode == 128 + signum, err.decode()[-1500:]
    assert len(lines) == 1 and "--resume" in lines[0] and "Traceback" not in err.decode(), lines
    step = int(lines[0].split(" at step ")[1].split()[0])
    assert (run / "checkpoints" / ckpt_dir(step) / WEIGHTS).is_file() and 5 <= step < 400
    assert max_logged_step(run) == step  # the checkpoint holds every step logged
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    a = load_file(tmp_path / "ref" / "checkpoints" / "step_0000400" / WEIGHTS)
    b = load_file(run / "checkpoints" / "step_0000400" / WEIGHTS)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_data_prepared_again_with_another_holdout_seed(tmp_path: Path) -> None:
    from oelm.data.lm import prepare_lm, read_meta

    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(f"story {i}: the cat saw the dog number {i % 7} today." for i in range(300)))
    data = tmp_path / "data"
    first = prepare_lm(src, "byte", data, val_fraction=0.1, test_fraction=0.1, seed=1, verbose=False)
    cfg = tiny_config(data, tmp_path / "run", steps=4, checkpoint_every=4, eval_every=4, warmup=0)
    with one_thread():
        train(cfg)
    (tmp_path / "run" / "results.json").unlink()  # as if killed after its last checkpoint
    again = prepare_lm(src, "byte", data, val_fraction=0.1, test_fraction=0.1, seed=2, overwrite=True, verbose=False)
    assert again["fingerprint"] != first["fingerprint"] and read_meta(data)["splits"] == again["splits"]
    with pytest.raises(UserError, match=r"is not the data this run was trained on .*prepared again"), one_thread():
        train({**cfg, "resume": True, "steps": 8, "allow_change": ["steps"]})
    prepare_lm(src, "byte", data, val_fraction=0.1, test_fraction=0.1, seed=1, overwrite=True, verbose=False)
    with one_thread():  # the same preparation again: the same fingerprint, and the resume goes on
        assert train({**cfg, "resume": True, "steps": 8, "allow_change": ["steps"]})["steps"] == 8


@pytest.mark.parametrize("accum,ok", [(1, False), (2, True)])
def test_resume_at_another_world_size_keeps_the_global_batch_or_is_refused(
    accum: int, ok: bool, tmp_path: Path, caplog
) -> None:
    cfg, run = _kept_run(tmp_path, "run", method="oelm-freeze")
    state_path = run / "checkpoints" / "step_0000004" / "state.pt"
    state = torch.load(state_path, weights_only=True)
    assert state["world_size"] == 1 and state["global_batch"] == cfg["batch_size"]
    # As if two processes had trained it: twice the global batch of this one-process resume.
    state.update(world_size=2, global_batch=2 * cfg["batch_size"])
    torch.save(state, state_path)
    resume = {**cfg, "resume": True, "grad_accum": accum, "allow_change": ["grad_accum", "steps"], "steps": 6}
    if not ok:
        with pytest.raises(UserError, match=r"trained by 2 process\(es\) .* resume with --grad-accum 2"), one_thread():
            train(resume)
        return
    with one_thread(), caplog.at_level("WARNING", logger="oelm"):
        assert train(resume)["steps"] == 6
    assert "the global batch stays" in caplog.text
