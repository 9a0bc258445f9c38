"""Faults a run must survive: stale best/, failed starts, changed configs on resume, locks, unsafe files."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import re
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from oelm.cli import main
from oelm.training import checkpoint as ckpt
from oelm.training.loop import Trainer, train
from oelm.utils.errors import UserError
from train_utils import one_thread, synthetic_lm_dir, tiny_config

SRC = Path(__file__).resolve().parents[1] / "src" / "oelm"


def _weights_like(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(3, 2)


def test_restore_best_brings_back_the_checkpoints_best(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    old, newer = _weights_like(0), _weights_like(1)
    ckpt.save_best(root, old, {"step": 5})
    step_dir = ckpt.save_checkpoint(root, 10, old, {}, {}, keep_last=2)
    ckpt.save_best(root, newer, {"step": 15})  # written by the killed process after its checkpoint
    ckpt.restore_best(root, step_dir, best_step=5)
    best = root / "best" / ckpt.WEIGHTS
    assert ckpt.weights_step(best) == 5
    assert torch.equal(load_file(best)["weight"], old.weight.detach())
    ckpt.save_best(root, newer, {"step": 15})
    (step_dir / ckpt.BEST_COPY).unlink()  # an old checkpoint without the copy: stale best/ goes
    ckpt.restore_best(root, step_dir, best_step=5)
    assert not best.exists()


def test_resume_with_newer_best_matches_uninterrupted_run(tmp_path: Path) -> None:
    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    cfg = tiny_config(data, tmp_path / "ref", steps=20, eval_every=5, checkpoint_every=10, keep_last=3)
    with one_thread():
        reference = train(cfg)
        run = tmp_path / "run"
        train({**cfg, "out": str(run), "steps": 20})
        # Make it look killed after step 10's checkpoint, having written a newer (bogus) best/.
        (run / "results.json").unlink()
        import shutil

        shutil.rmtree(run / "checkpoints" / "step_0000020")
        ckpt.save_best(run / "checkpoints", _bogus_model(run), {"step": 17})
        resumed = train({**cfg, "out": str(run), "resume": True})
    for key in ("best_step", "best_val_loss", "val_loss", "test_loss", "freeze_check"):
        assert resumed[key] == reference[key], key


def _bogus_model(run: Path) -> nn.Module:
    """A module whose state dict has the run's keys and shapes but zero weights."""
    tensors = load_file(run / "checkpoints" / "step_0000010" / ckpt.WEIGHTS)
    module = nn.Module()
    for name, t in tensors.items():
        module.register_buffer(name.replace(".", "_"), torch.zeros_like(t))
    return module


def test_finish_refuses_a_best_of_another_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    real = ckpt.save_best

    def wrong_step(root, model, meta):  # best/ claims a step the run did not select
        return real(root, model, {**meta, "step": 999})

    monkeypatch.setattr(ckpt, "save_best", wrong_step)
    with one_thread(), pytest.raises(UserError, match="holds step 999.*--overwrite"):
        train(tiny_config(data, tmp_path / "run", steps=4, warmup=1, eval_every=2))


def test_failed_start_leaves_nothing_that_blocks_the_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    cfg = tiny_config(data, tmp_path / "run", steps=4, warmup=1)

    def broken(self):
        raise UserError("method options are bad")

    with monkeypatch.context() as m:
        m.setattr(Trainer, "_build", broken)
        with pytest.raises(UserError):
            train(cfg)
    assert not (tmp_path / "run").exists()  # nothing was created before the build succeeded
    # A directory from an older failed start (config.yaml, no checkpoint) does not block either.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("data: elsewhere\nlr: 1.0\n")
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    with one_thread():
        assert train({**cfg, "lr": 2e-3})["status"] == "complete"


def test_resume_with_changed_config_names_keys_unless_allowed(tmp_path: Path) -> None:
    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    cfg = tiny_config(data, tmp_path / "run", steps=6, warmup=1, eval_every=3, checkpoint_every=3)
    with one_thread():
        train({**cfg, "steps": 3})  # a finished 3-step run, with a checkpoint
        changed = {**cfg, "lr": 1e-3, "model_overrides": {**cfg["model_overrides"], "n_layer": 2}, "resume": True}
        with pytest.raises(UserError, match=r"differs in: lr, model_overrides\.n_layer, steps.*--allow-change"):
            train(changed)
        with pytest.raises(UserError, match=r"differs in: model_overrides\.n_layer"):
            train({**changed, "allow_change": "lr,steps"})
        out = train({**cfg, "lr": 1e-3, "resume": True, "allow_change": ["lr", "steps"]})
    train_lines = [
        json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"train"' in x
    ]
    assert out["status"] == "complete" and [r["step"] for r in train_lines] == [1, 2, 3, 4, 5, 6]
    assert max(r["lr"] for r in train_lines[3:]) <= 1e-3 + 1e-12  # the new peak LR took effect


def test_state_file_is_loaded_without_running_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    step = tmp_path / "step_0000001"
    step.mkdir()
    with open(step / ckpt.STATE, "wb") as fh:
        pickle.dump({"x": Evil()}, fh, protocol=2)
    with pytest.raises(UserError, match="cannot be loaded safely"):
        ckpt.load_state(step)
    assert not marker.exists()


def test_no_unsafe_loaders_in_the_source() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in SRC.rglob("*.py"))
    assert not re.search(r"weights_only\s*=\s*False", text)
    assert not re.search(r"yaml\.(load|unsafe_load|full_load)\(", text)
    assert not re.search(r"trust_remote_code\s*=\s*True", text)
    assert not re.search(r"\bpickle\.loads?\(|(?<![\w.])(eval|exec)\(", text)


def test_dtype_keyword_follows_the_transformers_version() -> None:
    from oelm.models.hf_cls import dtype_kwarg

    assert dtype_kwarg(torch.float32, "4.40.0") == {"torch_dtype": torch.float32}
    assert dtype_kwarg(torch.float32, "4.56.0") == {"dtype": torch.float32}


def test_nonzero_ranks_stop_waiting_for_data(tmp_path: Path) -> None:
    from oelm.experiments.prepare import wait_for_file

    start = time.monotonic()
    with pytest.raises(UserError, match="rank 0.*OELM_DATA_WAIT_S"):
        wait_for_file(tmp_path / "meta.json", timeout_s=0.2, poll_s=0.05)
    assert time.monotonic() - start < 2


def test_every_train_flag_has_help() -> None:
    from oelm.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["train"]
    missing = [a.option_strings for a in sub._actions if a.option_strings and not (a.help or "").strip()]
    assert not missing
    flags = {s for a in sub._actions for s in a.option_strings}
    assert {"--lr", "--allow-change", "--no-tensorboard", "--data-dir", "--qk-init", "--dataset"} <= flags


def test_offline_hub_name_fails_fast_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import oelm.utils.hub

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setattr(oelm.utils.hub, "hub_reachable", lambda timeout_s=1.5: False)
    cases = [
        (["prepare", "lm", "someone/corpus", "--tokenizer", "byte", "--out", str(tmp_path / "a")], "local text file"),
        (
            ["prepare", "lm", "builtin:python-docs", "--tokenizer", "someone/tok", "--out", str(tmp_path / "b")],
            "local tokenizer folder",
        ),
        (["params", "someone/model"], "local config.json"),
    ]
    for argv, fix in cases:
        start = time.monotonic()
        assert main(argv) == 2
        assert time.monotonic() - start < 2
        err = capsys.readouterr().err
        assert "not reachable" in err and fix in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_two_trainings_in_one_directory_one_refuses(tmp_path: Path) -> None:
    from oelm.utils.lock import dir_lock

    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    run = tmp_path / "run"
    with dir_lock(run, "training run"):  # as if another process were training there
        with pytest.raises(UserError, match=r"another training run \(pid"):
            train(tiny_config(data, run, steps=2, warmup=0))
        assert [p.name for p in run.iterdir()] == [".lock"]  # nothing of the refused run
    with one_thread():
        assert train(tiny_config(data, run, steps=2, warmup=0))["status"] == "complete"
    with dir_lock(run, "training run"):  # released
        pass


def test_sweep_lock_refuses_a_second_sweep_and_is_freed_when_its_holder_is_killed(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from oelm.utils.lock import LOCK_NAME, dir_lock

    with (
        dir_lock(tmp_path, "sweep"),
        pytest.raises(UserError, match=rf"another sweep \(pid {os.getpid()} on "),
        dir_lock(tmp_path, "sweep"),
    ):
        pass
    (tmp_path / LOCK_NAME).write_text("somehost 99999999\n")  # left by a killed process: not held
    with dir_lock(tmp_path, "sweep"):
        assert (tmp_path / LOCK_NAME).read_text().split()[1] == str(os.getpid())
    code = f"from oelm.utils.lock import dir_lock\nwith dir_lock({str(tmp_path)!r}):\n    print(1, flush=True)\n    input()"
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "1\n"
        with pytest.raises(UserError, match=rf"another sweep \(pid {holder.pid} on "), dir_lock(tmp_path, "sweep"):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel drops its lock
        holder.wait()
    with dir_lock(tmp_path, "sweep"):
        pass


@pytest.mark.parametrize(
    "env,message",
    [
        ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR and MASTER_PORT are not"),
        ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29613"}, "do not describe a job"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ],
)
def test_stale_launch_variables_are_one_clear_error_not_a_hang(
    env, message, tmp_path: Path, monkeypatch, capsys
) -> None:
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "run"
    assert main(["train", f"data={synthetic_lm_dir(tmp_path / 'data')}", f"out={out}", "steps=2", "warmup=0"]) == 2
    err = capsys.readouterr().err
    assert message in err and "torchrun" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_missing_peer_rank_times_out_with_a_clear_error(monkeypatch) -> None:
    import socket

    from oelm.training.distributed import init_distributed

    with socket.socket() as s:  # a free port for the store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "WORLD_SIZE": "2",
        "RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OELM_DIST_TIMEOUT_S": "2",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    start = time.perf_counter()
    with pytest.raises(UserError, match=r"could not join the process group of 2 processes as rank 0 within 2 s"):
        init_distributed("cpu")
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize(
    "failure",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory."),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"),
    ],
)
def test_out_of_memory_is_one_line_naming_the_sizes_to_lower(failure, tmp_path: Path, monkeypatch, capsys) -> None:
    from oelm.training.lm import LMTask

    calls = {"n": 0}
    real = LMTask.loss

    def loss(self, model, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise failure
        return real(self, model, batch)

    monkeypatch.setattr(LMTask, "loss", loss)
    out = tmp_path / "run"
    argv = [
        "train",
        f"data={synthetic_lm_dir(tmp_path / 'data')}",
        f"out={out}",
        "steps=4",
        "warmup=0",
        "checkpoint_every=2",
    ]
    assert main([*argv, "model=gpt-tiny", "batch_size=4", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "out of memory during training at step 3" in err
    assert "batch_size 4" in err and "--grad-accum" in err and "step_0000002 is intact" in err


def test_other_runtime_errors_are_not_reported_as_out_of_memory(tmp_path: Path, monkeypatch) -> None:
    from oelm.training.lm import LMTask

    def loss(self, model, batch):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(LMTask, "loss", loss)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        train(tiny_config(synthetic_lm_dir(tmp_path / "data"), tmp_path / "run", steps=2, warmup=0))


def test_resume_under_another_thread_count_warns_what_bit_identity_needs(tmp_path: Path, caplog) -> None:
    cfg = tiny_config(synthetic_lm_dir(tmp_path / "data"), tmp_path / "run", steps=4, checkpoint_every=2, warmup=0)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        train({**cfg, "steps": 2})
        caplog.clear()
        torch.set_num_threads(2)
        with caplog.at_level("WARNING", logger="oelm"):
            train({**cfg, "resume": True, "allow_change": ["steps"]})
    finally:
        torch.set_num_threads(threads)
    err = caplog.text
    assert "resuming with threads = 2 where the run used 1" in err and "OMP_NUM_THREADS=1" in err
    assert "torch" not in err.split("threads = 2")[0]  # only what changed is named


@pytest.mark.parametrize("log_every", [1, 10])  # caught at a log line, or before a checkpoint between them
def test_a_non_finite_loss_stops_the_run_records_it_and_exits_3(
    log_every: int, tmp_path: Path, monkeypatch, capsys
) -> None:
    from oelm.records.run import COLLAPSED, run_status
    from oelm.training.lm import LMTask

    calls = {"n": 0}
    real = LMTask.loss

    def loss(self, model, batch):
        calls["n"] += 1
        out = real(self, model, batch)
        return out * float("nan") if calls["n"] >= 4 else out

    monkeypatch.setattr(LMTask, "loss", loss)
    out = tmp_path / "run"
    argv = ["train", f"data={synthetic_lm_dir(tmp_path / 'data')}", f"out={out}", "steps=20", "warmup=0"]
    argv += ["checkpoint_every=2", f"log_every={log_every}", "eval_every=0", "--no-progress"]
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "training loss became nan at step 4" in err and "--lr" in err
    record = json.loads((out / "results.json").read_text())
    assert record["status"] == "diverged" and record["diverged_at_step"] == 4
    assert run_status(out)[0] == COLLAPSED  # finished, never averaged
    steps = sorted(p.name for p in (out / "checkpoints").glob("step_*"))
    assert steps == ["step_0000002"]  # nothing written from the non-finite step on
    assert main([*argv, "--resume"]) == 3  # a finished, diverged run stays an error


@pytest.mark.parametrize("kind", ["file", "dangling-symlink", "under-a-file", "read-only"])
def test_an_unusable_out_is_one_line_naming_it(kind: str, tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("x")
    elif kind == "dangling-symlink":
        out.symlink_to(tmp_path / "missing" / "target")
    elif kind == "under-a-file":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "run"
    else:  # root may write anywhere, so the permission check is made to say no
        import oelm.utils.lock as lock

        monkeypatch.setattr(lock.os, "access", lambda path, mode: Path(path) != out)
    data = synthetic_lm_dir(tmp_path / "data")
    assert main(["train", f"data={data}", f"out={out}", "steps=2", "warmup=0", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(out.name) in err and "--out" in err
    if kind == "read-only":
        assert "is not writable" in err and not out.exists()


def test_a_signal_during_the_last_step_stops_before_the_final_evaluation(tmp_path: Path, monkeypatch) -> None:
    import signal as sig

    from oelm.training.lm import LMTask
    from oelm.utils.errors import Interrupted

    calls = {"n": 0}
    real = LMTask.loss

    def loss(self, model, batch):
        calls["n"] += 1
        if calls["n"] == 3:  # the third and last step
            os.kill(os.getpid(), sig.SIGTERM)
        return real(self, model, batch)

    monkeypatch.setattr(LMTask, "loss", loss)
    cfg = tiny_config(synthetic_lm_dir(tmp_path / "data"), tmp_path / "run", steps=3, warmup=0, checkpoint_every=0)
    with pytest.raises(Interrupted, match="SIGTERM at step 3 of 3"), one_thread():
        train(cfg)
    assert (tmp_path / "run" / "checkpoints" / "step_0000003").is_dir()
    assert not (tmp_path / "run" / "results.json").exists()
    monkeypatch.setattr(LMTask, "loss", real)
    with one_thread():  # the resume has no step left: it evaluates and finishes
        assert train({**cfg, "resume": True})["steps"] == 3


TRAINER_MAX_LINES = 450  # issue 50: the Trainer had grown from 457 to 539 lines with fault handling


def test_the_trainer_class_stays_under_450_lines() -> None:
    """The Trainer reads top to bottom: build, restore, loop, finish. What a fault needs goes to the
    part made for it (strategy.py: stop signals, a lost rank; resume.py: rank agreement, best/'s
    step; rundir.py: the run directory), so the class cannot grow back silently."""
    lines = len(inspect.getsource(Trainer).splitlines())
    assert lines < TRAINER_MAX_LINES, (
        f"class Trainer is {lines} lines (limit {TRAINER_MAX_LINES}): move what is not the loop itself into "
        "training/strategy.py, resume.py, rundir.py or results.py"
    )
