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
    from oelm.cli.report import view_margin
    from oelm.reports.finetune import MARGIN_POINTS

    assert view_margin(argparse.Namespace(view="finetune", margin=None)) == MARGIN_POINTS
    assert view_margin(argparse.Namespace(view="report", margin=None)) == MARGIN


@pytest.mark.parametrize(
    ("argv", "new"),
    [
        (["report", "--view", "finetune", "d", "--reference", "baseline"], "--baseline"),
        (["report", "--view", "finetune", "d", "--margin-points", "0.5"], "--margin"),
        (["report", "d", "--reference", "baseline"], "--baseline"),
        (["report", "--view", "board", "d", "--out", "o", "--reference", "baseline"], "--baseline"),
        (["confirm", "plan", "d", "--out", "o", "--reference", "baseline"], "--baseline"),
        (["report", "--view", "board", "d", "--out", "o", "--margin-points", "1"], "--margin"),
    ],
)
def test_old_flag_spellings_are_refused_with_one_line_naming_the_new_flag(argv, new, capsys) -> None:
    """One name per concept (issue 50): the control arm is --baseline and the margin --margin in
    every command; an old spelling stops before any work with one line naming its replacement."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"is now {new} " in err[0] and f"pass {new}" in err[0]


def test_every_comparing_command_takes_baseline_and_margin() -> None:
    from oelm.cli import build_parser

    parser = build_parser()
    for argv in (
        ["report", "--view", "finetune", "d", "--out", "o"],
        ["report", "d"],
        ["report", "--view", "board", "d", "--out", "o"],
        ["confirm", "plan", "d", "--out", "o"],
    ):
        args = parser.parse_args([*argv, "--baseline", "arm", "--margin", "0.25"])
        assert (args.baseline, args.margin) == ("arm", 0.25), argv


@pytest.mark.parametrize(
    ("old", "view"), [("leaderboard", "board"), ("finetune-board", "finetune"), ("ladder", "ladder")]
)
def test_the_commands_the_views_replaced_are_refused_naming_the_view(old, view, capsys) -> None:
    """One report (issue 50): `oelm leaderboard`, `finetune-board` and `ladder` are views of
    `oelm report`; the old command, with whatever flags it had, stops with one line naming the view."""
    assert main([old, "d", "--out", "o", "--seeds", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"oelm: error: `oelm {old}` is now `oelm report --view {view}` (same flags, same page); run that"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--view", "ladder", "--baseline", "x"], "--baseline"),
        (["--view", "ladder", "--margin", "2"], "--margin"),
        (["--view", "report", "--seeds", "1"], "--seeds"),
        (["--view", "finetune", "--study-numbers", "s.yaml"], "--study-numbers"),
        (["--view", "confirmation", "--baseline", "x"], "--baseline"),
    ],
)
def test_a_flag_another_view_reads_is_refused_not_ignored(argv, flag, tmp_path, capsys) -> None:
    assert main(["report", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"oelm: error: {flag} is read by the ")


# Building the parser, `--version` and every `--help` (nested commands too) in a fresh interpreter,
# then the heavy packages it left in sys.modules: the commands load the library only when they run.
_HELP_EVERYWHERE = """
import argparse, contextlib, io, json, sys
from oelm.cli import build_parser, main

def paths(parser, prefix):
    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            shown = {a.dest for a in action._choices_actions}  # the replaced commands' refusals are hidden
            for name, sub in action.choices.items():
                if name in shown:
                    yield from paths(sub, [*prefix, name])

lines = [["--version"]] + [[*p, "--help"] for p in paths(build_parser(), [])]
for argv in lines:
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv
print(json.dumps({"lines": lines, "heavy": [m for m in sys.argv[1:] if m in sys.modules]}))
"""
# pydantic too: not heavy like torch, but ~0.25 s of a 0.5 s budget on 2 cores (the train flags come
# from cli/train_flags.json instead). How long the answers take: benchmarks/cli_startup.py.
HEAVY = ["torch", "transformers", "matplotlib", "scipy", "statsmodels", "numpy", "datasets", "peft", "pydantic"]


def test_help_and_version_import_no_heavy_module() -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _HELP_EVERYWHERE, *HEAVY], capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert ["train", "--help"] in seen["lines"] and ["prepare", "lm", "--help"] in seen["lines"]
    assert ["confirm", "plan", "--help"] in seen["lines"] and len(seen["lines"]) >= 15
    assert seen["heavy"] == [], (
        f"building the parser imported {seen['heavy']}: import the library inside the command's function "
        "(cli/ convention) and give the parser a light source for what it needs"
    )


def test_stored_train_flags_match_the_config_fields() -> None:
    from oelm.cli.train import config_flags, stored_flags

    assert stored_flags() == config_flags(), (
        "src/oelm/cli/train_flags.json is out of date with TrainConfig's fields: run `python -m oelm.cli.train`"
    )
