"""docs/results/claims-ledger.md answers every claim of the study: a verdict or a command per row.

Each row of the ledger's tables is one claim of the earlier study. A row either carries a
measurement of ours with its verdict in the project's vocabulary and a link to the page holding
it, or says why there is none and gives the command that would measure it. Its links resolve, its
commands parse (oelm's own parser; a benchmark's flags are the ones its script defines) and name
files that exist. Its numbers of ours are generated blocks, kept current by
tests/test_results_docs.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from oelm.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
LEDGER = ROOT / "docs" / "results" / "claims-ledger.md"
VERDICT = re.compile(
    r"worse \(resolved\)|better \(resolved\)|equivalent within ±[\d.]+%|unresolved \(smallest detectable gap [\d.]+%"
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]+)`")
COLUMNS = ["#", "claim", "source", "study", "ours", "verdict", "where"]


def _rows(text: str) -> list[dict[str, str]]:
    """The claim rows of the generated tables (what the reader sees, not the templates)."""
    rows = []
    for body in re.findall(r"\n-->\n(.*?)<!-- /generated -->", text, re.S):
        for line in body.splitlines():
            if re.match(r"\| [A-Z]\d+[a-z]? \|", line):
                cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
                assert len(cells) == len(COLUMNS), f"row with {len(cells)} cells, not {len(COLUMNS)}: {line[:80]}"
                rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


@pytest.fixture(scope="module")
def text() -> str:
    return LEDGER.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def rows(text: str) -> list[dict[str, str]]:
    return _rows(text)


def _commands(cell: str) -> list[str]:
    """The commands quoted in a cell: `oelm ...` and `python -m benchmarks....`."""
    return [c for c in CODE.findall(cell) if c.startswith(("oelm ", "python -m benchmarks."))]


def _problems(r: dict[str, str]) -> list[str]:
    """What a row lacks: a source, a measurement or reason, a verdict with its page, or a command."""
    out = []
    if not all(r[k] for k in COLUMNS):
        out.append("an empty cell")
    if not (re.search(r"`(final|phase[234]|medium512)`", r["source"]) or r["source"].startswith("as ")):
        out.append("no source report named")
    if VERDICT.search(r["verdict"]):
        if not LINK.search(r["where"]):
            out.append("a verdict without a link to the page holding it")
    elif r["verdict"] != "—":
        out.append(f"verdict {r['verdict']!r} is not in the vocabulary")
    elif not _commands(r["where"]):
        out.append("no verdict and no command that would measure it")
    return out


def test_every_row_has_a_verdict_with_its_page_or_a_command(rows):
    assert len(rows) >= 30
    ids = [r["#"] for r in rows]
    assert len(ids) == len(set(ids)), "claim ids repeat"
    problems = [f"row {r['#']}: {p}" for r in rows for p in _problems(r)]
    assert not problems, "\n".join(problems)
    assert sum(bool(VERDICT.search(r["verdict"])) for r in rows) >= 10  # measurements, not only commands


def test_a_row_that_answers_nothing_is_caught():
    """A made-up row with neither a verdict nor a command, and one with an old word, are refused."""
    line = "| Z1 | a claim | `final` §1 | 1 → 2 | none: no data | {} | {} |"
    text = "<!-- generated: template x\n-->\n{}\n{}\n<!-- /generated -->".format(
        line.format("—", "not measured"), line.format("significant", "[page](README.md)").replace("Z1", "Z2")
    )
    bare, worded = _rows(text)
    assert _problems(bare) == ["no verdict and no command that would measure it"]
    assert _problems(worded) == ["verdict 'significant' is not in the vocabulary"]
    fixed = {**bare, "where": "`oelm sweep configs/sweeps/xnli-gpt-medium.yaml`"}
    assert _problems(fixed) == []


def test_the_study_numbers_of_every_experiment_are_in_the_ledger(text):
    """Each single-run figure the study reported (configs/study/study_numbers.yaml) has its row."""
    numbers = yaml.safe_load((ROOT / "configs" / "study" / "study_numbers.yaml").read_text())["experiments"]
    missing = [name for name, e in numbers.items() if f"{e['value']:.2f}" not in text]
    assert not missing, f"study experiments with no row in the ledger: {missing}"
    for claim in ("+11.60 points", "-57.1%", "+14.9%", "+15.5%", "98.5%", "+1.08 points", "+19%", "+16.4%"):
        assert claim in text, claim


def test_links_resolve(text):
    links = LINK.findall(text)
    assert links
    broken = [t for t in links if not t.startswith("http") and not (LEDGER.parent / t.split("#")[0]).exists()]
    assert not broken, f"links to nothing: {broken}"


def test_every_command_parses_and_names_existing_files(rows):
    commands = {c for r in rows for c in _commands(r["where"])}
    assert any(c.startswith("oelm sweep") for c in commands) and any("benchmarks." in c for c in commands)
    parser = build_parser()
    for command in sorted(commands):
        argv = shlex.split(command)
        if argv[0] == "oelm":
            try:
                args = parser.parse_args(argv[1:])
            except SystemExit:
                pytest.fail(f"`{command}` does not parse")
            if argv[1] == "sweep":  # the spec itself is validated by tests/test_sweep_specs.py
                assert (ROOT / args.spec).is_file(), command
            if argv[1] == "report":
                assert all((ROOT / p).is_dir() for p in args.paths), command
        else:
            module = ROOT / Path(*argv[2].split(".")).with_suffix(".py")
            assert module.is_file(), command
            source = module.read_text()
            unknown = [a for a in argv[3:] if a.startswith("--") and f'"{a}"' not in source]
            assert not unknown, f"`{command}`: {module.name} defines no {unknown}"
