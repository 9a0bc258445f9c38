"""Study configs run under their own folders, and a taken folder's suggested --out is accepted."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from oelm.cli import main
from oelm.experiments.resolve import resolve_config
from oelm.training.lm import tokenizer_name
from test_sweep import TINY
from train_utils import synthetic_lm_dir

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "configs" / "study"
CONFIGS = sorted(p for p in STUDY.glob("*.yaml") if p.name != "study_numbers.yaml")


def test_every_study_config_has_its_own_default_run_folder() -> None:
    folders = {}
    for path in CONFIGS:
        cfg = resolve_config(path, "smoke").config
        folders[path.stem] = cfg.run_dir().as_posix()
    assert len(set(folders.values())) == len(CONFIGS), folders
    assert folders["gpt-02"] == "runs/study/gpt-02-smoke-oelm-freeze-s0"
    assert folders["gpt-05"] == "runs/study/gpt-05-smoke-oelm-freeze-s0"
    # the folder follows what the run is: its scale, a method or seed given on the command line
    assert resolve_config(STUDY / "gpt-02.yaml", None, overrides=["seed=3"]).config.run_dir().as_posix() == (
        "runs/study/gpt-02-full-oelm-freeze-s3"
    )
    flags = {"method": "oelm-random"}
    assert resolve_config(STUDY / "gpt-02.yaml", "smoke", flags).config.run_dir().name == "gpt-02-smoke-oelm-random-s0"
    # an explicit --out / out= wins
    assert resolve_config(STUDY / "gpt-02.yaml", "smoke", {"out": "mine"}).config.out == "mine"
    assert resolve_config(STUDY / "gpt-02.yaml", "smoke", overrides=["out=x/y"]).config.out == "x/y"


@pytest.mark.slow
def test_two_study_configs_run_one_after_the_other(shared_data, tmp_path, monkeypatch, capsys) -> None:
    """gpt-02 then gpt-05 at smoke scale with no --out: both run (they once shared a folder)."""
    work = tmp_path / "repo"
    work.mkdir()
    (tmp_path / "shared").symlink_to(shared_data.parent)  # the configs read ../shared/data
    monkeypatch.chdir(work)
    tiny = ["steps=2", "warmup=1", "eval_every=2", "eval_batches=1", "final_eval_batches=1"]
    for config, data in (("gpt-02", "ts"), ("gpt-05", "docs")):
        assert main(["train", str(STUDY / f"{config}.yaml"), "--scale", "smoke", f"data={data}", *tiny]) == 0
    out = capsys.readouterr().out
    assert "runs/study/gpt-02-smoke-oelm-freeze-s0" in out and "runs/study/gpt-05-smoke-oelm-freeze-s0" in out
    results = json.loads((work / "runs/study/gpt-05-smoke-oelm-freeze-s0/results.json").read_text())
    assert results["tokenizer"] == "byte"  # what its perplexity is per: a report needs it beside the study's


@pytest.mark.slow
def test_a_taken_folders_suggested_out_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**TINY, "data": str(synthetic_lm_dir(tmp_path / "data")), "progress": False}))
    out = tmp_path / "run"
    (tmp_path / "run-2").mkdir()  # taken: the suggestion skips it
    assert main(["train", str(config), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", str(config), "--out", str(out), "lr=0.01"]) == 2
    err = capsys.readouterr().err
    suggested = re.search(r"e\.g\. (--out \S+), which is free", err)
    assert suggested, err
    assert suggested.group(1) == f"--out {(tmp_path / 'run-3').as_posix()}"
    argv = ["train", str(config), "lr=0.01", *shlex.split(suggested.group(1))]
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "run-3" / "results.json").is_file()


def test_a_runs_tokenizer_is_recorded_by_name_without_a_machines_path() -> None:
    assert [tokenizer_name(s) for s in ("byte", "gpt2", "gpt2:/home/me/gpt2", "/data/tok/gpt2.tiktoken")] == [
        "byte",
        "gpt2",
        "gpt2",
        "gpt2.tiktoken",
    ]
