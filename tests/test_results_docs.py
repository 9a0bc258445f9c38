"""docs/results/README.md (and README.md) show what the stored run records say, not older numbers.

The tables and figures between `<!-- generated: ... -->` comments are written by
scripts/results_tables.py from the report.json / leaderboard.json files under docs/; these tests
fail when a record changed (or a template was edited) without rerunning it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


@pytest.fixture(scope="module")
def results_tables():
    """scripts/results_tables.py as a module."""
    return load_script("results_tables")


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


# ---------------------------------------------------------------- one vocabulary, recomputed

OLD_WORDS = re.compile(r"\b(underpowered|significant(ly)?|n\.s\.|recovered|disappears)(?![\w.])", re.I)


def _strings(value):
    """Every string value of a JSON document (keys such as Power's `underpowered` flag are data names)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_docs_word_every_result_in_the_one_vocabulary():
    """No doc, generated report or stored record text says 'underpowered', 'significant', 'n.s.',
    'recovered' or 'disappears' of a result: verdicts are worse / better (resolved), equivalent
    within ±m%, or unresolved (smallest detectable gap X% at 80% power)."""
    found = []
    for path in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "docs").rglob("*.json")]):
        if path.suffix == ".json":
            texts = list(_strings(json.loads(path.read_text())))
        else:
            texts = path.read_text().splitlines()
        found += [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for t in texts for m in OLD_WORDS.finditer(t)]
    assert not found, "old wording (use the vocabulary of oelm.reports.tables.verdict_text):\n" + "\n".join(found)


def _records(folder: Path, by_seed_freeze: dict[int, float]) -> Path:
    """Compact run records of a tiny table: held-out values per seed, nothing else (as a record
    rebuilt from a stored table holds)."""
    from oelm.records.compact import write_record
    from oelm.records.layout import RunKey
    from oelm.records.run import RunRecord

    arms = {
        "baseline": ({0: 4.00, 1: 4.10, 2: 3.95, 3: 4.05}, 0.003, 0, 0.0),
        "oelm-freeze": (by_seed_freeze, 0.006, 20, 0.044),
        "oelm-nofreeze": ({0: 3.90, 1: 4.00, 2: 3.86, 3: 3.95}, 0.003, 0, 0.0),
    }
    for method, (by_seed, lr, frozen, saving) in arms.items():
        for seed, value in by_seed.items():
            key = RunKey(method, f"lr{lr:g}", seed, lr)
            results = {
                "schema_version": 2, "status": "complete", "task": "lm", "method": method, "model": "gpt-tiny",
                "dataset": "tiny", "seed": seed, "lr": lr, "primary_metric": "test_perplexity",
                "selection_metric": "best_val_loss", "higher_is_better": False, "test_perplexity": value,
                "selection_kept": False, "trainable_params": 100 - frozen, "frozen_params": frozen,
                "theoretical_saving": saving,
            }  # fmt: skip
            run = RunRecord(key.path(folder), "complete", results, source="docs/results/x/records/stored-report.json")
            write_record(run, key.path(folder))
    return folder


def _report(tmp_path: Path, by_seed_freeze: dict[int, float], *extra: str) -> dict:
    from oelm.cli import main

    folder = _records(tmp_path / "records", by_seed_freeze)
    assert main(["report", str(folder), "--out", str(tmp_path / "out"), *extra]) == 0
    return json.loads((tmp_path / "out" / "report.json").read_text())


def _verdicts(report: dict) -> dict[str, str]:
    return {a["method"]: a["verdict"] for a in report["groups"][0]["arms"]}


@pytest.mark.slow
def test_a_report_of_records_computes_its_verdicts_from_the_per_seed_values(tmp_path):
    """`oelm report` over compact records compares every arm from its per-seed values: a consistent
    +5% per seed is worse (resolved); one changed seed makes it unresolved; the page says the runs
    are rebuilt records; --baseline moves the reference."""
    steady = {0: 4.20, 1: 4.31, 2: 4.15, 3: 4.25}  # +4.9% to +5.1% in every seed
    report = _report(tmp_path, steady)
    assert report["groups"][0]["reference"] == "baseline"
    assert _verdicts(report)["oelm-freeze"] == "worse (resolved)"
    freeze = next(a for a in report["groups"][0]["arms"] if a["method"] == "oelm-freeze")
    assert freeze["primary"]["n"] == 4 and abs(freeze["gap_percent"] - 5.0) < 0.2
    assert freeze["decision"]["m"] == 2
    md = (tmp_path / "out" / "report.md").read_text()
    assert (
        "Reference: **baseline**" in md
        and "records rebuilt from the stored table docs/results/x/records/stored-report.json" in md
    )
    assert not OLD_WORDS.search(md)

    noisy = {**steady, 1: 3.80}  # one seed now better than the baseline: the gap no longer resolves
    shutil.rmtree(tmp_path / "records")
    assert _verdicts(_report(tmp_path, noisy))["oelm-freeze"].startswith("unresolved (smallest detectable gap ")

    shutil.rmtree(tmp_path / "records")
    moved = _report(tmp_path, steady, "--baseline", "oelm-nofreeze")
    assert moved["groups"][0]["reference"] == "oelm-nofreeze"
    assert _verdicts(moved)["baseline"] is not None and _verdicts(moved)["oelm-nofreeze"] is None


@pytest.mark.slow
def test_a_leaderboard_of_records_shows_the_same_init_twin(tmp_path):
    """`oelm leaderboard` over compact records keeps the named reference (the default-init baseline)
    and, with oelm-nofreeze on the board, compares oelm-freeze with its same-init twin too."""
    from oelm.cli import main

    folder = _records(tmp_path / "records", {0: 4.20, 1: 4.31, 2: 4.15, 3: 4.25})
    assert main(["leaderboard", str(folder), "--out", str(tmp_path / "board"), "--baseline", "baseline"]) == 0
    md = (tmp_path / "board" / "leaderboard.md").read_text()
    assert (tmp_path / "board" / "pareto.png").is_file() and "Reference: **baseline**" in md
    assert "gap vs its same-init trainable twin" in md and "vs oelm-nofreeze: " in md
    table = json.loads((tmp_path / "board" / "leaderboard.json").read_text())["tables"][0]
    freeze = next(e for e in table["ranked"] if e["method"] == "oelm-freeze")
    assert freeze["verdict"] == "worse (resolved)" and freeze["twin"] == "oelm-nofreeze"
    assert freeze["twin_verdict"] is not None
