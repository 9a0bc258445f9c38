"""Every stored result page regenerates from its committed run records, through the one comparison path."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import load_script
from oelm.records.compact import RECORD_FILE, read_record
from oelm.records.load import load_runs
from oelm.utils.io import load_yaml_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


@pytest.fixture(scope="module")
def regen():
    """scripts/regenerate_results.py as a module."""
    return load_script("regenerate_results")


def _pages() -> list[dict]:
    return load_yaml_text((RESULTS / "pages.yaml").read_text())


def test_every_stored_page_has_committed_records_without_machine_paths() -> None:
    """Each page of the manifest reads a folder of committed records; none names an absolute path."""
    pages = _pages()
    assert any(isinstance(p["records"], list) for p in pages)  # the ladder: one folder per rung
    for page in pages:
        for name in page["records"] if isinstance(page["records"], list) else [page["records"]]:
            folder = (RESULTS / name).resolve()
            records = sorted(folder.rglob(RECORD_FILE))
            assert records, f"{name}: no committed record.json"
            for path in records:
                text = path.read_text()
                assert "/tmp/" not in text and "/work/" not in text and "/home/" not in text, path
                assert read_record(path.parent).finished
            for other in folder.glob("*.*"):  # sweep.yaml, plan.json, confirmation.*, stored tables
                assert not re.search(r"(?<![\w.])/(tmp|work|home|root)/", other.read_text()), other
            runs = load_runs([folder])
            assert len(runs) == len(records)  # a record folder loads exactly as run directories do


@pytest.mark.slow
def test_every_results_page_regenerates_from_its_records(regen) -> None:
    """`python scripts/regenerate_results.py --check`: rebuilt in a scratch copy, nothing differs."""
    assert regen.check() == []


@pytest.mark.slow
def test_an_edited_record_changes_its_page(regen, tmp_path: Path) -> None:
    """The check is not vacuous: held-out values edited in the records show up as a stale page."""
    for part in ("docs", "scripts", "configs"):
        shutil.copytree(ROOT / part, tmp_path / part)
    shutil.copy2(ROOT / "README.md", tmp_path / "README.md")
    for record in (tmp_path / "docs" / "results" / "agnews-cpu" / "records").rglob(RECORD_FILE):
        raw = json.loads(record.read_text())  # every seed of every setting: the chosen ones among them
        raw["results"][raw["results"]["primary_metric"]] += 0.01
        record.write_text(json.dumps(raw, indent=1))
    diff = regen.check(tmp_path, only={"agnews-cpu"})
    assert "docs/results/agnews-cpu/report.md" in diff and "docs/results/agnews-cpu/report.json" in diff
