"""A metric that is NaN or inf when a run finishes is named in its record, never silently dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oelm.records.run import classify, heldout_note, read_results
from oelm.training.lm import LMTask
from oelm.training.loop import train
from train_utils import one_thread, synthetic_lm_dir, tiny_config


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_test_metric_is_named_in_results_and_in_the_report_note(bad, tmp_path: Path, monkeypatch) -> None:
    original = LMTask.evaluate

    def evaluate(self, model, split, final):
        out = original(self, model, split, final)
        return {k: bad if isinstance(v, float) else v for k, v in out.items()} if split == "test" else out

    monkeypatch.setattr(LMTask, "evaluate", evaluate)
    with one_thread():
        train(tiny_config(synthetic_lm_dir(tmp_path / "data", n_train=2000), tmp_path / "run", steps=4))
    raw = json.loads((tmp_path / "run" / "results.json").read_text())  # strict JSON: no NaN tokens
    assert raw["test_perplexity"] is None and "test_perplexity" in raw["non_finite"]
    results = read_results(tmp_path / "run")
    assert classify(results)[0] == "complete"  # selection is on validation, which is finite
    assert "test_perplexity is not a finite number" in heldout_note(results)


def test_the_note_reads_a_null_primary_metric_of_older_records_and_finite_ones_stay_silent() -> None:
    older = {"primary_metric": "test_accuracy", "test_accuracy": None}
    assert "not a finite number" in heldout_note(older)
    assert heldout_note({"primary_metric": "test_accuracy", "test_accuracy": 0.8}) == ""
    assert heldout_note({"primary_metric": "test_accuracy"}) == ""  # not recorded at all: nothing to say


def test_a_compact_record_of_a_run_with_non_finite_values_is_strict_json(tmp_path: Path) -> None:
    from oelm.records.compact import dump_record
    from oelm.records.run import RunRecord

    run = RunRecord(
        path=tmp_path,
        status="collapsed",
        results={"status": "diverged", "best_val_loss": float("nan"), "diverged_loss": float("inf")},
        _metrics=[{"kind": "eval", "step": 5, "val_loss": float("nan")}],
        _items={},
    )
    record = json.loads(dump_record(run), parse_constant=lambda c: pytest.fail(f"{c} in a record"))
    assert record["results"]["best_val_loss"] is None and record["evals"][0]["val_loss"] is None
