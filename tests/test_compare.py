"""`oelm compare` with a tiny budget: data prepared on the fly, table printed, report written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.cli import main
from oelm.experiments.compare import compare_spec
from oelm.experiments.sweep import spec_from_dict


def test_compare_spec_gives_every_method_the_same_budget_and_grid(tmp_path: Path) -> None:
    spec = spec_from_dict(compare_spec(out=tmp_path, seeds=(0, 1), steps=40))
    runs = spec.runs()
    assert len(runs) == 3 * 3 * 2
    assert {r.config["steps"] for r in runs} == {40}
    assert {tuple(a["lr"]) for a in spec.methods.values()} == {(3e-4, 1e-3, 3e-3)}


@pytest.mark.slow
def test_compare_cli_tiny(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cmp"
    code = main(["compare", "--out", str(out), "--steps", "4", "--lrs", "1e-3", "--seq-len", "32",
                 "--batch-size", "2", "--methods", "baseline", "oelm-freeze", "--parallel", "2"])
    assert code == 0
    text = capsys.readouterr().out
    assert "oelm-freeze" in text and "report:" in text
    assert (out / "data" / "meta.json").is_file()
    report = json.loads((out / "report" / "report.json").read_text())
    arms = {a["method"]: a for a in report["groups"][0]["arms"]}
    assert set(arms) == {"baseline", "oelm-freeze"} and arms["oelm-freeze"]["frozen_params"] > 0
