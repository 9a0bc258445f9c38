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


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("lr: &a [*a]\n", "recursive alias"),
        ("- a list\n", "holds a YAML list"),
        (b"lr: 0.003 \xe9\n", "codec can't decode"),
    ],
)
def test_an_unreadable_run_config_is_named_with_its_reason_never_as_a_key_to_allow(finished, text, why) -> None:
    """config.yaml broken after the run wrote it (a recursive alias, not a mapping, not UTF-8): the
    resume names the file, the reason and the fix, instead of offering `--allow-change config.yaml
    unreadable`; the checkpoints stay untouched."""
    cfg, run = finished
    path = run / "config.yaml"
    (run / "results.json").unlink()  # an unfinished run: what the refusal protects
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    for resume in (True, False):
        with one_thread(), pytest.raises(UserError) as err:
            train({**cfg, "checkpoint_every": 3, "resume": resume})
        message = str(err.value)
        assert f"{str(path)!r} cannot be read (" in message and why in message, message
        assert "pass --overwrite" in message and "--allow-change" not in message
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
