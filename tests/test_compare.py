"""`oelm compare`: presets stored as data, a tiny run end to end, and the closing reading."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from oelm.cli import main
from oelm.experiments.compare import load_compare, preset_path, preset_spec
from oelm.experiments.presets import PRESET_DIR, preset_names
from oelm.experiments.resolve import resolve_config
from oelm.experiments.sweep import load_spec, spec_from_dict
from oelm.records.load import load_runs
from oelm.reports.comparison import page_sections
from oelm.utils.errors import UserError

# What the removed ComparePreset + compare_spec built for `oelm compare --preset quick` (default flags),
# and with `--methods oelm-freeze oelm-random --lrs 1e-3 3e-3 --steps 300`: the preset files are now
# sweep specs, and the spec they give must stay this one key by key, so that every run's config (and
# its hash) stays the same and an existing runs/compare/quick resumes.
_CONFIG = {
    "task": "lm",
    "data": "runs/compare/quick/data",
    "model": "gpt-narrow",
    "steps": 1000,
    "batch_size": 16,
    "seq_len": 128,
    "warmup": 100,
    "eval_every": 200,
    "eval_batches": 16,
    "final_eval_batches": None,
    "checkpoint_every": 0,
    "device": "cpu",
    "dtype": "float32",
    "tensorboard": False,
    "log_every": 10,
    "progress": False,
}
OLD_QUICK = {
    "name": "compare-quick",
    "out": "runs/compare/quick",
    "prepare": {"source": "builtin:tales", "tokenizer": "byte", "val_fraction": 0.05, "test_fraction": 0.1, "seed": 0},
    "config": _CONFIG,
    "methods": {"baseline": {"lr": [0.006, 0.012, 0.024]}, "oelm-freeze": {"lr": [0.006, 0.012, 0.024]}},
    "seeds": [0, 1, 2],
    "max_extend": 2,
}
OLD_QUICK_FLAGS = {
    **OLD_QUICK,
    "config": {**_CONFIG, "steps": 300, "warmup": 30, "eval_every": 60},
    "methods": {"oelm-freeze": {"lr": [0.001, 0.003]}, "oelm-random": {"lr": [0.001, 0.003]}},
}


def _identities(spec) -> list[dict]:
    return [resolve_config(run.config).identity() for run in spec.runs()]


@pytest.mark.parametrize(
    ("flags", "old"),
    [
        ({}, OLD_QUICK),
        ({"methods": ["oelm-freeze", "oelm-random"], "lrs": [1e-3, 3e-3], "steps": 300}, OLD_QUICK_FLAGS),
    ],
)
def test_the_quick_preset_builds_the_spec_the_old_compare_built(flags: dict, old: dict) -> None:
    new = preset_spec("quick", **flags)
    assert set(new) == set(old)
    for key in old:
        assert new[key] == old[key], key
    spec, before = load_compare("quick", **flags), spec_from_dict(old)
    assert spec.to_dict() == before.to_dict() and spec.out == before.out  # SWEEP/sweep.yaml
    assert [r.run_dir for r in spec.runs()] == [r.run_dir for r in before.runs()]
    assert _identities(spec) == _identities(before)  # every run's config, so its hash


def test_the_stored_quickstart_runs_are_the_quick_presets_runs() -> None:
    """docs/results/quickstart's records (`oelm compare --preset quick`) differ from the runs the
    preset plans only in where the data folder lay: a resumed runs/compare/quick reuses them."""
    spec = load_compare("quick")
    planned = {(r.method, r.lr, r.seed): r for r in spec.runs()}
    stored = load_runs([Path(__file__).parents[1] / "docs/results/quickstart/records"])
    assert len(stored) == len(planned) == 18
    for run in stored:
        mine = planned[(run.config["method"], run.config["lr"], run.config["seed"])]
        assert mine.differences_from(run.config) == ["data"]
        assert Path(mine.config["data"]).relative_to(spec.out) == Path(run.config["data"])


def test_presets_ship_as_sweep_specs_and_resolve_to_fair_sweeps(tmp_path: Path) -> None:
    assert {"quick", "full"} <= set(preset_names())
    quick = load_compare("quick", out=tmp_path)
    assert quick.base["device"] == "cpu" and quick.base["model"] == "gpt-narrow"
    assert quick.prepare["source"] == "builtin:tales" and quick.prepare["test_fraction"] >= 0.1
    assert quick.base["data"] == (tmp_path / "data").as_posix()  # --out moves the prepared data along
    assert load_compare("full").base["model"] == "gpt-medium-512"
    runs = quick.runs()
    assert len(runs) == sum(len(a["lr"]) for a in quick.methods.values()) * len(quick.seeds)
    assert {r.config["steps"] for r in runs} == {1000}
    for arm in quick.methods.values():  # each grid is centred: its middle LR is not an edge
        assert len(arm["lr"]) >= 3
    for name in preset_names():  # `oelm sweep` runs a preset file as it is
        assert load_spec(PRESET_DIR / f"{name}.yaml").to_dict() == load_compare(name).to_dict()


def test_a_sweep_spec_file_is_all_it_takes_to_change_the_regime(tmp_path: Path) -> None:
    raw = yaml.safe_load(preset_path("quick").read_text())
    raw["config"].update(steps=77, warmup=8, eval_every=15)
    raw.update(name="mine", methods={"baseline": {"lr": [5e-3]}, "oelm-freeze": {"lr": [2e-3, 4e-3]}})
    del raw["out"]
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(raw))
    spec = load_compare(path)
    assert {r.config["steps"] for r in spec.runs()} == {77}
    assert spec.methods["oelm-freeze"]["lr"] == [2e-3, 4e-3]
    assert spec.out == Path("runs/compare/mine") and " runs/compare/mine " in spec.extend
    with pytest.raises(UserError, match="unknown compare preset 'nope'"):
        load_compare("nope")
    path.write_text(yaml.safe_dump({**raw, "stepz": 3}))
    with pytest.raises(UserError, match=r"unknown sweep spec key\(s\) \['stepz'\]"):
        load_compare(path)
    with pytest.raises(UserError, match="no LR grid"):
        load_compare("quick", methods=["oelm-global"])
    with pytest.raises(UserError, match="steps"):
        load_compare("quick", steps=0)


def tiny_preset(folder: Path, **spec: object) -> Path:
    """The quick preset cut to seconds: a sweep spec file in `folder`."""
    raw = yaml.safe_load(preset_path("quick").read_text())
    raw["prepare"]["max_docs"] = 12
    raw["config"].update(steps=4, batch_size=2, seq_len=32, eval_batches=4, warmup=1, eval_every=1)
    raw.update(methods={"baseline": {"lr": [1e-3]}, "oelm-freeze": {"lr": [1e-3]}}, seeds=[0, 1, 2])
    raw.update(max_extend=0, **spec)  # one fixed LR per arm here; grid extension is tested in test_sweep
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_compare_cli_tiny(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tiny = tiny_preset(tmp_path)
    out = tmp_path / "cmp"
    code = main(["compare", "--preset", str(tiny), "--out", str(out), "--steps", "4", "--parallel", "2"])
    assert code == 0
    text = capsys.readouterr().out
    assert "oelm-freeze" in text and "report:" in text
    # The output ends with the plain-language reading, generated from the records.
    last = text.strip().splitlines()[-1]
    assert last.startswith("In plain words:") and "oelm-freeze reached test_perplexity" in last
    assert "indicative only" in last and "theoretical saving" in last and "Test-set noise" in last
    assert (out / "data" / "meta.json").is_file()
    report = page_sections(out / "report" / "report.json")
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
    recipe = preset_spec("quick", out="out", data="a.txt", tokenizer="byte")["prepare"]
    ensure_lm_data(recipe, "out/data")
    assert read_json(Path("out/data/meta.json"))["prepare_recipe"]["source"] == "a.txt"
    before = Path("out/data/train.bin").read_bytes()
    ensure_lm_data({**recipe, "source": str(tmp_path / "a.txt")}, "out/data")  # the same file, spelled otherwise
    other = preset_spec("quick", out="out", data="b.txt", tokenizer="byte")["prepare"]
    with pytest.raises(UserError, match=r"prepared from 'a\.txt' .*differs in: source 'a\.txt' -> 'b\.txt'.*--out"):
        ensure_lm_data(other, "out/data")
    with pytest.raises(UserError, match=r"differs in: test_fraction"):
        ensure_lm_data({**recipe, "test_fraction": 0.3}, "out/data")
    assert Path("out/data/train.bin").read_bytes() == before
