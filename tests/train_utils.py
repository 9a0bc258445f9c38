"""Helpers shared by the tests/test_train_*.py files: tiny data directories and configs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO / ".." / "shared" / "data"
TINYSTORIES = SHARED_DATA / "lm" / "tinystories"


def synthetic_lm_dir(path: Path, vocab: int = 64, n_train: int = 20_000, seed: int = 0, test: bool = True) -> Path:
    """An LM data directory per the contract: a learnable periodic token stream + noise."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    sizes = {"train": n_train, "val": n_train // 10}
    if test:
        sizes["test"] = n_train // 10
    pattern = rng.integers(0, vocab - 1, size=37)
    for split, n in sizes.items():
        tokens = np.resize(pattern, n).copy()
        noise = rng.random(n) < 0.1
        tokens[noise] = rng.integers(0, vocab - 1, size=int(noise.sum()))
        tokens.astype(np.uint16).tofile(path / f"{split}.bin")
    meta = {
        "source": "synthetic",
        "tokenizer": "byte",
        "vocab_size": vocab,
        "eot_id": vocab - 1,
        "dtype": "uint16",
        "splits": sizes,
        "split_origin": {"val": "holdout"},
        "holdout": None,
    }
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def tinystories_dir(path: Path, max_docs: int = 400) -> Path:
    """The shared TinyStories sample prepared with the byte tokenizer (skip when absent)."""
    if not TINYSTORIES.is_dir():
        pytest.skip(f"shared TinyStories sample not found at {TINYSTORIES} (../shared/data beside the repo)")
    from oelm.data.lm import prepare_lm

    prepare_lm(TINYSTORIES, "byte", path, max_docs=max_docs, verbose=False, workers=1)
    return path


def tiny_config(data: Path, out: Path, **overrides: Any) -> dict[str, Any]:
    """A gpt-tiny config that trains in a couple of seconds on CPU."""
    cfg = {
        "data": str(data),
        "out": str(out),
        "model": "gpt-tiny",
        "method": "oelm-freeze",
        "model_overrides": {"n_layer": 1, "d_model": 64, "n_head": 4, "block_size": 32},
        "steps": 20,
        "batch_size": 4,
        "seq_len": 32,
        "lr": 3e-3,
        "warmup": 2,
        "eval_every": 10,
        "eval_batches": 2,
        "final_eval_batches": 2,
        "checkpoint_every": 10,
        "log_every": 1,
        "progress": False,
        "tensorboard": False,
        "device": "cpu",
        "seed": 0,
    }
    cfg.update(overrides)
    return cfg


def torchrun_train(
    cfg: dict[str, Any], config_file: Path, nproc: int, *args: str, **env: str
) -> subprocess.CompletedProcess:
    """`oelm train CONFIG` under torchrun with `nproc` gloo processes (one thread each); `args` are
    more command-line flags, `env` more environment variables."""
    config_file.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    cmd += ["-m", "oelm", "train", str(config_file), "--no-progress", *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=300)


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread: tiny models are faster so, and a busy CI box is not oversubscribed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def max_logged_step(run: Path) -> int:
    """The highest step in RUN/metrics.jsonl (0 before the first line)."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return max((json.loads(x)["step"] for x in lines if x.endswith("}")), default=0)


def wait_for(cond, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Poll until cond() holds; fail if the process exits or the time runs out first."""
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"training exited early (rc={proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("timed out waiting for the run to progress")
        time.sleep(0.01)


def sigkill_then_resume(
    cfg: dict[str, Any], run: Path, config_file: Path, checkpoint_step: int, past_step: int
) -> None:
    """`oelm train` in a subprocess, SIGKILLed once checkpoint_step is saved and past_step logged,
    then resumed with --resume to the end (one thread each, as the reference run)."""
    config_file.write_text(yaml.safe_dump({**cfg, "out": str(run)}))
    cmd = [sys.executable, "-m", "oelm", "train", str(config_file)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    step_dir = run / "checkpoints" / f"step_{checkpoint_step:07d}"
    wait_for(lambda: step_dir.is_dir() and max_logged_step(run) >= past_step, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "results.json").exists(), "the run finished before it could be killed"
    assert max_logged_step(run) < cfg["steps"]
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
