"""The vs_reference benchmark runs end to end on a tiny shape and writes sane rows (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_reference.py"


def _load():
    spec = importlib.util.spec_from_file_location("vs_reference", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vs_reference_rows_and_memory(tmp_path, capsys):
    bench = _load()
    out = tmp_path / "rows.json"
    argv = ["--device", "cpu", "--preset", "gpt-tiny", "--vocab", "97", "--seq", "16", "--batch", "2",
            "--rounds", "2", "--steps", "1", "--threads", "1", "--json", str(out)]
    threads = torch.get_num_threads()
    try:
        assert bench.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"reference", "baseline", "oelm-freeze", "oelm-qk-ffn", "baseline-AA", "baseline-nobias"}
    assert all(r["complete"] and r["steps_timed"] == 2 and r["tokens_per_s"] > 0 for r in rows.values())
    # The CPU estimate drops exactly the frozen tensors' gradients and AdamW moments.
    freeze = rows["oelm-freeze"]
    assert freeze["memory_saving_vs_baseline_bytes"] == freeze["frozen_grad_and_optimizer_bytes"] > 0
    assert 0 < freeze["theoretical_saving"] < rows["oelm-qk-ffn"]["theoretical_saving"]
    assert rows["reference"]["flops_per_step"] == rows["baseline"]["flops_per_step"] == rows["baseline-nobias"]["flops_per_step"]
    # Every ratio has an interval over the (paired) rounds around its per-round geometric mean.
    for r in rows.values():
        lo, hi = r["speedup_vs_baseline_ci"]
        assert r["rounds_paired"] == 2 and 0 < lo <= hi
    assert rows["baseline"]["speedup_vs_baseline_ci"] == [1.0, 1.0]
    # The frozen arms are shadowed by their skipped work: exactly the FLOPs of the theoretical saving.
    base = rows["baseline"]
    for name in ("oelm-freeze", "oelm-qk-ffn"):
        r = rows[name]
        assert math.isclose(r["skipped_work_flops"], r["theoretical_saving"] * base["flops_per_step"], rel_tol=1e-9)
        assert 0 < r["skipped_work_share_of_baseline"] < 1 and r["skipped_work_speedup_ceiling"] > 1
        assert len(r["skipped_time_saved_ci"]) == 2 and r["saving_realized_ci"] is not None
    assert base["skipped_work_s"] is None and rows["reference"]["skipped_time_saved_ci"] is None
    out_text = capsys.readouterr().out
    assert "oelm-freeze" in out_text and "skipped work alone takes" in out_text  # printed, not only written


def test_count_ops_rows_are_deterministic_and_add_up(tmp_path, capsys):
    bench = _load()
    out = tmp_path / "ops.json"
    argv = ["--count-ops", "--device", "cpu", "--preset", "gpt-tiny", "--vocab", "97", "--seq", "8", "--json", str(out)]
    assert bench.main(argv) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"reference", "baseline", "oelm-freeze", "oelm-qk-ffn", "baseline-nobias"}
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


def test_reference_model_matches_the_oelm_shape():
    bench = _load()
    from oelm.models.gpt import GPT, gpt_config

    ours = GPT(gpt_config("gpt-tiny", vocab_size=97, block_size=16))
    ref = bench.RefGPT(97, 16, 2, 4, 128, 512)
    # Same matrices; ours adds only the MLP and LayerNorm biases, which bias=False drops.
    mats = lambda m: sorted(p.numel() for p in m.parameters() if p.ndim == 2)  # noqa: E731
    assert sum(mats(ours)) == sum(mats(ref))
    bias_free = GPT(gpt_config("gpt-tiny", vocab_size=97, block_size=16, bias=False))
    assert sum(p.numel() for p in bias_free.parameters()) == sum(p.numel() for p in ref.parameters())
