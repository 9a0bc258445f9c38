"""Sweeps on other engines: submitit (its local executor here) and Ray (a local instance), the
retry policy, and the flags; runs and records equal to a local sweep's."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from oelm.experiments import executors
from oelm.experiments.dispatch import RunQueue, drive
from oelm.experiments.executors import ExecutorSpec, JobPool, installed
from oelm.experiments.runner import run_sweep
from oelm.experiments.sweep import spec_from_dict
from oelm.utils.errors import UserError

TINY = {
    "task": "lm",
    "model": "gpt-tiny",
    "steps": 4,
    "batch_size": 2,
    "seq_len": 32,
    "warmup": 1,
    "eval_every": 2,
    "eval_batches": 1,
    "final_eval_batches": 1,
    "checkpoint_every": 2,
    "device": "cpu",
    "tensorboard": False,
    "progress": False,
    "timing_warmup": 1,
    "model_overrides": {"n_layer": 1, "d_model": 32, "n_head": 2},
}


def tiny_spec(root: Path, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "out": str(root / name),
        "prepare": {"source": "builtin:python-docs", "tokenizer": "byte", "max_docs": 20},
        "config": {**TINY, "data": str(root / "data")},
        "methods": {"baseline": {"lr": [3e-3]}, "oelm-freeze": {"lr": [3e-3]}},
        "seeds": [0, 1],
        "max_extend": 0,
    }


def weights(sweep: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Every run's last checkpoint weights, by run path inside the sweep."""
    out = {}
    for f in sorted(sweep.glob("runs/*/*/*/checkpoints/*/*.safetensors")):
        out[str(f.relative_to(sweep))] = load_file(f)
    return out


def results(sweep: Path) -> dict[str, dict[str, Any]]:
    keep = ("best_val_loss", "test_loss", "steps", "tokens_seen", "method", "seed", "lr")
    out = {}
    for f in sorted(sweep.glob("runs/*/*/*/results.json")):
        r = json.loads(f.read_text())
        out[str(f.relative_to(sweep))] = {k: r.get(k) for k in keep}
    return out


def same_runs(a: Path, b: Path) -> None:
    assert results(a) and results(a) == results(b)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and wa
    for key in wa:
        assert all(torch.equal(wa[key][t], wb[key][t]) for t in wa[key]), key


# ---- the flags -----------------------------------------------------------------------------------


def test_executor_flags_are_validated_before_any_run(monkeypatch) -> None:
    with pytest.raises(UserError, match="one of local, submitit, ray"):
        ExecutorSpec.parse("slurm")
    with pytest.raises(UserError, match="KEY=VALUE"):
        ExecutorSpec.parse("ray", ["address"])
    with pytest.raises(UserError, match="not an option of the ray executor"):
        ExecutorSpec.parse("ray", ["partition=gpu"])
    with pytest.raises(UserError, match="must be an integer"):
        ExecutorSpec.parse("submitit", ["gpus_per_run=two"])
    with pytest.raises(UserError, match="cluster must be"):
        ExecutorSpec.parse("submitit", ["cluster=k8s"])
    # A job of 0 CPUs, 0 minutes or 0 GB never runs: `cpus_per_run=0` went on to start the sweep.
    for option in ("cpus_per_run=0", "timeout_min=0", "mem_gb=0", "gpus_per_run=-1"):
        with pytest.raises(UserError, match=r"must be at least [01], got"):
            ExecutorSpec.parse("submitit", [option])
    assert ExecutorSpec.parse("submitit", ["gpus_per_run=0", "cpus_per_run=1"]).options["cpus_per_run"] == 1
    monkeypatch.setattr(executors, "installed", lambda package: False)
    with pytest.raises(UserError, match="needs the ray package"):
        ExecutorSpec.parse("ray")
    assert ExecutorSpec.parse("local") == ExecutorSpec()


def test_cli_refuses_a_bad_executor_option_with_exit_2(tmp_path: Path, capsys) -> None:
    from oelm.cli import main

    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(tiny_spec(tmp_path, "cli")))
    code = main(["sweep", str(spec), "--executor", "submitit", "--executor-option", "partitio=gpu"])
    assert code == 2 and "not an option of the submitit executor" in capsys.readouterr().err
    assert not (tmp_path / "cli").exists()


# ---- the retry policy (a simulated executor) ---------------------------------------------------


class FakeRun:
    def __init__(self, label: str, root: Path) -> None:
        self.label, self.method, self.config = label, "baseline", {"steps": 1}
        self.run_dir = root / label  # no results.json: the queue learns nothing from it


class ScriptedPool(JobPool):
    """Jobs end at once with what the script says for the run's n-th submission."""

    def __init__(self, tmp: Path, script: dict[str, list[Any]]) -> None:
        super().__init__(tmp, 2, 1, {})
        self.script, self.submitted = script, []

    def _config(self, run):
        return {"out": run.label}

    def _submit(self, config):
        self.submitted.append(config["out"])
        return self.script[config["out"]].pop(0)

    def _ended(self, handle):
        if handle == "crash":
            return True, None, "RuntimeError: node lost"
        if handle == "user":
            return True, {"error": "bad input", "retry": False}, None
        return True, {"error": None}, None


def test_a_crash_is_retried_once_and_a_user_error_never(tmp_path: Path) -> None:
    script = {"once": ["crash", "ok"], "twice": ["crash", "crash"], "bad": ["user"], "fine": ["ok"]}
    pool = ScriptedPool(tmp_path, script)
    queue = RunQueue([FakeRun(k, tmp_path) for k in script])
    queue.expected = lambda run: 1.0  # type: ignore[method-assign]
    ended: dict[str, str | None] = {}

    def on_done(run, error):
        ended[run.label] = error
        return []

    drive(queue, pool, on_done, poll_s=0.01)
    assert ended == {"once": None, "twice": "RuntimeError: node lost", "bad": "bad input", "fine": None}
    assert sorted(pool.submitted) == sorted(["once", "once", "twice", "twice", "bad", "fine"])
    assert sorted(pool.retried) == ["once", "twice"]
    assert "submitted again after: RuntimeError: node lost" in (tmp_path / "retries.log").read_text()


# ---- real engines ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_submitit_local_sweep_equals_a_local_sweep_and_resumes(tmp_path: Path) -> None:
    pytest.importorskip("submitit")
    local = run_sweep(spec_from_dict(tiny_spec(tmp_path, "local")), progress=False, report=False, threads=1)
    assert len(local.trained) == 4 and not local.failed
    executor = ExecutorSpec.parse("submitit", ["cluster=local", "timeout_min=10"])
    spec = spec_from_dict(tiny_spec(tmp_path, "sub"))
    first = run_sweep(spec, parallel=2, progress=False, report=False, threads=1, executor=executor)
    assert len(first.trained) == 4 and not first.failed, first.failed
    same_runs(tmp_path / "local", tmp_path / "sub")
    assert list((tmp_path / "sub" / "logs" / "submitit").glob("*_log.out")), "submitit wrote its job logs"
    # A half-done sweep resumes: a lost run is trained again, the finished ones are kept.
    lost = next((tmp_path / "sub").glob("runs/oelm-freeze/*/seed1"))
    (lost / "results.json").unlink()
    again = run_sweep(
        spec_from_dict(tiny_spec(tmp_path, "sub")),
        parallel=2,
        progress=False,
        report=False,
        threads=1,
        executor=executor,
    )
    assert len(again.skipped) == 3 and [r.run_dir for r in again.trained] == [lost]
    same_runs(tmp_path / "local", tmp_path / "sub")


@pytest.mark.slow
def test_ray_sweep_on_a_local_instance_equals_a_local_sweep(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    local = run_sweep(spec_from_dict(tiny_spec(tmp_path, "local")), progress=False, report=False, threads=1)
    assert not local.failed
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        executor = ExecutorSpec.parse("ray", ["cpus_per_run=1"])
        out = run_sweep(
            spec_from_dict(tiny_spec(tmp_path, "ray")),
            parallel=2,
            progress=False,
            report=False,
            threads=1,
            executor=executor,
        )
        assert len(out.trained) == 4 and not out.failed, out.failed
        same_runs(tmp_path / "local", tmp_path / "ray")
        again = run_sweep(
            spec_from_dict(tiny_spec(tmp_path, "ray")),
            parallel=2,
            progress=False,
            report=False,
            threads=1,
            executor=executor,
        )
        assert len(again.skipped) == 4 and not again.trained
    finally:
        ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not installed("ray"), reason="needs ray (pip install 'oelm[cluster]')")
def test_a_ray_address_nobody_listens_on_is_one_line_naming_it_within_seconds(tmp_path: Path, capsys) -> None:
    from oelm.cli import main

    address = f"127.0.0.1:{_free_port()}"
    for given in (address, f"ray://{address}"):
        start = time.monotonic()
        with pytest.raises(UserError, match=rf"address='{re.escape(given)}': no Ray head answers there"):
            ExecutorSpec.parse("ray", [f"address={given}"])
        assert time.monotonic() - start < 10
    with pytest.raises(UserError, match="is not HOST:PORT"):
        ExecutorSpec.parse("ray", ["address=head-node"])
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps(tiny_spec(tmp_path, "ray")))
    start = time.monotonic()
    code = main(["sweep", str(spec), "--executor", "ray", "--executor-option", f"address={address}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and time.monotonic() - start < 10
    assert len(err.splitlines()) == 1 and address in err and "ray start --head" in err
    assert not (tmp_path / "ray").exists()
