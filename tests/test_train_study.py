"""`oelm train configs/study/ID.yaml --scale smoke` prepares the data and runs the experiment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_study_config_smoke_scale_runs_end_to_end(shared_data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # study configs name data relative to the repo root
    data, out = tmp_path / "data", tmp_path / "run"
    argv = [
        "train",
        "configs/study/gpt-02.yaml",
        "--scale",
        "smoke",
        f"data={data}",
        f"out={out}",
        "steps=12",
        "warmup=2",
        "eval_every=6",
        "eval_batches=2",
        "final_eval_batches=4",
    ]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert (data / "meta.json").is_file()
    assert results["method"] == "oelm-freeze" and results["steps"] == 12
    assert results["test_perplexity"] is not None and results["freeze_check"]["ok"]


def test_scale_errors_are_clear(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert main(["train", "configs/study/gpt-02.yaml", "--scale", "huge"]) == 2
    assert "unknown scale 'huge'" in capsys.readouterr().err
    plain = tmp_path / "plain.yaml"
    plain.write_text("model: gpt-tiny\n")
    assert main(["train", str(plain), "--scale", "smoke"]) == 2
    assert "has no 'scales' section" in capsys.readouterr().err


@pytest.mark.parametrize("config", ["gptcls-imdb-02.yaml", "gptcls-xnli-01.yaml"])
def test_classification_study_configs_run_at_smoke_scale(config, shared_data, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "run"
    argv = [
        "train",
        f"configs/study/{config}",
        "--scale",
        "smoke",
        f"out={out}",
        "steps=6",
        "warmup=1",
        "eval_every=3",
        "classification.max_train=48",
        "classification.max_eval=24",
    ]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "classification" and results["steps"] == 6
    assert results["split_roles"]["heldout"] and results["freeze_check"]["ok"]
