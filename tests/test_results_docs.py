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
from oelm.reports.comparison import page_sections

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
    stored = page_sections(RESULTS / "quickstart" / "report.json")
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


def test_the_ladder_block_is_the_pages_trend_test_row_by_row(results_tables, tmp_path, capsys):
    """A ladder block prints one row per tested line of ladder.json, with its slope, verdict and
    fit as ladder.md prints them; another view's page is refused in one line (exit 2)."""
    page = page_sections(RESULTS / "scale-ladder" / "ladder.json")
    tested = [t for t in page["trends"] if t["slope"] is not None]
    table = results_tables.ladder_block("scale-ladder", results_tables.Records(RESULTS), "here")
    rows = table.splitlines()[2:]
    assert len(rows) == len(tested)
    ladder_md = (RESULTS / "scale-ladder" / "ladder.md").read_text()
    for t in tested:
        slope = f"{t['slope']:+.2f} [{t['slope_low']:+.2f}, {t['slope_high']:+.2f}]"
        (row,) = [r for r in rows if slope in r]
        assert t["verdict"] in row and f"slope {slope.replace(' [', '% per decade [')}" in ladder_md
    fit = next(f for f in page["pair_fits"] if f["multiplier"] is not None)
    (row,) = [r for r in rows if f"| {fit['architecture']} | {fit['method']} vs" in r and f"size at {fit['held']}" in r]
    assert f"{fit['multiplier']:.3g}x [" in row and f"{fit['predicted_gap']:+.3g}% [" in row
    doc = tmp_path / "README.md"
    doc.write_text("<!-- generated: ladder quickstart/report.json -->\n<!-- /generated -->\n")
    assert results_tables.main(["--check", "--records", str(RESULTS), str(doc)]) == 2
    assert "a 'report' page, not a 'ladder' page" in capsys.readouterr().err


def test_the_bound_field_is_the_one_sided_upper_bound_of_the_per_seed_gaps(results_tables):
    """{{RECORD METHOD bound}}: "the cost is below X%" for a claim its seeds could not power, from
    the same per-seed gaps the interval uses (one-sided 95%: inside the two-sided interval's top)."""
    from oelm.reports.stats import gap_upper_bound

    records = results_tables.Records(RESULTS)
    _, table, _ = records.get("twin-board/leaderboard.json", "test")
    table = table or records.get("twin-board/leaderboard.json", "test")[0].table(None, "test")
    gaps = table.group.versus_of("oelm-early-freeze").gap_paired
    text = results_tables.fill("{{twin-board/leaderboard.json oelm-early-freeze bound}}", records, "test")
    value = float(text.rstrip("%"))
    assert gaps.mean < value < gaps.ci_high
    a = gaps.std * ((gaps.n - 1) / gaps.n) ** 0.5  # n values at mean ± a have this mean and sample SD
    per_seed = [gaps.mean + (a if i % 2 else -a) for i in range(gaps.n)]
    assert gaps.n % 2 == 0 and value == pytest.approx(gap_upper_bound(per_seed), abs=0.005)


# ---------------------------------------------------------------- one vocabulary, recomputed

OLD_WORDS = re.compile(
    r"\b(underpowered|significant(ly)?|n\.s\.|recovered|disappears|marginally|roughly the same|on par"
    r"|(worse|better), resolved|resolved \((worse|better)\))(?![\w.])",
    re.I,
)


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


# A page written by code says so in its first lines; every other page under docs/ is hand-written.
GENERATED_PAGE = re.compile(
    r"Generated by|Regenerate with|do not edit by hand|generated, not hand-written|^# OELM comparison report"
    r"|^# Leaderboard|^# Confirmation of|^## Probes:",
    re.M,
)
# A measured gap or difference: a % or accuracy points, not a margin (±1%), a power or an interval's level.
RESULT_NUMBER = re.compile(
    r"(?<![±\w.])[+\-−]?\d+(?:\.\d+)?\s?%(?!\s?(?:power|CI|confidence|interval|prediction))"
    r"|\b\d+(?:\.\d+)? (?:accuracy )?points\b"
)
VERDICT_WORD = re.compile(r"\b(?:worse|better|equivalent|unresolved)\b", re.I)
# 'worse' / 'better' as a verdict is 'worse (resolved)' / 'better (resolved)'; 'equivalent' names its margin.
OFF_VOCABULARY = re.compile(
    r"\b(?:worse|better)\b(?!\s+\(resolved\))(?<!\+ = worse)(?<!lower is better)(?<!higher is better)"
    r"|\bequivalent\b(?! within ±)",
    re.I,
)
DEFINITION = re.compile(r"gap X\b|±M%")  # the vocabulary defined with placeholders, not a result
STAGE = re.compile(r"\bpilots?\b|\bconfirm(?:ation|ations|ed|s)?\b|\bsingle runs?\b", re.I)
REFERENCE = re.compile(r"\b(?:against|vs|than|reference|twins?|baseline|to)\b", re.I)


# The claims ledger quotes the study's own words ("better than the baseline") in its claim column and
# states once, above its tables, that every stored row of ours is a pilot; tests/test_claims_ledger.py
# keeps its rows.
NOT_CHECKED = ("docs/results/claims-ledger.md",)


def hand_written_pages(root: Path = ROOT) -> list[Path]:
    """README.md and every page under docs/ that no command writes (less NOT_CHECKED)."""
    pages = [
        p
        for p in sorted((root / "docs").rglob("*.md"))
        if p.relative_to(root).as_posix() not in NOT_CHECKED
        and not GENERATED_PAGE.search("\n".join(p.read_text().splitlines()[:8]))
    ]
    return [root / "README.md", *pages]


def _paragraphs(text: str) -> list[tuple[str, int]]:
    """TEXT's paragraphs, each with the part of TEXT it sits in: even parts are hand-written, odd
    ones a generated block (between `generated` comments). Fenced code and templates are dropped."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    parts = re.split(r"<!-- generated:.*?-->(.*?)<!-- /generated -->", text, flags=re.S)
    return [(p, i) for i, part in enumerate(parts) for p in re.split(r"\n\s*\n", part) if p.strip()]


def result_sentence_problems(text: str) -> list[str]:
    """Each sentence (or table row) of TEXT that states a result (a verdict word and a measured gap)
    but whose paragraph does not say whether it is a pilot or a confirmation or names no reference,
    and each hand-written one that words its verdict outside the vocabulary (generated text is
    worded by oelm's formatters). A table's paragraph includes its caption (the paragraphs either
    side); a generated block's is the whole block with the hand-written paragraphs either side."""
    paragraphs = _paragraphs(text)
    problems = []
    for i, (paragraph, part) in enumerate(paragraphs):
        generated = part % 2 == 1
        lines = paragraph.strip().splitlines()
        table = all(line.lstrip().startswith("|") for line in lines)
        units = lines if table else re.split(r"(?<=[.;])\s+", " ".join(paragraph.split()))
        if generated:
            block = [j for j, (_, q) in enumerate(paragraphs) if q == part]
            context = " ".join(p for p, _ in paragraphs[max(0, block[0] - 1) : block[-1] + 2])
        else:
            context = " ".join(p for p, _ in paragraphs[max(0, i - 1) : i + 2]) if table else paragraph
        for unit in units:
            if not (VERDICT_WORD.search(unit) and RESULT_NUMBER.search(unit)) or DEFINITION.search(unit):
                continue
            missing = [
                what
                for what, pattern in (("pilot or confirmation", STAGE), ("reference", REFERENCE))
                if not pattern.search(context)
            ]
            bad = [] if generated else [m.group(0) for m in OFF_VOCABULARY.finditer(unit)]
            if missing or bad:
                why = ", ".join([*(f"no {w}" for w in missing), *(f"{b!r} outside the vocabulary" for b in bad)])
                problems.append(f"{why}: {unit.strip()[:160]}")
    return problems


def test_every_result_sentence_states_its_stage_reference_and_verdict():
    """Every result sentence of README.md and the hand-written docs says whether it is a pilot (the
    seeds that chose the LR) or a confirmation (fresh seeds through `oelm confirm`), names its
    reference, and words its verdict as worse / better (resolved), equivalent within ±m% or
    unresolved (...): never a bare 'worse' or 'equivalent' beside a number."""
    found = [
        f"{p.relative_to(ROOT)}: {q}" for p in hand_written_pages() for q in result_sentence_problems(p.read_text())
    ]
    assert not found, "result sentences to complete:\n" + "\n".join(found)


def test_the_result_sentence_check_catches_what_it_should():
    """The check above fails on a bare verdict, a missing stage or a missing reference, and passes
    the same sentence completed; generated pages are not in its scope."""
    bad = [
        "Frozen Q/K are worse than their twins by 11-42% where it resolves.",  # no stage, bare 'worse'
        "oelm-freeze: +4.11% [+0.72, +7.51], worse (resolved).",  # no stage, no reference
        "A pilot: oelm-freeze is equivalent to the baseline at +0.3%.",  # equivalence without its margin
    ]
    for sentence in bad:
        assert result_sentence_problems(sentence), sentence
    good = "A pilot: oelm-freeze against the baseline +4.11% [+0.72, +7.51], worse (resolved)."
    assert result_sentence_problems(good) == []
    table = "Pilot rows against the baseline:\n\n| arm | gap |\n|---|---|\n| oelm-freeze | +4.11%: worse (resolved) |\n"
    assert result_sentence_problems(table) == []
    assert result_sentence_problems(table.replace("Pilot rows", "Rows")) != []
    pages = hand_written_pages()
    assert ROOT / "README.md" in pages and RESULTS / "README.md" in pages
    assert RESULTS / "quickstart" / "report.md" not in pages and RESULTS / "leaderboard.md" not in pages


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
    return page_sections(tmp_path / "out" / "report.json")


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
    assert (
        main(["report", "--view", "board", str(folder), "--out", str(tmp_path / "board"), "--baseline", "baseline"])
        == 0
    )
    md = (tmp_path / "board" / "leaderboard.md").read_text()
    assert (tmp_path / "board" / "pareto.png").is_file() and "Reference: **baseline**" in md
    assert "mean per-seed gap vs its same-init trainable twin" in md and "vs oelm-nofreeze: " in md
    table = page_sections(tmp_path / "board" / "leaderboard.json")["tables"][0]
    freeze = next(e for e in table["ranked"] if e["method"] == "oelm-freeze")
    assert freeze["verdict"] == "worse (resolved)" and freeze["twin"] == "oelm-nofreeze"
    assert freeze["twin_verdict"] is not None


def test_the_pair_field_is_the_declared_primary_comparison_recomputed(results_tables):
    """{{RECORD METHOD pair}}: a method's declared primary comparison, against its own control (not
    the table's reference), recomputed from the per-seed values with Holm over the primary family."""
    records = results_tables.Records(RESULTS)
    board = page_sections(RESULTS / "ladder/llama-d64-confirm/leaderboard.json")["tables"][0]
    by_seed = {e["method"]: e["by_seed"] for e in board["ranked"]}
    gaps = [100 * (by_seed["identity-q"][s] / by_seed["baseline"][s] - 1) for s in by_seed["baseline"]]
    text = results_tables.fill("{{ladder/llama-d64-confirm/leaderboard.json identity-q pair}}", records, "test")
    assert text.startswith(f"{sum(gaps) / len(gaps):+.2f}% [") and "vs baseline: " in text
    assert text.endswith("(resolved) [primary]")
    none = results_tables.fill("{{ladder/llama-d64-confirm/leaderboard.json baseline pair}}", records, "test")
    assert none == results_tables.NA  # the baseline is no pair's frozen arm
