"""`oelm compare`: presets stored as data, a tiny run end to end, and the closing reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from oelm.cli import main
from oelm.experiments.compare import apply_overrides, compare_spec, load_preset, preset_names
from oelm.experiments.sweep import spec_from_dict
from oelm.utils.errors import UserError


def test_presets_ship_as_data_and_resolve_to_fair_sweeps(tmp_path: Path) -> None:
    assert {"quick", "full"} <= set(preset_names())
    quick = load_preset("quick")
    assert quick.device == "cpu" and quick.model == "gpt-narrow" and quick.data == "builtin:tales"
    assert quick.test_fraction >= 0.1
    assert load_preset("full").model == "gpt-medium-512"
    spec = spec_from_dict(compare_spec(quick, tmp_path))
    runs = spec.runs()
    grids = {m: tuple(g.lr) for m, g in quick.methods.items()}
    assert len(runs) == sum(len(g) for g in grids.values()) * len(quick.seeds)
    assert {r.config["steps"] for r in runs} == {quick.steps}
    assert {m: tuple(a["lr"]) for m, a in spec.methods.items()} == grids
    for grid in grids.values():  # each grid is centred: its middle LR is not an edge
        assert len(grid) >= 3
    assert spec.prepare["test_fraction"] == quick.test_fraction


def test_a_preset_file_is_all_it_takes_to_change_the_regime(tmp_path: Path) -> None:
    raw = yaml.safe_load(Path(load_preset.__globals__["PRESET_DIR"], "quick.yaml").read_text())
    raw.update(steps=77, methods={"baseline": {"lr": [5e-3]}, "oelm-freeze": {"lr": [2e-3, 4e-3]}})
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(raw))
    spec = spec_from_dict(compare_spec(load_preset(path), tmp_path / "out"))
    assert {r.config["steps"] for r in spec.runs()} == {77}
    assert spec.methods["oelm-freeze"]["lr"] == [2e-3, 4e-3]
    with pytest.raises(UserError, match="unknown compare preset 'nope'"):
        load_preset("nope")
    path.write_text(yaml.safe_dump({**raw, "stepz": 3}))
    with pytest.raises(UserError, match="invalid compare preset"):
        load_preset(path)
    with pytest.raises(UserError, match="no LR grid"):
        apply_overrides(load_preset("quick"), methods=["oelm-global"])


@pytest.mark.slow
def test_compare_cli_tiny(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tiny = {
        **load_preset("quick").model_dump(exclude={"name"}),
        "max_docs": 12,
        "steps": 4,
        "batch_size": 2,
        "seq_len": 32,
        "eval_batches": 4,
        "seeds": [0, 1, 2],
        "methods": {"baseline": {"lr": [1e-3]}, "oelm-freeze": {"lr": [1e-3]}},
        "max_extend": 0,  # one fixed LR per arm here; grid extension is tested in test_sweep
    }
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump(tiny))
    out = tmp_path / "cmp"
    code = main(["compare", "--preset", str(preset), "--out", str(out), "--parallel", "2"])
    assert code == 0
    text = capsys.readouterr().out
    assert "oelm-freeze" in text and "report:" in text
    # The output ends with the plain-language reading, generated from the records.
    last = text.strip().splitlines()[-1]
    assert last.startswith("In plain words:") and "oelm-freeze reached test_perplexity" in last
    assert "indicative only" in last and "theoretical saving" in last and "Test-set noise" in last
    assert (out / "data" / "meta.json").is_file()
    report = json.loads((out / "report" / "report.json").read_text())
    arms = {a["method"]: a for a in report["groups"][0]["arms"]}
    assert set(arms) == {"baseline", "oelm-freeze"} and arms["oelm-freeze"]["frozen_params"] > 0
    assert arms["baseline"]["noise"]["test_se"] > 0 and arms["oelm-freeze"]["power"]["n"] == 3
    # The gap's test-set noise, paired window by window over the same test windows.
    assert arms["oelm-freeze"]["paired_noise"]["test_size"] == arms["baseline"]["noise"]["test_size"]
    assert arms["oelm-freeze"]["paired_noise"]["test_se"] > 0 and "Test-set noise in the gap" in last
    md = (out / "report" / "report.md").read_text().rstrip()
    assert md.endswith(report["groups"][0]["reading"])
    assert "oelm confirm plan" in md and "pilot: 3 seeds" in md


def test_compare_on_other_data_into_the_same_out_refuses_naming_the_data(tmp_path: Path, monkeypatch) -> None:
    from oelm.experiments.prepare import ensure_lm_data
    from oelm.utils.io import read_json

    monkeypatch.chdir(tmp_path)
    for name, word in (("a.txt", "cat"), ("b.txt", "dog")):
        Path(name).write_text("".join(f"The {word} number {i} sat down.\n\n" for i in range(60)), encoding="utf-8")
    preset = apply_overrides(load_preset("quick"), data="a.txt", tokenizer="byte")
    recipe = compare_spec(preset, "out")["prepare"]
    ensure_lm_data(recipe, "out/data")
    assert read_json(Path("out/data/meta.json"))["prepare_recipe"]["source"] == "a.txt"
    before = Path("out/data/train.bin").read_bytes()
    ensure_lm_data({**recipe, "source": str(tmp_path / "a.txt")}, "out/data")  # the same file, spelled otherwise
    other = compare_spec(apply_overrides(preset, data="b.txt"), "out")["prepare"]
    with pytest.raises(UserError, match=r"prepared from 'a\.txt' .*differs in: source 'a\.txt' -> 'b\.txt'.*--out"):
        ensure_lm_data(other, "out/data")
    with pytest.raises(UserError, match=r"differs in: test_fraction"):
        ensure_lm_data({**recipe, "test_fraction": 0.3}, "out/data")
    assert Path("out/data/train.bin").read_bytes() == before
