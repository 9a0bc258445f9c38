"""Scaling fits of a ladder (oelm.reports.scaling): L(N) = E + A / N^alpha per arm, paired bootstrap."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oelm.reports.scaling import (
    DATA_BUDGETS,
    FLOORLESS,
    MIN_RUNGS,
    TARGET_PARAMS,
    DataLaw,
    PowerLaw,
    data_gap,
    fit_data_law,
    fit_data_pair,
    fit_pair,
    fit_power_law,
    gap_percent,
    reach,
    sig,
)

SIZES = [4_000, 9_000, 23_000, 50_000, 100_000, 220_000]


def series(law: PowerLaw, noise: float, seed: int, sizes=SIZES, seeds: int = 3) -> dict[int, dict[int, float]]:
    """Per-seed losses on a known curve, multiplied by log-normal noise (a shared draw per seed and rung)."""
    rng = np.random.default_rng(seed)
    return {n: {s: float(law.loss(n)) * math.exp(rng.normal(0, noise)) for s in range(seeds)} for n in sizes}


def test_the_fit_recovers_a_known_curve() -> None:
    """Exact points of L = 1.2 + 40 / N^0.4: E, A and alpha come back to 1e-4."""
    law = PowerLaw(1.2, 40.0, 0.4)
    fit = fit_power_law(SIZES, [float(law.loss(n)) for n in SIZES])
    floor, scale = fit.E, fit.A
    assert floor == pytest.approx(1.2, rel=1e-4) and scale == pytest.approx(40.0, rel=1e-3)
    assert fit.alpha == pytest.approx(0.4, rel=1e-4)


def test_a_constant_factor_in_a_reads_as_a_parameter_multiplier_and_no_exponent_difference() -> None:
    """Frozen arm: the same floor and exponent, 1.5x the A: it needs 1.5^(1/0.4) = 2.76x the parameters."""
    control, frozen = PowerLaw(1.2, 40.0, 0.4), PowerLaw(1.2, 60.0, 0.4)
    f, c, pair = fit_pair(
        "gpt", "oelm-freeze", "oelm-nofreeze", series(frozen, 0.002, 1), series(control, 0.002, 2), boot=40
    )
    assert f.alpha_low <= 0.4 <= f.alpha_high and c.alpha_low <= 0.4 <= c.alpha_high
    assert pair.d_alpha_low <= 0 <= pair.d_alpha_high
    assert pair.multiplier_low <= 1.5 ** (1 / 0.4) <= pair.multiplier_high and pair.never == 0
    assert pair.at == SIZES[-1] and "extrapolation" in pair.note
    # The gap falls with size, since both curves approach the same floor.
    assert pair.predicted_gap < gap_percent(frozen, control, SIZES[-1]) and pair.reach_1pct < math.inf


def test_a_smaller_exponent_is_resolved_and_the_gap_never_closes() -> None:
    """Frozen arm learning more slowly (alpha 0.3 against 0.4) with a higher floor: the interval of the
    exponent difference excludes 0, and the predicted gap never falls to 1%."""
    control, frozen = PowerLaw(1.2, 40.0, 0.4), PowerLaw(1.3, 20.0, 0.3)
    _, _, pair = fit_pair("gpt", "f", "c", series(frozen, 0.002, 3), series(control, 0.002, 4), boot=40)
    assert pair.d_alpha_high < 0
    assert pair.reach_1pct == math.inf and pair.predicted_low > 5


def test_fewer_than_five_rungs_get_no_fit() -> None:
    """OLMo's ladder refuses fewer than five points; so does this one, saying why."""
    law = PowerLaw(1.2, 40.0, 0.4)
    sizes = SIZES[: MIN_RUNGS - 1]
    f, c, pair = fit_pair("gpt", "f", "c", series(law, 0.01, 0, sizes), series(law, 0.01, 1, sizes), boot=10)
    assert f.alpha is None and pair.multiplier is None and pair.d_alpha is None
    assert pair.note == f"{MIN_RUNGS - 1} rung(s): a fit needs at least {MIN_RUNGS} sizes" == f.note


def test_the_bootstrap_is_seeded_and_its_numbers_rounded_to_what_they_mean() -> None:
    """Two fits of the same records agree exactly; stored numbers have 4 significant digits."""
    a = fit_pair(
        "gpt", "f", "c", series(PowerLaw(1.3, 50, 0.35), 0.01, 5), series(PowerLaw(1.2, 40, 0.4), 0.01, 6), boot=20
    )
    b = fit_pair(
        "gpt", "f", "c", series(PowerLaw(1.3, 50, 0.35), 0.01, 5), series(PowerLaw(1.2, 40, 0.4), 0.01, 6), boot=20
    )
    assert (a[2].d_alpha_low, a[2].multiplier_high, a[0].E) == (b[2].d_alpha_low, b[2].multiplier_high, b[0].E)
    assert len(f"{a[2].d_alpha:.12g}".lstrip("-").replace(".", "").lstrip("0")) <= 4
    assert sig(123456.0) == 123500.0 and sig(math.inf) == math.inf and sig(None) is None


def test_params_for_and_reach_read_the_curves() -> None:
    """The N at which a curve reaches a loss, and where a gap falls to 1%, are exact on known curves."""
    law = PowerLaw(1.0, 10.0, 0.5)
    assert law.params_for(1.1) == pytest.approx(10_000.0) and law.params_for(1.0) == math.inf
    f, c = PowerLaw(1.0, 20.0, 0.5), PowerLaw(1.0, 10.0, 0.5)
    n = reach(f, c, 1_000.0)
    # The gap falls as 10 / sqrt(N) nats: 1% perplexity at 10 / sqrt(N) = log(1.01).
    assert n == pytest.approx((10 / math.log(1.01)) ** 2, rel=0.03)


def test_a_floor_the_rungs_cannot_identify_is_named_not_hidden() -> None:
    """Pure power-law losses (no floor): the fitted E sits at the optimizer's bound, and the arm and
    pair say that their extrapolation assumes the loss keeps falling at the same rate."""
    pure_c, pure_f = PowerLaw(0.0, 8.0, 0.12), PowerLaw(0.0, 9.0, 0.11)
    f, c, pair = fit_pair("gpt", "f", "c", series(pure_f, 0.002, 7), series(pure_c, 0.002, 8), boot=10)
    assert FLOORLESS == c.note == f.note and pair.note.endswith(FLOORLESS)
    assert c.alpha == pytest.approx(0.12, abs=0.01)


def test_a_curve_that_misses_its_rungs_says_so() -> None:
    """Losses on a plateau at the small rungs, then falling (a broken power law): the fitted form
    misses a rung's mean by many standard errors, and the fit says it is no law."""
    from oelm.reports.scaling import MISFIT

    rng = np.random.default_rng(9)

    def broken(seed_shift: float) -> dict[int, dict[int, float]]:
        return {
            n: {s: min(3.1, 40.0 * n**-0.3) * (1 + seed_shift) * math.exp(rng.normal(0, 0.002)) for s in range(3)}
            for n in SIZES
        }

    f, c, pair = fit_pair("gpt", "f", "c", broken(0.02), broken(0.0), boot=10)
    assert c.misfit > 3 * c.seed_se and MISFIT in c.note and MISFIT in pair.note


# ---- L(N, D) ----------------------------------------------------------------------------------------

# A ladder at 20 tokens per parameter with its two smallest sizes also at 80 and 300.
CELLS = [(n, 20 * n) for n in SIZES] + [(n, b * n) for n in SIZES[:2] for b in (80, 300)]


def cells(law: DataLaw, noise: float, seed: int) -> dict[tuple[int, int], dict[int, float]]:
    rng = np.random.default_rng(seed)
    return {k: {s: law.loss(*k) * math.exp(rng.normal(0, noise)) for s in range(3)} for k in CELLS}


def test_the_data_law_fit_recovers_a_known_surface() -> None:
    """Exact points of L = 1.0 + 30 / N^0.35 + 60 / D^0.3: the exponents come back to 1e-3."""
    law = DataLaw(1.0, 30.0, 0.35, 60.0, 0.3)
    fit = fit_data_law([n for n, _ in CELLS], [d for _, d in CELLS], [law.loss(*k) for k in CELLS])
    assert fit.alpha == pytest.approx(0.35, rel=1e-3) and fit.beta == pytest.approx(0.3, rel=1e-3)
    assert fit.loss(1e6, 2e7) == pytest.approx(law.loss(1e6, 2e7), rel=1e-4)


def test_a_frozen_arm_that_gains_less_from_data_is_read_so_and_the_gap_extrapolated_per_budget() -> None:
    """The frozen arm's data exponent is 0.25 against the control's 0.3 (equal data terms at 2e5
    tokens): the fit resolves the difference of betas below 0, and its extrapolated gap at 124M
    parameters falls from 20 to 300 tokens per parameter, as the true surfaces' does. The point
    values are not asserted: three seeds a cell leave an extrapolation over three decades loose."""
    control = DataLaw(1.0, 30.0, 0.35, 60.0, 0.3)
    frozen = DataLaw(1.0, 30.0, 0.35, 60.0 * 2e5**-0.05, 0.25)
    truth = {b: data_gap(frozen, control, TARGET_PARAMS, b) for b in DATA_BUDGETS}
    assert truth[20] > truth[300] > 0
    fit = fit_data_pair(
        "gpt", "oelm-freeze", "oelm-nofreeze", cells(frozen, 0.002, 1), cells(control, 0.002, 2), boot=40
    )
    assert (fit.cells, fit.sizes, fit.budgets) == (len(CELLS), len(SIZES), 3)
    assert fit.d_beta_low <= fit.d_beta <= fit.d_beta_high < 0
    for b in DATA_BUDGETS:
        value, low, high = fit.predicted[b]
        assert low <= value <= high and fit.predicted_loo[b][0] <= fit.predicted_loo[b][1]
    assert fit.predicted[300][0] < fit.predicted[20][0] and "extrapolation from 10 cells" in fit.note


def test_no_data_law_without_five_sizes_and_a_size_at_two_budgets() -> None:
    law = DataLaw(1.0, 30.0, 0.35, 60.0, 0.3)
    only_size = {k: v for k, v in cells(law, 0.002, 1).items() if k[1] == 20 * k[0]}
    fit = fit_data_pair("gpt", "oelm-freeze", "oelm-nofreeze", only_size, only_size, boot=5)
    assert fit.d_beta is None and fit.predicted == {} and "no size trained at two budgets" in fit.note


def test_leaving_one_rung_out_shows_what_the_seed_bootstrap_cannot_a_rung_the_curve_leans_on() -> None:
    """The frozen arm's top rung reads 3% high in every seed (a shift the seeds share): the bootstrap
    over seeds keeps that rung in every draw and stays narrow around a gap far from the true 1.2%,
    while the refits that leave one rung out span it, from near the truth to the shifted curve."""
    control, frozen = PowerLaw(1.2, 40.0, 0.4), PowerLaw(1.2, 60.0, 0.4)
    shifted = {
        n: {s: v * (1.03 if n == SIZES[-1] else 1.0) for s, v in d.items()} for n, d in series(frozen, 0.002, 1).items()
    }
    _, _, pair = fit_pair("gpt", "oelm-freeze", "oelm-nofreeze", shifted, series(control, 0.002, 2), boot=40)
    truth = gap_percent(frozen, control, TARGET_PARAMS)
    assert pair.predicted_high - pair.predicted_low < 3 and pair.predicted_low > 3 * truth
    low, high = pair.predicted_loo
    assert low < 2 * truth and high >= pair.predicted_gap and high - low > 10


def test_a_rung_with_one_paired_seed_enters_the_fit_as_a_fixed_point_and_is_named() -> None:
    """The GPU rungs run one seed per LR: such a rung enters the fit (before, one such rung stopped
    every fit of the ladder) as the same point in every bootstrap draw, and the note says so."""
    control, frozen = PowerLaw(1.2, 40.0, 0.4), PowerLaw(1.2, 60.0, 0.4)
    top = 1_200_000
    sf, sc = series(frozen, 0.002, 1), series(control, 0.002, 2)
    sf[top], sc[top] = {0: float(frozen.loss(top))}, {0: float(control.loss(top))}
    f, c, pair = fit_pair("gpt", "oelm-freeze", "oelm-nofreeze", sf, sc, boot=40)
    assert pair.rungs == len(SIZES) + 1 and pair.at == top and f.runs == 3 * len(SIZES) + 1
    assert "one paired seed at 1,200,000" in pair.note and f.seed_se is not None
    assert pair.multiplier_low <= 1.5 ** (1 / 0.4) <= pair.multiplier_high
