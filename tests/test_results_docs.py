"""docs/results/README.md (and README.md) show what the stored run records say, not older numbers.

The tables and figures between `<!-- generated: ... -->` comments are written by
scripts/results_tables.py from the report.json / leaderboard.json files under docs/; these tests
fail when a record changed (or a template was edited) without rerunning it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


@pytest.fixture(scope="module")
def results_tables():
    """scripts/results_tables.py imported as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("results_tables", ROOT / "scripts" / "results_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_results_docs_are_current(results_tables, capsys):
    """`python scripts/results_tables.py --check` passes: every generated block is up to date."""
    code = results_tables.main(["--check"])
    out = capsys.readouterr().out
    assert code == 0, f"stale generated blocks; run `python scripts/results_tables.py`:\n{out}"
    text = (RESULTS / "README.md").read_text()
    assert "<!-- generated: template fair-comparison" in text  # the study-vs-fair table is generated


def test_check_detects_a_stale_table(results_tables, tmp_path, capsys):
    """A generated number edited by hand is reported stale (exit 1), and a rewrite restores it."""
    original = (RESULTS / "README.md").read_text()
    marker = "<!-- generated: arms quickstart -->\n"
    start = original.index(marker) + len(marker)
    end = original.index("<!-- /generated -->", start)
    body = original[start:end]
    # The quickstart's oelm-freeze test perplexity as its report.json stores it, edited by hand.
    stored = json.loads((RESULTS / "quickstart" / "report.json").read_text())
    arm = next(a for g in stored["groups"] for a in g["arms"] if a["method"] == "oelm-freeze")
    shown = f"{arm['primary']['mean']:.3f}"
    assert shown in body
    copy = tmp_path / "README.md"
    copy.write_text(original[:start] + body.replace(shown, "9.999") + original[end:])
    records = ["--records", str(RESULTS)]

    assert results_tables.main(["--check", *records, str(copy)]) == 1
    assert "arms quickstart" in capsys.readouterr().out
    assert results_tables.main([*records, str(copy)]) == 0  # rewrite in place
    assert copy.read_text() == original
    assert results_tables.main(["--check", *records, str(copy)]) == 0


def test_unknown_method_is_an_error_naming_it(results_tables, tmp_path, capsys):
    """A template naming a method the record does not hold fails with exit 2, not a blank cell."""
    shutil.copytree(RESULTS / "quickstart", tmp_path / "quickstart", ignore=shutil.ignore_patterns("*.png"))
    doc = tmp_path / "README.md"
    doc.write_text("<!-- generated: template t\n{{quickstart oelm-nope gap}}\n-->\n<!-- /generated -->\n")
    assert results_tables.main(["--check", str(doc)]) == 2
    assert "oelm-nope" in capsys.readouterr().err
