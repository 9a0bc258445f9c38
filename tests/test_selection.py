"""Selection never touches held-out data: held-out changes leave every choice as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from oelm.experiments.runner import run_sweep
from oelm.experiments.sweep import spec_from_dict
from oelm.records import run as records
from oelm.records.load import load_run, load_runs
from oelm.reports.comparison import page_sections
from oelm.reports.report import write_report
from test_report import make_run
from test_sweep import TINY

ACC = {  # (method, lr): per-seed (validation best accuracy, held-out accuracy)
    ("baseline", 1e-4): [(0.80, 0.79), (0.81, 0.80), (0.79, 0.78)],
    ("baseline", 3e-4): [(0.84, 0.70), (0.85, 0.71), (0.83, 0.69)],
    ("oelm-freeze", 1e-4): [(0.78, 0.90), (0.77, 0.91), (0.79, 0.89)],
    ("oelm-freeze", 3e-4): [(0.82, 0.60), (0.83, 0.61), (0.81, 0.59)],
}


def _cls_sweep(root: Path) -> None:
    for (method, lr), seeds in ACC.items():
        for seed, (val, held) in enumerate(seeds):
            make_run(
                root,
                method,
                lr,
                seed,
                task="classification",
                best_accuracy=val,
                heldout_accuracy=held,
                collapsed=False,
                heldout_collapsed=False,
                primary_metric="heldout_accuracy",
                selection_metric="best_accuracy",
            )


def _edit(run: Path, **changes) -> None:
    path = run / "results.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _chosen(root: Path) -> dict[str, str]:
    _, comp = write_report([root], root / "report")
    return {a.method: a.setting for g in comp.groups for a in g.arms}


def _run(root: Path, method: str, lr: float, seed: int) -> Path:
    return root / "runs" / method / f"lr{lr:g}" / f"seed{seed}"


def test_heldout_changes_do_not_move_the_choice_but_validation_changes_do(tmp_path: Path) -> None:
    _cls_sweep(tmp_path)
    before = _chosen(tmp_path)
    assert before == {"baseline": "lr0.0003", "oelm-freeze": "lr0.0003"}  # best validation, worse held-out
    # Held-out collapse and held-out accuracies changed everywhere: information only.
    rng = np.random.default_rng(0)
    for run in tmp_path.glob("runs/*/lr*/seed*"):
        _edit(run, heldout_accuracy=float(rng.uniform(0.3, 0.6)), heldout_collapsed=True, majority_accuracy=0.95)
    assert _chosen(tmp_path) == before
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Held-out information" in md and "heldout_collapsed: true" in md
    # Collapse on validation makes the setting ineligible: the choice moves.
    _edit(_run(tmp_path, "oelm-freeze", 3e-4, 1), collapsed=True)
    assert _chosen(tmp_path)["oelm-freeze"] == "lr0.0001"
    # So does a worse validation score (the test can fail: validation does decide).
    _edit(_run(tmp_path, "baseline", 3e-4, 0), best_accuracy=0.5)
    assert _chosen(tmp_path)["baseline"] == "lr0.0001"


def test_failed_freeze_check_dominates_collapse_and_is_visible(tmp_path: Path) -> None:
    _cls_sweep(tmp_path)
    bad = _run(tmp_path, "oelm-freeze", 3e-4, 2)
    _edit(bad, collapsed=True, freeze_check={"ok": False})
    rec = load_run(bad)
    assert rec.status == records.INVALID and "freeze check failed" in rec.reason
    assert _chosen(tmp_path)["oelm-freeze"] == "lr0.0001"  # an invalid run makes its LR ineligible
    report = page_sections(tmp_path / "report" / "report.json")
    assert any("failed their freeze check" in w and "seed 2" in w for w in report["groups"][0]["warnings"])


def test_divergence_is_judged_on_validation(tmp_path: Path) -> None:
    run = make_run(tmp_path, "baseline", 1e-3, 0, test_perplexity=float("inf"), best_val_loss=1.5)
    assert load_run(run).status == records.COMPLETE  # held-out oddity: noted, not excluded
    assert "test_perplexity is inf" in records.heldout_note(load_run(run).results)
    _edit(run, best_val_loss=float("nan"))
    assert load_run(run).status == records.COLLAPSED


@pytest.mark.slow
def test_real_sweep_choice_is_unchanged_when_the_test_split_changes(tmp_path: Path) -> None:
    """Train a tiny sweep twice, on data that differ only in test.bin: same choices, other test numbers."""
    spec = {
        "name": "sel",
        "out": str(tmp_path / "a"),
        "prepare": {"source": "builtin:python-docs", "tokenizer": "byte", "max_docs": 20, "test_fraction": 0.2},
        "config": {**TINY, "steps": 4, "data": str(tmp_path / "data")},
        "methods": {"baseline": {"lr": [1e-3, 1e-2]}, "oelm-freeze": {"lr": [1e-3, 1e-2]}},
        "seeds": [0],
        "max_extend": 0,
    }
    first = run_sweep(spec_from_dict(spec), progress=False, threads=1)
    assert not first.failed
    # Same train/val, a different test split: the tokens of test.bin reversed.
    shutil.copytree(tmp_path / "data", tmp_path / "data2")
    test_bin = tmp_path / "data2" / "test.bin"
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    np.fromfile(test_bin, dtype=dtype)[::-1].copy().tofile(test_bin)
    second = run_sweep(
        spec_from_dict(
            {
                **spec,
                "out": str(tmp_path / "b"),
                "prepare": None,
                "config": {**spec["config"], "data": str(tmp_path / "data2")},
            }
        ),
        progress=False,
        threads=1,
    )
    arms = [{a.method: a for a in o.comparison.groups[0].arms} for o in (first, second)]
    assert {m: a.setting for m, a in arms[0].items()} == {m: a.setting for m, a in arms[1].items()}
    assert arms[0]["baseline"].primary.mean != arms[1]["baseline"].primary.mean  # test numbers moved
    # Every arm and every evaluation used one validation set: the same windows everywhere.
    results = [r.results for r in load_runs([tmp_path / "a" / "runs"])]
    assert len({r["val_tokens"] for r in results}) == 1
    assert all(r["best_val_loss"] == pytest.approx(r["val_loss"], rel=1e-4) for r in results)
    assert all(r["test_loss_se"] > 0 for r in results)
    # Each run stores its per-window test losses in window order: their mean is its test loss.
    for run in load_runs([tmp_path / "a" / "runs"]):
        items = run.test_items()
        losses = items["values"]
        assert items["metric"] == "test_loss" and len(losses) == run.results["test_windows"] > 1
        assert sum(losses) / len(losses) == pytest.approx(run.results["test_loss"], abs=1e-5)
    # The test split is a seeded hold-out of the training documents, and every record and report says so.
    assert {r["test_source"] for r in results} == {records.TEST_HOLDOUT}
    assert all(r["final_split"] == "test" and r["final_perplexity"] == r["test_perplexity"] for r in results)
    assert first.comparison.groups[0].splits["test_source"] == records.TEST_HOLDOUT
    assert records.TEST_HOLDOUT in (tmp_path / "a" / "report" / "report.md").read_text()
