"""Every stored result page regenerates from its committed run records, through the one comparison path."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import load_script
from oelm.records.compact import RECORDS_FILE, RUN_RECORD_FILE, read_records, record_text, write_raw_records
from oelm.records.load import load_runs
from oelm.reports.comparison import page_sections
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
            boards = sorted(folder.rglob(RECORDS_FILE))
            assert boards and not list(folder.rglob(RUN_RECORD_FILE)), f"{name}: records not in one runs.jsonl.gz"
            records = [raw for board in boards for raw in read_records(board.parent).values()]
            for raw in records:
                text = record_text(raw)
                assert "/tmp/" not in text and "/work/" not in text and "/home/" not in text, raw["path"]
            for other in folder.glob("*.*"):  # sweep.yaml, plan.json, confirmation.*, stored tables
                if other.name != RECORDS_FILE:
                    assert not re.search(r"(?<![\w.])/(tmp|work|home|root)/", other.read_text()), other
            runs = load_runs([folder])
            assert len(runs) == len(records) and all(r.finished for r in runs)  # loads as run directories do


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
    board = tmp_path / "docs" / "results" / "agnews-cpu" / "records"
    stored = read_records(board)
    for raw in stored.values():  # every seed of every setting: the chosen ones among them
        raw["results"][raw["results"]["primary_metric"]] += 0.01
    write_raw_records(stored, board)
    diff = regen.check(tmp_path, only={"agnews-cpu"})
    assert "docs/results/agnews-cpu/report.md" in diff and "docs/results/agnews-cpu/report.json" in diff


def _jitter(value: object, rel: float) -> object:
    """Every float of a JSON value moved by a relative `rel` (another CPU's last bits when tiny)."""
    if isinstance(value, float):
        return value * (1 + rel)
    if isinstance(value, dict):
        return {k: _jitter(v, rel) for k, v in value.items()}
    if isinstance(value, list):
        return [_jitter(v, rel) for v in value]
    return value


def test_a_stored_fit_moved_in_its_last_bits_still_matches(regen, tmp_path: Path) -> None:
    """The ladder's fitted slopes differ by ~1e-15 relative on another CPU: the same page, not a
    stale one; a change a figure would show (1e-6) or any change of a key, count or word is caught."""
    stored = page_sections(RESULTS / "ladder" / "ladder.json")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(stored, indent=1))
    b.write_text(json.dumps(_jitter(stored, 3e-15), indent=1))
    assert a.read_bytes() != b.read_bytes() and regen.same_content(a, b)
    b.write_text(json.dumps(_jitter(stored, 1e-6), indent=1))
    assert not regen.same_content(a, b)
    b.write_text(json.dumps({**stored, "extra": 1}, indent=1))
    assert not regen.same_content(a, b)
    b.write_text(json.dumps([stored], indent=1))
    assert not regen.same_content(a, b)


@pytest.mark.parametrize(
    ("other", "same"),
    [
        ("gap +4.11% [+0.72, +7.51] over 45 records: worse (resolved)", True),
        ("gap +4.12% [+0.72, +7.50] over 45 records: worse (resolved)", True),  # a rounding boundary
        ("gap +4.13% [+0.72, +7.51] over 45 records: worse (resolved)", False),
        ("gap +4.110% [+0.72, +7.51] over 45 records: worse (resolved)", False),
        ("gap +4.11% [+0.72, +7.51] over 46 records: worse (resolved)", False),
        ("gap +4.11% [+0.72, +7.51] over 45 records: unresolved", False),
        ("gap +4.11% [+0.72, +7.51, +9.1] over 45 records: worse (resolved)", False),
    ],
)
def test_a_page_may_move_one_unit_in_a_printed_decimal_only(regen, tmp_path: Path, other: str, same: bool) -> None:
    """Markdown: words, integers and layout exact; each printed decimal within one last-digit unit."""
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    a.write_text("gap +4.11% [+0.72, +7.51] over 45 records: worse (resolved)")
    b.write_text(other)
    assert regen.same_content(a, b) is same


@pytest.mark.parametrize(
    ("other", "same"),
    [
        ("gap +6.5% [-1.3, +12] over 10 cells", True),  # an interval's end printed to 2 digits, on a boundary
        ("gap +6.5% [-1.3, +15] over 10 cells", False),  # two units
        ("gap +6.5% [-1.3, +13] over 11 cells", False),  # a count stays exact
        ("gap +6.5% [-1.3, 13] over 10 cells", False),
    ],
)
def test_a_signed_integer_is_a_measured_value_that_may_move_one_unit(
    regen, tmp_path: Path, other: str, same: bool
) -> None:
    """A gap printed as "+13" (2 significant digits) is a value, not a count: it may cross a rounding
    boundary as a decimal may; an unsigned integer may not."""
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    a.write_text("gap +6.5% [-1.3, +13] over 10 cells")
    b.write_text(other)
    assert regen.same_content(a, b) is same


def test_a_number_stored_rounded_may_move_one_unit_in_its_last_digit(regen, tmp_path: Path) -> None:
    """Scaling fits store 4 significant digits (an optimizer's last bits differ by CPU): 0.4067 and
    0.4068 are the same fit at that precision; 0.4069 is not, nor is a full-precision float moved by 1e-4."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"alpha": 0.4067, "E": 1230.0, "loss": 2.718281828459045}))
    for other, same in [
        ({"alpha": 0.4068, "E": 1230.0, "loss": 2.718281828459045}, True),
        ({"alpha": 0.4067, "E": 1231.0, "loss": 2.718281828459045}, True),
        ({"alpha": 0.4069, "E": 1230.0, "loss": 2.718281828459045}, False),
        ({"alpha": 0.4067, "E": 1232.0, "loss": 2.718281828459045}, False),
        ({"alpha": 0.4067, "E": 1230.0, "loss": 2.7183}, False),
        ({"alpha": 0.4067, "E": 1230.0, "loss": 2.718281828459045, "gap": 12.0}, None),
    ]:
        if same is None:  # a 2-digit stored extrapolation (13.0 against 12.0): one unit
            a.write_text(json.dumps({**json.loads(a.read_text()), "gap": 13.0}))
            b.write_text(json.dumps(other))
            assert regen.same_content(a, b)
            b.write_text(json.dumps({**other, "gap": 11.0}))
            assert not regen.same_content(a, b)
            continue
        b.write_text(json.dumps(other))
        assert regen.same_content(a, b) is same, other


def test_a_mistyped_page_name_is_refused_listing_the_pages(regen, capsys) -> None:
    with pytest.raises(SystemExit, match=r"--only: no page 'agnews-cpuu' in .*pages\.yaml; pages: .*agnews-cpu,"):
        regen.main(["--check", "--only", "agnews-cpu", "agnews-cpuu"])
    assert "regenerates" not in capsys.readouterr().out  # refused before anything was rebuilt
