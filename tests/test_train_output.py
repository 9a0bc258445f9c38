"""What `oelm train` says while it runs: validation results as they come, the split of its final
number, a warning when there is no test split, and --data that is not a prepared folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from oelm.cli import main
from test_sweep import TINY
from train_utils import synthetic_lm_dir


def train(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture, name: str = "run") -> tuple[int, str, str]:
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({**TINY, "data": str(data), "out": str(tmp_path / name), "progress": True}))
    code = main(["train", str(config)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validation_results_print_as_they_come_and_the_final_split_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, out, err = train(tmp_path, synthetic_lm_dir(tmp_path / "no-test", test=False), capsys)
    assert code == 0
    warning = next(line for line in err.splitlines() if "has no test split" in line)
    assert warning.startswith("oelm: warning: ") and "--test-fraction" in warning
    evals = re.findall(r"step (\d+)/6: validation loss (\S+), perplexity (\S+)", err)
    assert [int(step) for step, *_ in evals] == [3, 6]  # eval_every 3, and the last step
    assert all(len(loss.rstrip(",").replace(".", "").lstrip("0")) <= 4 for _, loss, _ in evals)  # 4 digits
    assert "(best so far)" in err and err.index("has no test split") < err.index("step 3/6: validation")
    final = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r".*run: val_perplexity = \d+(\.\d{1,3})? on the validation split, which also chose the checkpoint: "
        r"not a held-out number \(no test split\), best validation checkpoint \(step \d\); freeze_check ok = True",
        final,
    ), final

    code, out, err = train(tmp_path, synthetic_lm_dir(tmp_path / "with-test"), capsys, name="held")
    assert code == 0 and "has no test split" not in err
    final = out.strip().splitlines()[-1]
    assert re.fullmatch(r".*held: test_perplexity = \S+ on the test split \(official split\), .*", final), final


def test_data_that_is_not_a_prepared_folder_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = tmp_path / "stories.txt"
    text.write_text("Once upon a time.\n", encoding="utf-8")
    code, _, err = train(tmp_path, text, capsys)
    assert code == 2
    assert f"--data '{text}' is a file, not a prepared data folder" in err
    assert f"`oelm prepare lm {text} --tokenizer TOK --out DIR`" in err
    code, _, err = train(tmp_path, tmp_path, capsys)  # a folder of text files
    assert code == 2 and "is a folder of text files (stories.txt" in err and "not a prepared data folder" in err
