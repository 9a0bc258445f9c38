"""`oelm report` on synthetic run directories written exactly to the run-directory schema."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as sps

from oelm.cli import main
from oelm.records import run as records
from oelm.records.load import load_run, load_runs
from oelm.reports import stats
from oelm.reports.aggregate import compare, compare_to, rebase
from oelm.reports.comparison import page_sections
from oelm.reports.report import summary_table, write_report
from oelm.utils.errors import UserError

# test perplexity and best_val_loss per (method, lr, seed); chosen LRs: baseline 1e-3, oelm 3e-3
LM = {
    ("baseline", 3e-4): {0: (5.0, 1.70), 1: (5.2, 1.72), 2: (5.1, 1.71)},
    ("baseline", 1e-3): {0: (4.2, 1.50), 1: (4.4, 1.52), 2: (4.3, 1.49)},
    ("oelm-freeze", 1e-3): {0: (5.5, 1.80), 1: (5.4, 1.79), 2: (5.6, 1.81)},
    ("oelm-freeze", 3e-3): {0: (4.6, 1.60), 1: (4.9, 1.62), 2: (4.7, 1.61)},
}
STEP_TIME = {"baseline": 0.10, "oelm-freeze": 0.09}


def make_run(root: Path, method: str, lr: float, seed: int, **results) -> Path:
    """A complete run directory following docs/architecture.md exactly."""
    run = root / "runs" / method / f"lr{lr:g}" / f"seed{seed}"
    run.mkdir(parents=True)
    task = results.pop("task", "lm")
    config = {
        "task": task,
        "data": "data/tinystories",
        "model": "gpt-tiny",
        "method": method,
        "seed": seed,
        "lr": lr,
        "steps": 40,
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    curve = results.pop("curve", [2.0, 1.8])
    lines = [{"kind": "train", "step": 1, "loss": 3.0, "lr": lr, "tokens": 512, "step_time": 0.1}]
    lines += [
        {"kind": "eval", "step": 20 * (i + 1), "split": "val", "loss": v, "perplexity": float(np.exp(v))}
        for i, v in enumerate(curve)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    base = {
        "schema_version": 1,
        "status": "complete",
        "task": task,
        "method": method,
        "model_type": method,
        "model": "gpt-tiny",
        "dataset": "tinystories",
        "seed": seed,
        "lr": lr,
        "steps": 40,
        "tokens_seen": 40 * 512,
        "best_step": 40,
        "total_wall_time": 5.0,
        "mean_step_time": STEP_TIME.get(method, 0.1),
        "median_step_time": 0.1,
        "tokens_per_second": 512 / STEP_TIME.get(method, 0.1),
        "peak_memory_bytes": 0,
        "trainable_params": 1000 if method == "baseline" else 900,
        "frozen_params": 0 if method == "baseline" else 100,
        "freeze_check": {"ok": True},
        "git_commit": "abc",
        "device": "cpu",
        "primary_metric": "test_perplexity",
        "selection_metric": "best_val_loss",
    }
    base.update(results)
    (run / "results.json").write_text(json.dumps(base))
    return run


@pytest.fixture()
def lm_sweep(tmp_path: Path) -> Path:
    for (method, lr), seeds in LM.items():
        for seed, (ppl, val) in seeds.items():
            make_run(
                tmp_path,
                method,
                lr,
                seed,
                test_perplexity=ppl,
                best_val_loss=val,
                theoretical_saving=0.05 if method != "baseline" else 0.0,
                curve=[val + 0.3, val],
            )
    # A diverged run at the otherwise best-looking LR of oelm-random: that LR must not be chosen.
    make_run(tmp_path, "oelm-random", 1e-2, 0, test_perplexity=4.5, best_val_loss=float("nan"))
    make_run(tmp_path, "oelm-random", 1e-2, 1, test_perplexity=4.0, best_val_loss=1.1)
    make_run(tmp_path, "oelm-random", 1e-3, 0, test_perplexity=6.0, best_val_loss=1.9)
    # An unfinished run: config and metrics, no results.json.
    unfinished = make_run(tmp_path, "oelm-random", 1e-3, 1, test_perplexity=6.1, best_val_loss=2.0)
    (unfinished / "results.json").unlink()
    return tmp_path


def _arm(report: dict, method: str) -> dict:
    return next(a for a in report["groups"][0]["arms"] if a["method"] == method)


READING = Path(__file__).resolve().parent.parent / "docs" / "reading.md"


def reading_sections(text: str) -> list[str]:
    """The docs/reading.md sections an output names ('docs/reading.md#leaderboard' -> 'leaderboard'),
    each checked to be a heading of that page (its GitHub anchor: lower case, spaces as dashes)."""
    named = re.findall(r"docs/reading\.md#([a-z0-9-]+)", text)
    headings = re.findall(r"^#+ (.+)$", READING.read_text(encoding="utf-8"), flags=re.M)
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
    assert named and set(named) <= anchors, (named, sorted(anchors))
    return named


def test_report_names_its_reading_guide_which_says_what_the_numbers_mean(lm_sweep: Path) -> None:
    """report.md carries one line naming docs/reading.md#report; the page holds the guide."""
    md = write_report([lm_sweep], lm_sweep / "out")[0].read_text()
    assert "How to read these numbers: docs/reading.md#report." in md and "How to read:" not in md
    assert reading_sections(md) == ["report"]
    page = READING.read_text(encoding="utf-8")
    section = " ".join(page[page.index("## Report") : page.index("## Leaderboard")].split())
    for needle in ("Student-t", "(m/b - 1)·100", "seeds x test examples", "seeds only", "Wilcoxon", "Holm", "TOST"):
        assert needle in section, needle
    assert "noncentral t" in section and "study_numbers.yaml" in section


def test_report_numbers_equal_those_from_records(lm_sweep: Path) -> None:
    md_path, comp = write_report([lm_sweep], lm_sweep / "out")
    report = page_sections(lm_sweep / "out" / "report.json")
    base, oelm = _arm(report, "baseline"), _arm(report, "oelm-freeze")
    assert base["lr"] == 1e-3 and oelm["lr"] == 3e-3  # best mean best_val_loss per method
    b = np.array([LM[("baseline", 1e-3)][s][0] for s in range(3)])
    m = np.array([LM[("oelm-freeze", 3e-3)][s][0] for s in range(3)])
    assert base["primary"]["mean"] == pytest.approx(b.mean())
    lo, hi = sps.t.interval(0.95, df=2, loc=m.mean(), scale=sps.sem(m))
    assert (oelm["primary"]["ci_low"], oelm["primary"]["ci_high"]) == pytest.approx((lo, hi))
    assert oelm["gap_percent"] == pytest.approx((m.mean() / b.mean() - 1) * 100)
    assert oelm["gap_paired"]["mean"] == pytest.approx(np.mean((m / b - 1) * 100))
    # The test is on the same quantity as the interval: the per-seed % gaps, against 0.
    p_gap = sps.ttest_1samp((m / b - 1) * 100, 0.0).pvalue
    assert oelm["paired_test"]["p_value"] == pytest.approx(p_gap)
    assert oelm["decision"]["p"] == pytest.approx(p_gap) and oelm["decision"]["m"] == 1  # oelm-random: no test
    assert oelm["step_time_ratio"] == pytest.approx(0.9)
    assert oelm["trainable_params"] == 900 and oelm["frozen_params"] == 100

    md = md_path.read_text()
    assert f"{m.mean():.3f} ± " in md and f"{np.mean((m / b - 1) * 100):+.2f}% [" in md  # the mean per-seed gap
    assert f"p = {p_gap:.3g}, Holm p = " in md and "(m = 1)" in md
    assert "5.0%" in md  # theoretical saving next to the measured ratio 0.900
    assert "0.900" in md
    # Both arms chose the top of a 2-LR grid: the report says the grid may be too narrow.
    assert "baseline: the chosen lr 0.001 is the largest of its grid [0.0003, 0.001]" in md
    assert any(p.suffix == ".png" for p in (lm_sweep / "out").iterdir())


def test_collapsed_and_incomplete_runs_are_listed_not_averaged(lm_sweep: Path) -> None:
    md_path, comp = write_report([lm_sweep], lm_sweep / "out")
    report = page_sections(lm_sweep / "out" / "report.json")
    rnd = _arm(report, "oelm-random")
    # lr 1e-2 has the best validation loss but a diverged seed: the collapse-free LR is chosen.
    assert rnd["lr"] == 1e-3 and rnd["primary"]["n"] == 1 and rnd["primary"]["mean"] == 6.0
    assert rnd["primary"]["ci_low"] is None
    assert len(report["excluded"]) == 1 and "lr0.01/seed0" in report["excluded"][0]["path"]
    assert len(report["incomplete"]) == 1
    md = md_path.read_text()
    assert "## Excluded runs" in md and "diverged" in md
    assert "## Incomplete runs" in md and "no results.json" in md
    assert "6.000 ± n/a (n=1)" in md


def test_classification_collapse_and_accuracy_in_points(tmp_path: Path) -> None:
    acc = {"baseline": [0.80, 0.82, 0.81], "oelm-freeze": [0.85, 0.86, 0.84]}
    for method, values in acc.items():
        for seed, a in enumerate(values):
            make_run(
                tmp_path,
                method,
                1e-4,
                seed,
                task="classification",
                heldout_accuracy=a,
                best_accuracy=a + 0.01,
                collapsed=False,
                primary_metric="heldout_accuracy",
                selection_metric="best_accuracy",
            )
    make_run(
        tmp_path,
        "oelm-freeze",
        1e-4,
        3,
        task="classification",
        heldout_accuracy=0.5,
        best_accuracy=0.5,
        collapsed=True,
        primary_metric="heldout_accuracy",
        selection_metric="best_accuracy",
    )
    md_path, comp = write_report([tmp_path])
    arm = comp.groups[0].arms[1]
    # The one rule for seeds at chance (aggregate.counted_runs): the only setting holds a seed at
    # chance, so it is what the arm gave on that seed and is kept, at its held-out accuracy.
    assert arm.method == "oelm-freeze" and arm.primary.n == 4 and sorted(arm.by_seed) == [0, 1, 2, 3]
    mean = (0.85 + 0.86 + 0.84 + 0.5) / 4
    assert comp.groups[0].versus_of(arm.method).gap == pytest.approx((0.81 - mean) / 0.81 * 100)  # + = worse
    md = md_path.read_text()
    assert "76.25 ± " in md and "-4.75" in md  # shown in percent, delta in points
    assert "collapsed: true" in md


def test_records_status_and_layout_fallback(tmp_path: Path) -> None:
    run = make_run(tmp_path, "baseline", 3e-4, 7, test_perplexity=4.0, best_val_loss=1.4)
    data = json.loads((run / "results.json").read_text())
    data["status"] = "running"
    (run / "results.json").write_text(json.dumps(data))
    (run / "config.yaml").unlink()
    rec = load_run(run)
    assert rec.status == records.INCOMPLETE and rec.seed == 7 and rec.lr == 3e-4
    (run / "results.json").unlink()
    rec = load_run(run)
    assert (rec.method, rec.lr, rec.seed) == ("baseline", 3e-4, 7)  # from the sweep layout


def test_bad_input_is_one_user_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(UserError, match="no run directories"):
        write_report([tmp_path])
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_budget_warning_compares_arms_seed_by_seed(tmp_path: Path) -> None:
    # Dynamic padding: tokens differ between seeds but must match across arms within a seed.
    for method in ("baseline", "oelm-freeze"):
        for seed, tokens in ((0, 1000), (1, 1010)):
            make_run(tmp_path, method, 1e-3, seed, test_perplexity=5.0, best_val_loss=1.6, tokens_seen=tokens)
    _, comp = write_report([tmp_path], tmp_path / "fair")
    report = page_sections(tmp_path / "fair" / "report.json")
    assert not any("unequal budgets" in w for w in report["groups"][0]["warnings"])
    make_run(tmp_path, "oelm-random", 1e-3, 0, test_perplexity=5.0, best_val_loss=1.6, tokens_seen=900)
    write_report([tmp_path], tmp_path / "unfair")
    report = page_sections(tmp_path / "unfair" / "report.json")
    warning = next(w for w in report["groups"][0]["warnings"] if "unequal budgets" in w)
    assert "seed 0" in warning and "seed 1" not in warning


def test_a_warning_that_changes_a_verdict_reaches_the_terminal(tmp_path: Path, capsys) -> None:
    """Unequal budgets are printed by `oelm report` and `oelm leaderboard`, not only written to the file."""
    for method, tokens in (("baseline", 1000), ("oelm-freeze", 900)):
        for seed in range(3):
            make_run(
                tmp_path, method, 1e-3, seed, test_perplexity=5.0 + seed / 10, best_val_loss=1.6, tokens_seen=tokens
            )
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r")]) == 0
    assert "unequal budgets" in capsys.readouterr().out
    assert (
        main(["report", "--view", "board", str(tmp_path), "--out", str(tmp_path / "b"), "--baseline", "baseline"]) == 0
    )
    assert "  warning: " in (out := capsys.readouterr().out) and "unequal budgets" in out


def test_report_states_power_and_flags_an_underpowered_gap(tmp_path: Path) -> None:
    ppl = {"baseline": [10.0, 10.4, 9.8], "oelm-freeze": [10.3, 10.1, 10.2]}  # gaps +3%, -2.9%, +4.1%
    for method, values in ppl.items():
        for seed, v in enumerate(values):
            make_run(tmp_path, method, 1e-3, seed, test_perplexity=v, best_val_loss=2.0)
    md_path, comp = write_report([tmp_path], extend="oelm confirm plan SW --seeds {seeds} --out C")
    power = comp.groups[0].versus_of("oelm-freeze").power
    gaps = np.array(ppl["oelm-freeze"]) / np.array(ppl["baseline"]) * 100 - 100
    d = stats.min_detectable_effect_size(3)
    assert power.mde == pytest.approx(d * gaps.std(ddof=1))
    assert power.underpowered
    md = md_path.read_text()
    assert f"unresolved (smallest detectable gap {power.mde:.2f}% at 80% power)" in md  # m = 1: no Holm step
    # A pilot result: two seed counts, each named: the seeds to detect the observed gap (the pilot's
    # SD taken as true, worded as a power estimate) and the seed plan's seeds for 80% power at the
    # margin (from the SD's upper bound, what `oelm confirm plan` plans), with the plan call.
    sd = gaps.std(ddof=1)
    n_gap = stats.seeds_needed(gaps.mean() / sd)
    n_margin = stats.planned_seeds(stats.sd_upper_bound(sd, 3), 1.0)
    assert 3 < n_gap < n_margin
    assert (
        f"pilot: 3 seeds (LRs chosen on them); seeds to detect the observed gap: about {n_gap} fresh seeds "
        f"would detect a true mean per-seed gap of {gaps.mean():+.2f}% with 80% power"
    ) in md
    assert "a power estimate, not a promise" in md
    assert "seeds for 80% power at ±1% (the seed plan of `oelm confirm plan`" in md and f"): {n_margin};" in md
    assert f"`oelm confirm plan SW --seeds {n_gap} --out C --all`" in md  # no pilot claim
    assert "--seeds $(seq" not in md and "reuses the finished runs" not in md
    assert "no difference" not in md.replace("not evidence of no difference", "").replace(
        "never means 'no difference'", ""
    )
    report = page_sections(tmp_path / "report" / "report.json")
    assert _arm(report, "oelm-freeze")["power"]["underpowered"] is True


def test_table_verdict_and_reading_print_one_gap_the_mean_per_seed_one(tmp_path: Path) -> None:
    # A reference seed far from the others: the gap of the means (+8.64%) and the mean per-seed
    # gap (+9.76%, the paired interval's, the test's and the verdict's) differ. Every line prints
    # the mean per-seed gap and names it; the gap of the means is printed nowhere.
    ppl = {"baseline": [10.0, 20.0, 10.5], "oelm-freeze": [11.0, 21.0, 12.0]}
    for method, values in ppl.items():
        for seed, v in enumerate(values):
            make_run(tmp_path, method, 1e-3, seed, test_perplexity=v, best_val_loss=2.0)
    md_path, comp = write_report([tmp_path])
    group = comp.groups[0]
    per_seed = np.array(ppl["oelm-freeze"]) / np.array(ppl["baseline"]) * 100 - 100
    of_means = (np.mean(ppl["oelm-freeze"]) / np.mean(ppl["baseline"]) - 1) * 100
    shown, means = f"{per_seed.mean():+.2f}%", f"{of_means:+.2f}%"
    assert shown == "+9.76%" and means == "+8.64%"
    md = md_path.read_text()
    row = next(line for line in md.splitlines() if line.startswith("| oelm-freeze |"))
    assert f"| {shown} [" in row  # the table, beside its paired interval
    assert f"observed mean per-seed gap {shown}." in md  # the verdict and power line
    assert f"{per_seed.mean():.2f}% worse as the mean per-seed gap" in md  # the reading
    terminal = "\n".join(summary_table(group))  # what `oelm compare` prints
    assert f"{shown} [" in terminal and "mean per-seed gap" in terminal
    for text in (md, terminal):
        assert means not in text and f"{abs(of_means):.1f}%" not in text
    stored = _arm(page_sections(tmp_path / "report" / "report.json"), "oelm-freeze")
    assert stored["mean_seed_gap_percent"] == pytest.approx(per_seed.mean())
    assert stored["gap_percent"] == pytest.approx(of_means)  # kept, under its own name
    vs = group.versus_of("oelm-freeze")
    assert vs.mean_seed_gap == pytest.approx(per_seed.mean()) and vs.gap == pytest.approx(of_means)


def test_the_tasks_recorded_direction_decides_selection_and_gaps(tmp_path: Path) -> None:
    # A metric whose name says nothing about its direction: only the recorded flag can decide.
    for seed in (0, 1, 2):
        for method, lr, sel, test in (
            ("baseline", 1e-3, 0.50, 0.60),
            ("baseline", 3e-3, 0.70, 0.70),
            ("oelm-freeze", 1e-3, 0.40, 0.50),
            ("oelm-freeze", 3e-3, 0.65, 0.66),
        ):
            make_run(
                tmp_path,
                method,
                lr,
                seed,
                primary_metric="test_bleu",
                selection_metric="val_bleu",
                higher_is_better=True,
                val_bleu=sel + 0.01 * seed,
                test_bleu=test + 0.01 * seed,
            )
    group = compare(load_runs([tmp_path / "runs"])).groups[0]
    assert group.higher_is_better
    arms = {a.method: a for a in group.arms}
    assert arms["baseline"].lr == 3e-3 and arms["oelm-freeze"].lr == 3e-3  # the higher val_bleu
    assert group.versus_of("oelm-freeze").gap == pytest.approx((0.70 - 0.66) / 0.71 * 100, rel=0.05)


def test_test_set_noise_of_a_gap_is_paired_by_window(tmp_path: Path) -> None:
    """Window difficulty is shared by both arms, so it cancels out of the gap's test-set noise."""
    rng = np.random.default_rng(0)
    hard = rng.gamma(2.0, 0.5, size=400)  # per-window difficulty: a large spread, common to all runs
    for seed in range(3):
        for method, shift in (("baseline", 0.0), ("oelm-freeze", 0.05 + 0.01 * seed)):
            losses = hard + shift + rng.normal(0, 0.01, size=hard.size)
            loss = float(losses.mean())
            run = make_run(
                tmp_path,
                method,
                1e-3,
                seed,
                test_loss=loss,
                test_perplexity=float(np.exp(loss)),
                best_val_loss=1.5,
                test_windows=hard.size,
                test_loss_se=float(losses.std(ddof=1) / np.sqrt(hard.size)),
            )
            (run / records.TEST_ITEMS_FILE).write_text(
                json.dumps({"metric": "test_loss", "unit": "window", "values": losses.tolist()})
            )
    group = compare(load_runs([tmp_path])).groups[0]
    arms = {a.method: a for a in group.arms}
    unpaired, paired = arms["baseline"].noise, group.versus_of("oelm-freeze").paired_noise
    assert paired is not None and paired.test_size == 400 and group.versus_of("baseline").paired_noise is None
    assert paired.test_se == pytest.approx(0.01 * np.sqrt(2) / np.sqrt(400), rel=0.15)
    assert paired.seed_sd == pytest.approx(0.01, rel=0.3)  # the per-seed shift differs by 0.01
    assert unpaired.test_se > 20 * paired.test_se  # the per-arm SE is dominated by window difficulty
    from oelm.reports.reading import noise_text

    text = noise_text(group)
    assert "NOT small next to the standard deviation over seeds (" in text  # per arm: difficulty
    assert "oelm-freeze - baseline: standard error of the test_loss difference" in text and "400 windows" in text
    assert "small next to the standard deviation over seeds of that difference" in text
    # Runs without stored windows (older records) simply have no paired figure.
    for path in tmp_path.rglob(records.TEST_ITEMS_FILE):
        path.unlink()
    assert compare(load_runs([tmp_path])).groups[0].versus_of("oelm-freeze").paired_noise is None


def test_reading_says_where_the_validation_curves_cross(tmp_path: Path) -> None:
    """A method ahead early and behind at the end: the reading names the budget dependence."""
    for seed in range(3):
        make_run(tmp_path, "baseline", 1e-3, seed, test_perplexity=4.0, best_val_loss=1.40, curve=[2.4, 1.9, 1.6, 1.4])
        make_run(
            tmp_path,
            "oelm-freeze",
            1e-3,
            seed,
            test_perplexity=4.2 + 0.01 * seed,
            best_val_loss=1.45,
            curve=[2.2, 1.85, 1.65, 1.45],
        )
    group = compare(load_runs([tmp_path])).groups[0]
    from oelm.reports.aggregate import crossing
    from oelm.reports.reading import reading

    arms = {a.method: a for a in group.arms}
    c = crossing(arms["oelm-freeze"], arms["baseline"], group)
    assert (c.last_other, c.first_final, c.ahead_at_end) == (40, 60, False)
    text = reading(group)
    assert "oelm-freeze was ahead of the baseline until step 40 and behind from step 60 on" in text
    # No crossing: nothing said.
    for run in (tmp_path / "runs" / "oelm-freeze").rglob("metrics.jsonl"):
        lines = [json.loads(x) for x in run.read_text().splitlines()]
        for x in lines:
            if x["kind"] == "eval":
                x["loss"] += 0.5
        run.write_text("".join(json.dumps(x) + "\n" for x in lines))
    group = compare(load_runs([tmp_path])).groups[0]
    assert crossing(group.arms[1], group.arms[0], group) is None and "until step" not in reading(group)


def test_reading_calls_a_sweep_step_time_ratio_indicative_never_a_finding(tmp_path: Path) -> None:
    """Sweep runs are timed apart, with no interval or A/A floor: the ratio is shown, labelled indicative."""
    for seed in range(3):
        make_run(
            tmp_path,
            "baseline",
            1e-3,
            seed,
            test_perplexity=4.0,
            best_val_loss=1.4,
            mean_step_time=0.100,
            theoretical_saving=0.0,
        )
        make_run(
            tmp_path,
            "oelm-freeze",
            1e-3,
            seed,
            test_perplexity=4.1 + 0.01 * seed,
            best_val_loss=1.45,
            mean_step_time=0.090,
            theoretical_saving=0.037,
        )
    from oelm.reports.reading import reading

    text = reading(compare(load_runs([tmp_path])).groups[0])
    assert "0.90x the baseline's (90.0 vs 100.0 ms; indicative only" in text and "theoretical saving of 3.7%" in text
    assert "less time" not in text and "more time" not in text  # no saving or cost claimed from it


def test_every_markdown_table_comes_from_one_formatter(lm_sweep: Path) -> None:
    from oelm.reports.tables import md_table

    assert md_table(["a", "b"], [["1", 2], ["x", ""]]) == ["| a | b |", "|---|---|", "| 1 | 2 |", "| x |  |"]
    assert md_table(["a", "b", "c"], [], align="lrc")[1] == "|:---|---:|:---:|"
    with pytest.raises(ValueError, match="2 cells"):
        md_table(["a", "b", "c"], [["1", "2"]])
    # The report's tables are md_table's lines: header, rule, one line per row, same cell count.
    md = (write_report([lm_sweep], lm_sweep / "out")[0]).read_text()
    tables = [ln for ln in md.splitlines() if ln.startswith("|")]
    rules = [ln for ln in tables if set(ln) <= set("|-:")]
    assert len(rules) == 2 and all(ln.endswith(" |") for ln in tables if ln not in rules)


def test_printed_summary_fits_100_columns(lm_sweep: Path, capsys: pytest.CaptureFixture) -> None:
    from oelm.reports.report import SUMMARY_WIDTH, print_summary, summary_table
    from oelm.reports.tables import text_table

    assert text_table(["a", "long\nhead"], [["xyz", "1"]], align="lr") == [
        "     long",
        "a    head",
        "───  ────",
        "xyz     1",
    ]
    # The longest registered method name, with a paired interval: the widest usual row.
    for seed in range(3):
        make_run(
            lm_sweep,
            "oelm-random-scaled",
            3e-3,
            seed,
            test_perplexity=5.0 + 0.3 * seed,
            best_val_loss=1.6,
            theoretical_saving=0.037,
        )
    _, comp = write_report([lm_sweep], lm_sweep / "out")
    capsys.readouterr()
    print_summary(comp)
    printed = capsys.readouterr().out.splitlines()
    # The table fits 100 columns; prose lines (reference, verdicts, warnings) stay one line each
    # off a terminal (no hard wraps in a file: tests/test_summary_output.py).
    assert SUMMARY_WIDTH == 100 and any(ln.startswith("Reference: baseline") for ln in printed)
    table = summary_table(comp.groups[0])
    assert max(len(ln) for ln in table) <= SUMMARY_WIDTH
    assert all(ln in printed for ln in table)  # the table itself is never wrapped
    row = next(ln for ln in table if ln.startswith("oelm-random-scaled"))
    assert "lr0.003" in row and "(n=3)" in row and " [" in row  # mean ± CI and the paired interval
    assert any(ln.startswith("verdict: oelm-random-scaled: worse (resolved)") for ln in printed)
    assert any("report.md adds" in ln for ln in printed)


def test_results_schema_is_one_definition_written_in_order_and_read_by_one_status(tmp_path: Path) -> None:
    import torch

    from oelm.training.config import make_config
    from oelm.training.results import RunFacts, build_results, build_timing
    from oelm.training.rundir import plan_run

    facts = RunFacts(
        cfg=make_config({"data": "d", "out": str(tmp_path / "run"), "steps": 4, "warmup": 0}),
        steps=4,
        tokens_seen=64,
        best_val_loss=1.5,
        best_step=4,
        wall_time=1.0,
        step_times=[0.1] * 4,
        cuda_timer=False,
        eval_times=[0.2],
        world=1,
        device=torch.device("cpu"),
        amp=None,
        dataset="d",
        audit_totals={"trainable": 10, "frozen": 2},
        method_options={},
        flops_per_step=None,
        flops_saving=None,
        peak_memory=None,
        memory_kind="none",
        task_results={
            "primary_metric": "test_loss",
            "selection_metric": "best_val_loss",
            "test_loss": 1.6,
            "final_split": "test",
            "test_source": records.TEST_OFFICIAL,
        },
    )
    results = build_results(facts, {"ok": True}, build_timing(facts))
    # results.json: the common keys of records.CommonResults in their order, then the task's.
    assert tuple(results)[: len(records.COMMON_KEYS)] == records.COMMON_KEYS
    assert results["schema_version"] == records.SCHEMA_VERSION == 2 and results["status"] == records.COMPLETE
    run = tmp_path / "run"
    run.mkdir()
    assert records.run_status(run) == (records.INCOMPLETE, "no results.json") and not records.run_finished(run)
    (run / records.RESULTS_FILE).write_text(json.dumps(results))
    assert records.run_status(run) == (records.COMPLETE, "") and records.run_finished(run)
    assert load_run(run).finished and records.read_results(run) == results
    # Finished but excluded (freeze check failed): still finished for sweeps and the run directory.
    (run / records.RESULTS_FILE).write_text(json.dumps(dict(results, freeze_check={"ok": False})))
    assert records.run_status(run)[0] == records.INVALID and records.run_finished(run)
    (run / "config.yaml").write_text(yaml.safe_dump(facts.cfg.model_dump(mode="json")))
    assert plan_run(facts.cfg.model_copy(update={"resume": True})).finished is not None
    (run / records.RESULTS_FILE).write_text(json.dumps(dict(results, status="running")))
    assert records.run_status(run) == (records.INCOMPLETE, "status is 'running'") and not records.run_finished(run)


VOCABULARY = (
    r"worse \(resolved\)|better \(resolved\)|equivalent within ±[0-9.]+%"
    r"|unresolved \(smallest detectable gap (?:[0-9.]+%|n/a) at 80% power[^)]*\)"
)
FORBIDDEN = ("significant", "n.s.", "recovered", "underpowered")


def _family_sweep(root: Path) -> None:
    """One reference and four methods whose per-seed gaps give each of the four verdicts."""
    base = [10.0, 10.4, 9.8, 10.1, 10.2]
    gaps = {
        "oelm-freeze": [0.10, 0.11, 0.095, 0.105, 0.10],  # +10%: worse (resolved)
        "oelm-nofreeze": [-0.08, -0.09, -0.075, -0.085, -0.08],  # -8%: better (resolved)
        "oelm-freeze-q": [0.0005, -0.0004, 0.0002, -0.0001, 0.0003],  # tight around 0: equivalent
        "oelm-freeze-k": [0.05, -0.06, 0.04, -0.02, 0.03],  # wide: unresolved
    }
    for seed, b in enumerate(base):
        make_run(root, "baseline", 1e-3, seed, test_perplexity=b, best_val_loss=2.0)
        for method, g in gaps.items():
            make_run(root, method, 1e-3, seed, test_perplexity=b * (1 + g[seed]), best_val_loss=2.0)


def test_four_verdicts_holm_and_the_vocabulary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import re

    from oelm.reports.report import print_summary

    _family_sweep(tmp_path)
    md_path, comp = write_report([tmp_path], tmp_path / "out", margin=1.0)
    group = comp.groups[0]
    verdicts = {m: v.decision.verdict for m, v in group.versus.items() if v.decision}
    assert verdicts == {
        "oelm-freeze": "worse",
        "oelm-nofreeze": "better",
        "oelm-freeze-q": "equivalent",
        "oelm-freeze-k": "unresolved",
    }
    assert group.comparisons == 4
    others = [a for a in group.arms if a.method != "baseline"]
    decisions = [group.versus_of(a.method).decision for a in others]
    raw = [d.p for d in decisions]
    from statsmodels.stats.multitest import multipletests

    assert [d.holm_p for d in decisions] == pytest.approx(list(multipletests(raw, method="holm")[1]))
    for a, d in zip(others, decisions):  # the test is on the interval's quantity: the per-seed % gaps
        gaps = [(a.by_seed[s] / group.arms[0].by_seed[s] - 1) * 100 for s in sorted(a.by_seed)]
        assert d.p == pytest.approx(sps.ttest_1samp(gaps, 0.0).pvalue)

    report = page_sections(tmp_path / "out" / "report.json")
    g = report["groups"][0]
    assert report["margin_percent"] == 1.0 and g["margin_percent"] == 1.0 and g["comparisons"] == 4
    assert g["reference"] == "baseline" and g["baseline"] == "baseline"  # the old key is kept
    assert _arm(report, "oelm-freeze-q")["verdict"] == "equivalent within ±1%"
    assert _arm(report, "oelm-freeze")["decision"]["m"] == 4

    md = md_path.read_text()
    freeze = group.versus_of("oelm-freeze").decision
    assert f"p = {freeze.p:.3g}, Holm p = {freeze.holm_p:.3g} (m = 4)" in md
    assert "Reference: **baseline**" in md
    print_summary(comp)
    printed = capsys.readouterr().out
    for text in (md, printed, g["reading"]):
        low = text.lower()
        assert not any(word in low for word in FORBIDDEN), [w for w in FORBIDDEN if w in low]
    for text in (md, printed):
        for needle in ("worse (resolved)", "better (resolved)", "equivalent within ±1%", "unresolved (smallest"):
            assert needle in text
    # Every verdict cell of the main table is one of the four.
    head = next(ln.split(" | ") for ln in md.splitlines() if ln.startswith("| method | setting chosen"))
    rows = [r for ln in md.splitlines() if ln.startswith("| oelm-") and len(r := ln.split(" | ")) == len(head)]
    col = head.index("verdict")
    assert rows and all(re.fullmatch(VOCABULARY, r[col]) for r in rows)
    # A narrower margin: the tight gaps are still equivalent within it, the wide ones are not.
    _, comp2 = write_report([tmp_path], tmp_path / "out2", margin=0.2)
    assert comp2.groups[0].versus_of("oelm-freeze-q").decision.verdict == "equivalent"


def test_a_comparison_is_a_new_value_and_rebase_changes_nothing_shared(tmp_path: Path) -> None:
    """Re-referencing a table gives a new Group; the original, its arms and its comparisons stay."""
    import dataclasses

    _family_sweep(tmp_path)
    group = compare(load_runs([tmp_path])).groups[0]
    before = dict(group.versus)
    moved = rebase(group, "oelm-nofreeze", margin=1.0)
    assert moved is not group and moved.arms is group.arms  # the arms are shared, never repainted
    assert group.baseline == "baseline" and group.versus == before and group.margin == stats.MARGIN
    assert moved.baseline == "oelm-nofreeze" and moved.margin == 1.0
    assert moved.versus == compare_to(group.arms, "oelm-nofreeze", group.higher_is_better, 1.0)
    assert moved.versus_of("oelm-nofreeze").gap == 0 and moved.versus_of("oelm-nofreeze").decision is None
    assert moved.versus_of("baseline").gap > 0 and moved.versus_of("baseline").reference == "oelm-nofreeze"
    assert rebase(moved, "baseline", margin=stats.MARGIN).versus == before  # nothing hidden carried over
    with pytest.raises(dataclasses.FrozenInstanceError):
        group.arms[0].lr = 1.0  # type: ignore[misc]
    assert compare_to(group.arms, "baseline", group.higher_is_better) == before


def test_cli_report_takes_a_margin(tmp_path: Path) -> None:
    _family_sweep(tmp_path)
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "o"), "--margin", "0.5"]) == 0
    report = page_sections(tmp_path / "o" / "report.json")
    assert report["groups"][0]["margin_percent"] == 0.5
    assert _arm(report, "oelm-freeze-q")["verdict"] == "equivalent within ±0.5%"


def test_runs_trained_on_differently_prepared_data_are_not_compared(tmp_path: Path) -> None:
    for seed in range(3):
        make_run(tmp_path, "baseline", 1e-3, seed, test_perplexity=4.0, best_val_loss=1.4, data_fingerprint="aaaa")
        fp = "aaaa" if seed < 2 else "bbbb"  # the last seed ran after the data was prepared again
        make_run(tmp_path, "oelm-freeze", 1e-3, seed, test_perplexity=4.1, best_val_loss=1.45, data_fingerprint=fp)
    with pytest.raises(UserError, match=r"trained on different data \(aaaa: 5 run\(s\).*bbbb: 1 run\(s\)"):
        compare(load_runs([tmp_path]))
    same = tmp_path / "runs" / "oelm-freeze" / "lr0.001" / "seed2" / "results.json"
    same.write_text(json.dumps({**json.loads(same.read_text()), "data_fingerprint": "aaaa"}))
    assert compare(load_runs([tmp_path])).groups  # one preparation: compared as usual


def test_version_1_records_read_in_todays_names_and_reports_name_the_split(tmp_path: Path) -> None:
    """model_type -> method; a validation-only final_perplexity is not passed off as final; splits shown."""
    for seed in range(3):
        for method in ("baseline", "oelm-freeze"):
            run = make_run(
                tmp_path,
                method,
                1e-3,
                seed,
                val_perplexity=10.0 + seed + (method != "baseline"),
                primary_metric="val_perplexity",
                test_perplexity=None,
                test_loss=None,
                best_val_loss=2.0 + seed / 10,
            )
            res = json.loads((run / "results.json").read_text())
            res.pop("method")  # a version-1 record that named the method only as model_type
            res["final_perplexity"] = res["val_perplexity"]  # version 1: validation, when no test
            (run / "results.json").write_text(json.dumps(res))
    read = load_run(tmp_path / "runs" / "baseline" / "lr0.001" / "seed0").results
    assert read["method"] == "baseline" and "model_type" not in read
    assert read["final_split"] == "val" and read["final_perplexity"] is None and read["test_source"] is None
    fresh = records.normalize_results({"task": "lm", "method": "m", "test_loss": 2.0, "final_perplexity": 7.4})
    assert fresh["final_split"] == "test" and fresh["final_perplexity"] == 7.4
    assert fresh["test_source"] == records.TEST_UNKNOWN
    # A record of today with a subset selection set: the report labels the validation metric.
    for seed in range(3):
        path = tmp_path / "runs" / "oelm-freeze" / "lr0.001" / f"seed{seed}" / "results.json"
        res = json.loads(path.read_text())
        path.write_text(json.dumps({**res, "val_windows": 64, "val_windows_all": 900, "val_subset": True}))
    md_path, comp = write_report([tmp_path / "runs"], tmp_path / "rep")
    md = md_path.read_text()
    assert "final numbers on **validation** (the data has no test split)" in md
    assert comp.groups[0].splits["final_split"] == "val"
    assert comp.groups[0].splits["val_subset"] == "mixed"  # only one arm's records say: not claimed
    for seed in range(3):
        path = tmp_path / "runs" / "baseline" / "lr0.001" / f"seed{seed}" / "results.json"
        res = json.loads(path.read_text())
        path.write_text(json.dumps({**res, "val_windows": 64, "val_windows_all": 900, "val_subset": True}))
    md = write_report([tmp_path / "runs"], tmp_path / "rep")[0].read_text()
    assert "val_perplexity (val, subset of 64 windows)" in md and "a fixed subset of 64 of the split's 900" in md


def _cls_run(root: Path, method: str, seed: int, correct: np.ndarray | None) -> None:
    """A classification run whose held-out accuracy is the mean of `correct` (stored per example)."""
    acc = float(correct.mean()) if correct is not None else 0.8 + seed / 100
    run = make_run(
        root,
        method,
        1e-4,
        seed,
        task="classification",
        heldout_accuracy=acc,
        best_accuracy=0.8,
        collapsed=False,
        primary_metric="heldout_accuracy",
        selection_metric="best_accuracy",
    )
    if correct is not None:
        items = {"metric": "heldout_accuracy", "unit": "example", "values": correct.astype(int).tolist()}
        (run / records.TEST_ITEMS_FILE).write_text(json.dumps(items))


def test_classifier_gap_interval_includes_test_set_noise(tmp_path: Path) -> None:
    """Seeds that agree exactly still leave the test set's noise: the seeds x test examples interval shows it."""
    rng = np.random.default_rng(0)
    n = 200  # a small test set: its noise dominates
    base = (rng.random(n) < 0.8).astype(int)
    worse = base.copy()
    worse[rng.choice(np.flatnonzero(base == 1), 10, replace=False)] = 0  # 10 fewer right: -5 points
    for seed in range(3):  # every seed the same predictions: no seed spread at all
        _cls_run(tmp_path / "boot", "baseline", seed, base)
        _cls_run(tmp_path / "boot", "oelm-freeze", seed, worse)
    md_path, comp = write_report([tmp_path / "boot"])
    vs = comp.groups[0].versus_of("oelm-freeze")
    boot = vs.gap_items
    gap = (base.mean() - worse.mean()) / base.mean() * 100
    assert boot is not None and boot.n_seeds == 3 and boot.n_items == n
    assert boot.mean == pytest.approx(gap) and boot.ci_low < gap < boot.ci_high
    # The paired difference of 10 of 200 examples: its SE in % of the reference, paired by example.
    se = np.std(base - worse, ddof=1) / np.sqrt(n) / base.mean() * 100
    assert boot.ci_high - boot.ci_low == pytest.approx(2 * 1.96 * se, rel=0.25)
    # The seeds-only interval of identical per-seed gaps has zero width: it claims a certainty the
    # 200-example test set does not give.
    assert vs.gap_paired.ci_low == pytest.approx(vs.gap_paired.ci_high)
    md = md_path.read_text()
    assert f"[{boot.ci_low:+.2f}, {boot.ci_high:+.2f}] (seeds + test examples)" in md
    report = page_sections(tmp_path / "boot" / "report" / "report.json")
    assert _arm(report, "oelm-freeze")["gap_seeds_items"]["method"].startswith("Student t, seeds x test items")
    # Records without per-example data keep the seeds-only interval, labelled as such.
    for seed in range(3):
        _cls_run(tmp_path / "old", "baseline", seed, None)
        _cls_run(tmp_path / "old", "oelm-freeze", seed, None)
    md_path, comp = write_report([tmp_path / "old"])
    assert comp.groups[0].versus_of("oelm-freeze").gap_items is None and "(seeds only)" in md_path.read_text()


def test_seeds_items_interval_widens_with_seed_spread() -> None:
    """Seed-to-seed spread widens the interval beyond the test examples' own noise."""
    rng = np.random.default_rng(1)
    ref = (rng.random((4, 500)) < 0.8).astype(float)
    same = stats.paired_items_gap(ref * 0 + ref, ref, True)
    assert same.ci_low == same.ci_high == 0.0  # identical arms: no gap at all
    spread = ref.copy()
    spread[0, :40] = 0  # one seed much worse: the seeds disagree
    wide = stats.paired_items_gap(spread, ref, True)
    narrow = stats.paired_items_gap(np.repeat(spread[:1], 4, 0), np.repeat(ref[:1], 4, 0), True)
    assert wide.ci_high - wide.ci_low > narrow.ci_high - narrow.ci_low
    assert wide.mean == pytest.approx(np.mean((ref.mean(1) - spread.mean(1)) / ref.mean(1) * 100))
    with pytest.raises(ValueError, match="seeds, items"):
        stats.paired_items_gap(ref[0], ref[0], True)


def test_lm_tables_show_bits_per_byte_where_the_runs_recorded_it(tmp_path: Path) -> None:
    """Bits per byte (comparable across tokenizers, where perplexity is not) sits beside the
    perplexity when the runs recorded it, and reads 'n/a (not recorded)' for runs that predate it."""
    for method, bpb in (("baseline", 1.20), ("oelm-freeze", 1.25)):
        for seed in range(3):
            make_run(tmp_path / "a", method, 1e-3, seed, test_perplexity=5.0 + seed / 10, best_val_loss=1.6)
            make_run(
                tmp_path / "b", method, 1e-3, seed, test_perplexity=5.0 + seed / 10, best_val_loss=1.6,
                test_bits_per_byte=bpb + seed / 100,
            )  # fmt: skip
    md_a, _ = write_report([tmp_path / "a"], tmp_path / "ra")
    md_b, _ = write_report([tmp_path / "b"], tmp_path / "rb")
    head = "test bits per byte (comparable across tokenizers): mean ± 95% CI (n)"
    old = md_a.read_text()
    assert head in old and old.count("| n/a (not recorded) |") == 2  # one per arm, no crash
    text = md_b.read_text()
    assert head in text and "| 1.260 ± " in text and "| n/a (not recorded) |" not in text
    arms = {a["method"]: a for a in page_sections(tmp_path / "rb" / "report.json")["groups"][0]["arms"]}
    assert arms["oelm-freeze"]["bits_per_byte"]["mean"] == pytest.approx(1.26)
    assert arms["oelm-freeze"]["bits_per_byte"]["key"] == "test_bits_per_byte"
    old_arms = page_sections(tmp_path / "ra" / "report.json")["groups"][0]["arms"]
    assert {a["bits_per_byte"]["n"] for a in old_arms} == {0}


def test_a_named_control_no_table_has_is_refused_before_anything_is_written(tmp_path: Path, capsys) -> None:
    """`--baseline` with a typo wrote a page whose every gap was 'not computed' and exited 0 (the
    report and the board); a margin of inf called every gap equivalent. Both stop in one line."""
    for seed in range(2):
        for method in ("baseline", "oelm-freeze"):
            make_run(tmp_path / "runs", method, 1e-3, seed, test_perplexity=4.0 + seed, best_val_loss=1.4)
    for view in ("report", "board"):
        out = tmp_path / f"out-{view}"
        argv = ["report", "--view", view, str(tmp_path / "runs"), "--out", str(out), "--baseline", "basline"]
        assert main(argv) == 2 and not out.exists()
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["oelm: error: --baseline 'basline' names no arm of these runs; arms: baseline, oelm-freeze"]
    for margin in ("inf", "nan", "0", "-1"):
        assert main(["report", str(tmp_path / "runs"), "--margin", margin]) == 2
        assert "--margin: must be a finite number > 0" in capsys.readouterr().err
