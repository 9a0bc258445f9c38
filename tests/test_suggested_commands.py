"""Every command the toolkit suggests is accepted on the state that suggested it.

A verdict's `oelm confirm plan` line (report, terminal summary, leaderboard), the `oelm compare`
extend command, and the way out that a refused run folder names: each is taken from the output
as printed, run through `oelm.cli.main` on that same state, and must not be refused.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from oelm.cli import main
from oelm.experiments.sweep import confirm_command
from oelm.reports.report import print_summary, write_report
from test_report import make_run
from test_sweep import TINY
from train_utils import synthetic_lm_dir

BASE = [10.0, 10.2, 9.9]
COMMAND = re.compile(r"`(oelm [^`]+)`")
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\.\.\.")  # SWEEP_DIR, SPEC.yaml's SPEC, "..."


def pilot(root: Path, gaps: dict[str, list[float]]) -> Path:
    """A finished pilot sweep (run-directory schema and sweep.yaml): per method, its per-seed gaps."""
    for seed, ppl in enumerate(BASE):
        make_run(root, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5)
        for method, gap in gaps.items():
            make_run(root, method, 3e-3, seed, test_perplexity=ppl * (1 + gap[seed]), best_val_loss=1.6)
    methods = {"baseline": {"lr": [1e-3]}} | {m: {"lr": [3e-3]} for m in gaps}
    base = {**TINY, "data": str(synthetic_lm_dir(root.parent / f"{root.name}-data"))}
    record = {"name": root.name, "base": base, "methods": methods, "seeds": [0, 1, 2], "grid": {}}
    (root / "sweep.yaml").write_text(yaml.safe_dump({**record, "baseline": "baseline"}))
    return root


def suggested(text: str, verb: str) -> list[str]:
    """The runnable `oelm VERB ...` commands quoted in `text` (placeholders excluded), once each."""
    # A console wraps long lines where output is not a terminal: a command may span two lines.
    found = [" ".join(c.split()) for c in COMMAND.findall(text)]
    found = [c for c in found if c.startswith(f"oelm {verb} ") and not PLACEHOLDER.search(c)]
    return list(dict.fromkeys(found))


def accepted(command: str, capsys: pytest.CaptureFixture) -> str:
    """Run a suggested command as typed; it must exit 0. Returns what it printed."""
    code = main(shlex.split(command)[1:])
    out = capsys.readouterr()
    assert code == 0, f"suggested `{command}` was refused (exit {code}): {out.err.strip()}"
    return out.out


PILOTS = {
    # oelm-freeze resolved worse, oelm-qknorm unresolved: a plain plan and an --all plan
    "mixed": {"oelm-freeze": [0.10, 0.11, 0.09], "oelm-qknorm": [0.03, -0.02, 0.01]},
    # every verdict unresolved: a plain `oelm confirm plan` has no claim to confirm
    "unresolved": {"oelm-freeze": [0.03, -0.02, 0.01]},
}


@pytest.mark.parametrize("kind", list(PILOTS))
def test_a_verdicts_confirm_plan_is_accepted(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # `confirm plan` names its pilot relative to the working directory
    sweep = pilot(tmp_path / "pilot", PILOTS[kind])
    extend = confirm_command(sweep)  # what `oelm sweep` and `oelm compare` quote
    report, comparison = write_report([sweep], extend=extend)
    print_summary(comparison, extend)
    printed = capsys.readouterr().out
    lines = [line for line in (report.read_text() + printed).splitlines() if suggested(line, "confirm plan")]
    assert lines, "the verdicts suggest no runnable `oelm confirm plan`"
    for line in lines:
        out = accepted(suggested(line, "confirm plan")[0], capsys)
        # The plan covers the arm whose verdict line suggested it.
        named = [m for m in PILOTS[kind] if m in line.removeprefix("verdict: ").split(":")[0]]
        assert named and all(f" {m} (lr " in out for m in named), (line, out)
        shutil.rmtree(f"{sweep}-confirm")  # each suggestion on the state that made it

    assert main(["report", "--view", "board", str(sweep), "--out", str(tmp_path / "board")]) == 0
    board = (tmp_path / "board" / "leaderboard.md").read_text()
    capsys.readouterr()
    assert suggested(board, "confirm plan"), "the leaderboard's pilot lines suggest no runnable command"
    for command in suggested(board, "confirm plan"):
        accepted(command, capsys)
        shutil.rmtree(f"{sweep}-confirm")


FLAG = re.compile(r"(?:pass|choose another) (--[a-z-]+)")


def refusal(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """The one error line of a refused `oelm` call."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("oelm: error: ") and "\n" not in err
    return err


def test_a_refused_run_folders_way_out_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The same settings again: --resume and --overwrite. Other settings: another --out or --overwrite
    (never --resume, which continues only the same settings and would be refused too)."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**TINY, "data": str(synthetic_lm_dir(tmp_path / "data")), "progress": False}))
    out = tmp_path / "run"
    first = ["train", str(config), "--out", str(out)]
    assert main(first) == 0
    capsys.readouterr()

    for argv in (first, [*first, "lr=0.01"]):
        err = refusal(argv, capsys)
        flags = FLAG.findall(err)
        assert flags and set(flags) <= {"--resume", "--overwrite", "--out"}, err
        assert ("--resume" in flags) == (argv == first), err
        for flag in flags:
            extra = ["--out", str(tmp_path / "elsewhere")] if flag == "--out" else [flag]
            accepted("oelm " + shlex.join([*argv, *extra]), capsys)
            shutil.rmtree(tmp_path / "elsewhere", ignore_errors=True)
            if flag == "--overwrite" and argv != first:  # the folder now holds the lr=0.01 run
                assert main([*first, "--overwrite"]) == 0  # put the original run back for the next case
                capsys.readouterr()


@pytest.mark.slow
def test_the_compare_extend_command_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`oelm compare`'s verdicts quote `oelm confirm plan` on its own (default) output folder, also for a
    preset file whose `name` differs from its file name and that names no `out`."""
    from test_compare import tiny_preset

    monkeypatch.chdir(tmp_path)
    preset = tiny_preset(tmp_path, name="tiny-regime", out=None)
    preset.rename("preset.yaml")
    assert main(["compare", "--preset", "preset.yaml", "--parallel", "2"]) == 0
    printed = capsys.readouterr().out
    commands = suggested(printed + Path("runs/compare/tiny-regime/report/report.md").read_text(), "confirm plan")
    assert commands and all(" runs/compare/tiny-regime " in c for c in commands), commands
    for command in commands:
        accepted(command, capsys)
        shutil.rmtree("runs/compare/tiny-regime-confirm")


def test_a_text_files_prepare_line_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--data naming a text file: the error's `oelm prepare lm FILE --tokenizer TOK --out DIR`, filled
    in, prepares a folder that the same training then accepts."""
    text = tmp_path / "stories.txt"
    text.write_text("\n\n".join(f"story {i}: " + "the cat sat on the mat. " * 12 for i in range(300)), encoding="utf-8")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**TINY, "progress": False}))
    argv = ["train", str(config), "--out", str(tmp_path / "run")]
    err = refusal([*argv, "--data", str(text)], capsys)
    (command,) = suggested(err.replace("TOK", "byte").replace("DIR", str(tmp_path / "prepared")), "prepare lm")
    accepted(command, capsys)
    accepted("oelm " + shlex.join([*argv, "--data", str(tmp_path / "prepared")]), capsys)
