"""The fine-tuning board: accuracy points, test-set noise, Holm families, costs and dominance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from oelm.cli import main
from oelm.records import run as records
from oelm.reports import stats
from oelm.reports.comparison import page_sections
from oelm.reports.finetune import write_board

N = 400  # held-out examples


def cls_run(
    root: Path,
    method: str,
    seed: int,
    correct: np.ndarray,
    trainable: int,
    step: float,
    lr=1e-4,
    data="sst2",
    collapsed=False,
) -> None:
    """A finished classification run whose held-out accuracy is the mean of `correct`."""
    run = root / "runs" / method / f"lr{lr:g}" / f"seed{seed}"
    run.mkdir(parents=True)
    config = {"task": "classification", "data": data, "model": "minilm", "method": method, "seed": seed, "lr": lr}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "metrics.jsonl").write_text(
        json.dumps({"kind": "eval", "step": 10, "split": "val", "loss": 0.5, "accuracy": 0.8}) + "\n"
    )
    results = {
        "schema_version": 2,
        "status": "complete",
        "task": "classification",
        "method": method,
        "model": "minilm",
        "dataset": data,
        "seed": seed,
        "lr": lr,
        "steps": 10,
        "tokens_seen": 1000,
        "best_val_loss": 0.5,
        "best_step": 10,
        "total_wall_time": 5.0,
        "mean_step_time": step,
        "median_step_time": step,
        "tokens_per_second": 100.0,
        "peak_memory_bytes": 1000,
        "trainable_params": trainable,
        "frozen_params": 1000 - trainable,
        "freeze_check": {"ok": True},
        "git_commit": "abc",
        "device": "cpu",
        "heldout_accuracy": float(correct.mean()),
        "best_accuracy": 0.8,
        "final_val_loss": 0.5,
        "collapsed": collapsed,
        "primary_metric": "heldout_accuracy",
        "selection_metric": "best_accuracy",
        "higher_is_better": True,
    }
    (run / "results.json").write_text(json.dumps(results))
    items = {"metric": "heldout_accuracy", "unit": "example", "values": correct.astype(int).tolist()}
    (run / records.TEST_ITEMS_FILE).write_text(json.dumps(items))


def flip(base: np.ndarray, n: int, rng: np.random.Generator, to: int) -> np.ndarray:
    """`base` with n examples flipped to `to` (from the other value)."""
    out = base.copy()
    out[rng.choice(np.flatnonzero(base != to), n, replace=False)] = to
    return out


@pytest.fixture()
def board_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    root = tmp_path / "sweep"
    for seed in range(5):
        base = (rng.random(N) < 0.85).astype(int)
        cls_run(root, "baseline", seed, base, 1000, 1.0)
        cls_run(root, "freeze-qk", seed, flip(base, 40, rng, 0), 900, 0.95)  # 10 points worse
        cls_run(root, "bitfit", seed, base.copy(), 10, 0.6)  # identical predictions: equal
        cls_run(root, "freeze-vo", seed, flip(base, 40, rng, 0), 900, 0.99)  # worse and no cheaper
    return root


def test_board_reads_points_decides_holm_and_marks_dominated(board_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["report", "--view", "finetune", str(board_dir), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "freeze-qk: -10.00 points worse (resolved)" in printed
    board = page_sections(tmp_path / "out" / "board.json")["boards"][0]
    rows = {r["method"]: r for r in board["rows"]}
    assert rows["baseline"]["verdict"] == "reference"
    assert rows["freeze-qk"]["diff"] == pytest.approx(-10.0)
    assert rows["freeze-qk"]["diff_low"] < -10.0 < rows["freeze-qk"]["diff_high"]
    # Identical predictions: equivalence within ±0.5 points is shown (interval of width 0).
    assert rows["bitfit"]["verdict"] == "equivalent within ±0.5 points"
    # The family is the three arms against the reference.
    assert {rows[m]["m"] for m in ("freeze-qk", "bitfit", "freeze-vo")} == {3}
    assert rows["freeze-qk"]["holm_p"] >= rows["freeze-qk"]["p"]
    # Costs and dominance: bitfit keeps the accuracy at 1% of the parameters and less time.
    assert rows["bitfit"]["optimizer_bytes"] == 8 * 10 and rows["bitfit"]["step_ratio"] == pytest.approx(0.6)
    assert "bitfit" in rows["freeze-qk"]["dominated_by"] and rows["bitfit"]["dominated_by"] == []
    assert "bitfit" in rows["baseline"]["dominated_by"]  # same accuracy, cheaper in every cost
    # The exploratory family compares freeze-qk with every other arm and is labelled so.
    explore = {r["method"]: r for r in board["exploratory"]}
    assert set(explore) == {"bitfit", "freeze-vo"} and explore["bitfit"]["diff"] == pytest.approx(10.0)
    assert all(r["family"].startswith("exploratory") for r in explore.values())
    md = (tmp_path / "out" / "board.md").read_text()
    assert "freezing Q/K is dominated: bitfit" in md and "freeze-qk -10.00 points" in md
    assert "Exploratory family" in md and "(pareto.png)" in md and (tmp_path / "out" / "pareto.png").stat().st_size
    # Regenerating from the same records gives the same page.
    write_board([board_dir], tmp_path / "again")
    again = page_sections(tmp_path / "again" / "board.json")
    assert again["boards"] == page_sections(tmp_path / "out" / "board.json")["boards"]


def test_interval_includes_test_noise_even_when_seeds_agree(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    base = (rng.random(N) < 0.8).astype(int)
    worse = flip(base, 8, rng, 0)  # -2 points on every seed, identically
    for seed in range(3):
        cls_run(tmp_path / "s", "baseline", seed, base, 1000, 1.0)
        cls_run(tmp_path / "s", "lora", seed, worse, 10, 0.7)
    _, boards = write_board([tmp_path / "s"], tmp_path / "o")
    row = next(r for r in boards[0].rows if r.method == "lora")
    # The seeds agree exactly, yet the 400-example test set leaves a paired SE of the difference.
    se = np.std(worse - base, ddof=1) / np.sqrt(N) * 100
    assert row.diff == pytest.approx(-2.0) and row.diff_high - row.diff_low == pytest.approx(2 * 1.96 * se, rel=0.3)
    assert row.mde is not None and row.mde > 0


def test_the_difference_is_paired_by_seed_and_example() -> None:
    """Two arms that make the same predictions differ by exactly 0, with no width; one more right
    answer per seed moves the difference by 100 / N points on every seed."""
    a = np.array([[1, 0, 1, 1], [1, 1, 0, 1]], dtype=float) * 100
    same = stats.seeds_items_interval(a - a.copy())
    assert same.mean == 0 and same.ci_low == same.ci_high == 0 and same.p_value() is None and same.tost_p(0.5) == 0
    b = a.copy()
    b[:, 1] = 100  # the second example right on both seeds
    assert stats.seeds_items_interval(b - a).mean == pytest.approx(100 / 4 / 2)


def test_board_refuses_a_sweep_without_full_fine_tuning(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(2)
    for seed in range(2):
        cls_run(tmp_path / "s", "lora", seed, (rng.random(N) < 0.8).astype(int), 10, 0.7)
    assert main(["report", "--view", "finetune", str(tmp_path / "s"), "--out", str(tmp_path / "o")]) == 2
    assert "full fine-tuning" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_several_tasks_get_one_table_and_one_answer_across_them(board_dir: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    other = tmp_path / "agnews"
    for seed in range(5):
        base = (rng.random(N) < 0.9).astype(int)
        cls_run(other, "baseline", seed, base, 1000, 1.0, data="ag_news")
        cls_run(other, "freeze-qk", seed, base.copy(), 900, 0.95, data="ag_news")  # the same predictions
        cls_run(other, "bitfit", seed, flip(base, 4, rng, 0), 10, 0.6, data="ag_news")  # 1 point worse
    write_board([board_dir, other], tmp_path / "out")
    md = (tmp_path / "out" / "board.md").read_text()
    table = md.split("## Across the tasks")[1].split("## ag_news")[0]
    assert "| method | trainable (share of full fine-tuning) | ag_news | sst2 |" in table
    freeze = next(line for line in table.splitlines() if line.startswith("| freeze-qk |"))
    # ag_news: identical predictions (equivalent); sst2: 10 points worse and dominated by bitfit.
    assert "| 90.0% | +0.00 [+0.00, +0.00] equivalent (±0.5) | -10.00 [" in freeze and "dominated by bitfit" in freeze
    assert "| freeze-vo | 90.0% | not run |" in table
    # The answer reads every task's verdicts: a resolved loss on one task decides it.
    assert "- Frozen pretrained Q/K (`freeze-qk`): worse (resolved) on sst2; equivalent on ag_news" in table
    assert "cost accuracy (resolved) on sst2, saving 10.0% of the AdamW state" in table
    assert md.index("## Across the tasks") < md.index("## ag_news") < md.index("## sst2")
    # One task: no across-tasks section.
    write_board([board_dir], tmp_path / "one")
    assert "Across the tasks" not in (tmp_path / "one" / "board.md").read_text()


def test_a_seed_at_chance_stays_in_the_mean_and_is_counted(tmp_path: Path) -> None:
    """A run whose validation accuracy stayed at chance is the arm's result on that seed: dropping it
    would average the surviving seeds only (the XNLI board lost 2 of oelm-freeze's 5 seeds so)."""
    rng = np.random.default_rng(2)
    root = tmp_path / "sweep"
    for seed in range(5):
        base = (rng.random(N) < 0.8).astype(int)
        cls_run(root, "baseline", seed, base, 1000, 1.0)
        at_chance = seed >= 3
        mine = (np.arange(N) % 3 == 0).astype(int) if at_chance else base.copy()
        cls_run(root, "oelm-freeze", seed, mine, 900, 0.9, collapsed=at_chance)
    write_board([root], tmp_path / "out")
    board = page_sections(tmp_path / "out" / "board.json")["boards"][0]
    row = next(r for r in board["rows"] if r["method"] == "oelm-freeze")
    assert row["seeds"] == [0, 1, 2, 3, 4] and row["at_chance"] == 2 and row["no_result"] == 0
    # Three seeds equal to the baseline's, two at a third: the mean and the paired gap include both.
    ref = next(r for r in board["rows"] if r["method"] == "baseline")
    assert row["diff"] < -15 and row["accuracy"] == pytest.approx(
        (3 * ref["accuracy"] + 2 * 100 * np.mean(np.arange(N) % 3 == 0)) / 5, abs=3
    )
    md = (tmp_path / "out" / "board.md").read_text()
    assert "| oelm-freeze | 0.0001 | 5 | 2 of 5 |" in md
    assert "kept in every mean, interval and test): oelm-freeze 2 of 5" in md


def test_every_view_counts_a_seed_at_chance_the_same_way(tmp_path: Path) -> None:
    """One rule for seeds at chance (issue 50): `oelm report` and the boards kept different seeds
    (the report dropped a seed at chance, the fine-tuning board kept it). Both now read
    aggregate.counted_runs: the same five seeds, the same mean, the same paired gap."""
    from oelm.reports.report import write_report

    rng = np.random.default_rng(3)
    root = tmp_path / "sweep"
    for seed in range(5):
        base = (rng.random(N) < 0.8).astype(int)
        cls_run(root, "baseline", seed, base, 1000, 1.0)
        mine = (np.arange(N) % 3 == 0).astype(int) if seed == 4 else flip(base, 8, rng, 0)
        cls_run(root, "oelm-freeze", seed, mine, 900, 0.9, collapsed=seed == 4)
    _, comparison = write_report([root], tmp_path / "report")
    arm = next(a for a in comparison.groups[0].arms if a.method == "oelm-freeze")
    assert sorted(arm.by_seed) == [0, 1, 2, 3, 4] and arm.primary.n == 5
    write_board([root], tmp_path / "board")
    row = next(
        r for r in page_sections(tmp_path / "board" / "board.json")["boards"][0]["rows"] if r["method"] == "oelm-freeze"
    )
    assert row["seeds"] == sorted(arm.by_seed) and row["at_chance"] == 1
    assert row["accuracy"] == pytest.approx(arm.primary.mean * 100)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "except a seed at chance level at its arm's chosen setting" in md


def test_a_peak_recorded_as_the_process_lifetime_peak_is_shown_as_an_upper_bound(
    board_dir: Path, tmp_path: Path
) -> None:
    """Runs recorded before each run's peak was measured from its start carry the process's
    lifetime peak (a sweep worker's earlier runs included): the board marks it ≤ and says why,
    and a board of per-run peaks says nothing of it."""
    for run in board_dir.glob("runs/*/*/seed*"):
        kind = "process_max_rss" if "bitfit" in run.parts else "run_peak_rss"
        (run / "timing_stats.json").write_text(json.dumps({"peak_memory_bytes": 1000, "memory_kind": kind}))
    assert main(["report", "--view", "finetune", str(board_dir), "--out", str(tmp_path / "a")]) == 0
    page = (tmp_path / "a" / "board.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| ")}
    assert "≤ 1 KiB" in rows["bitfit"] and "≤" not in rows["baseline"]
    assert "a figure marked ≤ was recorded as the process's lifetime peak" in page
    for run in board_dir.glob("runs/bitfit/*/seed*"):
        (run / "timing_stats.json").write_text(json.dumps({"peak_memory_bytes": 1000, "memory_kind": "run_peak_rss"}))
    assert main(["report", "--view", "finetune", str(board_dir), "--out", str(tmp_path / "b")]) == 0
    assert "≤" not in (tmp_path / "b" / "board.md").read_text()
