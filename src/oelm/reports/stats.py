"""Statistics over seeds: mean with a Student-t 95% interval, paired tests, relative gaps."""

from __future__ import annotations

import gc
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
MIN_PAIRED_SEEDS = 3  # below this a paired test has too few degrees of freedom to mean much
MIN_WILCOXON_SEEDS = 6  # with n <= 5 the exact two-sided Wilcoxon p can never reach 0.05


@dataclass(frozen=True)
class Summary:
    """Mean of values over seeds with a two-sided Student-t interval (None when n < 2)."""

    n: int
    mean: float | None
    std: float | None
    ci_low: float | None
    ci_high: float | None

    @property
    def half_width(self) -> float | None:
        """Half the width of the interval, or None when it is undefined."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_high - self.ci_low) / 2

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return {**asdict(self), "half_width": self.half_width}


@dataclass(frozen=True)
class PairedTest:
    """Paired comparison of a method against the baseline over shared seeds."""

    n: int
    seeds: tuple
    mean_diff: float
    t_statistic: float | None
    p_value: float | None
    wilcoxon_p: float | None

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return {**asdict(self), "seeds": list(self.seeds)}


def _finite(values: Sequence[float]) -> list[float]:
    """Keep only finite numbers."""
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def summarize(values: Sequence[float], confidence: float = CONFIDENCE) -> Summary:
    """Mean, sample std and Student-t interval of finite values (interval None for n < 2)."""
    vals = _finite(values)
    n = len(vals)
    if n == 0:
        return Summary(0, None, None, None, None)
    mean = float(np.mean(vals))
    if n == 1:
        return Summary(1, mean, None, None, None)
    std = float(np.std(vals, ddof=1))
    half = float(sps.t.ppf(0.5 + confidence / 2, df=n - 1)) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half)


def paired_test(method: Mapping[object, float], baseline: Mapping[object, float]) -> PairedTest | None:
    """Paired t-test (and Wilcoxon when n >= 6) of method - baseline over shared seeds."""
    seeds = sorted(s for s in method if s in baseline and _finite([method[s]]) and _finite([baseline[s]]))
    if len(seeds) < MIN_PAIRED_SEEDS:
        return None
    m = np.array([float(method[s]) for s in seeds])
    b = np.array([float(baseline[s]) for s in seeds])
    diff = m - b
    t_stat: float | None
    p_val: float | None
    if np.allclose(diff, diff[0]):
        # Constant differences have zero variance: the t statistic is undefined, not infinite.
        t_stat, p_val = None, None
    else:
        res = sps.ttest_rel(m, b)
        t_stat, p_val = float(res.statistic), float(res.pvalue)
    wil = None
    if len(seeds) >= MIN_WILCOXON_SEEDS and np.any(diff != 0):
        wil = float(sps.wilcoxon(m, b).pvalue)
    return PairedTest(len(seeds), tuple(seeds), float(diff.mean()), t_stat, p_val, wil)


def relative_gap(method: float, baseline: float, higher_is_better: bool) -> float:
    """Gap in percent, signed so that positive means the method is WORSE than the baseline.

    Lower-is-better metrics (loss, perplexity): (m / b - 1) * 100.
    Higher-is-better metrics (accuracy): (b - m) / b * 100.
    """
    if baseline == 0:
        return math.nan
    if higher_is_better:
        return (baseline - method) / baseline * 100.0
    return (method / baseline - 1.0) * 100.0


def paired_gaps(
    method: Mapping[object, float], baseline: Mapping[object, float], higher_is_better: bool
) -> list[float]:
    """Per-seed relative gaps (percent, positive = worse) over the seeds both arms share."""
    seeds = sorted(s for s in method if s in baseline)
    gaps = [relative_gap(float(method[s]), float(baseline[s]), higher_is_better) for s in seeds]
    return _finite(gaps)


def is_higher_better(metric: str) -> bool:
    """Direction of a metric from its name: accuracy/F1 up, loss/perplexity down."""
    name = metric.lower()
    if any(k in name for k in ("accuracy", "acc", "f1", "score")):
        return True
    if any(k in name for k in ("loss", "perplexity", "ppl")):
        return False
    raise ValueError(f"unknown direction for metric {metric!r}")


# ---- power -------------------------------------------------------------------------------------
ALPHA = 0.05  # two-sided significance level of the paired t-test
POWER = 0.8  # chance of detecting an effect of the minimum detectable size
MAX_SEEDS = 10_000


def paired_power(effect_size: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test with n pairs at effect size d = mean diff / sd diff:
    statsmodels' TTestPower (the one-sample t-test of the paired differences)."""
    from statsmodels.stats.power import TTestPower  # heavy optional dependency: imported on use

    if n < 2:
        return math.nan
    d = abs(effect_size)
    value = float(TTestPower().power(d, n, alpha))
    # Far out scipy's noncentral t gives nan: first in the lower tail, which is ~0 there (the upper
    # tail alone is the power; at n = 2 it is still near 0.8), then in the upper one, where it is ~1.
    if not math.isfinite(value):
        value = float(TTestPower().power(d, n, alpha / 2, alternative="larger"))
    return min(1.0, value) if math.isfinite(value) else 1.0


def min_detectable_effect_size(n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest d (in units of the paired SD) that n pairs detect with the given power."""
    from scipy.optimize import brentq  # heavy optional dependency: imported on use

    if n < 2:
        return math.inf
    return float(brentq(lambda d: paired_power(d, n, alpha) - power, 1e-9, 100.0, xtol=1e-10))


def seeds_needed(effect_size: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Smallest number of paired seeds whose test detects effect size d with the given power."""
    d = abs(effect_size)
    if not math.isfinite(d) or d == 0:
        return None
    lo, hi = 2, 2
    while paired_power(d, hi, alpha) < power:
        if hi >= MAX_SEEDS:
            return None
        lo, hi = hi, min(hi * 2, MAX_SEEDS)
    while lo < hi:  # power rises with n: bisect for the first n that reaches it
        mid = (lo + hi) // 2
        if paired_power(d, mid, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


MIN_CONFIRM_SEEDS = 3  # a confirmation's paired test needs at least this many fresh seeds


def observed_gap_seeds(
    observed: float | None, sd: float | None, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """Seeds to detect the observed gap: the fewest paired seeds (at least MIN_CONFIRM_SEEDS, what a
    paired test needs) whose two-sided paired t-test at `alpha` detects a true mean per-seed gap of
    |observed| % with `power`, were `sd` (the pilot's SD of the per-seed gaps) the true SD.

    A power estimate, not a promise: at that many seeds a true gap of that size is missed with
    probability 1 - power, and a pilot's SD of a few seeds is itself uncertain (the seed plan of
    `oelm confirm plan`, margin_seeds, plans from its upper bound). None where sd or the gap is
    missing or the gap is 0. Every page that prints this count takes it from here (Power.seeds_for_observed).
    """
    if sd is None or observed is None or not math.isfinite(observed) or observed == 0 or not math.isfinite(sd):
        return None
    if sd == 0:
        return MIN_CONFIRM_SEEDS
    n = seeds_needed(observed / sd, alpha, power)
    return None if n is None else max(MIN_CONFIRM_SEEDS, n)


@dataclass(frozen=True)
class Power:
    """What a paired comparison of n seeds can resolve, in the units of the paired values."""

    n: int
    sd_diff: float | None
    mde: float | None  # minimum detectable |mean difference| at n seeds (alpha, power below)
    observed: float | None  # the observed mean paired difference
    underpowered: bool  # |observed| < mde: this comparison cannot tell such a gap from noise
    seeds_for_observed: int | None  # seeds to detect the observed difference (observed_gap_seeds)
    alpha: float = ALPHA
    power: float = POWER

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return asdict(self)


def power_analysis(diffs: Sequence[float], alpha: float = ALPHA, power: float = POWER) -> Power:
    """Minimum detectable effect of a paired t-test from the observed paired differences, and the
    seeds to detect the observed mean difference (observed_gap_seeds)."""
    vals = _finite(diffs)
    n = len(vals)
    if n < 2:
        return Power(n, None, None, float(np.mean(vals)) if vals else None, True, None, alpha, power)
    sd = float(np.std(vals, ddof=1))
    mean = float(np.mean(vals))
    needed = observed_gap_seeds(mean, sd, alpha, power)
    if sd == 0:
        return Power(n, 0.0, 0.0, mean, False, needed, alpha, power)
    mde = min_detectable_effect_size(n, alpha, power) * sd
    return Power(n, sd, mde, mean, abs(mean) < mde, needed, alpha, power)


# ---- learning-rate sensitivity -------------------------------------------------------------------


def lr_sensitivity(losses: Sequence[float | None], cap: float) -> float | None:
    """LR sensitivity as Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer
    training instabilities", sec. 3.1) define it: E_lr[min(L(lr), L0) - L*], the expected excess of
    the final loss over the best one across the grid's learning rates (equally weighted; the grids
    are geometric), each loss capped at L0 (`cap`) and a non-finite or missing loss (a diverged
    learning rate) counted as L0; L* = the smallest capped loss. None below two learning rates."""
    if len(losses) < 2 or not math.isfinite(cap):
        return None
    capped = [min(float(v), cap) if v is not None and math.isfinite(float(v)) else cap for v in losses]
    best = min(capped)
    return float(np.mean([v - best for v in capped]))


# ---- conservative seed planning ------------------------------------------------------------------
MIN_PILOT_SEEDS = 3  # an upper confidence bound of an SD needs at least this many paired pilot seeds
SD_CONFIDENCE = 0.95  # one-sided confidence of that bound


def sd_upper_bound(sd: float, n: int, confidence: float = SD_CONFIDENCE) -> float | None:
    """One-sided upper confidence bound of a normal SD from a sample SD of n values (scipy's chi2):
    sd * sqrt((n - 1) / chi2.ppf(1 - confidence, n - 1)). None below MIN_PILOT_SEEDS values."""
    if n < MIN_PILOT_SEEDS or not math.isfinite(sd):
        return None
    return float(sd * math.sqrt((n - 1) / sps.chi2.ppf(1.0 - confidence, n - 1)))


def planned_seeds(sd_upper: float, margin: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Fresh paired seeds whose two-sided t-test at `alpha` detects a gap of ±margin with `power`
    when the SD of the per-seed gaps is `sd_upper` (seeds_needed; at least MIN_PILOT_SEEDS)."""
    if sd_upper == 0:
        return MIN_PILOT_SEEDS
    n = seeds_needed(margin / sd_upper, alpha, power)
    return None if n is None else max(MIN_PILOT_SEEDS, n)


@dataclass(frozen=True)
class MarginSeeds:
    """Seeds for 80% power at ±margin: what the seed plan of `oelm confirm plan` asks of one
    comparison (margin_seeds), a different quantity from the seeds to detect the observed gap."""

    pilot_seeds: int  # paired pilot seeds
    pilot_sd: float | None  # their sample SD of the per-seed % gaps
    sd_upper: float | None  # its one-sided SD_CONFIDENCE upper bound (None below MIN_PILOT_SEEDS)
    margin: float
    alpha: float  # the Holm level alpha / m of the plan's family
    power: float
    needed: int | None  # fresh seeds for `power` at ±margin (None: not computable)


def margin_seeds(
    gaps: Sequence[float], margin: float, m: int = 1, alpha: float = ALPHA, power: float = POWER
) -> MarginSeeds:
    """Seeds for `power` at ±margin of one comparison, from its pilot's per-seed % gaps: the fewest
    fresh paired seeds whose two-sided t-test at Holm's level alpha / m detects a gap of ±margin
    with `power` were the SD of the gaps the one-sided 95% upper bound of the pilot's SD
    (sd_upper_bound, planned_seeds). The one count `oelm confirm plan` plans and every report quotes."""
    vals = _finite(gaps)
    sd = summarize(vals).std
    upper = None if sd is None else sd_upper_bound(sd, len(vals))
    level = alpha / max(m, 1)
    needed = None if upper is None else planned_seeds(upper, margin, level, power)
    return MarginSeeds(len(vals), sd, upper, margin, level, power, needed)


def gap_upper_bound(gaps: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """One-sided upper confidence bound of the mean per-seed gap (Student t): the bound a claim
    becomes when its seeds could not reach the planned power ("the cost is below X%")."""
    return summary_upper_bound(summarize(gaps), confidence)


def summary_upper_bound(summary: Summary, confidence: float = CONFIDENCE) -> float | None:
    """gap_upper_bound from a Summary of the per-seed gaps (its n, mean and sample SD)."""
    if summary.n < 2 or summary.mean is None or summary.std is None:
        return None
    return summary.mean + float(sps.t.ppf(confidence, summary.n - 1)) * summary.std / math.sqrt(summary.n)


# ---- multiplicity and equivalence ---------------------------------------------------------------
MARGIN = 1.0  # default equivalence margin of the TOST, in % of the reference's metric

WORSE, BETTER, EQUIVALENT, UNRESOLVED = "worse", "better", "equivalent", "unresolved"
PRIMARY, EXPLORATORY = "primary", "exploratory"  # the Holm families of a table with a declared primary


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values of a family (statsmodels' multipletests); None stays None.

    The family is the p-values that exist: m = the number of not-None entries.
    """
    from statsmodels.stats.multitest import multipletests  # heavy optional dependency: imported on use

    present = [i for i, p in enumerate(pvalues) if p is not None]
    out: list[float | None] = [None] * len(pvalues)
    if not present:
        return out
    # statsmodels' Holm branch ends in gc.collect(), which walks the whole heap (~0.3 s once torch
    # is imported, paid per table); freezing the existing objects first leaves it almost nothing to walk.
    gc.freeze()
    try:
        adjusted = multipletests([float(pvalues[i]) for i in present], method="holm")[1]
    finally:
        gc.unfreeze()
    for i, p in zip(present, adjusted):
        out[i] = float(p)
    return out


def gap_test(gaps: Sequence[float]) -> tuple[float | None, float | None]:
    """Two-sided one-sample t-test of per-seed paired gaps against 0: (t, p), None when undefined.

    Undefined below MIN_PAIRED_SEEDS gaps or when every gap is the same (zero variance).
    """
    vals = _finite(gaps)
    if len(vals) < MIN_PAIRED_SEEDS or np.allclose(vals, vals[0]):
        return None, None
    res = sps.ttest_1samp(vals, 0.0)
    return float(res.statistic), float(res.pvalue)


def tost(gaps: Sequence[float], margin: float = MARGIN) -> float | None:
    """p-value of the paired TOST that the mean gap lies within ±margin (statsmodels' ttost_paired).

    The per-seed gaps are the paired differences (method against the reference, already paired
    by seed), so the test runs on them against zeros. None where a t-test is undefined.
    """
    from statsmodels.stats.weightstats import ttost_paired  # heavy optional dependency: imported on use

    vals = _finite(gaps)
    if len(vals) < MIN_PAIRED_SEEDS or np.allclose(vals, vals[0]) or margin <= 0:
        return None
    p = float(ttost_paired(np.array(vals), np.zeros(len(vals)), -margin, margin)[0])
    return p if math.isfinite(p) else None


@dataclass(frozen=True)
class Decision:
    """The verdict of one comparison against the reference, from Holm-adjusted tests of its family.

    verdict is WORSE or BETTER (the difference test's Holm p < alpha), EQUIVALENT (else the TOST's
    Holm p < alpha: the gap lies within ±margin) or UNRESOLVED (neither; mde says what the seeds
    could have resolved). p and the TOST are on the per-seed % gaps, the quantity of the paired
    interval; m is the number of comparisons in the family (those with a p-value).
    """

    verdict: str
    n: int
    mean_gap: float | None
    p: float | None
    holm_p: float | None
    tost_p: float | None
    tost_holm_p: float | None
    m: int
    margin: float
    mde: float | None  # smallest |gap| the Holm-adjusted test detects with `power` (at mde_alpha)
    alpha: float = ALPHA
    power: float = POWER
    mde_alpha: float | None = None  # the level mde is computed at: alpha / m, Holm's strictest step
    tost_power: float | None = None  # chance the Holm-adjusted TOST shows ±margin when the true gap is 0
    # The Holm family it was decided in: PRIMARY (declared before the runs), EXPLORATORY (every other
    # comparison where a primary family was declared) or "" (none declared: one family of all).
    family: str = ""

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return asdict(self)


def decide_family(
    families: Sequence[Sequence[float]],
    margin: float = MARGIN,
    alpha: float = ALPHA,
    power: float = POWER,
    family: str = "",
) -> list[Decision]:
    """One Decision per comparison of a family, given each comparison's per-seed % gaps.

    Both the difference test and the TOST are Holm-adjusted over the family (m = the comparisons
    that have a p-value). A resolved difference takes precedence over equivalence: a gap the seeds
    resolve is reported as such even where it lies within the margin.
    """
    gaps = [_finite(g) for g in families]
    ps = [gap_test(g)[1] for g in gaps]
    tosts = [tost(g, margin) if p is not None else None for g, p in zip(gaps, ps)]
    holm_ps, holm_tosts = holm(ps), holm(tosts)
    m = sum(p is not None for p in ps)
    # The detectable gap of the test actually used: Holm's strictest step tests at alpha / m, and
    # a gap must pass it whatever the others' p-values are (a bound that holds for every row).
    level = alpha / max(m, 1)
    out = []
    for g, p, hp, tp, htp in zip(gaps, ps, holm_ps, tosts, holm_tosts):
        mean = float(np.mean(g)) if g else None
        pw = power_analysis(g, level, power)
        if hp is not None and hp < alpha and mean is not None and mean != 0:
            verdict = WORSE if mean > 0 else BETTER
        elif htp is not None and htp < alpha:
            verdict = EQUIVALENT
        else:
            verdict = UNRESOLVED
        tested = p is not None  # no test: no detectable gap or equivalence power to state
        mde = pw.mde if tested else None
        eq_power = tost_power(pw.sd_diff, pw.n, margin, level) if tested else None
        out.append(
            Decision(
                verdict,
                len(g),
                mean,
                p,
                hp,
                tp,
                htp,
                m,
                margin,
                mde,
                alpha,
                power,
                level if tested else None,
                eq_power,
                family,
            )
        )
    return out


def tost_power(sd: float | None, n: int, margin: float, alpha: float) -> float | None:
    """Approximate power of the paired TOST within ±margin at level alpha when the true gap is 0,
    from the observed SD of the per-seed gaps (central-t approximation: 2 T(margin/se - t_1-a) - 1)."""
    from scipy.stats import t  # heavy optional dependency: imported on use

    if sd is None or n < 2:
        return None
    if sd == 0:
        return 1.0
    df, se = n - 1, sd / math.sqrt(n)
    return max(0.0, 2.0 * float(t.cdf(margin / se - t.ppf(1.0 - alpha, df), df)) - 1.0)


# ---- test-set noise: seeds and test items, crossed ----------------------------------------------


@dataclass(frozen=True)
class ItemsInterval:
    """Student-t interval of a mean over seeds x test items, with the test set's noise in it.

    Every seed of every arm reads the same test items, so a grand mean over a [seeds, items] table
    (a per-item 0/1 correctness, or its paired difference between two arms) carries two kinds of
    noise: the seeds' and the finite test set's, which is shared by all seeds. Its variance, in the
    two-way crossed random-effects model y_si = mu + a_s + b_i + e_si, is (MS_seeds + MS_items -
    MS_residual) / (seeds x items) from the ANOVA mean squares (the items' part dropped where
    MS_items < MS_residual, the usual non-negative estimate; never below MS_items / (seeds x items),
    so seeds that agree exactly still leave the test set's noise), with Satterthwaite's degrees of
    freedom.
    With the items' part negligible it is the Student-t interval of the per-seed means (k - 1 df),
    which holds its coverage at 3 seeds where a percentile bootstrap does not (tests/test_interval_coverage.py).
    """

    n_seeds: int
    n_items: int
    mean: float
    se: float
    df: float
    ci_low: float
    ci_high: float
    method: str = "Student t, seeds x test items crossed variance components (Satterthwaite df)"

    def p_value(self) -> float | None:
        """Two-sided p of the t-test of mean = 0; with no noise at all (se = 0) its limit: 0 for a
        non-zero mean, None (no test) for a zero one."""
        if self.se == 0:
            return 0.0 if self.mean != 0 else None
        return float(2 * sps.t.sf(abs(self.mean) / self.se, self.df))

    def tost_p(self, margin: float) -> float | None:
        """p of the two one-sided t-tests that the mean lies within ±margin (se = 0: its limit, 0 or 1)."""
        if self.se == 0:
            return 0.0 if abs(self.mean) < margin else 1.0
        low = sps.t.sf((self.mean + margin) / self.se, self.df)
        high = sps.t.cdf((self.mean - margin) / self.se, self.df)
        return float(max(low, high))

    def mde(self, alpha: float = ALPHA, power: float = POWER) -> float:
        """Smallest |mean| the two-sided test at `alpha` detects with `power` (central-t approximation)."""
        return float((sps.t.ppf(1 - alpha / 2, self.df) + sps.t.ppf(power, self.df)) * self.se)

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return asdict(self)


def seeds_items_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> ItemsInterval:
    """The ItemsInterval of the grand mean of a [seeds, items] array (>= 2 seeds, >= 2 items)."""
    y = np.asarray(values, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] < 2 or y.shape[1] < 2:
        raise ValueError(f"need a [seeds, items] array with at least 2 of each, got shape {y.shape}")
    k, n = y.shape
    grand, rows, cols = float(y.mean()), y.mean(axis=1), y.mean(axis=0)
    ms_seeds = n * float(np.var(rows, ddof=1))
    ms_items = k * float(np.var(cols, ddof=1))
    resid = y - rows[:, None] - cols[None, :] + grand
    ms_resid = float(np.sum(resid**2)) / ((k - 1) * (n - 1))
    terms = [(ms_seeds, k - 1)]  # (mean square with coefficient 1 or -1, its df)
    if ms_items > ms_resid:
        terms += [(ms_items, n - 1), (-ms_resid, (k - 1) * (n - 1))]
    if ms_items > sum(ms for ms, _ in terms):
        # Seeds that scatter less than the items' own noise (e.g. identical per-seed scores): the
        # items' mean square alone, E = (residual + seeds x item variance) / ..., never a zero width.
        terms = [(ms_items, n - 1)]
    var = sum(ms for ms, _ in terms) / (k * n)
    if var <= 0:
        return ItemsInterval(k, n, grand, 0.0, float(k - 1), grand, grand)
    df = float(sum(ms for ms, _ in terms) ** 2 / sum(ms**2 / d for ms, d in terms))
    se = math.sqrt(var)
    half = float(sps.t.ppf(0.5 + confidence / 2, df)) * se
    return ItemsInterval(k, n, grand, se, df, grand - half, grand + half)


def paired_items_gap(
    method: np.ndarray, reference: np.ndarray, higher_is_better: bool, confidence: float = CONFIDENCE
) -> ItemsInterval:
    """Interval of the mean per-seed relative gap (%, + = worse) of per-item scores, test-set noise
    included: `method` and `reference` are [seeds, items] arrays (row s of both is seed s, column i
    test item i, e.g. 0/1 correctness). Item i's share of seed s's % gap is the paired difference
    scaled by that seed's reference score, so the grand mean is the mean per-seed % gap exactly
    (the reference's seed scores taken as fixed) and seeds_items_interval gives its interval."""
    m, b = np.asarray(method, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if m.shape != b.shape or m.ndim != 2:
        raise ValueError(f"need two [seeds, items] arrays of one shape, got {m.shape} and {b.shape}")
    scale = b.mean(axis=1, keepdims=True)
    if np.any(scale == 0):
        raise ValueError("a seed of the reference scores 0: a relative gap is undefined")
    diff = (b - m) if higher_is_better else (m - b)
    return seeds_items_interval(diff / scale * 100.0, confidence)
