"""A run's config.yaml edited after the run wrote it is refused on --resume (issue 40): by hand
(its first line still there) or by a YAML tool (comments dropped: results.json has the digest)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from oelm.cli import main
from oelm.training.loop import train
from oelm.utils.errors import UserError
from train_utils import one_thread, synthetic_lm_dir, tiny_config


@pytest.fixture
def finished(tmp_path: Path) -> tuple[dict, Path]:
    cfg = tiny_config(
        synthetic_lm_dir(tmp_path / "data", n_train=4000), tmp_path / "run", steps=3, warmup=1, eval_every=3
    )
    with one_thread():
        train({**cfg, "checkpoint_every": 3})
    return cfg, tmp_path / "run"


def _resume_from_file(run: Path) -> dict:
    """What `oelm train RUN/config.yaml --resume` resolves to."""
    return {**yaml.safe_load((run / "config.yaml").read_text()), "resume": True}


@pytest.mark.parametrize("state", ["finished", "unfinished"])
def test_a_hand_edited_config_is_refused_on_resume(state: str, finished) -> None:
    _, run = finished
    if state == "unfinished":  # checkpoints, no results: what a killed run leaves
        (run / "results.json").unlink()
    text = (run / "config.yaml").read_text()
    assert text.startswith("# oelm train wrote this file; identity sha256 ")
    (run / "config.yaml").write_text(text.replace("lr: 0.003\n", "lr: 0.001\n"))
    with one_thread(), pytest.raises(UserError, match=r"config\.yaml' was edited after the run wrote it"):
        train(_resume_from_file(run))


def test_a_config_rewritten_by_a_yaml_tool_is_refused_through_results_json(finished) -> None:
    _, run = finished
    stored = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**stored, "steps": 6, "lr": 0.001}))  # comments gone
    with one_thread(), pytest.raises(UserError, match="was edited after the run wrote it"):
        train(_resume_from_file(run))


def test_the_unedited_file_resumes_and_an_allowed_change_rewrites_the_digest(finished, capsys) -> None:
    cfg, run = finished
    with one_thread():
        assert main(["train", str(run / "config.yaml"), "--resume"]) == 0  # the digest survives YAML
        out = train({**_resume_from_file(run), "steps": 6, "allow_change": ["steps"]})
        assert out["status"] == "complete" and out["steps"] == 6
        assert train(_resume_from_file(run))["steps"] == 6  # the new file is the run's own
