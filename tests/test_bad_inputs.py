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
