"""Statistics over seeds: mean with a Student-t 95% interval, paired tests, relative gaps."""

from __future__ import annotations

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


def paired_test(
    method: Mapping[object, float], baseline: Mapping[object, float]
) -> PairedTest | None:
    """Paired t-test (and Wilcoxon when n >= 6) of method - baseline over shared seeds."""
    seeds = sorted(
        s for s in method if s in baseline and _finite([method[s]]) and _finite([baseline[s]])
    )
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
