"""A run's peak memory is the run's: not the process's earlier peak (a sweep worker's previous
runs, or the data a parent prepared before it started its workers)."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from oelm.training.loop import train
from oelm.training.timing import PROC_CLEAR_REFS, PeakMemory
from train_utils import synthetic_lm_dir, tiny_config

MiB = 2**20

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not PROC_CLEAR_REFS.exists(), reason="the per-run peak needs Linux's /proc/self"
)


def _spike(mib: int) -> int:
    """Touch MIB mebibytes and free them again; returns the process's lifetime peak RSS after it."""
    block = np.ones(mib * MiB // 8)
    block[:: 4096 // 8] = 2.0  # every page resident
    del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_the_peak_starts_at_the_run_not_at_the_process() -> None:
    process_peak = _spike(600)
    memory = PeakMemory(torch.device("cpu"))
    assert memory.kind == "run_peak_rss"
    held = np.ones(50 * MiB // 8)
    held[:: 4096 // 8] = 2.0
    peak, kind = memory.read()
    assert kind == "run_peak_rss"
    assert peak < process_peak - 400 * MiB  # the 600 MiB before the run is not the run's
    assert peak >= held.nbytes  # what the run holds is
    # Without the reset (the fallback's kind) the figure is the process's lifetime peak.
    memory.kind = "process_max_rss"
    assert memory.read() == (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_max_rss")


def test_runs_trained_one_after_another_in_one_process_each_get_their_own_peak(tmp_path: Path) -> None:
    """What a sweep at --parallel 1 does (runs inline): the second run's figure was the first's
    peak or more, whatever it used, and every run of a worker read the same number."""
    data = synthetic_lm_dir(tmp_path / "data")
    process_peak = _spike(600)
    results = [train(tiny_config(data, tmp_path / f"run{i}", steps=2, warmup=0, checkpoint_every=0)) for i in range(2)]
    for i, r in enumerate(results):
        timing = json.loads((tmp_path / f"run{i}" / "timing_stats.json").read_text())
        assert timing["memory_kind"] == "run_peak_rss" and timing["peak_memory_bytes"] == r["peak_memory_bytes"]
        assert 0 < r["peak_memory_bytes"] < process_peak - 400 * MiB
