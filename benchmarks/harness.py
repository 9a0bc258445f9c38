"""What every benchmark here times with: arms side by side in one process, ratios with intervals.

- `balanced_orders`: the order the arms take their turns in, round by round (a Williams design).
- `Timed` and `interleaved_rounds`: steps timed with CUDA events (read after each round, no host
  sync inside a step) or with wall and process CPU time, kept per step and as one median per round.
- `median_ci` and `paired_ratio`: the median over rounds of a within-round ratio, with a
  distribution-free 95% interval (a round runs the arms side by side, so drift cancels within it).
- `write_rows`: the JSON rewritten atomically, so a run stopped early keeps its figures.
- `fresh_compile_caches`, `sync`, `device_name`, and `fmt_pct` / `fmt_ci` for printing.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def balanced_orders(n: int) -> list[list[int]]:
    """Orders for timing n arms in interleaved rounds: a Williams crossover design.

    Over one cycle (n rounds for even n, 2n for odd n) every arm takes every position equally
    often and follows every other arm equally often. A rotating order (round r starts at arm r)
    balances positions but not predecessors: each arm always runs right after the same arm, so
    whatever that arm leaves behind (a heap reshaped by large frees, evicted caches) biases every
    round alike and no interval over rounds can show it. Measured on CPU: two copies of one model
    ran 0.7-2.7% apart for a whole process under rotation (A/A 1.007-1.027 in six processes), and within
    noise under a balanced order (1.000-1.012, every interval containing 1.0).
    """
    if n < 1:
        raise ValueError(f"need at least one arm, got {n}")
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...: consecutive differences are all distinct mod n
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % n for x in first] for i in range(n)]
    return rows if n % 2 == 0 or n == 1 else rows + [row[::-1] for row in rows]


class Timed:
    """Step timing shared by every arm: per-step times and per-round medians (for paired ratios)."""

    name: str
    cuda: bool

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu_times: list[float] = []  # CPU only: process CPU seconds, steadier than wall time under load
        self.round_medians: list[float] = []  # one per round: rounds pair the arms in time
        self.round_cpu_medians: list[float] = []
        self._events: list[tuple[Any, Any]] = []
        self._wall: list[float] = []
        self._cpu: list[float] = []

    def step(self) -> None:
        raise NotImplementedError

    def timed(self, n: int, record: bool) -> None:
        """n steps; CUDA events are recorded around each and read later in `collect`."""
        for _ in range(n):
            if self.cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                self.step()
                e.record()
                if record:
                    self._events.append((s, e))
            else:
                t0, c0 = time.perf_counter(), time.process_time()
                self.step()
                if record:
                    self._wall.append(time.perf_counter() - t0)
                    self._cpu.append(time.process_time() - c0)

    def collect(self) -> None:
        """End of a round (after its synchronize): read CUDA events, keep the round's medians."""
        self._wall.extend(s.elapsed_time(e) / 1000.0 for s, e in self._events)
        self._events.clear()
        if self._wall:
            self.times.extend(self._wall)
            self.round_medians.append(statistics.median(self._wall))
        if self._cpu:
            self.cpu_times.extend(self._cpu)
            self.round_cpu_medians.append(statistics.median(self._cpu))
        self._wall, self._cpu = [], []


def interleaved_rounds(timed: list[Timed], rounds: int, steps: int, cuda: bool) -> Iterator[int]:
    """Run `rounds` rounds of `steps` recorded steps per item, in a carryover-balanced order (each
    item follows every other equally often over a cycle); after each round synchronize, collect
    every item's times and yield the number of rounds done (break out to stop early)."""
    orders = balanced_orders(len(timed))
    for r in range(rounds):
        for i in orders[r % len(orders)]:
            timed[i].timed(steps, record=True)
        sync(cuda)
        for t in timed:
            t.collect()
        yield r + 1


def machine() -> dict[str, Any]:
    """The CPU (its model name where /proc/cpuinfo has one), core count, OS, Python and oelm version."""
    from oelm import __version__

    cpu = platform.processor() or platform.machine()
    try:
        names = [x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("model name")]
        cpu = names[0].split(":", 1)[1].strip() if names else cpu
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "oelm": __version__,
    }


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """Median of per-round values with a distribution-free interval for it (order statistics).

    The interval runs from the j-th to the (n+1-j)-th smallest value, j the largest rank with
    P(Binomial(n, 1/2) < j) <= (1 - confidence) / 2: no assumption on the noise's shape, and one
    disturbed round moves it by one rank, not by its size. None where n is too small (n < 6 at 95%).
    """
    from scipy.stats import binom

    vals = sorted(v for v in values if math.isfinite(v))
    n = len(vals)
    if n == 0:
        return None, None, None
    med = statistics.median(vals)
    j = int(binom.ppf((1 - confidence) / 2, n, 0.5))  # P(X <= j-1) <= alpha/2 < P(X <= j)
    if binom.cdf(j, n, 0.5) <= (1 - confidence) / 2:
        j += 1
    if j < 1:
        return med, None, None
    return med, vals[j - 1], vals[n - j]


def paired_ratio(num: list[float], den: list[float]) -> tuple[float | None, float | None, float | None]:
    """Median over rounds of num_r / den_r with its 95% interval: each round pairs the arms in time,
    so slow drift of the machine cancels within a round and the interval is the noise that remains."""
    return median_ci([a / b for a, b in zip(num, den)])


def write_rows(path: Path | None, rows: list[dict]) -> None:
    """Rewrite the JSON list of rows at `path` (nothing without one) through a temporary file, so
    a run stopped at any moment leaves the rows of its last complete write."""
    if path:
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(rows, indent=2))
        os.replace(tmp, path)


def fresh_compile_caches(compile: bool) -> None:
    """With torch.compile: the GPT arms share GPT.forward's code object, so fresh caches and room for every arm's graph."""
    if not compile:
        return
    torch._dynamo.reset()
    for limit in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))


def sync(cuda: bool) -> None:
    """Wait for the device (CUDA); nothing to wait for on CPU."""
    if cuda:
        torch.cuda.synchronize()


def device_name(device: str) -> str:
    """The GPU's name, or the CPU with its torch thread count."""
    return torch.cuda.get_device_name() if device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"


def fmt_pct(v: float | None, digits: int = 0) -> str:
    return f"{100 * v:.{digits}f}%" if v is not None else "n/a"


def fmt_ci(ci: list | None, scale: float = 1.0, unit: str = "x") -> str:
    """'[lo, hi]' of a 95% interval over rounds, or '' when there are too few rounds for one."""
    if not ci or ci[0] is None:
        return ""
    digits = 0 if scale == 100 else 3
    return f"[{scale * ci[0]:.{digits}f}{unit}, {scale * ci[1]:.{digits}f}{unit}]"
