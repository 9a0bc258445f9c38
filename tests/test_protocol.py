"""The decisive protocol: instability flagged and counted, the robust LR rule, LR sensitivity,
the declared primary family and the conservative seed plan."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from oelm.experiments.confirm import judge, make_plan, seed_plan_lines
from oelm.experiments.sweep import spec_from_dict
from oelm.records.load import load_run, load_runs
from oelm.records.stability import DIVERGED_KIND, SPIKED, instability
from oelm.records.sweep import BEST_MEAN, ROBUST
from oelm.reports import stats
from oelm.reports.aggregate import compare
from oelm.reports.comparison import page_sections
from oelm.reports.report import write_report
from oelm.utils.errors import UserError
from test_report import make_run
from test_sweep import TINY


def _lm(root: Path, method: str, lr: float, seed: int, val: float, curve: list[float] | None = None, **more) -> Path:
    """An LM run whose best validation loss is `val` (its curve ends there unless given)."""
    return make_run(
        root,
        method,
        lr,
        seed,
        test_perplexity=math.exp(val),
        best_val_loss=val,
        higher_is_better=False,
        curve=curve or [val + 0.5, val],
        **more,
    )


# ---- instability ----------------------------------------------------------------------------------


def test_stability_rule_flags_non_finite_values_and_spikes_only(tmp_path: Path) -> None:
    stable = load_run(_lm(tmp_path, "baseline", 1e-3, 0, 1.0, curve=[2.0, 1.0, 1.45]))
    spiked = load_run(_lm(tmp_path, "baseline", 1e-3, 1, 1.0, curve=[2.0, 1.0, 1.6, 1.0]))
    nan_curve = load_run(_lm(tmp_path, "baseline", 1e-3, 2, 1.0, curve=[2.0, float("nan")]))
    stopped = load_run(
        _lm(tmp_path, "baseline", 1e-3, 3, 1.0, status="diverged", diverged_loss="nan", diverged_at_step=7)
    )
    assert instability(stable) is None  # 1.45 < 1.5 x 1.0
    flag = instability(spiked)
    assert flag is not None and flag.kind == SPIKED and "1.6 at step 60" in flag.reason  # recovered, still flagged
    assert instability(nan_curve).kind == DIVERGED_KIND
    assert instability(stopped).kind == DIVERGED_KIND and "step 7" in instability(stopped).reason
    # A classifier's validation loss rising with overconfidence is not a spike (it selects on accuracy).
    cls = make_run(
        tmp_path,
        "baseline",
        1e-3,
        9,
        task="classification",
        curve=[0.5, 0.3, 0.9],
        best_accuracy=0.8,
        heldout_accuracy=0.8,
        higher_is_better=True,
        primary_metric="heldout_accuracy",
        selection_metric="best_accuracy",
    )
    assert instability(load_run(cls)) is None


def test_flagged_runs_are_kept_counted_per_lr_and_stated_in_the_report(tmp_path: Path) -> None:
    for seed, val in enumerate([1.00, 1.01, 1.02]):
        _lm(tmp_path, "baseline", 1e-3, seed, val)
        curve = [2.0, val, 1.7] if seed == 0 else None  # seed 0 spikes after its best
        _lm(tmp_path, "oelm-freeze", 1e-3, seed, val + 0.05, curve=curve)
    _lm(tmp_path, "oelm-freeze", 2e-3, 0, float("nan"))  # non-finite: excluded, still counted
    _lm(tmp_path, "oelm-freeze", 2e-3, 1, 1.3)
    path, comp = write_report([tmp_path], tmp_path / "report")
    arm = next(a for a in comp.groups[0].arms if a.method == "oelm-freeze")
    assert arm.setting == "lr0.001" and arm.primary.n == 3  # the spiked run enters with its value
    assert arm.unstable_count() == (2, 5)
    text = path.read_text()
    assert "| 1 of 3 (1 spiked); 2 of 5 over all LRs |" in text  # main table: chosen setting; all LRs
    assert "| 1 of 2 (1 diverged) |" in text  # the LR table's row of lr 0.002
    assert "Stability rule:" in text and "enters every mean" in text  # the rule and the policy, stated
    assert "oelm-freeze: the stability check judged seed scatter at lr0.002 on fewer than 3 seeds" in text
    data = page_sections(tmp_path / "report" / "report.json")
    cells = data["groups"][0]["arms"][1]["lr_sweep"]
    assert [len(c["unstable"]) for c in cells] == [1, 1]


# ---- the LR rule ----------------------------------------------------------------------------------


def _choices(root: Path, rule: str) -> dict[str, str]:
    return {a.method: a.setting for g in compare(load_runs([root]), lr_rule=rule).groups for a in g.arms}


def test_robust_rule_skips_scattering_seeds_and_the_neighbour_of_an_unstable_lr(tmp_path: Path) -> None:
    # baseline: lr 1e-3 has the best mean but its seeds scatter (range 0.3 over mean 0.983 = 30.5%).
    for seed, val in enumerate([0.85, 0.95, 1.15]):
        _lm(tmp_path, "baseline", 1e-3, seed, val)
    for seed, val in enumerate([1.00, 1.01, 1.02]):
        _lm(tmp_path, "baseline", 5e-4, seed, val)
    # oelm-freeze: lr 1e-3 is best and tight, but its x2 neighbour has a spiked seed.
    for seed, val in enumerate([0.90, 0.91, 0.92]):
        _lm(tmp_path, "oelm-freeze", 1e-3, seed, val)
        _lm(tmp_path, "oelm-freeze", 5e-4, seed, val + 0.1)
        _lm(tmp_path, "oelm-freeze", 2e-3, seed, val + 0.2, curve=[3.0, val, 2.0] if seed == 1 else None)
    assert _choices(tmp_path, BEST_MEAN) == {"baseline": "lr0.001", "oelm-freeze": "lr0.001"}
    assert _choices(tmp_path, ROBUST) == {"baseline": "lr0.0005", "oelm-freeze": "lr0.0005"}
    arms = {a.method: a for a in compare(load_runs([tmp_path])).groups[0].arms}
    assert arms["baseline"].rejected["lr0.001"] == "seeds scatter (30.5% > 10%)"
    assert arms["oelm-freeze"].rejected["lr0.001"] == "its next larger lr 0.002 holds an unstable run"
    assert arms["oelm-freeze"].rejected["lr0.0005"] == ""


def test_lr_rule_is_a_validated_spec_field_that_reports_follow(tmp_path: Path) -> None:
    raw = {
        "config": {**TINY, "data": str(tmp_path / "data")},
        "methods": {"baseline": {"lr": [1e-3]}},
        "seeds": [0],
        "out": str(tmp_path),
    }
    assert spec_from_dict(dict(raw)).lr_rule == ROBUST
    assert spec_from_dict({**raw, "lr_rule": "best-mean"}).to_dict()["lr_rule"] == BEST_MEAN
    with pytest.raises(UserError, match="lr_rule must be one of robust, best-mean"):
        spec_from_dict({**raw, "lr_rule": "lowest-loss"})
    for seed, val in enumerate([0.85, 0.95, 1.15]):
        _lm(tmp_path, "baseline", 1e-3, seed, val)
        _lm(tmp_path, "baseline", 5e-4, seed, 1.0 + seed / 100)
    (tmp_path / "sweep.yaml").write_text(json.dumps({"methods": {"baseline": {"lr": [5e-4, 1e-3]}}, "seeds": [0]}))
    _, comp = write_report([tmp_path], tmp_path / "report")  # a record without the key: the earlier rule
    assert comp.groups[0].lr_rule == BEST_MEAN and comp.groups[0].arms[0].setting == "lr0.001"
    assert "the robust rule would choose another" in " ".join(comp.groups[0].warnings)
    assert "LR rule `best-mean`" in (tmp_path / "report" / "report.md").read_text()
    assert (tmp_path / "report" / "lr-00-tinystories-lm-gpt-tiny.png").stat().st_size > 0


def test_lr_sensitivity_is_the_mean_capped_excess_over_the_best_lr() -> None:
    # Losses over a grid: best 1.0; 2.0 is 1.0 above; a diverged LR (nan) and 9.0 count as the cap 3.0.
    assert stats.lr_sensitivity([1.0, 2.0, float("nan"), 9.0], cap=3.0) == pytest.approx((0 + 1 + 2 + 2) / 4)
    assert stats.lr_sensitivity([1.5, 1.5], cap=3.0) == 0.0
    assert stats.lr_sensitivity([1.0], cap=3.0) is None  # one LR: no range


def test_arm_sensitivity_reads_final_validation_losses_capped_at_the_first(tmp_path: Path) -> None:
    for seed in range(2):
        _lm(tmp_path, "baseline", 1e-3, seed, 1.0, curve=[4.0, 1.0])
        _lm(tmp_path, "baseline", 2e-3, seed, 1.2, curve=[3.0, 1.2, 1.4])  # final 1.4, not its best
    _lm(tmp_path, "baseline", 4e-3, 0, float("nan"), status="diverged", diverged_loss="nan", diverged_at_step=3)
    group = compare(load_runs([tmp_path])).groups[0]
    assert group.loss_cap == 4.0  # the highest first validation loss
    # L = 1.0, 1.4, 4.0 (diverged: the cap); L* = 1.0.
    assert group.arms[0].sensitivity == pytest.approx((0 + 0.4 + 3.0) / 3)


# ---- the primary family -------------------------------------------------------------------------

GAPS = {"baseline": 0.0, "oelm-freeze": 0.02, "oelm-random": 0.03, "oelm-nofreeze": 0.01}  # log-loss offsets


def _family_sweep(root: Path) -> None:
    for seed, noise in enumerate([0.0, 0.004, -0.003, 0.006]):
        for method, offset in GAPS.items():
            _lm(root, method, 1e-3, seed, 1.0 + offset + noise * (offset > 0) * (1 + offset * 20))


def test_holm_runs_over_the_declared_primary_family_only(tmp_path: Path) -> None:
    _family_sweep(tmp_path)
    runs = load_runs([tmp_path])
    everything = compare(runs).groups[0]
    declared = compare(runs, primary=[("oelm-freeze", "baseline"), ("oelm-random", "oelm-nofreeze")]).groups[0]
    d_all = everything.versus_of("oelm-freeze").decision
    d_primary = declared.versus_of("oelm-freeze").decision
    assert d_all.m == 3 and d_all.family == ""  # no primary: one family of every comparison
    assert d_primary.m == 2 and d_primary.family == stats.PRIMARY  # Holm over the two declared pairs
    assert d_primary.p == pytest.approx(d_all.p) and d_primary.holm_p < d_all.holm_p
    explore = declared.versus_of("oelm-random").decision  # not primary against the reference: exploratory
    assert explore.family == stats.EXPLORATORY and explore.m == 2  # oelm-random and oelm-nofreeze vs baseline
    assert declared.families == {stats.PRIMARY: 2, stats.EXPLORATORY: 2}
    pair = declared.primary_versus[("oelm-random", "oelm-nofreeze")]  # a primary pair off the reference
    assert pair.reference == "oelm-nofreeze" and pair.decision.m == 2


def test_reports_label_families_and_say_when_none_was_declared(tmp_path: Path) -> None:
    _family_sweep(tmp_path)
    path, _ = write_report([tmp_path], tmp_path / "plain")
    assert "No primary family was declared" in path.read_text() and "[exploratory]" not in path.read_text()
    sweep = {"methods": {m: {"lr": [1e-3]} for m in GAPS}, "seeds": [0, 1, 2, 3]}
    (tmp_path / "sweep.yaml").write_text(json.dumps({**sweep, "primary": [["oelm-freeze", "baseline"]]}))
    text = write_report([tmp_path], tmp_path / "declared")[0].read_text()
    assert "Primary family, declared before the runs: oelm-freeze vs baseline (m = 1" in text
    assert "### Primary comparisons" in text
    assert text.count("[exploratory]") >= 2 and "[primary]" in text  # main table and verdict lines


def test_primary_pairs_must_name_two_arms_of_the_spec(tmp_path: Path) -> None:
    raw = {
        "config": {**TINY, "data": str(tmp_path / "data")},
        "methods": {"baseline": {"lr": [1e-3]}, "oelm-freeze": {"lr": [1e-3]}},
        "seeds": [0],
        "out": str(tmp_path),
    }
    assert spec_from_dict({**raw, "primary": [["oelm-freeze", "baseline"]]}).to_dict()["primary"] == [
        ["oelm-freeze", "baseline"]
    ]
    with pytest.raises(UserError, match="names oelm-random, not an arm; its arms are baseline, oelm-freeze"):
        spec_from_dict({**raw, "primary": [["oelm-random", "baseline"]]})
    with pytest.raises(UserError, match="compares an arm with itself"):
        spec_from_dict({**raw, "primary": [["baseline", "baseline"]]})
    with pytest.raises(UserError, match="not a \\[method, compared with\\] pair"):
        spec_from_dict({**raw, "primary": ["oelm-freeze"]})


# ---- seeds planned from a conservative SD ---------------------------------------------------------


def test_sd_upper_bound_is_the_one_sided_chi_square_bound_and_covers_95_percent() -> None:
    assert stats.sd_upper_bound(1.0, 3) == pytest.approx(4.415, abs=1e-3)  # sqrt(2 / chi2.ppf(0.05, 2))
    assert stats.sd_upper_bound(1.0, 2) is None  # a pilot of 2 seeds plans nothing
    rng = np.random.default_rng(0)
    sds = rng.normal(size=(20_000, 4)).std(axis=1, ddof=1)  # true SD 1, pilots of 4 seeds
    covered = np.mean(sds * stats.sd_upper_bound(1.0, 4) >= 1.0)  # the bound is linear in the sample SD
    assert covered == pytest.approx(0.95, abs=0.01)


def test_planned_seeds_reach_the_power_at_the_margin_from_the_upper_bound() -> None:
    n = stats.planned_seeds(sd_upper=2.0, margin=1.0, alpha=0.05 / 2)
    assert stats.paired_power(0.5, n, 0.025) >= 0.8 > stats.paired_power(0.5, n - 1, 0.025)
    assert stats.planned_seeds(sd_upper=0.01, margin=1.0) == stats.MIN_PILOT_SEEDS  # at least 3


def _pilot(root: Path, gaps: dict[str, list[float]], n: int = 4) -> Path:
    base = [10.0, 10.2, 9.9, 10.1][:n]
    for seed, ppl in enumerate(base):
        make_run(root, "baseline", 1e-3, seed, test_perplexity=ppl, best_val_loss=1.5)
        for method, g in gaps.items():
            make_run(root, method, 1e-3, seed, test_perplexity=ppl * (1 + g[seed]), best_val_loss=1.6)
    methods = {m: {"lr": [1e-3]} for m in ["baseline", *gaps]}
    record = {"name": "pilot", "base": dict(TINY), "methods": methods, "seeds": list(range(n)), "baseline": "baseline"}
    (root / "sweep.yaml").write_text(json.dumps(record))
    return root


def test_confirmation_plan_asks_for_seeds_from_the_pilot_sd_bound_or_says_it_is_a_bound(tmp_path: Path) -> None:
    pilot = _pilot(
        tmp_path / "pilot", {"oelm-freeze": [0.10, 0.11, 0.09, 0.10], "oelm-random": [0.05, 0.06, 0.04, 0.05]}
    )
    plan = make_plan(pilot, None, every=True, primary=[["oelm-freeze", "baseline"]])
    (entry,) = plan.seed_plan  # the primary family is one pair: alpha / 1
    gaps = [100 * g for g in [0.10, 0.11, 0.09, 0.10]]
    assert entry.pilot_seeds == 4 and entry.pilot_sd == pytest.approx(float(np.std(gaps, ddof=1)), rel=1e-6)
    assert entry.sd_upper == pytest.approx(stats.sd_upper_bound(entry.pilot_sd, 4))
    assert entry.needed == stats.planned_seeds(entry.sd_upper, 1.0, 0.05) == len(plan.seeds) and entry.enough
    assert plan.primary == [["oelm-freeze", "baseline"]]
    short = make_plan(pilot, 3, every=True, primary=[["oelm-freeze", "baseline"]]).seed_plan[0]
    assert not short.enough and "cannot reach 80% power at ±1%" in short.note and "bound" in short.note
    with pytest.raises(UserError, match="names oelm-qknorm, not an arm"):
        make_plan(pilot, 3, every=True, primary=[["oelm-qknorm", "baseline"]])
    # Without a primary family the plan covers every claim, Holm over all of them.
    everyone = make_plan(pilot, 3, every=True).seed_plan
    assert [e.method for e in everyone] == ["oelm-random", "oelm-freeze"] and {e.alpha for e in everyone} == {0.025}


def test_a_two_seed_pilot_plans_no_seeds_and_the_claim_becomes_a_bound(tmp_path: Path) -> None:
    pilot = _pilot(tmp_path / "pilot", {"oelm-freeze": [0.10, 0.11]}, n=2)
    with pytest.raises(UserError, match="--seeds not given and the pilot cannot plan them"):
        make_plan(pilot, None, every=True)
    plan = make_plan(pilot, 4, every=True)
    assert plan.seed_plan[0].needed is None and "needs at least 3" in plan.seed_plan[0].note
    # The fresh seeds' claim is stated as a bound: the one-sided 95% upper end of the mean gap.
    fresh = [
        make_run(
            tmp_path / "fresh",
            m,
            1e-3,
            s,
            test_perplexity=10 * (1 + 0.1 * (m != "baseline") + 0.01 * s * (m != "baseline")),
            best_val_loss=1.5,
        )
        for s in plan.seeds
        for m in ("baseline", "oelm-freeze")
    ]
    _, results = judge(plan, [load_run(p) for p in fresh])
    gaps = [100 * (0.1 + 0.01 * s) / 1.0 for s in plan.seeds]
    assert results[0].bound == pytest.approx(stats.gap_upper_bound(gaps))
    assert results[0].bound > float(np.mean(gaps))
    text = "\n".join(seed_plan_lines(plan, results))
    assert f"is below {results[0].bound:+.2f}% with 95% confidence" in text


def test_a_spec_without_a_baseline_arm_takes_its_primary_pairs_common_reference(tmp_path: Path) -> None:
    """The twin-board specs compare frozen arms with their same-init twin and have no 'baseline'
    arm: the sweep's own report then computed no gap at all ("no finished 'baseline' runs")."""
    raw = {
        "config": {**TINY, "data": str(tmp_path / "data")},
        "methods": {m: {"lr": [1e-3]} for m in ("oelm-nofreeze", "oelm-freeze", "oelm-lowrank")},
        "seeds": [0],
        "out": str(tmp_path),
    }
    pairs = [["oelm-freeze", "oelm-nofreeze"], ["oelm-lowrank", "oelm-nofreeze"]]
    assert spec_from_dict({**raw, "primary": pairs}).baseline == "oelm-nofreeze"
    assert spec_from_dict({**raw, "primary": pairs, "baseline": "oelm-freeze"}).baseline == "oelm-freeze"
    assert spec_from_dict({**raw, "primary": [pairs[0], ["oelm-lowrank", "oelm-freeze"]]}).baseline == "baseline"
    with_baseline = {**raw, "methods": {**raw["methods"], "baseline": {"lr": [1e-3]}}}
    assert spec_from_dict({**with_baseline, "primary": pairs}).baseline == "baseline"
