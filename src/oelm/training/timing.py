"""Step timing (CUDA events or perf_counter), summary statistics, peak FLOPs and memory.

The order in which arms timed side by side take their turns (`balanced_orders`) is the
benchmarks' (benchmarks/harness.py): nothing in training times arms against each other."""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


class StepTimer:
    """Times training steps; on CUDA with events resolved lazily (no per-step synchronize)."""

    def __init__(self, device: torch.device, times: list[float] | None = None) -> None:
        self.cuda = device.type == "cuda"
        self.times: list[float] = list(times or [])
        self._pending: list[tuple[Any, Any]] = []
        self._start: Any = None

    def start(self) -> None:
        """Mark the start of a step (after its data is loaded)."""
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        """Mark the end of a step."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._start, end))
        else:
            self.times.append(time.perf_counter() - self._start)

    def resolve(self) -> list[float]:
        """Turn recorded CUDA events into seconds (waits only for the last pending event)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self.times.extend(s.elapsed_time(e) / 1000.0 for s, e in self._pending)
            self._pending.clear()
        return self.times

    def last(self) -> float:
        """Seconds of the most recent step."""
        times = self.resolve()
        return times[-1] if times else float("nan")


def summarize(times: list[float], warmup: int) -> dict[str, Any]:
    """Mean, std, median, min, max, p95, p99 of step times with the first `warmup` excluded."""
    skip = min(warmup, max(len(times) - 1, 0))
    arr = np.asarray(times[skip:], dtype=np.float64)
    if arr.size == 0:
        return {"count": 0, "warmup_excluded": skip}
    return {
        "count": int(arr.size),
        "warmup_excluded": skip,
        "mean": float(arr.mean()),
        "std": float(arr.std()),
        "median": float(np.median(arr)),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "p95": float(np.percentile(arr, 95)),
        "p99": float(np.percentile(arr, 99)),
    }


# Where Linux keeps a process's resident-memory high-water mark (VmHWM), and how it is reset.
PROC_STATUS = Path("/proc/self/status")
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


class PeakMemory:
    """One run's peak memory, from where the run starts: the CUDA allocator's peak, reset now; on
    Linux the resident-memory high-water mark (VmHWM), reset now. Without a reset the figure
    would be the process's: a sweep worker's runs one after another, and a child process inherits
    its parent's peak across exec (data prepared before the workers start), so every run of a
    sweep read the same largest figure. Where no reset is possible (macOS, a /proc that refuses the
    write) it falls back to the process's lifetime peak and says so in its kind."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.kind = "cuda_max_memory_allocated"
            return
        self.kind = "process_max_rss"  # includes what the process did before this run
        try:
            PROC_CLEAR_REFS.write_text("5")  # 5: reset the peak resident set size (Linux 4.0+)
            if _vm_hwm() is not None:
                self.kind = "run_peak_rss"
        except OSError:
            pass

    def read(self) -> tuple[int | None, str]:
        """Peak memory in bytes since the start, and what it measures."""
        if self.kind == "cuda_max_memory_allocated":
            return int(torch.cuda.max_memory_allocated(self.device)), self.kind
        if self.kind == "run_peak_rss" and (hwm := _vm_hwm()) is not None:
            return hwm, self.kind
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # ru_maxrss is KiB on Linux, bytes on macOS.
        return int(rss if sys.platform == "darwin" else rss * 1024), "process_max_rss"


def _vm_hwm() -> int | None:
    """The process's resident-memory high-water mark in bytes (Linux), else None."""
    try:
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


# What the FLOPs behind MFU count (oelm.core.flops): every matmul, the LM head and attention included.
MFU_COUNTS = "matmul FLOPs of forward+backward incl. LM head and attention core (oelm.core.flops)"


def mfu_fields(
    flops_per_step: float | None, stats: dict[str, Any], peak: float | None, note: str | None = None
) -> dict[str, Any]:
    """Achieved FLOP/s and model FLOPs utilization from the mean and median step time."""
    mean, median = stats.get("mean"), stats.get("median")
    achieved = flops_per_step / mean if flops_per_step and mean else None
    achieved_median = flops_per_step / median if flops_per_step and median else None
    return {
        "achieved_flops_per_second": achieved,
        "peak_flops_per_second": peak,
        "mfu": achieved / peak if achieved and peak else None,
        "mfu_median": achieved_median / peak if achieved_median and peak else None,
        "mfu_counts": MFU_COUNTS,
        "mfu_note": None if peak else (note or "no known peak FLOP/s for this device: MFU not given"),
    }
