"""Variants through `oelm train`: options validated up front, schedules resume exactly, reload re-applies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from oelm.cli import main
from oelm.core.methods import list_methods
from oelm.training.checkpoint import WEIGHTS, read_metadata, step_dir_name
from oelm.training.config import make_config
from oelm.training.loop import train
from oelm.utils.errors import UserError
from test_train_resume import metrics_without_timing
from train_utils import one_thread, sigkill_then_resume, synthetic_lm_dir, tiny_config

NEW = [
    "oelm-freeze-q",
    "oelm-freeze-k",
    "oelm-temp",
    "oelm-gain",
    "oelm-qknorm",
    "oelm-lowrank",
    "oelm-qbias",
    "oelm-late-freeze",
    "oelm-early-freeze",
    "oelm-unfreeze",
    "oelm-lower-half",
    "oelm-upper-half",
    "oelm-alternate",
]
LAYERS2 = {"n_layer": 2, "d_model": 32, "n_head": 4, "block_size": 32}


def test_every_method_is_registered_and_runs_through_train(tmp_path: Path) -> None:
    assert set(NEW) <= {m.name for m in list_methods()}
    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    with one_thread():
        for method in NEW:
            cfg = tiny_config(
                data,
                tmp_path / method,
                method=method,
                steps=4,
                eval_every=0,
                checkpoint_every=0,
                model_overrides=LAYERS2,
                timing_warmup=0,
            )
            results = train(cfg)
            assert results["freeze_check"]["ok"], (method, results["freeze_check"])
            audit = json.loads((tmp_path / method / "freeze_audit.json").read_text())
            assert audit["start"]["method"] == method and "options" in audit["start"]
            meta = read_metadata(tmp_path / method / "checkpoints" / step_dir_name(4) / WEIGHTS)
            assert meta["method"] == method and "layers" in json.loads(meta["method_options"])


def test_oelm_methods_lists_every_variant_with_its_options(capsys) -> None:
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name} " in out for name in NEW)
    assert "[rank=8]" in out and "[f=0.5, on_freeze=keep]" in out


def test_a_bogus_method_option_fails_up_front_with_exit_2_and_no_run_dir(tmp_path: Path, capsys) -> None:
    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    out = tmp_path / "run"
    rc = main(["train", "--data", str(data), "--method", "oelm-lowrank", "--out", str(out), "method_options.bogus=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "'bogus'" in err and "valid options: qk_init, layers, rank" in err
    assert not out.exists()
    spec = {
        "config": tiny_config(data, tmp_path / "x"),
        "methods": {"oelm-temp": {"lr": [1e-3], "method_options": {"rnak": 2}}},
    }
    from oelm.experiments.sweep import spec_from_dict

    with pytest.raises(UserError, match="unknown method option 'rnak'"):
        spec_from_dict(spec)
    with pytest.raises(UserError, match="layer_lr_decay"):
        make_config({"data": "x", "layer_lr_decay": 1.5})


def test_sample_reloads_a_run_with_adapters_and_layer_lr(tmp_path: Path) -> None:
    from oelm.training.sample import sample

    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    # The synthetic data claims the byte tokenizer: size the model for its ids.
    overrides = {"n_layer": 1, "d_model": 64, "n_head": 4, "block_size": 32, "vocab_size": 260}
    cfg = tiny_config(
        data,
        tmp_path / "run",
        method="oelm-lowrank",
        method_options={"rank": 2},
        layer_lr_decay=0.7,
        steps=6,
        eval_every=3,
        checkpoint_every=3,
        model_overrides=overrides,
    )
    with one_thread():
        results = train(cfg)
    assert results["freeze_check"]["ok"]
    weights = load_file(tmp_path / "run" / "checkpoints" / "best" / WEIGHTS)
    assert any(".oelm_adapter.lora_b" in k for k in weights)
    text = sample(tmp_path / "run", "ab", tokens=5, temperature=0)
    assert isinstance(text, str)
    assert main(["sample", str(tmp_path / "run"), "--tokens", "3"]) == 0
    timing = json.loads((tmp_path / "run" / "timing_stats.json").read_text())
    assert timing["theoretical_flops_saving"] > 0


def _truncate_to(src: Path, dst: Path, step: int) -> None:
    """A copy of a finished run as if it had been killed right after the checkpoint of `step`."""
    shutil.copytree(src, dst)
    (dst / "results.json").unlink()
    for p in (dst / "checkpoints").iterdir():
        if p.name.startswith("step_") and int(p.name[5:]) > step:
            shutil.rmtree(p)
    cfg = yaml.safe_load((dst / "config.yaml").read_text())
    cfg["out"] = str(dst)
    (dst / "config.yaml").write_text(yaml.safe_dump(cfg))


@pytest.mark.parametrize(
    "method,options", [("oelm-late-freeze", {"on_freeze": "reorthogonalize"}), ("oelm-unfreeze", {})]
)
def test_schedule_state_survives_resume_exactly(tmp_path: Path, method: str, options: dict) -> None:
    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    cfg = tiny_config(
        data,
        tmp_path / "ref",
        method=method,
        method_options=options,
        steps=20,
        checkpoint_every=5,
        keep_last=5,
        eval_every=5,
    )
    with one_thread():
        ref = train(cfg)
        # Step 10 is the switch (f = 0.5): its checkpoint is taken before it; 15 is after it.
        for step in (10, 15):
            run = tmp_path / f"cut{step}"
            _truncate_to(tmp_path / "ref", run, step)
            resumed = train({**cfg, "out": str(run), "resume": True})
            a = load_file(tmp_path / "ref" / "checkpoints" / step_dir_name(20) / WEIGHTS)
            b = load_file(run / "checkpoints" / step_dir_name(20) / WEIGHTS)
            assert all(torch.equal(a[k], b[k]) for k in a), step
            assert metrics_without_timing(run) == metrics_without_timing(tmp_path / "ref")
            for key in ("best_val_loss", "test_loss", "freeze_check", "trainable_params"):
                assert resumed[key] == ref[key], (step, key)
            audit = json.loads((run / "freeze_audit.json").read_text())
            assert audit["end"]["ok"] and audit["start"]["schedule"]["switched"]  # rows follow the switch
    assert ref["freeze_check"]["n_frozen_checked"] == (2 if method == "oelm-late-freeze" else 0)


def test_late_freeze_with_best_checkpoint_before_the_freeze_passes_its_check(tmp_path: Path, monkeypatch) -> None:
    """best/ saved while Q/K still trained holds their trainable-phase values: not a broken freeze.

    A probe that is solved early picks a best step before the switch; the end-of-run check used to
    compare those weights with the fingerprints taken at the switch and excluded the run.
    """
    from oelm.training.task import Task

    scores = iter(range(100))  # the first validation eval (step 5) is the best one
    monkeypatch.setattr(Task, "selection_score", lambda self, metrics: next(scores))
    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    cfg = tiny_config(
        data,
        tmp_path / "run",
        method="oelm-late-freeze",
        steps=20,
        eval_every=5,
        checkpoint_every=0,
        model_overrides=LAYERS2,
    )
    with one_thread():
        results = train(cfg)
    check = results["freeze_check"]
    assert results["best_step"] == 5 and check["ok"], check
    assert check["n_frozen_checked"] == 4 and "best/ is step 5" in check["notes"][0]
    # The evaluated weights are step 5's: Q/K differ from what was frozen at step 10.
    best = load_file(tmp_path / "run" / "checkpoints" / "best" / WEIGHTS)
    last = load_file(tmp_path / "run" / "checkpoints" / step_dir_name(20) / WEIGHTS)
    q = "transformer.h.0.attn.q_proj.weight"
    assert not torch.equal(best[q], last[q])
    # The report keeps the run (its check passed) and says where its score came from.
    from oelm.records.load import load_runs
    from oelm.reports.aggregate import compare

    group = compare(load_runs([tmp_path / "run"])).groups[0]
    assert group.arms[0].primary.n == 1
    assert any(
        "oelm-late-freeze: 1 of 1 runs were scored at a best checkpoint saved before their late "
        "freeze (seed 0: step 5)" in w
        for w in group.warnings
    ), group.warnings


@pytest.mark.slow  # a subprocess killed mid-run plus a reference run
def test_sigkill_during_late_freeze_then_resume_matches(tmp_path: Path) -> None:
    data = synthetic_lm_dir(tmp_path / "data")
    overrides = {"n_layer": 1, "d_model": 64, "n_head": 4, "block_size": 32, "dropout": 0.1}
    cfg = tiny_config(
        data,
        tmp_path / "ref",
        method="oelm-late-freeze",
        method_options={"f": 0.4},
        steps=30,
        model_overrides=overrides,
        checkpoint_every=10,
        eval_every=5,
        keep_last=3,
    )
    with one_thread():
        reference = train(cfg)
    run = tmp_path / "killed"
    # The switch is before step 13 (0.4 * 30 = 12): kill after the step-20 checkpoint, in the frozen phase.
    sigkill_then_resume(cfg, run, tmp_path / "config.yaml", checkpoint_step=20, past_step=22)
    a = load_file(tmp_path / "ref" / "checkpoints" / "step_0000030" / WEIGHTS)
    b = load_file(run / "checkpoints" / "step_0000030" / WEIGHTS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    resumed = json.loads((run / "results.json").read_text())
    for key in ("best_val_loss", "val_loss", "test_loss", "freeze_check"):
        assert resumed[key] == reference[key], key
    assert resumed["freeze_check"]["ok"] and resumed["freeze_check"]["n_frozen_checked"] == 2
