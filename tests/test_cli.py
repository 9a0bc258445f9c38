"""The `oelm` command's front: --version, help, and an unknown command."""

from __future__ import annotations

from importlib.metadata import version

import pytest

import oelm
from oelm.cli import main


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"oelm {oelm.__version__}"
    assert oelm.__version__ == version("oelm")  # pyproject reads it from oelm.__version__


def test_unknown_command_is_one_line_and_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trian"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trian" in err[0] and "--help" in err[0]


def test_quiet_silences_notes_and_keeps_warnings(tmp_path, capsys) -> None:
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(f"doc {i} words" for i in range(50)))
    assert main(["prepare", "lm", str(src), "--tokenizer", "byte", "--out", str(tmp_path / "loud")]) == 0
    assert "prepared" in capsys.readouterr().err
    assert main(["-q", "prepare", "lm", str(src), "--tokenizer", "byte", "--out", str(tmp_path / "quiet")]) == 0
    assert capsys.readouterr().err == ""
    import logging

    logging.getLogger("oelm.data.lm").warning("something to see")
    assert capsys.readouterr().err.strip() == "oelm: warning: something to see"


def test_the_margin_flag_default_is_the_library_default() -> None:
    import argparse

    from oelm.cli import add_margin_flag
    from oelm.reports.stats import MARGIN

    parser = argparse.ArgumentParser()
    add_margin_flag(parser)
    assert parser.parse_args([]).margin == MARGIN
