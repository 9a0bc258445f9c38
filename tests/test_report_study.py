"""The study's figures beside ours in `oelm report`: its gap beside our gap and verdict, and its
perplexity beside ours only for the same tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from oelm.reports.comparison import page_sections
from oelm.reports.report import print_summary, write_report
from test_report import make_run

REPO = Path(__file__).resolve().parents[1]
NUMBERS = REPO / "configs" / "study" / "study_numbers.yaml"
BASE = [10.0, 10.2, 9.9]
GAPS = [0.01, 0.03, 0.02]  # oelm-freeze 1-3% worse per seed


def sweep(root: Path, tokenizer: str | None) -> Path:
    extra = {} if tokenizer is None else {"tokenizer": tokenizer}
    for seed, ppl in enumerate(BASE):
        make_run(root, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5, **extra)
        freeze = ppl * (1 + GAPS[seed])
        make_run(root, "oelm-freeze", 3e-3, seed, test_perplexity=freeze, best_val_loss=1.6, **extra)
    return root


def section(text: str) -> str:
    return text.split("### Beside the original study", 1)[1].split("\n### ", 1)[0]


def rows(text: str) -> dict[str, list[str]]:
    out = {}
    for line in section(text).splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] in {"baseline", "oelm-freeze"}:
            out[cells[0]] = cells
    return out


@pytest.mark.parametrize("tokenizer", ["byte", None])
def test_a_byte_level_sweep_shows_the_studys_gap_not_its_perplexity(tmp_path: Path, tokenizer) -> None:
    md, comparison = write_report([sweep(tmp_path / "s", tokenizer)], tmp_path / "rep", study_numbers=NUMBERS)
    text = md.read_text()
    table = rows(text)
    base, freeze = table["baseline"], table["oelm-freeze"]
    # the study's gap, computed from its own two runs: 4.69 vs 4.27 PPL = +9.84%, beside ours
    assert freeze[4] == "+9.84% (GPT-02 vs GPT-01)"
    # the mean per-seed gap (the gap of the means is +2.01%)
    assert freeze[5].startswith("+2.00% [") and freeze[6].startswith("unresolved")
    assert freeze[1].startswith("GPT-02 (gpt-medium-512, lr 0.001, 100,000 steps")
    assert base[2] == "4.27 PPL, GPT-2 BPE" and base[4] == "0 (reference)"
    # its perplexity is GPT-2 BPE; ours byte-level (or not recorded): never side by side
    for row in (base, freeze):
        assert row[3].startswith("not comparable ("), row
    why = "different units" if tokenizer else "did not record their tokenizer"
    assert why in freeze[3]
    # 9.84% lies above our paired interval (gaps of 1-3%)
    assert freeze[7] == "no"
    # the main table no longer places the study's perplexity in a column of ours
    main = text.split("### Beside the original study")[0]
    assert "4.27" not in main and "study (reported)" not in main
    data = page_sections(md.parent / "report.json")["groups"][0]["study"]
    assert [r["study_id"] for r in data] == ["GPT-01", "GPT-02"]
    assert data[1]["study_gap"] == pytest.approx((4.69 / 4.27 - 1) * 100) and data[1]["comparable"] is False


def test_a_bpe_sweep_shows_the_studys_perplexity_beside_ours(tmp_path: Path, capsys) -> None:
    md, comparison = write_report([sweep(tmp_path / "s", "gpt2")], tmp_path / "rep", study_numbers=NUMBERS)
    base, freeze = rows(md.read_text())["baseline"], rows(md.read_text())["oelm-freeze"]
    assert base[2] == "4.27 PPL, GPT-2 BPE" and base[3].startswith("10.03 ± ") and base[3].endswith("GPT-2 BPE")
    assert freeze[3].startswith("10.") and "not comparable" not in freeze[3]
    # the terminal summary of a sweep carries the same: the study's gap beside ours, and its values
    print_summary(comparison)
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("oelm-freeze") and "GPT-02 vs GPT-01" in x)
    assert "+9.84%" in line and "+2.00%" in line and "unresolved" in line
    assert "study 4.69 PPL, GPT-2 BPE (GPT-02); ours 10." in out


def test_a_byte_level_summary_says_not_comparable(tmp_path: Path, capsys) -> None:
    _, comparison = write_report([sweep(tmp_path / "s", "byte")], tmp_path / "rep", study_numbers=NUMBERS)
    print_summary(comparison)
    out = capsys.readouterr().out
    assert (
        "the study's values (GPT-01 4.27 PPL, GPT-2 BPE; GPT-02 4.69 PPL, GPT-2 BPE) are not comparable with "
        "ours (different units: ours is byte-level perplexity, the study's GPT-2 BPE)"
    ) in " ".join(out.split())


def test_without_study_numbers_there_is_no_section(tmp_path: Path) -> None:
    md, _ = write_report([sweep(tmp_path / "s", "byte")], tmp_path / "rep")
    assert "Beside the original study" not in md.read_text()
