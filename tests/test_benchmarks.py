"""The benchmarks run end to end on tiny shapes and write sane rows (no timing asserted)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run_module(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m benchmarks.NAME ARGS` in a fresh process, the repository root on its path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", f"benchmarks.{name}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_vs_reference_rows_and_memory(tmp_path, capsys, load_benchmark):
    bench = load_benchmark("vs_reference")
    out = tmp_path / "rows.json"
    argv = [
        "--device",
        "cpu",
        "--preset",
        "gpt-tiny",
        "--vocab",
        "97",
        "--seq",
        "16",
        "--batch",
        "2",
        "--rounds",
        "6",
        "--steps",
        "1",
        "--threads",
        "1",
        "--json",
        str(out),
    ]
    threads = torch.get_num_threads()
    try:
        assert bench.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {
        "reference",
        "baseline",
        "oelm-freeze",
        "oelm-qk-ffn",
        "baseline-AA",
        "baseline-nobias",
        "baseline-logits",
    }
    assert all(r["complete"] and r["steps_timed"] == 6 and r["tokens_per_s"] > 0 for r in rows.values())
    # Freezing lowers the measured peak by at least the frozen tensors' AdamW moments (their
    # gradients count only if alive at the peak), and the row says where in the step the peak is.
    freeze = rows["oelm-freeze"]
    assert 0 < freeze["frozen_optimizer_state_bytes"] == 2 * freeze["frozen_grad_and_optimizer_bytes"] // 3
    assert freeze["frozen_optimizer_state_bytes"] <= freeze["memory_saving_vs_baseline_bytes"]
    assert freeze["memory_saving_vs_baseline_bytes"] <= freeze["frozen_grad_and_optimizer_bytes"] + 2**20
    assert all(r["peak_phase"] in ("forward", "backward", "optimizer") and r["peak_op"] for r in rows.values())
    assert 0 < freeze["theoretical_saving"] < rows["oelm-qk-ffn"]["theoretical_saving"]
    assert (
        rows["reference"]["flops_per_step"]
        == rows["baseline"]["flops_per_step"]
        == rows["baseline-nobias"]["flops_per_step"]
        == rows["baseline-logits"]["flops_per_step"]
    )
    # Every ratio is a median over the 6 paired rounds, inside its distribution-free interval.
    for r in rows.values():
        lo, hi = r["speedup_vs_baseline_ci"]
        assert r["rounds_paired"] == 6 and 0 < lo <= r["speedup_vs_baseline"] <= hi
        lo, hi = r["vs_reference_ci"]
        assert lo <= r["vs_reference"] <= hi
    assert rows["baseline"]["speedup_vs_baseline_ci"] == [1.0, 1.0] and rows["reference"]["vs_reference"] == 1.0
    # The frozen arms are shadowed by their skipped work: exactly the FLOPs of the theoretical saving.
    base = rows["baseline"]
    for name in ("oelm-freeze", "oelm-qk-ffn"):
        r = rows[name]
        assert math.isclose(r["skipped_work_flops"], r["theoretical_saving"] * base["flops_per_step"], rel_tol=1e-9)
        assert 0 < r["skipped_work_share_of_baseline"] < 1 and r["skipped_work_speedup_ceiling"] > 1
        lo, hi = r["skipped_time_saved_ci"]
        assert lo <= r["skipped_time_saved"] <= hi
        lo, hi = r["saving_realized_ci"]
        assert lo <= r["saving_realized"] <= hi
    assert base["skipped_work_s"] is None and rows["reference"]["skipped_time_saved_ci"] is None
    out_text = capsys.readouterr().out
    assert "oelm-freeze" in out_text and "skipped work alone takes" in out_text  # printed, not only written
    assert "loss without logits vs through logits" in out_text
    # --table summarizes the stored rows: one markdown line per process and batch, figures as in the JSON.
    assert bench.main(["--table", str(out)]) == 0
    header, rule, line = capsys.readouterr().out.strip().splitlines()
    cols = [c.strip() for c in header.strip("|").split("|")]
    cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
    assert rule.count("---") == len(cols) == len(cells)
    assert cells["run"] == "rows, 1" and cells["batch"] == "2"
    lo, hi = base["vs_reference_ci"]
    assert cells["baseline vs reference"] == f"{base['vs_reference']:.3f} [{lo:.3f}, {hi:.3f}]"
    fz = rows["oelm-freeze"]
    assert cells["realized of FLOP saving"].startswith(f"{100 * fz['saving_realized']:.0f}% [")
    assert cells["A/A"].startswith(f"{rows['baseline-AA']['speedup_vs_baseline']:.3f} [")
    logits = rows["baseline-logits"]["speedup_vs_baseline"]
    assert cells["loss without logits vs through logits"].startswith(f"{1 / logits:.3f} [")
    (tmp_path / "ops.json").write_text('[{"name": "baseline", "aten_ops_per_step": 1}]')  # a --count-ops file
    with pytest.raises(SystemExit, match="not the rows of a timed"):
        bench.main(["--table", str(tmp_path / "ops.json")])


def test_count_ops_rows_are_deterministic_and_add_up(tmp_path, capsys, load_benchmark):
    bench = load_benchmark("vs_reference")
    out = tmp_path / "ops.json"
    argv = ["--count-ops", "--device", "cpu", "--preset", "gpt-tiny", "--vocab", "97", "--seq", "8", "--json", str(out)]
    assert bench.main(argv) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"reference", "baseline", "oelm-freeze", "oelm-qk-ffn", "baseline-nobias", "baseline-logits"}
    # Training calls skip the logits; the baseline-logits arm keeps the plain loss for comparison.
    assert "_log_softmax_backward_data" in rows["baseline-logits"]["aten_ops_by_name"]
    assert "_log_softmax_backward_data" not in rows["baseline"]["aten_ops_by_name"]
    for r in rows.values():
        phases = r["aten_ops_forward"] + r["aten_ops_backward"] + r["aten_ops_optimizer"]
        assert r["aten_ops_per_step"] == phases == sum(r["aten_ops_by_name"].values())
        assert 0 < r["aten_view_ops_per_step"] < r["aten_ops_per_step"] and r["python_calls_per_step"] > 0
        assert r["aten_ops_by_name"]["_fused_adamw_"] >= 1  # the CUDA optimizer, whatever the device
    assert rows["reference"]["aten_ops_vs_reference"] == 1.0
    # Frozen weights skip their weight-gradient GEMMs (and gradient bookkeeping): fewer backward ops.
    base, frozen = rows["baseline"], rows["oelm-qk-ffn"]
    assert frozen["aten_ops_forward"] == base["aten_ops_forward"]
    assert frozen["aten_ops_by_name"]["mm"] < base["aten_ops_by_name"]["mm"]
    assert frozen["aten_ops_backward"] < rows["oelm-freeze"]["aten_ops_backward"] < base["aten_ops_backward"]
    assert "ops/step" in capsys.readouterr().out
    # Deterministic: a second count, at another batch and sequence length, gives the same numbers.
    assert bench.main(argv[:-1] + [str(tmp_path / "again.json"), "--batch", "2", "--seq", "5"]) == 0
    again = {r["name"]: r for r in json.loads((tmp_path / "again.json").read_text())}
    for name, r in rows.items():
        assert again[name]["aten_ops_by_name"] == r["aten_ops_by_name"], name
        assert again[name]["python_calls_per_step"] == r["python_calls_per_step"], name


def test_profile_ops_attributes_the_frozen_arms_saving_to_their_skipped_gemms(tmp_path, capsys, load_benchmark):
    bench = load_benchmark("vs_reference")
    out = tmp_path / "profile.json"
    argv = [
        "--profile-ops",
        "--device",
        "cpu",
        "--preset",
        "gpt-tiny",
        "--vocab",
        "97",
        "--seq",
        "8",
        "--rounds",
        "2",
        "--steps",
        "1",
        "--top",
        "4",
        "--json",
        str(out),
    ]
    assert bench.main(argv) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(rows) == set(load_benchmark("arms").ARMS)
    for r in rows.values():
        assert r["rounds"] == 2 and r["steps_per_round"] == 1 and r["time_kind"] == "self CPU time"
        assert r["total_ms_per_step"] > 0
        assert math.isclose(r["total_ms_per_step"], sum(o["ms_per_step"] for o in r["ops"].values()), rel_tol=1e-9)
        assert math.isclose(r["total_vs_baseline_ms"], r["total_ms_per_step"] - rows["baseline"]["total_ms_per_step"])
    mm = {name: r["ops"]["aten::mm"]["calls_per_step"] for name, r in rows.items()}
    # gpt-tiny has 2 layers; a frozen FFN drops the weight-gradient GEMMs of both its linears in each.
    assert mm["baseline"] - mm["oelm-qk-ffn"] == 2 * 2
    # Frozen Q/K rows shrink the fused weight-gradient GEMM instead of dropping one; it runs in the Function.
    assert mm["oelm-freeze"] == mm["baseline"]
    assert rows["oelm-freeze"]["ops"]["FusedRowsLinearBackward"]["calls_per_step"] == 2
    assert "FusedRowsLinearBackward" not in rows["baseline"]["ops"]
    text = capsys.readouterr().out
    assert "## oelm-freeze:" in text and "aten::mm" in text and "## baseline:" not in text
    for bad in (["--processes", "2"], ["--count-ops"], ["--top", "0"]):
        with pytest.raises(SystemExit):
            bench.parse(argv + bad)


def test_profile_ops_names_compiled_graphs_by_their_place_in_the_step(load_benchmark):
    from types import SimpleNamespace as NS

    bench = load_benchmark("profile_ops")
    ev = lambda key, start: NS(key=key, time_range=NS(start=start))  # noqa: E731
    fwd, bwd = "## Call CompiledFxGraph fab12 ##", "## Call CompiledFxGraph f9zz0 ##"
    prof = NS(events=lambda: [ev(bwd, 30), ev("aten::mm", 5), ev(fwd, 10), ev(fwd, 40), ev(bwd, 70)])
    assert bench.graph_names(prof) == {fwd: "## compiled graph 1 ##", bwd: "## compiled graph 2 ##"}


def test_profile_ops_counts_each_cuda_kernel_once(load_benchmark):
    """On CUDA a CPU op's device time is its kernels' time again: only the kernel events count."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    bench = load_benchmark("profile_ops")
    op = NS(device_type=DeviceType.CPU, self_device_time_total=7.0, is_user_annotation=False)  # aten::mm
    kernel = NS(device_type=DeviceType.CUDA, self_device_time_total=7.0, is_user_annotation=False)
    note = NS(device_type=DeviceType.CUDA, self_device_time_total=9.0, is_user_annotation=True)
    assert [bench.kernel_us(e) for e in (op, kernel, note)] == [0.0, 7.0, 0.0]


def test_reference_model_matches_the_oelm_shape(load_benchmark):
    bench = load_benchmark("reference_model")
    from oelm.models.gpt import GPT, gpt_config

    ours = GPT(gpt_config("gpt-tiny", vocab_size=97, block_size=16))
    ref = bench.RefGPT(97, 16, 2, 4, 128, 512)
    # Same matrices; ours adds only the MLP and LayerNorm biases, which bias=False drops.
    mats = lambda m: sorted(p.numel() for p in m.parameters() if p.ndim == 2)  # noqa: E731
    assert sum(mats(ours)) == sum(mats(ref))
    bias_free = GPT(gpt_config("gpt-tiny", vocab_size=97, block_size=16, bias=False))
    assert sum(p.numel() for p in bias_free.parameters()) == sum(p.numel() for p in ref.parameters())


def test_median_interval_is_the_order_statistic_interval(load_benchmark):
    bench = load_benchmark("harness")
    # n = 10: the classic 95% interval for a median is (x(2), x(9)), coverage 97.9%.
    assert bench.median_ci([float(v) for v in range(10, 0, -1)]) == (5.5, 2.0, 9.0)
    assert bench.median_ci([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (3.5, 1.0, 6.0)  # n = 6: the range
    assert bench.median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, None, None)  # n = 5: no 95% interval exists
    # One wild round moves the interval by a rank, not by its size.
    calm = [1.0 + 0.01 * i for i in range(20)]
    assert bench.median_ci(calm + [50.0])[2] < 1.2
    assert bench.paired_ratio([2.0] * 6, [1.0] * 6) == (2.0, 2.0, 2.0)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 9])
def test_balanced_orders_balance_positions_and_predecessors(n, load_benchmark):
    from collections import Counter

    balanced_orders = load_benchmark("harness").balanced_orders
    rows = balanced_orders(n)
    assert len(rows) == (n if n % 2 == 0 or n == 1 else 2 * n)
    assert all(sorted(r) == list(range(n)) for r in rows)
    positions = Counter((a, i) for r in rows for i, a in enumerate(r))
    assert len(positions) == n * n and len(set(positions.values())) == 1  # every arm at every position, alike
    follows = Counter(pair for r in rows for pair in zip(r, r[1:]))
    assert len(follows) == n * (n - 1) and len(set(follows.values())) <= 1  # every arm after every other, alike
    if n > 2:  # what a rotating order gets wrong: there each arm always follows the same one
        rotating = [list(range(k, n)) + list(range(k)) for k in range(n)]
        assert len(Counter(pair for r in rotating for pair in zip(r, r[1:]))) < n * (n - 1)
    with pytest.raises(ValueError, match="at least one arm"):
        balanced_orders(0)


def test_processes_repeat_the_measurement_in_fresh_processes(tmp_path, capfd, load_benchmark):
    bench = load_benchmark("vs_reference")
    out = tmp_path / "rows.json"
    argv = [
        "--device",
        "cpu",
        "--preset",
        "gpt-tiny",
        "--vocab",
        "97",
        "--seq",
        "8",
        "--batch",
        "1",
        "--rounds",
        "2",
        "--steps",
        "1",
        "--threads",
        "1",
        "--processes=2",
        "--json",
        str(out),
    ]
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text())
    assert [r["process"] for r in rows] == [0] * 7 + [1] * 7
    assert {r["name"] for r in rows if r["process"] == 1} == {r["name"] for r in rows if r["process"] == 0}
    text = capfd.readouterr().out
    assert "## process 2 of 2" in text and "across 2 processes" in text
    assert "oelm-freeze: speedup_vs_baseline" in text


def test_step_memory_profile_sees_a_transient_peak_and_its_phase(load_benchmark):
    bench = load_benchmark("arms")
    w = torch.nn.Parameter(torch.randn(64, 64))

    def forward():
        big = torch.zeros(4 * 2**20)  # 16 MiB, made by one op and dropped by Python before backward
        loss = w.square().sum() + big.sum()
        del big
        return loss

    prof = bench.step_memory_profile(forward, lambda: None)
    assert prof["peak_phase"] == "forward" and 16 * 2**20 <= prof["peak_bytes"] < 17 * 2**20

    def forward_saved():  # the same buffer, but autograd keeps a view of it until backward uses it
        big = torch.zeros(4 * 2**20)
        return (w * big[: 64 * 64].view(64, 64)).sum()

    prof = bench.step_memory_profile(forward_saved, lambda: None)
    assert prof["peak_phase"] == "backward" and prof["peak_bytes"] >= 16 * 2**20


def test_loss_without_logits_lowers_the_step_peak_by_the_logits_buffers(load_benchmark):
    """The plain loss keeps logits-sized buffers alive into backward; the fused one none of them."""
    bench = load_benchmark("arms")
    from oelm.models.gpt import GPT, gpt_config

    torch.manual_seed(0)
    vocab, b, t = 4096, 8, 64  # tokens (512) >> d (128), as in training: logits outweigh the head gradient
    model = GPT(gpt_config("gpt-tiny", vocab_size=vocab, block_size=t))
    x = torch.randint(0, vocab, (b, t))
    logits_bytes = b * t * vocab * 4
    plain = bench.step_memory_profile(lambda: model(x, x)[1], lambda: model.zero_grad(set_to_none=True))
    fused = bench.step_memory_profile(
        lambda: model(x, x, return_logits=False)[1], lambda: model.zero_grad(set_to_none=True)
    )
    assert plain["peak_op"] == "aten::_log_softmax_backward_data"
    assert fused["peak_op"] != plain["peak_op"]
    # The plain peak holds three logits-sized float32 buffers (log-softmax output, the dense NLL
    # gradient, the log-softmax backward's output); the fused one holds the chunk's log-softmax
    # (turned into the softmax in place) and the head's [vocab, d] gradient, a quarter of that here.
    assert plain["peak_bytes"] - fused["peak_bytes"] >= 1.5 * logits_bytes


@pytest.mark.slow
def test_train_throughput_runs_train_and_bare_rows(tmp_path):
    """python -m benchmarks.train_throughput end to end at a tiny shape: a train and a bare row per method."""
    argv = [
        "--device",
        "cpu",
        "--models",
        "gpt-tiny",
        "--vocab",
        "97",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--steps",
        "6",
        "--warmup",
        "2",
        "--repeats",
        "1",
        "--json",
    ]
    done = run_module("train_throughput", *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {(r["method"], r["runner"]): r for r in json.loads(done.stdout)}
    assert set(rows) == {(m, r) for m in ("baseline", "oelm-freeze") for r in ("train", "bare")}
    assert all(r["steps_timed"] == 4 and r["step_ms_median"] > 0 for r in rows.values())
    assert rows[("oelm-freeze", "train")]["frozen_params"] > 0 == rows[("baseline", "train")]["frozen_params"]


def test_skipped_work_follows_the_step_dtype(load_benchmark):
    """Under bf16 autocast (the CUDA step; --count-ops builds it on any device) the skipped GEMMs run in bf16."""
    args = load_benchmark("vs_reference").parse(
        ["--count-ops", "--device", "cpu", "--preset", "gpt-tiny", "--vocab", "97", "--seq", "8"]
    )
    arms = load_benchmark("arms")
    base, frozen = arms.build_arms(args, 2, ("baseline", "oelm-qk-ffn"))
    work = arms.SkippedWork(frozen)
    assert frozen.matmul_dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g, _ in work.inputs)
    assert len(work.inputs) == sum(1 for p in frozen.model.parameters() if not p.requires_grad)
    assert math.isclose(work.flops, frozen.saving * base.flops, rel_tol=1e-9)
    work.timed(2, record=True)
    work.collect()
    assert len(work.times) == 2 and len(work.round_medians) == 1


def test_fused_qkv_benchmark_times_the_frozen_and_trainable_projection(tmp_path, capsys, load_benchmark):
    bench = load_benchmark("fused_qkv")
    # The timed calls do what their names say: the frozen arm leaves Q and K without gradients.
    calls = {c.name: c for c in bench.arms(16, 8, torch.device("cpu"), amp=False)}
    assert list(calls) == ["trainable", "frozen", "skipped", "full wgrad", "V-rows wgrad"]
    calls["frozen"].step()
    calls["trainable"].step()
    assert [w.grad is not None for w in calls["frozen"].weights] == [False, False, True]
    assert [w.grad is not None for w in calls["trainable"].weights] == [True, True, True]
    out = tmp_path / "qkv.json"
    threads = torch.get_num_threads()
    try:
        assert (
            bench.main(
                [
                    "--device",
                    "cpu",
                    "--shapes",
                    "32x16",
                    "8x4",
                    "--rounds",
                    "6",
                    "--steps",
                    "1",
                    "--warmup",
                    "1",
                    "--threads",
                    "1",
                    "--json",
                    str(out),
                ]
            )
            == 0
        )
    finally:
        torch.set_num_threads(threads)
    rows = json.loads(out.read_text())
    assert [(r["tokens"], r["d"]) for r in rows] == [(32, 16), (8, 4)]
    for r in rows:
        assert set(r["median_us"]) == set(calls) and all(v > 0 for v in r["median_us"].values())
        lo, hi = r["saved_us"]["ci"]
        assert lo <= r["saved_us"]["median"] <= hi
    assert "freezing Q/K saves" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--shapes", "512by256"])
    assert "TOKENSxD" in capsys.readouterr().err


@pytest.mark.slow
def test_freeze_cost_executes_exactly_the_theoretical_saving(tmp_path):
    """python -m benchmarks.freeze_cost end to end on the study's GPT shape at batch 1: the executed FLOP
    saving equals the analytic one for both frozen methods, and the A/A row saves nothing."""
    argv = [
        "--scale",
        "0.01",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--control",
        "--models",
        "gpt-medium-512",
        "--device",
        "cpu",
        "--json",
    ]
    done = run_module("freeze_cost", *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["method"]: r for r in json.loads(done.stdout)}
    assert set(rows) == {"oelm-freeze", "oelm-qk-ffn", "baseline (A/A control)"}
    for name in ("oelm-freeze", "oelm-qk-ffn"):
        assert rows[name]["theoretical_saving"] > 0
        assert math.isclose(rows[name]["executed_saving"], rows[name]["theoretical_saving"], rel_tol=1e-6)
    assert rows["oelm-freeze"]["theoretical_saving"] < rows["oelm-qk-ffn"]["theoretical_saving"]
    assert rows["baseline (A/A control)"]["executed_saving"] == 0 and rows["baseline (A/A control)"]["time_ratio"] > 0


def test_cli_startup_times_every_arm_in_fresh_processes(tmp_path, capsys, load_benchmark):
    bench = load_benchmark("cli_startup")
    out = tmp_path / "cli.json"
    assert bench.main(["--rounds", "2", "--commands", "methods", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    names = ["oelm --version", "oelm --help", "oelm methods --help", "import oelm.cli", "python -c pass"]
    assert [r["name"] for r in rows] == names
    assert [r["reference"] for r in rows] == [False, False, False, True, True]
    assert rows[2]["argv"] == ["python", "-m", "oelm", "methods", "--help"]
    for r in rows:
        assert r["rounds"] == 2 and len(r["wall_times_s"]) == 2 and r["wall_s"]["median"] > 0
        assert r["wall_s"]["ci"] == [None, None]  # no 95% interval under 6 rounds
        assert r["cpu_s"]["median"] >= 0 and len(r["load_average_1min"]) == 2
        assert isinstance(r["heavy_imports"], list) != r["reference"]  # listed for commands only
        assert (r["under_target"] is None) == r["reference"]
    printed = capsys.readouterr().out
    assert "slowest: " in printed and "oelm methods --help" in printed
    with pytest.raises(SystemExit):
        bench.main(["--commands", "trian"])
    assert "unknown command(s) trian" in capsys.readouterr().err


@pytest.mark.slow  # two rounds of two 4-run sweeps in 2 worker processes: ~35 s on 2 cores
def test_sweep_queue_times_both_dealings_on_the_same_board(tmp_path, capsys, load_benchmark):
    bench = load_benchmark("sweep_queue")
    out = tmp_path / "queue.json"
    argv = ["--rounds", "2", "--seeds", "1", "--steps", "3", "--layers", "1", "--width", "32", "--batch", "2"]
    assert bench.main([*argv, "--seq", "16", "--workdir", str(tmp_path), "--json", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert list(rows) == ["round-robin", "queue", "queue / round-robin"]
    for name in ("round-robin", "queue"):
        r = rows[name]
        assert r["rounds"] == 2 and len(r["wall_times_s"]) == 2 and r["wall_s"]["ci"] == [None, None]
        assert 0 < r["occupancy"]["median"] <= 1 and r["runs"] == 4 and r["steps"] == [3, 9]
        assert r["cpu_s"]["median"] > 0
        trained = [run for worker in r["worker_runs"][-1] for run in worker.split()]
        assert sorted(trained) == [
            f"{arm}_steps{steps}/seed0" for arm in ("baseline/lr0.001", "oelm-freeze/lr0.003") for steps in (3, 9)
        ]
    ratio = rows["queue / round-robin"]
    assert len(ratio["round_ratios"]) == 2 and ratio["wall_ratio"]["median"] > 0
    assert len(ratio["load_average_1min"]) == 2
    # The old dealing gives worker 1 every long run (the grid is innermost); the queue starts with them.
    assert rows["round-robin"]["worker_runs"][-1][1].split() == [
        "baseline/lr0.001_steps9/seed0",
        "oelm-freeze/lr0.003_steps9/seed0",
    ]
    assert "queue / round-robin wall time: " in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == [out]  # the scratch folder is removed


@pytest.mark.slow
def test_presets_gpu_refuses_a_cpu_machine_and_times_tiny_presets_with_cpu(
    tmp_path, capsys, monkeypatch, load_benchmark
):
    bench = load_benchmark("presets_gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--presets", "gpt-tiny"])
    assert exc.value.code == 2 and "no CUDA GPU" in capsys.readouterr().err
    out = tmp_path / "gpu.json"
    tiny = ["--batch", "1", "--seq", "8", "--vocab", "64", "--warmup", "1", "--rounds", "2", "--steps", "1"]
    rows = bench.main(["--cpu", "--presets", "gpt-tiny", "llama-tiny", *tiny, "--json", str(out)])
    assert [(r["preset"], r["method"]) for r in rows] == [
        ("gpt-tiny", "baseline"),
        ("gpt-tiny", "oelm-freeze"),
        ("llama-tiny", "baseline"),
        ("llama-tiny", "oelm-freeze"),
    ]
    assert json.loads(out.read_text()) == json.loads(json.dumps(rows))  # every preset's rows stored
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["rounds"] == 2 and r["seq"] == 8
        assert r["peak_memory_bytes"] >= 4 * r["params"]  # at least the float32 weights
        assert r["dtype"] == "float32" and r["compile"] is False
    base, frozen = rows[2], rows[3]
    assert base["speedup"] == 1.0 and base["theoretical_saving"] == 0.0
    assert frozen["theoretical_saving"] > 0 and frozen["trainable"] < frozen["params"] == base["params"]


def test_vs_reference_times_only_the_arms_asked_for(tmp_path, load_benchmark, capsys):
    bench = load_benchmark("vs_reference")
    out = tmp_path / "rows.json"
    tiny = ["--device", "cpu", "--preset", "gpt-tiny", "--vocab", "97", "--seq", "16", "--batch", "2"]
    tiny += ["--rounds", "2", "--steps", "1", "--threads", "1", "--json", str(out)]
    threads = torch.get_num_threads()
    try:
        assert bench.main([*tiny, "--arms", "reference", "baseline", "oelm-freeze"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert [r["name"] for r in json.loads(out.read_text())] == ["reference", "baseline", "oelm-freeze"]
    assert "no A/A arm" in capsys.readouterr().out  # oelm-freeze's summary line without baseline-AA
    with pytest.raises(SystemExit) as exc:
        bench.parse([*tiny, "--arms", "reference", "oelm-freeze"])
    assert exc.value.code == 2 and "--arms must include reference and baseline" in capsys.readouterr().err


def test_gpu_suite_refuses_a_cpu_machine_and_its_steps_parse(tmp_path, capsys, monkeypatch, load_benchmark):
    suite = load_benchmark("gpu_suite")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        suite.main(["--out", str(tmp_path / "gpu")])
    assert exc.value.code == 2 and "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "gpu").exists()  # refused before any work
    steps = suite.steps(tmp_path)
    default = ["tests", "vs_reference_eager", "vs_reference_compiled", "presets", "vocab_padding"]
    assert list(steps) == [*default, *suite.OPT_IN]
    assert sum(steps[name][1] for name in default) <= 8 * 60  # the budget: under 8 minutes
    # Every benchmark step's arguments are valid for its script (parsed here with the CPU twin).
    vs, presets = load_benchmark("vs_reference"), load_benchmark("presets_gpu")
    for name in ("vs_reference_eager", "vs_reference_compiled"):
        argv = steps[name][0][3:]
        args = vs.parse([a if a != "cuda" else "cpu" for a in argv])
        assert args.batch == [8] and args.json == tmp_path / f"{name}.json"
    args = presets.parse_args([*steps["presets"][0][3:], "--cpu"])
    assert args.presets == ["gpt-medium-512", "gpt-gpt2s", "llama-gpt2s"] and "identity-q" in args.methods
    args = presets.parse_args([*steps["vocab_padding"][0][3:], "--cpu"])
    assert args.vocab_multiple == [1, 64] and args.presets == ["gpt-gpt2s", "llama-gpt2s"]
    argv = steps["presets_compiled"][0][3:]
    args = presets.parse_args([*argv, "--cpu"])
    assert "--no-compile" not in argv and "llama-350m" in args.presets and args.methods == list(suite.METHODS)


def test_gpu_suite_runs_an_opt_in_step_only_when_named(tmp_path, monkeypatch, load_benchmark):
    suite = load_benchmark("gpu_suite")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(suite, "device_facts", lambda: {"device": "fake"})
    ran = []

    def fake_run(cmd, **kwargs):
        ran.append(cmd)
        return suite.subprocess.CompletedProcess(cmd, 0, "ok", "")

    monkeypatch.setattr(suite.subprocess, "run", fake_run)
    suite.main(["--out", str(tmp_path / "all")])
    names = list(json.loads((tmp_path / "all" / "gpu_suite.json").read_text())["steps"])
    assert names == ["tests", "vs_reference_eager", "vs_reference_compiled", "presets", "vocab_padding"]
    suite.main(["--out", str(tmp_path / "one"), "--only", "presets_compiled"])
    assert list(json.loads((tmp_path / "one" / "gpu_suite.json").read_text())["steps"]) == ["presets_compiled"]
    assert "--no-compile" not in ran[-1] and "llama-350m" in ran[-1]
