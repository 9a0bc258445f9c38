"""The sweep/compare summary written to a pipe or a file: one line per line, no hard wraps or padding."""

from __future__ import annotations

from pathlib import Path

from oelm.records.load import load_runs
from oelm.reports.aggregate import compare
from oelm.reports.report import print_summary
from test_report import make_run


def test_summary_to_a_file_is_not_hard_wrapped(tmp_path: Path, capsys) -> None:
    for seed in range(3):
        make_run(tmp_path, "baseline", 1e-3, seed, test_perplexity=20.0 + seed, best_val_loss=3.0)
        make_run(tmp_path, "oelm-freeze", 1e-3, seed, test_perplexity=21.0 + seed * 1.3, best_val_loss=3.05)
    print_summary(compare(load_runs([tmp_path]), baseline="baseline"))
    out = capsys.readouterr().out  # captured: not a terminal
    verdicts = [line for line in out.splitlines() if line.startswith("verdict:")]
    # A verdict is several sentences: one line each, longer than the 100-column summary width.
    assert verdicts and all(len(line) > 100 for line in verdicts)
    assert not [line for line in out.splitlines() if line != line.rstrip()]  # no trailing padding
