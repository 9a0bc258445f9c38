"""`oelm sweep --parallel N` hands runs out from one queue: longest expected first, no worker
idles while runs are pending, results equal a serial sweep's, failures are reported, reruns resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from oelm.experiments.dispatch import RunQueue, drive, expected_work
from oelm.experiments.runner import run_sweep
from oelm.experiments.sweep import RunSpec, load_spec, spec_from_dict
from test_sweep import TINY


def _run(tmp_path: Path, method: str, steps: int, seed: int = 0, **config) -> RunSpec:
    run_dir = tmp_path / "runs" / method / f"lr0.001_steps{steps}" / f"seed{seed}"
    return RunSpec(method, 1e-3, seed, {"steps": steps}, run_dir, {**TINY, "steps": steps, **config})


def _finish(run: RunSpec, wall: float) -> RunSpec:
    """A finished run's results.json with its measured wall time."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    results = {"status": "complete", "task": "lm", "total_wall_time": wall, "selection_metric": "best_val_loss"}
    (run.run_dir / "results.json").write_text(json.dumps({**results, "best_val_loss": 1.0}))
    return run


def test_queue_hands_out_the_longest_expected_run_first(tmp_path: Path) -> None:
    short, long, wide = _run(tmp_path, "baseline", 6), _run(tmp_path, "baseline", 18), _run(tmp_path, "baseline", 6)
    wide.config["batch_size"] = 8  # 4x the sequences of a step
    assert expected_work(long.config) == 3 * expected_work(short.config)
    assert expected_work(wide.config) == 4 * expected_work(short.config)
    bigger = {**short.config, "model_overrides": {**TINY["model_overrides"], "d_model": 64}}
    assert expected_work(bigger) == 4 * expected_work(short.config)  # n_layer x d_model²
    queue = RunQueue([short, long, wide])
    assert [queue.take(0), queue.take(1), queue.take(0), queue.take(1)] == [wide, long, short, None]
    # Ties keep the sweep's order.
    a, b = _run(tmp_path, "baseline", 6, seed=0), _run(tmp_path, "baseline", 6, seed=1)
    queue = RunQueue([a, b])
    assert [queue.take(0), queue.take(0)] == [a, b]


def test_measured_times_of_finished_runs_of_the_same_arm_refine_the_order(tmp_path: Path) -> None:
    """An arm whose finished runs took 4x as long per unit of work goes first at equal steps; an
    arm not measured yet is priced at the median rate of the measured arms."""
    slow_done = _finish(_run(tmp_path, "oelm-lowrank", 6, seed=9, method_options={"rank": 4}), wall=8.0)
    fast_done = _finish(_run(tmp_path, "baseline", 6, seed=9), wall=2.0)
    slow = _run(tmp_path, "oelm-lowrank", 6, method_options={"rank": 4})
    fast = _run(tmp_path, "baseline", 12)
    other = _run(tmp_path, "oelm-freeze", 6)
    queue = RunQueue([fast, other, slow], finished=[slow_done, fast_done])
    assert queue.expected(slow) == pytest.approx(8.0) and queue.expected(fast) == pytest.approx(4.0)
    assert queue.expected(other) == pytest.approx(5.0)  # median of 8/work and 2/work, times work
    assert [queue.take(0), queue.take(0), queue.take(0)] == [slow, other, fast]
    # The same arm under other method options is another arm: not measured.
    assert queue.expected(_run(tmp_path, "oelm-lowrank", 6, method_options={"rank": 8})) == pytest.approx(5.0)


class SimulatedPool:
    """Slots on a simulated clock: a run takes `length(run)` seconds; records every start and
    whether, at any moment drive waits, a slot sits free while the queue still holds runs."""

    def __init__(self, slots: int, queue: RunQueue, length) -> None:
        self.slots, self.queue, self.length = slots, queue, length
        self.now, self.ends, self.starts, self.idle_while_pending = 0.0, {}, [], 0

    def start(self, slot: int, run: RunSpec) -> None:
        assert slot not in self.ends
        self.ends[slot] = self.now + self.length(run)
        self.starts.append((self.now, slot, run))

    def wait(self, timeout: float) -> list[tuple[int, str | None]]:
        if len(self.ends) < self.slots and len(self.queue):
            self.idle_while_pending += 1
        self.now = min(self.ends.values())
        done = sorted(s for s, end in self.ends.items() if end == self.now)
        for s in done:
            del self.ends[s]
        return [(s, None) for s in done]


def _simulate(queue: RunQueue, slots: int, runs: list[RunSpec], extra: list[RunSpec] = ()):
    """drive() over a simulated pool; `extra` joins the queue when the first run ends (a grid extension)."""
    pool = SimulatedPool(slots, queue, lambda r: float(r.config["steps"]))
    ended: list[RunSpec] = []

    def on_done(run: RunSpec, error: str | None) -> list[RunSpec]:
        assert error is None
        ended.append(run)
        return list(extra) if len(ended) == 1 else []

    drive(queue, pool, on_done)
    return pool, ended


def test_no_worker_idles_while_runs_are_pending_and_the_board_ends_sooner(tmp_path: Path, load_benchmark) -> None:
    """Two workers, a board whose settings alternate 6 and 18 steps in the sweep's order: the old
    dealing (pending[i::2]) gives every long run to one worker (72 s against 24 s); the queue
    ends at 48 s, the total work over two workers."""
    runs = [_run(tmp_path, m, steps, seed) for seed in (0, 1) for m in ("baseline", "oelm-freeze") for steps in (6, 18)]
    late = [_run(tmp_path, "baseline", 12, seed=5)]
    pool, ended = _simulate(RunQueue(runs, slots=2), 2, runs, late)
    assert sorted(map(id, ended)) == sorted(map(id, runs + late))  # every run, each once
    assert pool.idle_while_pending == 0
    assert pool.now == (4 * 6 + 4 * 18 + 12) / 2  # 54: both workers busy to the end
    assert [r.config["steps"] for _, _, r in pool.starts[:4]] == [18, 18, 18, 18]  # longest first

    old = load_benchmark("sweep_queue").RoundRobin
    pool, ended = _simulate(old(runs, slots=2), 2, runs)
    assert len(ended) == len(runs) and pool.now == 4 * 18 and pool.idle_while_pending > 0
    assert {slot for _, slot, r in pool.starts if r.config["steps"] == 18} == {1}


def _queue_spec(tmp_path: Path, out: str, **extra) -> dict:
    return {
        "name": "tiny",
        "out": str(tmp_path / out),
        "prepare": {
            "source": "builtin:python-docs",
            "tokenizer": "byte",
            "max_docs": 30,
            "test_fraction": 0.2,
        },
        "config": {**TINY, "data": str(tmp_path / "data")},
        "methods": {"baseline": {"lr": [1e-3, 3e-3]}, "oelm-freeze": {"lr": [3e-3, 1e-2]}},
        "seeds": [0, 1],
        "max_extend": 0,
        **extra,
    }


def _workers(sweep: Path) -> list[int]:
    """Pids of live worker processes of this sweep (their command line names its logs folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "oelm.experiments.worker" in cmd and str(sweep) in cmd:
            pids.append(int(proc.name))
    return pids


def _kill_first_worker(sweep: Path, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first worker process of this sweep as soon as it exists (while it imports torch)."""
    while not stop.is_set() and not killed:
        for pid in _workers(sweep)[:1]:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(0.02)


HELD_OUT = ("test_loss", "test_perplexity", "test_bits_per_byte", "best_val_loss", "val_loss", "tokens_seen")


@pytest.mark.slow  # a serial and two parallel sweeps of 8 tiny runs: ~40 s on 2 cores
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds worker processes through /proc")
def test_parallel_sweep_equals_a_serial_one_reports_failures_and_resumes(tmp_path: Path) -> None:
    serial = run_sweep(spec_from_dict(_queue_spec(tmp_path, "serial")), progress=False, report=False, threads=1)
    assert len(serial.trained) == 8 and not serial.failed

    # In parallel: one run's directory is blocked by a file, and one worker dies while it starts.
    raw = _queue_spec(tmp_path, "parallel")
    spec = spec_from_dict(raw)
    blocked = spec.runs()[3].run_dir
    blocked.parent.mkdir(parents=True)
    blocked.write_text("in the way")
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_first_worker, args=(tmp_path / "parallel", stop, killed))
    killer.start()
    try:
        first = run_sweep(spec, parallel=2, threads=1, progress=False, report=False)
    finally:
        stop.set()
        killer.join()
    assert killed, "no worker process was seen"
    errors = {r.run_dir: e for r, e in first.failed}
    assert len(errors) == 2 and len(first.trained) == 6  # the other runs went on, on the other worker and a new one
    assert "exists and is not a directory" in errors[blocked]
    died = [e for d, e in errors.items() if d != blocked]
    assert re.search(r"worker process ended \(exit code -9\) during this run; see .*/logs/worker[01]\.log", died[0])

    # The same command again trains only the two failed runs; the rest are skipped.
    blocked.unlink()
    again = run_sweep(spec_from_dict(raw), parallel=2, threads=1, progress=False)
    assert sorted(r.run_dir for r in again.trained) == sorted(errors) and not again.failed
    assert len(again.skipped) == 6 and (tmp_path / "parallel" / "report" / "report.md").is_file()

    # Every run's numbers are those of the serial sweep, bit for bit (each run is seeded).
    for run in spec.runs():
        mine = json.loads((run.run_dir / "results.json").read_text())
        theirs = json.loads(
            (tmp_path / "serial" / run.run_dir.relative_to(tmp_path / "parallel") / "results.json").read_text()
        )
        assert mine["test_loss"] is not None
        assert {k: mine[k] for k in HELD_OUT} == {k: theirs[k] for k in HELD_OUT}, run.label


@pytest.mark.slow  # 4 tiny runs in 2 workers: ~15 s on 2 cores
def test_parallel_sweep_extends_a_grid_as_soon_as_its_arm_finishes(tmp_path: Path) -> None:
    """The serial sweep's extensions (tests/test_sweep.py), made inside the queue: same LRs,
    same record; a rerun replays them on the finished runs and trains nothing."""
    raw = _queue_spec(tmp_path, "sweep", methods={"baseline": {"lr": [1e-5, 3e-5]}}, seeds=[0], max_extend=2)
    first = run_sweep(spec_from_dict(raw), parallel=2, threads=1, progress=False, report=False)
    assert not first.failed and sorted(r.lr for r in first.extended) == [9e-5, 2.7e-4]
    assert sorted(r.lr for r in first.trained) == [1e-5, 3e-5, 9e-5, 2.7e-4]
    record = yaml.safe_load((tmp_path / "sweep" / "sweep.yaml").read_text())
    assert [(e["lr"], e["side"], e["chosen"]) for e in record["extended"]["baseline"]] == [
        (9e-5, "up", 3e-5),
        (2.7e-4, "up", 9e-5),
    ]
    again = run_sweep(spec_from_dict(raw), parallel=2, threads=1, progress=False, report=False)
    assert not again.trained and len(again.extended) == 2 and len(again.skipped) == 4


@pytest.mark.slow  # a parallel sweep in a subprocess, killed with SIGKILL, then run again: ~40 s
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds worker processes through /proc")
def test_kill_9_of_a_parallel_sweep_stops_its_workers_and_the_same_command_resumes(tmp_path: Path) -> None:
    """The workers get SIGTERM when the sweep's process dies (Linux), checkpoint and stop; the
    same command then resumes those runs from their checkpoints and trains the rest."""
    raw = _queue_spec(tmp_path, "sweep", seeds=[0])
    raw["config"] = {**raw["config"], "steps": 800, "checkpoint_every": 800, "eval_every": 800}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "oelm", "sweep", str(path), "--parallel", "2", "--threads", "1", "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sweep = tmp_path / "sweep"
    deadline = time.monotonic() + 120
    # Both workers are in their step loop (a line per step: log_every 1): before it, a signal
    # stops a run that has nothing to checkpoint yet.
    while sum(p.stat().st_size > 0 for p in sweep.glob("runs/*/*/seed0/metrics.jsonl")) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 120
    while _workers(sweep):
        assert time.monotonic() < deadline, "a worker trains on after its sweep was killed"
        time.sleep(0.2)
    started = [r for r in sweep.glob("runs/*/*/seed0") if (r / "metrics.jsonl").exists()]
    assert len(started) == 2
    # On an idle machine a run can reach its last step before the kill lands: it is finished, not
    # in progress. Every run still in progress wrote a checkpoint and no results.
    interrupted = [r for r in started if not (r / "results.json").exists()]
    assert interrupted, "both runs finished before the kill: nothing was interrupted"
    for run in interrupted:
        assert list(run.glob("checkpoints/step_*/model.safetensors")), run
    done = len(started) - len(interrupted)
    again = run_sweep(load_spec(path), parallel=2, threads=1, progress=False, report=False)
    assert len(again.trained) == 4 - done and not again.failed and len(again.skipped) == done


def test_the_bar_shows_a_running_runs_last_logged_step(tmp_path) -> None:
    """A sweep's bar moved only between runs (the quickstart sat at 0/18 for minutes): each
    running run's label now carries the last training step its metrics.jsonl logged."""
    import json
    from types import SimpleNamespace

    from oelm.experiments.runner import steps_done

    run = SimpleNamespace(run_dir=tmp_path, config={"steps": 1000})
    assert steps_done(run) == ""  # not started: no metrics.jsonl yet
    lines = [{"kind": "train", "step": s, "loss": 2.0} for s in (10, 20, 340)]
    lines.append({"kind": "eval", "step": 340, "split": "val", "loss": 1.9})
    text = "".join(json.dumps(x) + "\n" for x in lines)
    (tmp_path / "metrics.jsonl").write_text("x" * 5000 + "\n" + text + '{"kind": "train", "st')  # a torn last line
    assert steps_done(run) == " (step 340/1000)"
