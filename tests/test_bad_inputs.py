"""Bad inputs across every command: one clear error line, exit code 2, no traceback, nothing left behind.

A fixed sample of the generated cases in tests/bad_input_cases.py (scripts/fault_suite.py runs all).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bad_input_cases import all_cases, run_case

CASES = [c for c in all_cases() if c.ci]
# Every third case keeps CI fast while each command and kind of fault stays represented.
SAMPLE = CASES[::3]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-inputs")


def test_the_generator_covers_every_command() -> None:
    prefixes = {c.id.split("-")[0] for c in all_cases()}
    assert len(all_cases()) >= 100
    assert {"prepare", "train", "cls", "sample", "report", "params", "methods", "sweep", "compare"} <= prefixes


@pytest.mark.parametrize("case", SAMPLE, ids=[c.id for c in SAMPLE])
def test_bad_input_gives_one_clear_line(case, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # study configs are repo-relative
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        outcome = run_case(case, root)
    finally:
        torch.set_num_threads(threads)
    assert outcome.ok, f"{case.id}: {outcome.problems}\n{outcome.stderr}"


OUT_IS_A_FILE = [c for c in CASES if "-out-is-a-file" in c.id or "-out-under-a-file" in c.id]


@pytest.mark.parametrize("case", OUT_IS_A_FILE, ids=[c.id for c in OUT_IS_A_FILE])
def test_an_out_that_is_a_file_is_refused_before_the_records_are_read(case, root: Path, monkeypatch) -> None:
    """Every page a command writes from stored records: an --out that is a file, or lies under one,
    is one line naming it (the ladder's refusal comes before its minutes of bootstrap refits); the
    file is left as it was. (All of them, not every third: each is a different writer.)"""
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    outcome = run_case(case, root)
    assert outcome.ok, f"{case.id}: {outcome.problems}\n{outcome.stderr}"
    assert (root / "afile").read_text() == "keep\n"
