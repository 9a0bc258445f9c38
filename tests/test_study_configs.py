"""Every study config, at full and smoke scale, validates as a TrainConfig."""

from __future__ import annotations

from pathlib import Path

import pytest

from oelm.experiments.resolve import resolve_raw
from oelm.reports.study_numbers import StudyNumbers
from oelm.training.config import make_config
from oelm.utils.errors import UserError
from oelm.utils.io import read_yaml

STUDY = Path(__file__).resolve().parents[1] / "configs" / "study"
CONFIGS = sorted(p for p in STUDY.glob("*.yaml") if p.name != "study_numbers.yaml")
EXPECTED = {
    "GPT-01",
    "GPT-02",
    "GPT-03",
    "GPT-04",
    "GPT-05",
    "GPT-06",
    "GPT-07",
    "XNLI-01",
    "XNLI-02",
    "SST-2-01",
    "SST-2-02",
    "MNLI-01",
    "MNLI-02",
    "GPTCLS-IMDB-01",
    "GPTCLS-IMDB-02",
    "GPTCLS-AGNEWS-01",
    "GPTCLS-AGNEWS-02",
    "GPTCLS-XNLI-01",
    "GPTCLS-XNLI-02",
    "FFN-01",
    "FFN-02",
}


def _hf_model_unsupported(cfg: dict) -> bool:
    """Whether TrainConfig still rejects Hugging Face model names (the study's BERT runs)."""
    try:
        make_config({**cfg, "model": "bert-base-uncased"})
    except UserError as err:
        return "unknown model preset" in str(err)
    return False


def test_every_study_experiment_has_a_config() -> None:
    ids = {read_yaml(p)["study"]["id"] for p in CONFIGS}
    assert ids == EXPECTED


@pytest.mark.parametrize("scale", ["full", "smoke"])
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_study_config_validates(path: Path, scale: str) -> None:
    train, meta = resolve_raw(path, scale)  # the path `oelm train CONFIG --scale` takes
    if train["model"] == "bert-base-uncased" and _hf_model_unsupported(train):
        pytest.xfail("TrainConfig accepts only GPT presets so far; the BERT runs need HF models")
    cfg = make_config(train)
    assert cfg.method and cfg.steps > 0 and meta["study"]["id"]
    for key in ("data", "model"):
        assert not str(getattr(cfg, key)).startswith("/"), "no absolute paths in configs"
    if scale == "smoke":
        assert cfg.model in {"gpt-tiny", "minilm"} and cfg.steps <= 200 and cfg.device == "cpu"
        if cfg.task == "classification":
            assert cfg.classification.epochs is None and cfg.classification.max_train


def test_unknown_scale_is_a_user_error() -> None:
    with pytest.raises(UserError, match="unknown scale"):
        resolve_raw(CONFIGS[0], "huge")


def test_study_numbers_table_is_labelled_and_matches_configs() -> None:
    numbers = StudyNumbers.load(STUDY / "study_numbers.yaml")
    assert "study" in numbers.source
    assert set(numbers.entries) == EXPECTED - {"FFN-01", "FFN-02"}  # the study never ran those
    assert numbers.lookup("lm", "tinystories", "gpt-tiny", "oelm-freeze")["value"] == 4.69


def test_resolve_is_the_one_path_to_a_run_config() -> None:
    """Above training, only experiments.resolve uses the study helpers and the config builders."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "oelm"
    builders = {"make_config", "apply_overrides", "load_yaml", "parse_override"}
    users: dict[str, set[str]] = {}
    for path in [*(src / "experiments").glob("*.py"), *(src / "cli").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            names = {a.name for a in node.names}
            if node.module == "oelm.experiments.study" or (node.module == "oelm.training.config" and names & builders):
                users.setdefault(path.stem, set()).update(names)
    assert set(users) == {"resolve"}, users
