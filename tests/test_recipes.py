"""The multi-process recipes of docs/distributed.md, each run as written on 2 CPU processes.

torchrun "two nodes on one host" for `oelm train`; the Hugging Face Trainer under torchrun (DDP
and DeepSpeed ZeRO-2/3) with an oelm model; accelerate with 2 CPU processes and its `--cpu` trap;
the parity benchmark's smoke run. Every test starts real processes: all are `slow`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import oelm
from train_utils import synthetic_lm_dir, tiny_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# Loss of 2 processes vs 1 with the same global batch: the two differ only in float32 summation
# order (a mean of two half-batch means vs one mean), measured at most ~2e-7 on these shapes.
LOSS_TOL = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env or ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


@pytest.mark.slow  # two torchrun launchers, one process each: ~15 s
def test_oelm_train_as_two_nodes_on_one_host(tmp_path: Path) -> None:
    """`--nnodes 2 --node_rank R` with the rendezvous on localhost: each "node" has LOCAL_RANK 0,
    so only the global rank may write the run; the job sees world size 2 and the freeze holds."""
    data = synthetic_lm_dir(tmp_path / "data")
    cfg = tiny_config(data, tmp_path / "run", steps=6, eval_every=3, checkpoint_every=3)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    port = str(free_port())

    def node(rank: int) -> subprocess.Popen:
        launch = f"--nnodes 2 --nproc_per_node 1 --node_rank {rank} --master_addr 127.0.0.1 --master_port {port}"
        cmd = torchrun(*launch.split(), "-m", "oelm", "train", str(config), "--no-progress")
        return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    nodes = [node(0), node(1)]
    outs = [n.communicate(timeout=300) for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(err[-3000:] for _, err in outs)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["world_size"] == 2 and results["global_batch_size"] == 2 * cfg["batch_size"]
    assert results["freeze_check"]["ok"] and results["status"] == "complete"
    timing = json.loads((tmp_path / "run" / "timing_stats.json").read_text())
    assert timing["allreduce_bytes_per_step"] == timing["gradient_bytes_per_step"] == 4 * results["trainable_params"]


def hf_example(out: Path, *args: str, nproc: int = 1) -> dict:
    """examples/hf_trainer_dist.py on `nproc` processes; its rank-0 summary."""
    script = [str(EXAMPLES / "hf_trainer_dist.py"), "--out", str(out), *args]
    if nproc == 1:
        run([sys.executable, *script])
    else:
        run(torchrun("--standalone", "--nproc_per_node", str(nproc), *script))
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny BERT under oelm-freeze on one process with the global batch of 8 (the reference)."""
    return hf_example(tmp_path_factory.mktemp("one") / "out", "--batch-size", "8")


@pytest.mark.slow  # torchrun with two processes: ~10 s
def test_hf_trainer_under_torchrun_trains_like_one_process(tmp_path: Path, one_process: dict) -> None:
    ddp = hf_example(tmp_path / "ddp", "--batch-size", "4", nproc=2)
    assert ddp["world_size"] == 2 and len(ddp["losses"]) == len(one_process["losses"]) == 6
    assert ddp["losses"] == pytest.approx(one_process["losses"], abs=LOSS_TOL)  # not 2x: no loss scaling
    assert ddp["frozen_identical"] and ddp["frozen_tensors"] == 2 * 2 * 2  # 2 layers x Q/K x weight/bias
    assert ddp["record_saved"]
    oelm.from_pretrained(tmp_path / "ddp" / "final")  # frozen bytes checked against the record


@pytest.mark.slow  # torchrun with two DeepSpeed processes: ~15-25 s each (the first ever also JIT-builds an op)
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_keeps_qk_frozen_and_the_record(tmp_path: Path, stage: int, one_process: dict) -> None:
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install -e '.[deepspeed]')")
    if shutil.which(os.environ.get("CXX", "c++")) is None:  # DeepSpeed JIT-builds its CPU comm op on first use
        pytest.skip("DeepSpeed on CPU needs a C++ compiler (c++ or $CXX) to build its shared-memory comm op")
    config = EXAMPLES / f"deepspeed_zero{stage}.json"
    zero = hf_example(tmp_path / "z", "--batch-size", "4", "--deepspeed", str(config), nproc=2)
    assert zero["zero_stage"] == stage and zero["world_size"] == 2
    # Q/K gathered from the shards (ZeRO-3) are bit-identical to their values before training.
    assert zero["frozen_identical"] and zero["frozen_moved"] == [] and zero["frozen_tensors"] == 8
    assert zero["losses"] == pytest.approx(one_process["losses"], abs=LOSS_TOL)
    # The Trainer's checkpoint and save_model carry the record, and the frozen bytes match it.
    for folder in (tmp_path / "z" / "final", tmp_path / "z" / "checkpoint-6"):
        record = json.loads((folder / "oelm_method.json").read_text())
        assert record["method"] == "oelm-freeze" and len(record["frozen"]) == 8
        audit = json.loads((folder / "oelm_audit.json").read_text()) if folder.name.startswith("ch") else None
        assert audit is None or audit["check"]["ok"]
        model = oelm.from_pretrained(folder)
        assert sum(not p.requires_grad for p in model.parameters()) == 8


def accelerate_launch(*args: str) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(free_port()), *args]


@pytest.mark.slow  # accelerate launching two processes, then one: ~15 s
def test_accelerate_cpu_config_runs_two_processes_and_cpu_flag_runs_one(tmp_path: Path) -> None:
    pytest.importorskip("accelerate", reason="needs accelerate (pip install -e '.[hf]')")
    loop = str(EXAMPLES / "accelerate_loop.py")
    config = str(EXAMPLES / "accelerate_cpu.yaml")
    two = accelerate_launch("--config_file", config, loop, "--out", str(tmp_path / "two"))
    run(two, env={**ENV, "ACCELERATE_USE_CPU": "1"})
    ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "two").glob("rank-*.json"))]
    assert [(r["process_index"], r["num_processes"]) for r in ranks] == [(0, 2), (1, 2)]
    assert ranks[0]["losses"] == ranks[1]["losses"] and all(r["audit_ok"] for r in ranks)
    # The trap: --cpu takes accelerate's one-process launcher whatever --num_processes says.
    run(accelerate_launch("--cpu", "--num_processes", "2", loop, "--out", str(tmp_path / "cpu")))
    ranks = [json.loads(p.read_text()) for p in (tmp_path / "cpu").glob("rank-*.json")]
    assert [(r["process_index"], r["num_processes"]) for r in ranks] == [(0, 1)]


@pytest.mark.slow  # one process, then torchrun with two: ~20 s
def test_dist_parity_benchmark_smoke(tmp_path: Path, load_benchmark) -> None:
    bench = load_benchmark("dist_parity")
    data = synthetic_lm_dir(tmp_path / "data")
    argv = ["--steps", "3", "--methods", "oelm-freeze", "--columns", "one", "ddp-2"]
    assert bench.main([*argv, "--data", str(data), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "dist_parity.json").read_text())
    one, ddp = report["results"]["oelm-freeze"]["one"], report["results"]["oelm-freeze"]["ddp-2"]
    assert len(one["losses"]) == len(ddp["losses"]) == 3 and ddp["world_size"] == 2
    assert ddp["max_abs_loss_diff"] <= LOSS_TOL and one["max_abs_loss_diff"] == 0
    assert ddp["freeze_check_ok"] and ddp["frozen_equal_one_process"]
    assert ddp["allreduce_bytes_per_step"] == ddp["gradient_bytes_per_step"] == 4 * ddp["trainable_params"]
    table = (tmp_path / "out" / "README.md").read_text()
    assert "| oelm-freeze | ddp-2 | 2 |" in table
