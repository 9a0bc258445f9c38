"""Scaling fits of a ladder: each arm's loss against parameters, L(N) = E + A / N^alpha.

Chinchilla's approach 3 (Hoffmann et al. 2022), as the field fits a ladder: every run's test loss
(nats per token) is a point; the fit minimizes the Huber loss (delta 1e-3) of log L, with
L-BFGS-B (scipy) from a grid of starts, keeping the best. A ladder of fewer than
MIN_RUNGS sizes gets no fit (OLMo's ladder refuses fewer than five points).

Intervals come from a paired bootstrap over seeds: at every rung the seeds of an arm and its
control are resampled together (the same draw for both), both arms are refitted, and every
derived quantity is read off each refit; the interval is the 2.5-97.5 percentile range. Derived
quantities of a pair (frozen arm f against its control c):

- the difference of exponents, alpha_f - alpha_c (negative: the frozen arm improves more slowly);
- the parameter multiplier at the top rung: the N at which f reaches c's fitted loss at the top
  rung, over that rung's N ("the frozen arm needs X times the parameters"); infinite where f's
  floor E_f is at or above that loss; at a fixed tokens-per-parameter ratio, compute grows as
  N^2, so the compute multiplier is its square;
- the predicted gap in perplexity at a target size, 100 (exp(L_f(N) - L_c(N)) - 1), and the size
  where the predicted gap falls to 1%, if it does below 10^12 parameters. Both are
  extrapolations of a curve fitted far below them, stated as such.

Stored numbers are rounded to 4 significant digits: what an interval this wide can mean, and the
same on every CPU (an optimizer's last bits are not).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIN_RUNGS = 5
HUBER_DELTA = 1e-3
BOOTSTRAP = 200
BOOTSTRAP_SEED = 0
# The L(N, D) fit's extrapolated gaps keep 2 significant digits: its five parameters trade off along
# a flat valley, so a last-bit change of the arithmetic (another CPU's SIMD or BLAS path) moves a
# bootstrap draw's optimum and an interval's end by up to about 1% (measured: 12.96 against 13.06).
EXTRAPOLATED_DIGITS = 2
TARGET_PARAMS = 124_000_000  # GPT-2 small
REACH_GAP = 1.0  # % perplexity: where "the cost is gone" is read
REACH_LIMIT = 1e12
LOG_E_MIN = -10.0  # the fit's lower bound on log E: a floor fitted there is no floor at all
# Starting points: (log E, log A, alpha) on a grid wide enough for byte- and BPE-level losses.
_STARTS = [(e, a, al) for e in (-1.0, 0.0, 0.5, 1.0) for a in (0.0, 2.0, 4.0, 6.0) for al in (0.1, 0.3, 0.6)]

Series = Mapping[int, Mapping[int, float]]  # parameters -> seed -> test loss (nats per token)


@dataclass(frozen=True)
class PowerLaw:
    """L(N) = E + A / N^alpha."""

    E: float
    A: float
    alpha: float

    def loss(self, n: float | np.ndarray) -> float | np.ndarray:
        """The fitted loss at N parameters."""
        return self.E + self.A * np.power(n, -self.alpha)

    def params_for(self, loss: float) -> float:
        """The N at which the curve reaches `loss` (inf where its floor E is at or above it)."""
        if loss <= self.E or self.A <= 0 or self.alpha <= 0:
            return math.inf
        return float((self.A / (loss - self.E)) ** (1.0 / self.alpha))


def _objective(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Huber loss of log L and its gradient in (log E, log A, alpha); x = log N, y = log L."""
    e, a, alpha = theta
    second = a - alpha * x
    pred = np.logaddexp(e, second)
    r = pred - y
    w = np.exp(e - pred)  # d pred / d e
    huber = np.where(np.abs(r) <= HUBER_DELTA, 0.5 * r**2, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA))
    dr = np.clip(r, -HUBER_DELTA, HUBER_DELTA)
    grad = np.array([np.sum(dr * w), np.sum(dr * (1 - w)), np.sum(-dr * (1 - w) * x)])
    return float(np.sum(huber)), grad


def fit_power_law(n: Sequence[float], loss: Sequence[float], starts: Sequence[tuple] | None = None) -> PowerLaw:
    """The best of L-BFGS-B fits of L(N) = E + A / N^alpha from a grid of starts (Huber on log L)."""
    x = np.log(np.asarray(n, dtype=float))
    y = np.log(np.asarray(loss, dtype=float))
    bounds = [(LOG_E_MIN, float(y.min())), (-20.0, 60.0), (0.0, 4.0)]
    e, a, alpha = _best_fit(_objective, (x, y), starts if starts is not None else _STARTS, bounds)
    return PowerLaw(E=float(math.exp(e)), A=float(math.exp(a)), alpha=float(alpha))


def _best_fit(objective: Any, args: tuple, starts: Sequence[tuple], bounds: list[tuple[float, float]]) -> np.ndarray:
    """The parameters of the best of L-BFGS-B minimizations of `objective` from each start."""
    from scipy.optimize import minimize  # heavy optional dependency: imported on use

    best = None
    for start in starts:
        res = minimize(
            objective,
            np.asarray(start, dtype=float),
            args=args,
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
            options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000},
        )
        if best is None or res.fun < best.fun - 1e-15:
            best = res
    return best.x


def _points(series: Series, seeds: Mapping[int, Sequence[int]] | None = None) -> tuple[list[float], list[float]]:
    """Every run as a point (N, loss); `seeds` picks (with repeats) which seeds of each rung enter."""
    ns: list[float] = []
    ls: list[float] = []
    for n, by_seed in sorted(series.items()):
        for s in seeds[n] if seeds is not None else sorted(by_seed):
            ns.append(float(n))
            ls.append(float(by_seed[s]))
    return ns, ls


FLOORLESS = (
    "E at the fit's lower bound: the rungs identify no irreducible loss, so the curve is a pure power "
    "law and its extrapolation assumes the loss keeps falling at the same rate"
)


MISFIT = (
    "the curve misses a rung's mean loss by more than three standard errors of that mean: the form "
    "does not describe these rungs, and its extrapolation is the shape of these points, not a law"
)
MISFIT_CELL = MISFIT.replace("a rung's", "a cell's")  # the same caveat of an L(N, D) surface


def single_seed_note(names: Iterable[str]) -> str:
    """The caveat of points with one paired seed (the GPU rungs): fixed in every bootstrap draw."""
    return (
        f"one paired seed at {', '.join(names)}: the same point in every bootstrap draw, so the intervals "
        "leave out its seed noise"
    )


def floorless(p: PowerLaw | DataLaw) -> bool:
    """Whether the fitted floor E sits at the optimizer's lower bound (not identified by the rungs)."""
    return math.log(p.E) <= LOG_E_MIN + 1e-6


def gap_percent(f: PowerLaw, c: PowerLaw, n: float) -> float:
    """The predicted perplexity gap of f over c at N parameters, in % (+ = f worse)."""
    return 100.0 * math.expm1(float(f.loss(n)) - float(c.loss(n)))


def reach(f: PowerLaw, c: PowerLaw, start: float, gap: float = REACH_GAP) -> float:
    """The smallest N >= start at which the predicted gap is at most `gap` %, inf if not below 10^12."""
    grid = np.geomspace(start, REACH_LIMIT, 400)
    gaps = 100.0 * np.expm1(f.loss(grid) - c.loss(grid))
    hits = np.flatnonzero(gaps <= gap)
    if not hits.size:
        return math.inf
    if hits[0] == 0:
        return float(start)
    from scipy.optimize import brentq  # heavy optional dependency: imported on use

    lo, hi = math.log(grid[hits[0] - 1]), math.log(grid[hits[0]])
    return float(math.exp(brentq(lambda x: gap_percent(f, c, math.exp(x)) - gap, lo, hi, xtol=1e-10)))


def sig(v: float | None, digits: int = 4) -> float | None:
    """A number rounded to `digits` significant digits (inf and None kept)."""
    if v is None or not math.isfinite(v) or v == 0:
        return v
    return float(f"{v:.{digits - 1}e}")


def _interval(values: Sequence[float]) -> tuple[float | None, float | None]:
    """The 2.5-97.5 percentile range (inf counts as a value above all others)."""
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if arr.size == 0:
        return None, None
    # Order statistics, not interpolation: an infinite refit (never matches) stays a value.
    lo = float(np.percentile(arr, 2.5, method="lower"))
    hi = float(np.percentile(arr, 97.5, method="higher"))
    return sig(lo), sig(hi)


@dataclass
class ArmFit:
    """One arm's fitted curve with bootstrap intervals."""

    architecture: str
    method: str
    rungs: int
    runs: int
    E: float | None = None
    A: float | None = None
    alpha: float | None = None
    alpha_low: float | None = None
    alpha_high: float | None = None
    E_low: float | None = None
    E_high: float | None = None
    # How far the curve misses the measured rungs: the largest |mean loss at a rung / fitted - 1|, in %,
    # beside the seeds' own scatter there (the largest standard error of a rung's mean, in %).
    misfit: float | None = None
    seed_se: float | None = None
    note: str = ""
    held: str = ""  # what the ladder held fixed along the curve (its tokens-per-parameter budget)


@dataclass
class PairFit:
    """A frozen arm against its control: exponents, multiplier and extrapolations, with intervals."""

    architecture: str
    method: str
    control: str
    rungs: int
    d_alpha: float | None = None  # alpha_method - alpha_control
    d_alpha_low: float | None = None
    d_alpha_high: float | None = None
    at: int | None = None  # the top rung's parameters
    multiplier: float | None = None  # parameters the method needs to match the control at `at`, / at
    multiplier_low: float | None = None
    multiplier_high: float | None = None
    never: float | None = None  # fraction of bootstrap refits in which the method never matches
    target: int = TARGET_PARAMS
    predicted_gap: float | None = None  # % at `target` (an extrapolation)
    predicted_low: float | None = None
    predicted_high: float | None = None
    # The predicted gap's range over refits that each leave one rung out: how far the extrapolation
    # leans on any single size (the bootstrap over seeds cannot show that).
    predicted_loo: list[float | None] = field(default_factory=list)
    reach_1pct: float | None = None  # parameters where the predicted gap falls to 1% (inf: not below 10^12)
    reach_low: float | None = None
    reach_high: float | None = None
    note: str = ""
    held: str = ""  # what the ladder held fixed along the curve (its tokens-per-parameter budget)
    curves: dict = field(default_factory=dict, repr=False)  # bootstrap refits, for the plot (not stored)


def _draws(series_f: Series, series_c: Series, rng: np.random.Generator) -> dict[int, list[int]]:
    """One paired bootstrap draw: at every rung, seeds common to both arms resampled with replacement."""
    out = {}
    for n in sorted(series_f):
        common = sorted(set(series_f[n]) & set(series_c[n]))
        out[n] = [common[i] for i in rng.integers(0, len(common), len(common))]
    return out


def fit_pair(
    architecture: str,
    method: str,
    control: str,
    series_f: Series,
    series_c: Series,
    boot: int = BOOTSTRAP,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[ArmFit, ArmFit, PairFit]:
    """Fit both arms of a pair, then the paired bootstrap; every number rounded by `sig`."""
    from threadpoolctl import threadpool_limits  # heavy optional dependency: imported on use

    # L-BFGS-B calls BLAS on 3-vectors: idle BLAS threads spinning beside busy cores cost 5x.
    with threadpool_limits(1):
        return _fit_pair(architecture, method, control, series_f, series_c, boot, seed)


def _fit_pair(
    architecture: str, method: str, control: str, series_f: Series, series_c: Series, boot: int, seed: int
) -> tuple[ArmFit, ArmFit, PairFit]:
    rungs = sorted(n for n in set(series_f) & set(series_c) if set(series_f[n]) & set(series_c[n]))
    series_f = {n: series_f[n] for n in rungs}
    series_c = {n: series_c[n] for n in rungs}
    arms = [
        ArmFit(architecture, m, len(rungs), sum(len(s[n]) for n in rungs))
        for m, s in ((method, series_f), (control, series_c))
    ]
    pair = PairFit(architecture, method, control, len(rungs))
    single = [n for n in rungs if len(set(series_f[n]) & set(series_c[n])) < 2]
    if len(rungs) < MIN_RUNGS or len(single) == len(rungs):
        why = (
            f"{len(rungs)} rung(s): a fit needs at least {MIN_RUNGS} sizes"
            if len(rungs) < MIN_RUNGS
            else "every rung has one paired seed: no bootstrap"
        )
        for a in arms:
            a.note = why
        pair.note = why
        return arms[0], arms[1], pair
    fits = [fit_power_law(*_points(s)) for s in (series_f, series_c)]
    top = float(max(rungs))
    rng = np.random.default_rng(seed)
    boots: list[tuple[PowerLaw, PowerLaw]] = []
    for _ in range(boot):
        draw = _draws(series_f, series_c, rng)
        # Each refit starts from the full fit and from the grid's best-known corner: fast and robust.
        refit = [
            fit_power_law(*_points(s, draw), starts=[(math.log(p.E), math.log(p.A), p.alpha), (0.0, 2.0, 0.3)])
            for s, p in zip((series_f, series_c), fits, strict=True)
        ]
        boots.append((refit[0], refit[1]))
    for arm, p, k in zip(arms, fits, (0, 1), strict=True):
        arm.E, arm.A, arm.alpha = sig(p.E), sig(p.A), sig(p.alpha)
        arm.alpha_low, arm.alpha_high = _interval([b[k].alpha for b in boots])
        arm.E_low, arm.E_high = _interval([b[k].E for b in boots])
        series = (series_f, series_c)[k]
        misses = [abs(float(np.mean(list(series[n].values()))) / float(p.loss(n)) - 1) for n in rungs]
        ses = [
            float(np.std(list(series[n].values()), ddof=1) / math.sqrt(len(series[n])))
            / float(np.mean(list(series[n].values())))
            for n in rungs
            if len(series[n]) > 1
        ]
        arm.misfit, arm.seed_se = sig(100 * max(misses)), sig(100 * max(ses)) if ses else None
        notes = [FLOORLESS] if floorless(p) else []
        if arm.seed_se is not None and arm.misfit > 3 * arm.seed_se:
            notes.append(MISFIT)
        arm.note = "; ".join(notes)
    f, c = fits
    pair.d_alpha = sig(f.alpha - c.alpha)
    pair.d_alpha_low, pair.d_alpha_high = _interval([b[0].alpha - b[1].alpha for b in boots])
    pair.at = int(top)
    mult = [b[0].params_for(float(b[1].loss(top))) / top for b in boots]
    pair.multiplier = sig(f.params_for(float(c.loss(top))) / top)
    pair.multiplier_low, pair.multiplier_high = _interval(mult)
    pair.never = sig(sum(math.isinf(m) for m in mult) / len(mult))
    pair.predicted_gap = sig(gap_percent(f, c, TARGET_PARAMS))
    pair.predicted_low, pair.predicted_high = _interval([gap_percent(b[0], b[1], TARGET_PARAMS) for b in boots])
    loo = []
    for left in rungs:
        kept = [{n: s[n] for n in rungs if n != left} for s in (series_f, series_c)]
        refit = [
            fit_power_law(*_points(k), starts=[(math.log(p.E), math.log(p.A), p.alpha), (0.0, 2.0, 0.3)])
            for k, p in zip(kept, fits, strict=True)
        ]
        loo.append(gap_percent(refit[0], refit[1], TARGET_PARAMS))
    pair.predicted_loo = [sig(min(loo)), sig(max(loo))]
    pair.reach_1pct = sig(reach(f, c, top))
    pair.reach_low, pair.reach_high = _interval([reach(b[0], b[1], top) for b in boots])
    pair.note = f"extrapolation from {len(rungs)} rungs ({int(min(rungs)):,}-{int(top):,} parameters)"
    if single:
        pair.note += "; " + single_seed_note(f"{n:,}" for n in single)
    if any(floorless(p) for p in fits):
        pair.note += "; " + FLOORLESS
    if any(MISFIT in a.note for a in arms):
        pair.note += "; " + MISFIT
    pair.curves = {"fit": fits, "boot": boots}
    return arms[0], arms[1], pair


# ---- L(N, D): size and data together, where the ladder has a data axis ----------------------------

DATA_BUDGETS = (20, 300)  # tokens per parameter at which the L(N, D) fit predicts the gap at TARGET_PARAMS
# Starting points: (log E, log A, alpha, log B, beta).
_STARTS_ND = [
    (e, a, al, b, be)
    for e in (-1.0, 0.0, 1.0)
    for a in (0.0, 3.0, 6.0)
    for al in (0.2, 0.5)
    for b in (0.0, 3.0, 6.0)
    for be in (0.2, 0.5)
]

Cells = Mapping[tuple[int, int], Mapping[int, float]]  # (parameters, tokens) -> seed -> test loss


@dataclass(frozen=True)
class DataLaw:
    """L(N, D) = E + A / N^alpha + B / D^beta (Chinchilla's approach 3)."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float

    def loss(self, n: float, d: float) -> float:
        """The fitted loss at N parameters trained on D tokens."""
        return float(self.E + self.A * n**-self.alpha + self.B * d**-self.beta)


def _objective_nd(theta: np.ndarray, x: np.ndarray, z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Huber loss of log L and its gradient in (log E, log A, alpha, log B, beta); x = log N, z = log D."""
    e, a, alpha, b, beta = theta
    terms = np.stack([np.full_like(x, e), a - alpha * x, b - beta * z])
    pred = np.logaddexp.reduce(terms, axis=0)
    w = np.exp(terms - pred)  # d pred / d each term's log
    r = pred - y
    huber = np.where(np.abs(r) <= HUBER_DELTA, 0.5 * r**2, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA))
    dr = np.clip(r, -HUBER_DELTA, HUBER_DELTA)
    grad = np.array(
        [np.sum(dr * w[0]), np.sum(dr * w[1]), np.sum(-dr * w[1] * x), np.sum(dr * w[2]), np.sum(-dr * w[2] * z)]
    )
    return float(np.sum(huber)), grad


def fit_data_law(
    n: Sequence[float], d: Sequence[float], loss: Sequence[float], starts: Sequence[tuple] | None = None
) -> DataLaw:
    """The best of L-BFGS-B fits of L(N, D) = E + A / N^alpha + B / D^beta from a grid of starts."""
    x, z = np.log(np.asarray(n, dtype=float)), np.log(np.asarray(d, dtype=float))
    y = np.log(np.asarray(loss, dtype=float))
    bounds = [(LOG_E_MIN, float(y.min())), (-20.0, 60.0), (0.0, 4.0), (-20.0, 60.0), (0.0, 4.0)]
    starts = starts if starts is not None else _STARTS_ND
    e, a, alpha, b, beta = _best_fit(_objective_nd, (x, z, y), starts, bounds)
    return DataLaw(E=math.exp(e), A=math.exp(a), alpha=float(alpha), B=math.exp(b), beta=float(beta))


def _cell_points(cells: Cells, seeds: Mapping[tuple[int, int], Sequence[int]] | None = None) -> tuple[list, list, list]:
    """Every run as a point (N, D, loss); `seeds` picks (with repeats) which seeds of each cell enter."""
    ns, ds, ls = [], [], []
    for key, by_seed in sorted(cells.items()):
        for s in seeds[key] if seeds is not None else sorted(by_seed):
            ns.append(float(key[0]))
            ds.append(float(key[1]))
            ls.append(float(by_seed[s]))
    return ns, ds, ls


def data_gap(f: DataLaw, c: DataLaw, n: float, tokens_per_param: float) -> float:
    """The predicted perplexity gap of f over c at N parameters and tokens_per_param x N tokens, in %."""
    d = tokens_per_param * n
    return 100.0 * math.expm1(f.loss(n, d) - c.loss(n, d))


@dataclass
class DataFit:
    """A frozen arm against its control over size and data: L(N, D) per arm, the gap it predicts at
    GPT-2 small's size at 20 and 300 tokens per parameter, paired bootstrap intervals."""

    architecture: str
    method: str
    control: str
    cells: int  # (size, tokens) cells both arms hold
    sizes: int
    budgets: int  # distinct tokens-per-parameter budgets among the cells
    alpha: float | None = None  # the method's exponent in N
    alpha_control: float | None = None
    beta: float | None = None  # the method's exponent in D
    beta_control: float | None = None
    d_alpha: float | None = None
    d_alpha_low: float | None = None
    d_alpha_high: float | None = None
    d_beta: float | None = None  # beta_method - beta_control (negative: it gains less from data)
    d_beta_low: float | None = None
    d_beta_high: float | None = None
    target: int = TARGET_PARAMS
    # tokens per parameter -> [predicted gap %, 2.5%, 97.5%] at `target` (an extrapolation)
    predicted: dict[int, list[float | None]] = field(default_factory=dict)
    # tokens per parameter -> [min, max] of the predicted gap over refits that each leave one size out
    predicted_loo: dict[int, list[float | None]] = field(default_factory=dict)
    misfit: float | None = None  # the largest |mean loss of a cell / fitted - 1| over both arms, %
    seed_se: float | None = None  # the largest standard error of a cell's mean, %
    note: str = ""


def fit_data_pair(
    architecture: str,
    method: str,
    control: str,
    cells_f: Cells,
    cells_c: Cells,
    boot: int = BOOTSTRAP,
    seed: int = BOOTSTRAP_SEED,
) -> DataFit:
    """Fit L(N, D) to both arms of a pair, then the paired bootstrap over seeds; numbers rounded by `sig`."""
    from threadpoolctl import threadpool_limits  # heavy optional dependency: imported on use

    with threadpool_limits(1):
        return _fit_data_pair(architecture, method, control, cells_f, cells_c, boot, seed)


def _fit_data_pair(
    architecture: str, method: str, control: str, cells_f: Cells, cells_c: Cells, boot: int, seed: int
) -> DataFit:
    keys = sorted(k for k in set(cells_f) & set(cells_c) if set(cells_f[k]) & set(cells_c[k]))
    single = [k for k in keys if len(set(cells_f[k]) & set(cells_c[k])) < 2]
    cells_f, cells_c = {k: cells_f[k] for k in keys}, {k: cells_c[k] for k in keys}
    sizes = {n for n, _ in keys}
    budgets = {float(f"{d / n:.1g}") for n, d in keys}  # 20.2 and 21.6 tokens per parameter are one budget
    out = DataFit(architecture, method, control, len(keys), len(sizes), len(budgets))
    by_size: dict[int, set[int]] = {}
    for n, d in keys:
        by_size.setdefault(n, set()).add(d)
    if len(sizes) < MIN_RUNGS or not any(len(v) > 1 for v in by_size.values()):
        out.note = (
            f"{len(sizes)} size(s) and {'a' if any(len(v) > 1 for v in by_size.values()) else 'no'} size trained "
            f"at two budgets: L(N, D) needs at least {MIN_RUNGS} sizes and one size at two budgets"
        )
        return out
    fits = [fit_data_law(*_cell_points(c)) for c in (cells_f, cells_c)]
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(boot):
        draw = _draws(cells_f, cells_c, rng)
        boots.append(
            [
                fit_data_law(
                    *_cell_points(c, draw), starts=[(math.log(p.E), math.log(p.A), p.alpha, math.log(p.B), p.beta)]
                )
                for c, p in zip((cells_f, cells_c), fits, strict=True)
            ]
        )
    f, c = fits
    out.alpha, out.alpha_control, out.beta, out.beta_control = sig(f.alpha), sig(c.alpha), sig(f.beta), sig(c.beta)
    out.d_alpha = sig(f.alpha - c.alpha)
    out.d_alpha_low, out.d_alpha_high = _interval([b[0].alpha - b[1].alpha for b in boots])
    out.d_beta = sig(f.beta - c.beta)
    out.d_beta_low, out.d_beta_high = _interval([b[0].beta - b[1].beta for b in boots])
    for budget in DATA_BUDGETS:
        low, high = _interval([data_gap(b[0], b[1], TARGET_PARAMS, budget) for b in boots])
        point = data_gap(f, c, TARGET_PARAMS, budget)
        out.predicted[budget] = [sig(v, EXTRAPOLATED_DIGITS) for v in (point, low, high)]
    loo: dict[int, list[float]] = {b: [] for b in DATA_BUDGETS}
    for left in sorted(sizes):
        if len({k for k in keys if k[0] != left and len(by_size[k[0]]) > 1}) == 0:
            continue  # without a size at two budgets the data exponent is not identified: no refit
        refit = [
            fit_data_law(
                *_cell_points({k: v for k, v in cells.items() if k[0] != left}),
                starts=[(math.log(p.E), math.log(p.A), p.alpha, math.log(p.B), p.beta), _STARTS_ND[0]],
            )
            for cells, p in zip((cells_f, cells_c), fits, strict=True)
        ]
        for budget in DATA_BUDGETS:
            loo[budget].append(data_gap(refit[0], refit[1], TARGET_PARAMS, budget))
    out.predicted_loo = {
        b: [sig(min(v), EXTRAPOLATED_DIGITS), sig(max(v), EXTRAPOLATED_DIGITS)] for b, v in loo.items() if v
    }
    misses, ses = [], []
    for cells, p in zip((cells_f, cells_c), fits, strict=True):
        for (n, d), by_seed in cells.items():
            values = list(by_seed.values())
            mean = float(np.mean(values))
            misses.append(abs(mean / p.loss(n, d) - 1))
            if len(values) > 1:
                ses.append(float(np.std(values, ddof=1) / math.sqrt(len(values))) / mean)
    out.misfit, out.seed_se = sig(100 * max(misses)), sig(100 * max(ses)) if ses else None
    notes = [f"extrapolation from {len(keys)} cells ({min(sizes):,}-{max(sizes):,} parameters, {len(budgets)} budgets)"]
    if single:
        notes.append(single_seed_note(f"{n:,} x {d:,} tokens" for n, d in single))
    if any(floorless(p) for p in fits):
        notes.append(FLOORLESS)
    if out.seed_se is not None and out.misfit > 3 * out.seed_se:
        notes.append(MISFIT_CELL)
    out.note = "; ".join(notes)
    return out
