"""The declared scale ladder (configs/sweeps/scale-ladder/ladder.yaml) and its driver's planning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import load_script
from oelm.utils.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "configs" / "sweeps" / "scale-ladder" / "ladder.yaml"
STORED = ROOT / "docs" / "results" / "scale-ladder" / "records"


@pytest.fixture(scope="module")
def driver():
    return load_script("scale_ladder")


def _spec_beside_stored(driver, rung: str, tmp_path: Path, monkeypatch) -> dict:
    """The declared spec, run from the repository root (where the committed rungs are) with its run
    folders in tmp_path; skipped when `rung` is not stored."""
    if not (STORED / rung / "sweep.yaml").is_file():
        pytest.skip(f"no stored {rung} rung")
    monkeypatch.chdir(ROOT)
    spec = driver.load(SPEC)
    spec["out"] = str(tmp_path / "runs")
    return spec


def test_the_ladder_spans_two_decades_at_20_tokens_per_parameter_in_both_families(driver) -> None:
    """Seven rungs per family, from a few thousand to a few hundred thousand parameters (>= 2 decades),
    each rung's budget 20 tokens per total parameter; the hypothesis is declared in the spec."""
    spec = driver.load(SPEC)
    assert spec["hypothesis"]["test"] and set(spec["families"]) == {"gpt", "llama"}
    for family in spec["families"]:
        grids = driver.grid_from(spec, None)
        sizes = []
        for rung in spec["rungs"]:
            rs = driver.rung_spec(spec, family, rung, grids)
            o = rs["overrides"]
            n = driver.total_params(o["model"], o["model_overrides"], driver.VOCAB)
            assert o["steps"] * 8 * 128 / n == pytest.approx(20, rel=0.02)
            assert rs["primary"] == spec["primary"] and set(rs["methods"]) == set(spec["arms"])
            # three seeds at every LR of the small rungs; the top CPU rung one, confirmed on fresh seeds
            assert rs["seeds"] == ([0] if rung["name"] == "r7" else [0, 1, 2])
            sizes.append(n)
        assert sizes == sorted(sizes) and len(sizes) >= 6 and sizes[-1] / sizes[0] >= 100


def test_the_transfer_rule_centres_each_arm_on_the_rung_below(driver) -> None:
    spec = driver.load(SPEC)
    below = dict.fromkeys(spec["arms"], 0.02)
    below["oelm-freeze"] = 0.08
    grids = driver.grid_from(spec, below)
    assert grids["oelm-freeze"] == [0.04, 0.08, 0.16] and grids["baseline"] == [0.01, 0.02, 0.04]
    with pytest.raises(UserError, match="chose no LR"):
        driver.grid_from(spec, {"baseline": 0.02})


def test_a_spec_without_a_declared_hypothesis_is_refused(driver, tmp_path: Path) -> None:
    raw = yaml.safe_load(SPEC.read_text())
    raw.pop("hypothesis")
    (tmp_path / "base.yaml").write_text((SPEC.parent / "base.yaml").read_text())
    (tmp_path / "ladder.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match="declare the trend hypothesis"):
        driver.load(tmp_path / "ladder.yaml")
    raw = yaml.safe_load(SPEC.read_text())
    raw["rungs"][0]["seed"] = [0]  # a misspelt key would silently run the spec's seeds
    (tmp_path / "ladder.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match=r"rungs\.0\.seed: Extra inputs are not permitted"):
        driver.load(tmp_path / "ladder.yaml")


def test_a_later_session_resumes_above_the_committed_rungs(driver, tmp_path: Path, monkeypatch, capsys) -> None:
    """With no run directories, the rungs already committed under docs/results/scale-ladder/records
    are skipped and their records carry the LR transfer on (here: every rung the repo stores)."""
    spec = _spec_beside_stored(driver, "gpt-r2", tmp_path, monkeypatch)
    spec["rungs"] = spec["rungs"][:2]  # r1 and r2, both stored
    assert driver.run_family(spec, "gpt", None, parallel=1, plan=False) == 2
    assert "gpt r1: stored in docs/results/scale-ladder/records/gpt-r1" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()  # nothing trained, nothing written
    lrs = driver.chosen_lrs(STORED / "gpt-r2")
    assert set(lrs) == set(spec["arms"]) and all(lr > 0 for lr in lrs.values())


def test_max_extend_raises_a_written_rung_s_limit_and_resumes_it(driver, tmp_path: Path, monkeypatch) -> None:
    """`--max-extend 4` rewrites the named rung's spec with the higher limit (its sweep record keeps
    it) and runs the sweep on it; without the flag a written spec is never moved; a lower value is
    refused."""
    spec = driver.load(SPEC)
    spec["out"] = str(tmp_path / "runs")
    spec["rungs"] = spec["rungs"][:1]
    rung_dir = tmp_path / "runs" / "gpt-r1"
    (rung_dir / "runs").mkdir(parents=True)  # a rung under way here, not the stored one
    written = driver.rung_spec(spec, "gpt", spec["rungs"][0], driver.grid_from(spec, None))
    (rung_dir / "ladder-rung.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
    calls = []
    monkeypatch.setattr(driver, "oelm", lambda argv: calls.append(argv) or 0)
    monkeypatch.setattr(driver, "chosen_lrs", lambda path: {})
    assert driver.run_family(spec, "gpt", {"r1"}, parallel=1, plan=False) == 1
    assert yaml.safe_load((rung_dir / "ladder-rung.yaml").read_text())["max_extend"] == 2
    assert driver.run_family(spec, "gpt", {"r1"}, parallel=1, plan=False, max_extend=4) == 1
    assert yaml.safe_load((rung_dir / "ladder-rung.yaml").read_text())["max_extend"] == 4
    assert calls[-1][:2] == ["sweep", (rung_dir / "ladder-rung.yaml").as_posix()] and len(calls) == 2
    with pytest.raises(UserError, match="only raises it"):
        driver.run_family(spec, "gpt", {"r1"}, parallel=1, plan=False, max_extend=3)


def test_the_data_axis_starts_from_a_committed_rung(driver, tmp_path: Path, monkeypatch, capsys) -> None:
    """A data-axis cell whose rung is stored only as committed records (no runs/ folder) centres its
    grid on the LRs those records chose and runs; --rungs keeps only the named rungs' cells. (It
    waited for the rung forever before: it looked for a runs/ folder in the stored records.)"""
    spec = _spec_beside_stored(driver, "gpt-r3", tmp_path, monkeypatch)
    # a budget no stored cell has (a stored cell is skipped as finished)
    spec["data_axis"] = [{"rung": "r2", "tokens_per_param": [40]}, {"rung": "r3", "tokens_per_param": [40]}]
    calls = []
    monkeypatch.setattr(driver, "oelm", lambda argv: calls.append(argv) or 0)
    driver.run_data_axis(spec, "gpt", parallel=1, plan=False, only={"r3"})
    assert "waits for the rung" not in capsys.readouterr().out
    cell = tmp_path / "runs" / "gpt-r3-t40"
    assert [c[:2] for c in calls] == [["sweep", (cell / "ladder-rung.yaml").as_posix()]]  # r3 only
    written = yaml.safe_load((cell / "ladder-rung.yaml").read_text())
    chosen = driver.chosen_lrs(STORED / "gpt-r3")
    assert written["methods"]["oelm-freeze"]["lr"] == driver.grid_from(spec, chosen)["oelm-freeze"]
    assert written["overrides"]["steps"] == 920  # 40 tokens per parameter at 23,544 parameters, batch 8 x 128


@pytest.mark.parametrize(
    ("spec_text", "argv", "says"),
    [
        (None, [], "not found"),
        ("", [], "declare the trend hypothesis"),
        ("[1, 2]\n", [], "must hold a mapping"),
        (
            "hypothesis: {test: t}\n",
            [],
            r"invalid ladder spec .*name: required \(ladder.yaml shows it\); base: required",
        ),
        (SPEC.read_text().replace("seeds: [0, 1, 2]", "seeds: [0, 0, 1]"), [], r"seeds repeat: \[0, 0, 1\]"),
        (SPEC.read_text().replace("{rung: r3,", "{rung: r9,"), [], "data_axis names rung 'r9'"),
        (SPEC.read_text().replace("max_extend: 2", "max_extend: -1"), [], "max_extend: Input should be greater"),
        (
            SPEC.read_text().replace("[[oelm-freeze, oelm-nofreeze],", "[[oelm-freeze, oelm-nofrez],"),
            [],
            "primary pair",
        ),
        (SPEC.read_text().replace("tokens_per_param: 20", "tokens_per_param: 0"), [], "tokens_per_param: Input should"),
        (SPEC.read_text().replace("transfer: [0.5, 1.0, 2.0]", "transfer: []"), [], "lr.transfer: List should have"),
        (SPEC, ["--family", "nope"], r"--family: no family \['nope'\]"),
        (SPEC, ["--rungs", "r99"], r"--rungs: no rung \['r99'\].*'r7'"),
        (SPEC, ["--max-extend", "-1"], "0 or more"),
        (SPEC, ["--data-axis", "--rungs", "r5"], r"--rungs \['r5'\] with --data-axis: no data-axis cells"),
    ],
)
def test_a_bad_spec_or_argument_is_one_line_before_any_rung(
    driver, tmp_path: Path, capsys, spec_text, argv, says
) -> None:
    """A missing, empty or malformed spec, an unknown family or rung, a negative extension limit:
    one `scale_ladder: error:` line naming it (exit 2), where some ran a rung or ended in a traceback."""
    path = tmp_path / "ladder.yaml"
    if isinstance(spec_text, Path):
        path = spec_text
    elif spec_text is not None:
        path.write_text(spec_text)
    assert driver.main([str(path), "--plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scale_ladder: error:") and err.count("\n") == 1
    assert re.search(says, err), err
