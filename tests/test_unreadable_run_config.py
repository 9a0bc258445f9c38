"""A run whose config.yaml cannot be read is refused by every reader of runs, never compared as if its
settings were unknown-but-equal (issue 40, first-round residue: a recursive alias)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oelm.cli import main
from oelm.records.load import load_run
from oelm.records.run import read_run_config
from oelm.utils.errors import UserError
from test_report import make_run

BROKEN = {
    "recursive alias": b"notes: &n [*n]\n",
    "not UTF-8": b"steps: 400 \xe9\n",
    "a YAML list": b"- steps\n",
    "duplicate key": b"steps: 40\nsteps: 400\n",
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_config_of_one_run_refuses_the_report_naming_the_file(tmp_path: Path, kind: str, capsys) -> None:
    """Six runs of two arms; one run was trained 10x longer and its config.yaml says so but is broken:
    read as {} it would pass every comparison check and be averaged with the others (exit 0)."""
    for seed in range(3):
        for i, method in enumerate(("baseline", "oelm-freeze")):
            make_run(tmp_path, method, 1e-3, seed, test_perplexity=10 + seed / 10 + i / 5, best_val_loss=1.5 + i / 10)
    path = tmp_path / "runs" / "oelm-freeze" / "lr0.001" / "seed2" / "config.yaml"
    text = path.read_bytes().replace(b"steps: 40\n", b"")
    path.write_bytes(text + BROKEN[kind])
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("oelm: error: "), err
    assert f"{str(path)!r} cannot be read (" in err[0] and "move that run out of the folders given" in err[0]
    assert not (tmp_path / "out" / "report.md").exists()


def test_a_missing_or_empty_config_is_still_an_empty_mapping(tmp_path: Path) -> None:
    """Records written without a config (compact records, older runs) are read as before."""
    assert read_run_config(tmp_path / "config.yaml") == {}
    (tmp_path / "config.yaml").write_text("# nothing yet\n")
    assert read_run_config(tmp_path / "config.yaml") == {}
    run = make_run(tmp_path, "baseline", 1e-3, 0)
    assert load_run(run).config["steps"] == 40
    (run / "config.yaml").write_bytes(b"- a list\n")
    with pytest.raises(UserError, match="holds a YAML list, not a mapping"):
        load_run(run)
