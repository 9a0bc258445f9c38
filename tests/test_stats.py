"""Statistics over seeds checked against values worked out by hand (and scipy for p-values)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from oelm.reports import stats


def test_summary_of_three_values_matches_hand_computation() -> None:
    s = stats.summarize([1.0, 2.0, 3.0])
    # mean 2, sample std 1, t_{0.975, df=2} = 4.302652729911275, half = t * 1 / sqrt(3)
    assert s.n == 3 and s.mean == pytest.approx(2.0) and s.std == pytest.approx(1.0)
    assert s.half_width == pytest.approx(4.302652729911275 / math.sqrt(3))
    assert (s.ci_low, s.ci_high) == pytest.approx((2 - 2.4841377, 2 + 2.4841377), abs=1e-6)


def test_single_seed_has_no_interval_and_empty_has_no_mean() -> None:
    one = stats.summarize([4.27])
    assert one.n == 1 and one.mean == 4.27 and one.ci_low is None and one.half_width is None
    assert stats.summarize([]).mean is None
    assert stats.summarize([float("nan"), 2.0]).n == 1  # non-finite values are dropped


def test_paired_t_test_by_seed() -> None:
    method = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 9: 7.0}  # seed 9 has no baseline partner
    base = {0: 0.5, 1: 1.0, 2: 2.5, 3: 3.0}
    test = stats.paired_test(method, base)
    assert test is not None and test.n == 4 and test.seeds == (0, 1, 2, 3)
    # diffs 0.5, 1, 0.5, 1: mean 0.75, sd 0.288675, t = 0.75 / (0.288675 / 2) = 5.196152
    assert test.mean_diff == pytest.approx(0.75)
    assert test.t_statistic == pytest.approx(5.196152, rel=1e-6)
    assert test.p_value == pytest.approx(2 * sps.t.sf(5.196152, df=3), rel=1e-5)
    assert test.wilcoxon_p is None  # needs >= 6 seeds


def test_paired_test_needs_three_seeds_and_wilcoxon_six() -> None:
    assert stats.paired_test({0: 1.0, 1: 2.0}, {0: 1.5, 1: 2.5}) is None
    m = {s: float(s) + 0.1 * s for s in range(6)}
    b = {s: float(s) for s in range(6)}
    test = stats.paired_test(m, b)
    assert test is not None and test.wilcoxon_p == pytest.approx(
        sps.wilcoxon([m[s] for s in range(6)], [b[s] for s in range(6)]).pvalue
    )
    same = stats.paired_test({0: 2.0, 1: 3.0, 2: 4.0}, {0: 1.0, 1: 2.0, 2: 3.0})
    assert same is not None and same.p_value is None  # constant differences: t undefined


def test_relative_gap_sign_means_worse() -> None:
    # The study's TinyStories numbers: 4.69 vs 4.27 perplexity is 9.84% worse.
    assert stats.relative_gap(4.69, 4.27, higher_is_better=False) == pytest.approx(9.8360656)
    # Accuracy 0.80 vs baseline 0.90 is (0.90 - 0.80) / 0.90 = 11.11% worse.
    assert stats.relative_gap(0.80, 0.90, higher_is_better=True) == pytest.approx(11.111111)
    assert stats.relative_gap(0.95, 0.90, higher_is_better=True) < 0
    assert stats.paired_gaps({0: 2.2, 1: 3.3}, {0: 2.0, 1: 3.0, 2: 1.0}, False) == pytest.approx([10.0, 10.0])


def test_metric_direction() -> None:
    assert stats.is_higher_better("heldout_accuracy") and stats.is_higher_better("best_accuracy")
    assert not stats.is_higher_better("test_perplexity") and not stats.is_higher_better("best_val_loss")
    with pytest.raises(ValueError):
        stats.is_higher_better("step_time")


# ---- power: reference values of G*Power / statsmodels TTestPower (one-sample = paired t,
# two-sided alpha 0.05, power 0.8; at n = 2, one degree of freedom, scipy's noncentral t gives
# nan at powers near 0.8, which must not read as a power of 1) -----------------------------------
@pytest.mark.parametrize("n, d", [(2, 11.5499), (10, 0.9960), (20, 0.6604), (30, 0.5292)])
def test_min_detectable_effect_size_matches_reference_tables(n: int, d: float) -> None:
    from oelm.reports.stats import min_detectable_effect_size, paired_power

    assert min_detectable_effect_size(n) == pytest.approx(d, abs=5e-4)
    assert paired_power(d, n) == pytest.approx(0.8, abs=2e-3)


@pytest.mark.parametrize("d, n", [(0.2, 199), (0.5, 34), (0.8, 15), (1.0, 10), (10.0, 3)])
def test_seeds_needed_matches_reference_tables(d: float, n: int) -> None:
    from oelm.reports.stats import paired_power, seeds_needed

    assert seeds_needed(d) == n
    assert paired_power(d, n) >= 0.8 > paired_power(d, n - 1)


def test_mde_has_the_promised_power_by_simulation() -> None:
    """At the MDE of 5 seeds, a simulated paired t-test rejects about 80% of the time."""
    from scipy import stats as sps

    from oelm.reports.stats import min_detectable_effect_size

    n, sims = 5, 20000
    d = min_detectable_effect_size(n)
    diffs = np.random.default_rng(0).normal(d, 1.0, size=(sims, n))
    p = sps.ttest_1samp(diffs, 0.0, axis=1).pvalue
    assert np.mean(p < 0.05) == pytest.approx(0.8, abs=0.015)


def test_power_analysis_flags_an_observed_gap_below_the_mde() -> None:
    from oelm.reports.stats import min_detectable_effect_size, power_analysis

    gaps = [2.0, -1.0, 1.5]  # mean 0.83%, SD 1.61%
    pw = power_analysis(gaps)
    assert pw.mde == pytest.approx(min_detectable_effect_size(3) * np.std(gaps, ddof=1))
    assert pw.underpowered and pw.seeds_for_observed > 3
    clear = power_analysis([10.0, 10.5, 9.5, 10.2])
    assert not clear.underpowered and clear.seeds_for_observed <= 4
    assert power_analysis([1.0]).mde is None


# ---- multiplicity, equivalence and the verdict ---------------------------------------------------


def test_holm_equals_statsmodels_and_skips_missing() -> None:
    from statsmodels.stats.multitest import multipletests

    ps = [0.01, 0.04, 0.03, 0.2]
    assert stats.holm(ps) == pytest.approx(list(multipletests(ps, method="holm")[1]))
    out = stats.holm([0.01, None, 0.04])
    assert out[1] is None and out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.04)
    assert stats.holm([None, None]) == [None, None]


def test_tost_declares_equivalence_only_for_tight_gaps_near_zero() -> None:
    tight = [0.05, -0.04, 0.02, -0.01, 0.03]
    wide = [2.0, -1.5, 0.5, -2.5, 1.8]
    assert stats.tost(tight, margin=1.0) < 0.05
    assert stats.tost(wide, margin=1.0) > 0.05
    assert stats.tost([0.1, 0.1, 0.1]) is None  # zero variance: undefined


def test_each_verdict_from_a_constructed_family() -> None:
    worse = [10.0, 11.0, 9.5, 10.5]
    better = [-8.0, -9.0, -7.5, -8.5]
    equal = [0.05, -0.04, 0.02, -0.01]
    noisy = [5.0, -6.0, 4.0, -2.0]
    decisions = stats.decide_family([worse, better, equal, noisy], margin=1.0)
    assert [d.verdict for d in decisions] == [stats.WORSE, stats.BETTER, stats.EQUIVALENT, stats.UNRESOLVED]
    assert {d.m for d in decisions} == {4}
    raw = [d.p for d in decisions]
    assert [d.holm_p for d in decisions] == pytest.approx(stats.holm(raw))
    assert decisions[3].mde == pytest.approx(stats.power_analysis(noisy, 0.05 / 4).mde)  # at the Holm level
    # Too few seeds: no test, so it is not counted in m and stays unresolved without a detectable gap.
    short = stats.decide_family([worse, [1.0, 2.0]])
    assert short[0].m == 1 and short[1].verdict == stats.UNRESOLVED and short[1].mde is None


def test_the_detectable_gap_is_that_of_the_holm_adjusted_test() -> None:
    """A verdict's detectable gap is computed at Holm's strictest level alpha/m, the level its gap
    must pass: larger than the unadjusted one as soon as m > 1, equal to it at m = 1."""
    gaps = [7.1, 3.0, 11.1]
    alone = stats.decide_family([gaps])[0]
    assert alone.mde == pytest.approx(stats.power_analysis(gaps).mde) and alone.mde_alpha == 0.05
    family = stats.decide_family([gaps] + [[0.5, 0.4, 0.6]] * 13)
    first = family[0]
    assert first.m == 14 and first.mde_alpha == pytest.approx(0.05 / 14)
    assert first.mde == pytest.approx(stats.power_analysis(gaps, 0.05 / 14).mde)
    assert first.mde > 3 * alone.mde  # three seeds at alpha 0.0036: a far weaker test
    assert first.verdict == stats.UNRESOLVED and abs(first.mean_gap) < first.mde


def test_tost_power_is_a_probability_that_grows_with_seeds_and_margin() -> None:
    powers = [stats.tost_power(1.0, n, 1.0, 0.05) for n in (3, 6, 12, 48)]
    assert all(0.0 <= p <= 1.0 for p in powers) and powers == sorted(powers) and powers[-1] > 0.9
    assert stats.tost_power(1.0, 6, 2.0, 0.05) > stats.tost_power(1.0, 6, 1.0, 0.05)
    assert stats.tost_power(None, 6, 1.0, 0.05) is None and stats.tost_power(0.0, 3, 1.0, 0.05) == 1.0
    # The twin board's regime (4 seeds, SD ~1.2%, Holm over 12): equivalence within ±1% is out of reach.
    assert stats.tost_power(1.2, 4, 1.0, 0.05 / 12) < 0.05
