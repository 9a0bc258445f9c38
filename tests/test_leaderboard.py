"""`oelm leaderboard` on synthetic run directories (the fixtures of test_report)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from oelm.cli import main
from oelm.reports.board import pareto_front
from oelm.reports.comparison import page_sections
from oelm.reports.leaderboard import write_leaderboard
from oelm.utils.errors import UserError
from test_report import READING, make_run, reading_sections

BASE = [10.0, 10.2, 9.9]
# method -> (relative gap per seed, theoretical saving): lower test perplexity ranks first.
ARMS = {
    "oelm-qknorm": ([0.010, 0.009, 0.011], 0.039),  # +1%, tight, keeps 97.5% of the saving: meets
    "oelm-lowrank": ([0.014, 0.016, 0.015], 0.020),  # +1.5% but keeps only 50%: misses on share
    "oelm-temp": ([0.05, 0.045, 0.055], 0.040),  # +5%
    "oelm-freeze": ([0.10, 0.11, 0.09], 0.040),  # +10%, the saving's reference
}


def _sweep(root: Path, arms: dict = ARMS) -> Path:
    """Three seeds per method at one LR (plus a worse LR for the baseline), as a sweep writes them."""
    for seed, ppl in enumerate(BASE):
        make_run(root, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5, theoretical_saving=0.0)
        make_run(root, "baseline", 3e-4, seed, test_perplexity=ppl + 1, best_val_loss=1.7, theoretical_saving=0.0)
        for method, (gaps, saving) in arms.items():
            run = make_run(
                root,
                method,
                3e-3,
                seed,
                test_perplexity=ppl * (1 + gaps[seed]),
                best_val_loss=1.6,
                theoretical_saving=saving,
            )
            adapter = 48 if method == "oelm-qknorm" else 0
            audit = {"start": {"totals": {"by_role": {"adapter": {"trainable": adapter, "frozen": 0}}}}}
            (run / "freeze_audit.json").write_text(json.dumps(audit))
    return root


def _read(out: Path) -> dict:
    return page_sections(out / "leaderboard.json")


def test_ranking_numbers_and_passing_verdict(tmp_path: Path) -> None:
    _sweep(tmp_path)
    md_path, boards = write_leaderboard([tmp_path], tmp_path / "lb")
    table = _read(tmp_path / "lb")["tables"][0]
    ranked = [e["method"] for e in table["ranked"]]
    assert ranked == ["baseline", "oelm-qknorm", "oelm-lowrank", "oelm-temp", "oelm-freeze"]
    qk = table["ranked"][1]
    gaps = np.array(ARMS["oelm-qknorm"][0]) * 100
    assert qk["gap_paired"]["mean"] == pytest.approx(gaps.mean())
    assert qk["saving_share"] == pytest.approx(0.039 / 0.040)
    assert qk["added_params"] == 48 and table["ranked"][2]["added_params"] == 0
    assert table["ranked"][0]["lr"] == 1e-3  # the baseline's LR chosen on validation
    assert table["ranked"][-1]["step_time_ratio"] == pytest.approx(0.9)
    assert table["passing"] == ["oelm-qknorm"] and table["closest"] is None
    assert qk["meets_target"] and not table["ranked"][2]["meets_target"]
    assert "keeps 50% < 75% of the saving" in table["ranked"][2]["misses"]
    md = md_path.read_text()
    assert "Target met** by oelm-qknorm" in md
    # How to read it is one docs page, named by its section; the page says what the notes said.
    assert "How to read these numbers: docs/reading.md#leaderboard (step-time ratios are indicative only" in md
    assert "How to read:" not in md and "No A/A control" not in md
    assert reading_sections(md) == ["leaderboard", "step-times"]
    page = " ".join(READING.read_text(encoding="utf-8").split())
    assert "No A/A control" in page and "benchmarks/freeze_cost.py --control" in page
    assert "| 2 | oelm-qknorm | 0.003 |" in md and "| 3.90% | 98% |" in md and "900 / 100 / 48" in md


def test_failing_verdict_names_the_closest(tmp_path: Path) -> None:
    arms = {k: v for k, v in ARMS.items() if k != "oelm-qknorm"}
    _sweep(tmp_path, arms)
    md_path, boards = write_leaderboard([tmp_path], tmp_path / "lb")
    table = _read(tmp_path / "lb")["tables"][0]
    assert table["passing"] == []
    # lowrank has the smallest gap but keeps too little saving: the closest keeps >= 75% of it.
    assert table["closest"] == "oelm-temp"
    md = md_path.read_text()
    assert "No method meets the target.** Closest: oelm-temp, mean per-seed gap +5.00%" in md
    assert "paired upper end" in md
    assert (
        "The smallest gap is oelm-lowrank's (mean per-seed gap +1.50%" in md and "keeps 50% < 75% of the saving" in md
    )


def test_pareto_front_membership(tmp_path: Path) -> None:
    assert pareto_front({"a": (0.0, 0.0), "b": (1.0, 3.0), "c": (2.0, 2.0), "d": (5.0, 3.0)}) == ["a", "b"]
    _sweep(tmp_path)
    write_leaderboard([tmp_path], tmp_path / "lb")
    # lowrank is beaten by qknorm on both axes; freeze by temp (same saving, smaller gap).
    assert _read(tmp_path / "lb")["tables"][0]["pareto_front"] == ["baseline", "oelm-qknorm", "oelm-temp"]


def test_incomplete_methods_are_listed_not_ranked(tmp_path: Path) -> None:
    _sweep(tmp_path)
    for seed in (0, 1):  # a method with 2 of 3 seeds
        make_run(tmp_path, "oelm-gain", 3e-3, seed, test_perplexity=10.0, best_val_loss=1.6)
    for seed in (0, 1, 2):  # complete at one LR, a second LR with one seed only
        make_run(tmp_path, "oelm-unfreeze", 3e-3, seed, test_perplexity=10.0, best_val_loss=1.6)
    make_run(tmp_path, "oelm-unfreeze", 1e-2, 0, test_perplexity=12.0, best_val_loss=1.9)
    spec = {
        "name": "t",
        "base": {},
        "seeds": [0, 1, 2],
        "grid": {},
        "baseline": "baseline",
        "methods": {"baseline": {"lr": [3e-4, 1e-3]}, "oelm-random": {"lr": [3e-3]}},
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    md_path, _ = write_leaderboard([tmp_path], tmp_path / "lb")
    data = _read(tmp_path / "lb")
    table = data["tables"][0]
    assert {e["method"] for e in table["incomplete"]} == {"oelm-gain", "oelm-unfreeze"}
    assert all(e["rank"] is None for e in table["incomplete"])
    assert "oelm-gain" not in [e["method"] for e in table["ranked"]]
    why = {e["method"]: e["incomplete"] for e in table["incomplete"]}
    assert "2 of 3 seeds" in why["oelm-gain"] and "lr0.01" in why["oelm-unfreeze"]
    assert data["not_started"] == ["oelm-random"]  # planned by sweep.yaml, never run
    md = md_path.read_text()
    assert "### Incomplete (listed, not ranked)" in md and "planned by the sweep" in md


def test_direction_follows_the_metric(tmp_path: Path) -> None:
    for method, accs in {"baseline": [0.80, 0.81, 0.82], "oelm-freeze": [0.85, 0.86, 0.84]}.items():
        for seed, a in enumerate(accs):
            make_run(
                tmp_path,
                method,
                1e-4,
                seed,
                task="classification",
                heldout_accuracy=a,
                best_accuracy=a,
                primary_metric="heldout_accuracy",
                selection_metric="best_accuracy",
            )
    write_leaderboard([tmp_path], tmp_path / "lb")
    table = _read(tmp_path / "lb")["tables"][0]
    assert table["higher_is_better"] and [e["method"] for e in table["ranked"]] == ["oelm-freeze", "baseline"]


def test_cli_writes_three_files_deterministically(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _sweep(tmp_path / "sweep")
    out = tmp_path / "lb"
    assert main(["report", "--view", "board", str(tmp_path / "sweep"), "--out", str(out)]) == 0
    assert "Target met by oelm-qknorm" in capsys.readouterr().out
    files = {p: (out / p).read_bytes() for p in ("leaderboard.md", "leaderboard.json", "pareto.png")}
    assert files["pareto.png"].startswith(b"\x89PNG")
    md = files["leaderboard.md"].decode()
    assert md.splitlines()[:5] == ["# Leaderboard", "", "Regenerate with:", "", "```"]
    assert f"oelm report --view board {tmp_path / 'sweep'} --out {out}" in md
    assert main(["report", "--view", "board", str(tmp_path / "sweep"), "--out", str(out)]) == 0
    assert (out / "leaderboard.md").read_bytes() == files["leaderboard.md"]
    assert (out / "leaderboard.json").read_bytes() == files["leaderboard.json"]
    assert (out / "pareto.png").read_bytes() == files["pareto.png"]


def test_bad_input_is_one_user_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(UserError, match="no run directories"):
        write_leaderboard([tmp_path], tmp_path / "lb")
    assert main(["report", "--view", "board", str(tmp_path / "missing"), "--out", str(tmp_path / "lb")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "lb").exists()


def test_a_sweep_with_no_finished_run_lists_the_plan(tmp_path: Path) -> None:
    run = make_run(tmp_path, "baseline", 1e-3, 0, test_perplexity=10.0, best_val_loss=1.5)
    (run / "results.json").unlink()  # started, not finished
    spec = {
        "name": "t",
        "base": {},
        "seeds": [0],
        "grid": {},
        "baseline": "baseline",
        "methods": {"baseline": {"lr": [1e-3]}, "oelm-freeze": {"lr": [1e-3]}},
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    md_path, boards = write_leaderboard([tmp_path], tmp_path / "lb")
    assert boards == [] and _read(tmp_path / "lb")["not_started"] == ["baseline", "oelm-freeze"]
    assert "No finished runs: nothing to rank." in md_path.read_text()
    assert (tmp_path / "lb" / "pareto.png").is_file()


def test_seeds_restrict_the_board_to_the_seeds_every_method_has(tmp_path: Path) -> None:
    _sweep(tmp_path)
    for seed in (3, 4):  # the main comparison has two more seeds than the variants
        make_run(tmp_path, "baseline", 1e-3, seed, test_perplexity=10.0, best_val_loss=1.5, theoretical_saving=0.0)
        make_run(tmp_path, "oelm-freeze", 3e-3, seed, test_perplexity=11.0, best_val_loss=1.6, theoretical_saving=0.04)
    write_leaderboard([tmp_path], tmp_path / "all")
    unranked = {e["method"] for e in _read(tmp_path / "all")["tables"][0]["incomplete"]}
    assert {"oelm-qknorm", "oelm-temp"} <= unranked  # 3 of 5 seeds: not comparable
    md_path, _ = write_leaderboard([tmp_path], tmp_path / "lb", seeds=[0, 1, 2])
    table = _read(tmp_path / "lb")["tables"][0]
    assert [e["method"] for e in table["ranked"]][:2] == ["baseline", "oelm-qknorm"] and not table["incomplete"]
    assert {e["primary"]["n"] for e in table["ranked"]} == {3}
    md = md_path.read_text()
    assert "--seeds 0 1 2" in md
    # Every ranked verdict is labelled a pilot result, with the fresh seeds a confirmation needs.
    assert "Pilot results: these seeds also chose every LR" in md
    assert re.search(r"- oelm-qknorm: pilot: 3 seeds \(LRs chosen on them\)", md)
    assert f"oelm confirm plan {tmp_path.as_posix()} --seeds " in md
    with pytest.raises(UserError, match=r"no run of seeds \[7\]"):
        write_leaderboard([tmp_path], tmp_path / "none", seeds=[7])


def test_the_reference_is_chosen_on_validation_never_on_test(tmp_path: Path) -> None:
    """A trainable arm with the best test perplexity but a worse validation loss is not the
    reference: held-out numbers are what the board reports, never what chooses it."""
    _sweep(tmp_path)
    for seed, ppl in enumerate(BASE):
        make_run(
            tmp_path,
            "oelm-nofreeze",
            3e-3,
            seed,
            test_perplexity=ppl * 0.8,  # far better on test ...
            best_val_loss=9.0,  # ... but worse on validation than every other arm
            theoretical_saving=0.0,
            frozen_params=0,
        )
    write_leaderboard([tmp_path], tmp_path / "lb")
    table = _read(tmp_path / "lb")["tables"][0]
    assert table["reference"] == "baseline" and "validation" in table["reference_rule"]


def test_reference_is_the_best_tuned_trainable_arm_and_the_twin_gap(tmp_path: Path) -> None:
    _sweep(tmp_path)
    for seed, ppl in enumerate(BASE):  # the orthogonal init left trainable: better than the baseline
        make_run(
            tmp_path,
            "oelm-nofreeze",
            3e-3,
            seed,
            test_perplexity=ppl * (1 - 0.05 - 0.002 * seed),
            best_val_loss=1.4,  # better on validation too: the best-tuned trainable arm
            theoretical_saving=0.0,
            frozen_params=0,
        )
    md_path, boards = write_leaderboard([tmp_path], tmp_path / "lb")
    table = _read(tmp_path / "lb")["tables"][0]
    assert table["reference"] == "oelm-nofreeze" and "best-tuned trainable" in table["reference_rule"]
    ranked = {e["method"]: e for e in table["ranked"]}
    assert ranked["oelm-nofreeze"]["gap_percent"] == 0 and ranked["baseline"]["gap_percent"] > 0
    assert table["comparisons"] == 5  # every other ranked method against the reference
    assert {e["decision"]["m"] for e in table["ranked"] if e["decision"]} == {5}
    assert ranked["baseline"]["verdict"] == "worse (resolved)"
    md = md_path.read_text()
    assert "Reference: **oelm-nofreeze** (the best-tuned trainable arm: best validation mean" in md
    assert "(m = 5)" in md and "verdict vs oelm-nofreeze" in md
    assert table["twin"] is False  # the twin is the reference: no second column
    # A named reference keeps the baseline; the twin column then shows the gap to oelm-nofreeze.
    md_path, _ = write_leaderboard([tmp_path], tmp_path / "named", baseline="baseline")
    named = _read(tmp_path / "named")["tables"][0]
    assert named["reference"] == "baseline" and named["twin"] is True
    freeze = next(e for e in named["ranked"] if e["method"] == "oelm-freeze")
    nofreeze = np.array(BASE) * (1 - 0.05 - 0.002 * np.arange(3))
    expected = (np.array(BASE) * (1 + np.array(ARMS["oelm-freeze"][0])) / nofreeze - 1) * 100
    assert freeze["twin_gap"]["mean"] == pytest.approx(expected.mean())
    assert freeze["twin_verdict"] == "worse (resolved)" and freeze["twin"] == "oelm-nofreeze"
    assert "mean per-seed gap vs its same-init trainable twin" in md_path.read_text()
    assert "vs oelm-nofreeze: " in md_path.read_text()
    qknorm = next(e for e in named["ranked"] if e["method"] == "oelm-qknorm")
    assert qknorm["twin_decision"]["m"] == 4  # the frozen head-wise orthogonal methods


def test_board_uses_only_the_vocabulary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _sweep(tmp_path)
    assert main(["report", "--view", "board", str(tmp_path), "--out", str(tmp_path / "lb"), "--margin", "2"]) == 0
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    low = md.lower() + capsys.readouterr().out.lower()
    assert not any(w in low for w in ("significant", "n.s.", "recovered", "underpowered"))
    table = _read(tmp_path / "lb")["tables"][0]
    assert table["margin_percent"] == 2.0 and "--margin 2" in md
    verdicts = {e["method"]: e["verdict"] for e in table["ranked"]}
    assert verdicts["baseline"] is None and verdicts["oelm-freeze"] == "worse (resolved)"
    assert all(
        v.startswith(("worse (resolved)", "better (resolved)", "equivalent within ±2%", "unresolved (smallest"))
        for v in verdicts.values()
        if v
    )


def test_saving_three_ways_counts_schedules_and_adapters(tmp_path: Path) -> None:
    """FLOPs as recorded; optimizer state by the peak trainable count; all-reduce by the step average."""
    for seed, ppl in enumerate(BASE):
        make_run(tmp_path, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5, theoretical_saving=0.0)
        make_run(
            tmp_path, "oelm-freeze", 1e-3, seed, test_perplexity=ppl * 1.05, best_val_loss=1.6, theoretical_saving=0.04
        )
        # late freeze at f = 0.25: Q/K (200 of 1000 parameters) train for a quarter of the steps.
        run = make_run(
            tmp_path,
            "oelm-late-freeze",
            1e-3,
            seed,
            test_perplexity=ppl * 1.01,
            best_val_loss=1.55,
            theoretical_saving=0.03,
            trainable_params=1000,
            frozen_params=0,
            method_options={"f": 0.25, "on_freeze": "keep", "layers": "all"},
        )
        roles = {"q": {"trainable": 100, "frozen": 0}, "k": {"trainable": 100, "frozen": 0}}
        (run / "freeze_audit.json").write_text(json.dumps({"start": {"totals": {"by_role": roles}}}))
    write_leaderboard([tmp_path], tmp_path / "lb", baseline="baseline")
    ranked = {e["method"]: e for e in _read(tmp_path / "lb")["tables"][0]["ranked"]}
    assert ranked["oelm-freeze"]["optimizer_state_saving"] == pytest.approx(0.1)  # 900 of 1000 trainable
    assert ranked["oelm-freeze"]["allreduce_saving"] == pytest.approx(0.1)
    late = ranked["oelm-late-freeze"]
    assert late["optimizer_state_saving"] == pytest.approx(0.0)  # state for Q/K exists from step 0
    assert late["allreduce_saving"] == pytest.approx(0.75 * 200 / 1000)
    assert ranked["baseline"]["allreduce_saving"] == pytest.approx(0.0)
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert "saving: optimizer state" in md and "saving: bytes all-reduced per step" in md


def test_a_trainable_control_saving_by_architecture_cannot_meet_the_target(tmp_path: Path) -> None:
    """Thin keys left trainable save FLOPs by their width, but the target is for frozen variants."""
    for seed, ppl in enumerate(BASE):
        make_run(tmp_path, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5, theoretical_saving=0.0)
        make_run(
            tmp_path, "oelm-freeze", 1e-3, seed, test_perplexity=ppl * 1.05, best_val_loss=1.6, theoretical_saving=0.04
        )
        make_run(
            tmp_path,
            "oelm-thin-keys-nofreeze",
            1e-3,
            seed,
            test_perplexity=ppl * 1.001,
            best_val_loss=1.5,
            theoretical_saving=0.15,
            frozen_params=0,
        )
    write_leaderboard([tmp_path], tmp_path / "lb", baseline="baseline")
    ranked = {e["method"]: e for e in _read(tmp_path / "lb")["tables"][0]["ranked"]}
    thin = ranked["oelm-thin-keys-nofreeze"]
    assert not thin["meets_target"] and thin["misses"][0].startswith("freezes nothing")
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert "Closest: oelm-freeze" in md  # the frozen variant, not the trainable control


def test_lm_board_shows_bits_per_byte_beside_perplexity(tmp_path: Path) -> None:
    """Bits per byte (one scale across tokenizers) is a column of an LM board and of its JSON; a
    method whose runs predate it reads 'n/a (not recorded)'."""
    _sweep(tmp_path, {"oelm-freeze": ARMS["oelm-freeze"]})
    for seed in range(3):  # the baseline's chosen LR recorded it, oelm-freeze's runs did not
        rec = tmp_path / "runs" / "baseline" / "lr0.001" / f"seed{seed}" / "results.json"
        results = json.loads(rec.read_text())
        rec.write_text(json.dumps({**results, "test_bits_per_byte": 1.1 + seed / 10}))
    md_path, _ = write_leaderboard([tmp_path], tmp_path / "lb")
    md = md_path.read_text()
    assert "test bits per byte (comparable across tokenizers): mean ± 95% CI (n)" in md
    rows = {
        line.split(" | ")[1]: line for line in md.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")
    }
    assert "| 1.200 ± " in rows["baseline"] and "| n/a (not recorded) |" in rows["oelm-freeze"]
    ranked = {e["method"]: e for e in _read(tmp_path / "lb")["tables"][0]["ranked"]}
    assert ranked["baseline"]["bits_per_byte"]["mean"] == pytest.approx(1.2)
    assert ranked["oelm-freeze"]["bits_per_byte"]["n"] == 0


def test_a_board_of_a_confirmations_runs_is_labelled_a_confirmation(tmp_path: Path) -> None:
    """The twin board's final records are a confirmation (fresh seeds, each arm at its pilot's LR):
    the board called them 'pilot results' and asked for a confirmation of the confirmation, and
    read no primary family although the plan declares one."""
    records = Path(__file__).resolve().parents[1] / "docs" / "results" / "twin-decisive" / "records"
    md, _ = write_leaderboard([records], tmp_path, baseline="oelm-nofreeze")
    text = md.read_text()
    assert "Confirmation results: these are the fresh seeds (103, 104, 105, 106, 107, 108, 109, 110)" in text
    assert "Pilot results" not in text and "oelm confirm plan" not in text
    assert "Primary family, declared before the runs: oelm-freeze vs oelm-nofreeze" in text
    pilot, _ = write_leaderboard([records.parent / "pilot-records"], tmp_path / "pilot", baseline="oelm-nofreeze")
    assert "Pilot results: these seeds also chose every LR" in pilot.read_text()


def test_one_step_time_ratio_for_every_view() -> None:
    """One step-time ratio (issue 50): the arm's mean step time over the control's, over the seeds
    both have (a seed without a control run, or a time of 0, does not enter); `oelm report`, the
    board and the fine-tuning board all read aggregate.step_time_ratio. The old boards averaged
    per-seed ratios, which one fast control seed dominates."""
    from types import SimpleNamespace

    from oelm.reports.aggregate import step_time_ratio
    from oelm.reports.board import step_ratio

    def run(seed: int, t: float | None) -> SimpleNamespace:
        return SimpleNamespace(seed=seed, results={"mean_step_time": t})

    arm = SimpleNamespace(runs=[run(0, 2.0), run(1, 3.0), run(2, 9.0), run(3, 1.0)])
    base = SimpleNamespace(runs=[run(0, 1.0), run(1, 2.0), run(3, 0.0)])
    assert step_time_ratio(arm.runs, base.runs) == pytest.approx((2.0 + 3.0) / (1.0 + 2.0))  # not (2 + 1.5) / 2
    assert step_ratio(arm, base) == step_time_ratio(arm.runs, base.runs) and step_ratio(arm, None) is None
    # No shared seed: every seed of each side.
    assert step_time_ratio([run(5, 4.0)], [run(6, 2.0), run(7, 6.0)]) == pytest.approx(1.0)
    assert step_time_ratio([run(0, None)], base.runs) is None
