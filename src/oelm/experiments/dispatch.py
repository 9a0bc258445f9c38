"""The work queue of `oelm sweep --parallel N`: N worker processes, each handed the next run when
it finishes one, longest expected run first.

- `RunQueue`: the pending runs and the order they are handed out in (`expected_work`, refined by
  the measured times of finished runs of the same arm).
- `drive`: the loop that keeps every slot busy while runs are pending; it knows slots only through
  the `Pool` protocol, so a simulated pool tests it (tests/test_sweep_queue.py).
- `WorkerPool`: the real pool, one `python -m oelm.experiments.worker --serve LOGS` process per
  slot, fed one JSON config path per line on its stdin, answering one JSON line per run.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from oelm.experiments.sweep import RunSpec
from oelm.models.catalog import PRESETS
from oelm.records.run import read_results

WORKER_STOP_S = 120.0  # how long stopped workers get to write their checkpoint


def expected_work(config: dict[str, Any]) -> float:
    """A run's work in relative units, from its config alone: optimizer steps x sequences per step
    (batch_size x grad_accum) x tokens per sequence x n_layer x d_model² for one of our presets (the
    model factor is 1 for any other model: the runs of one sweep share their model unless a grid
    varies it). Evaluation, start-up and the method's frozen share are not in it; measured times
    (`RunQueue`) are."""
    steps = float(config.get("steps") or 1000)
    sequences = float(config.get("batch_size") or 16) * float(config.get("grad_accum") or 1)
    preset = PRESETS.get(str(config.get("model", "gpt-tiny")))
    overrides = config.get("model_overrides") or {}
    size, block = 1.0, 1
    if preset is not None:
        layers = overrides.get("n_layer") or preset.n_layer
        width = overrides.get("d_model") or preset.d_model
        size, block = float(layers) * float(width) ** 2, overrides.get("block_size") or preset.block_size
    tokens = float(config.get("seq_len") or block)
    return steps * sequences * tokens * size


def arm_of(run: RunSpec) -> str:
    """The arm a run belongs to for timing purposes: its method and method options."""
    return f"{run.method} {json.dumps(run.config.get('method_options') or {}, sort_keys=True, default=str)}"


class RunQueue:
    """Pending runs, handed to whichever worker is free, the longest expected run first.

    A run's expected length is `expected_work(config)` until a run of the sweep has finished; from
    then on it is in seconds: its work times its arm's measured seconds per unit of work (median
    over the arm's finished runs of `total_wall_time` / work, so an arm that steps faster or
    evaluates longer counts as such), or, for an arm with no finished run yet, the median over the
    arms measured so far. Finished runs refine the order as they come in. A run resuming from a
    checkpoint counts as whole. Ties keep the sweep's seed-major order. `slot` is the worker asking
    (this queue serves any worker; a dealing that pins runs to workers overrides `take`).
    """

    def __init__(self, runs: Iterable[RunSpec], finished: Iterable[RunSpec] = (), slots: int = 1) -> None:
        self.pending: list[RunSpec] = []
        self.slots = slots
        self.rates: dict[str, list[float]] = {}  # arm -> measured seconds per unit of work
        for run in finished:
            self.learn(run)
        self.add(runs)

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, runs: Iterable[RunSpec]) -> None:
        """More runs to hand out (a grid extension's)."""
        self.pending.extend(runs)

    def learn(self, run: RunSpec) -> None:
        """Record a finished run's measured seconds per unit of work (nothing when unreadable)."""
        results = read_results(run.run_dir) or {}
        wall = results.get("total_wall_time")
        work = expected_work(run.config)
        if isinstance(wall, (int, float)) and wall > 0 and work > 0:
            self.rates.setdefault(arm_of(run), []).append(float(wall) / work)

    def expected(self, run: RunSpec) -> float:
        """The run's expected length: seconds once any run is measured, relative work before."""
        work = expected_work(run.config)
        if not self.rates:
            return work
        own = self.rates.get(arm_of(run))
        rate = statistics.median(own) if own else statistics.median(statistics.median(v) for v in self.rates.values())
        return work * rate

    def take(self, slot: int) -> RunSpec | None:
        """The next run for the worker in `slot`: the longest expected pending run (None: nothing left)."""
        if not self.pending:
            return None
        lengths = [self.expected(r) for r in self.pending]
        best = max(range(len(self.pending)), key=lambda i: (lengths[i], -i))
        return self.pending.pop(best)


class Pool(Protocol):
    """Slots that train one run each at a time (`WorkerPool`; a simulated one in the tests)."""

    slots: int

    def start(self, slot: int, run: RunSpec) -> None:
        """Begin training `run` in the idle `slot`."""

    def wait(self, timeout: float) -> list[tuple[int, str | None]]:
        """Slots whose run ended within `timeout` seconds, each with None (trained) or the error."""


def drive(
    queue: RunQueue,
    pool: Pool,
    on_done: Callable[[RunSpec, str | None], list[RunSpec]],
    on_change: Callable[[list[RunSpec]], None] | None = None,
    poll_s: float = 0.5,
) -> None:
    """Train every run of `queue` on `pool`: a free slot takes the next run at once, so no slot
    idles while runs are pending. `on_done(run, error)` is called as each run ends (error None: it
    trained) and returns runs to add to the queue (a grid extension); `on_change(running)` after
    every change of the running set (the progress line)."""
    busy: dict[int, RunSpec] = {}
    while True:
        for slot in range(pool.slots):
            if slot not in busy and (run := queue.take(slot)) is not None:
                busy[slot] = run
                pool.start(slot, run)
        if not busy:
            return
        if on_change:
            on_change(list(busy.values()))
        for slot, error in pool.wait(poll_s):
            run = busy.pop(slot)
            if error is None:
                queue.learn(run)
            queue.add(on_done(run, error))


class WorkerPool:
    """One worker process per slot (`python -m oelm.experiments.worker --serve LOGS`), started on
    its first run and kept for the next ones (importing torch per run would dominate tiny runs).
    Each gets `threads` torch threads; its output goes to LOGS/worker<slot>.log. A worker that dies
    fails its run and is replaced on the slot's next run. Use as a context manager: leaving it
    closes idle workers and stops busy ones with SIGTERM (they checkpoint and exit; killed after
    WORKER_STOP_S)."""

    def __init__(self, logs: Path, slots: int, threads: int) -> None:
        self.logs, self.slots, self.threads = logs, slots, threads
        self.procs: dict[int, subprocess.Popen] = {}
        self.running: dict[int, RunSpec] = {}
        self.selector = selectors.DefaultSelector()

    def __enter__(self) -> WorkerPool:
        self.logs.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def log_of(self, slot: int) -> Path:
        return self.logs / f"worker{slot}.log"

    def _spawn(self, slot: int) -> subprocess.Popen:
        env = {**os.environ, "OELM_THREADS": str(self.threads), "OMP_NUM_THREADS": str(self.threads)}
        log = open(self.log_of(slot), "a", encoding="utf-8")  # noqa: SIM115 (closed with the worker)
        proc = subprocess.Popen(
            [sys.executable, "-m", "oelm.experiments.worker", "--serve", str(self.logs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            text=True,
            bufsize=1,
        )
        proc.log = log  # type: ignore[attr-defined]
        self.procs[slot] = proc
        self.selector.register(proc.stdout, selectors.EVENT_READ, slot)
        return proc

    def start(self, slot: int, run: RunSpec) -> None:
        """Write the run's config to LOGS/<method>_<setting>_seed<N>.json and hand its path to the slot's worker."""
        path = self.logs / f"{run.method}_{run.run_dir.parent.name}_seed{run.seed}.json"
        path.write_text(json.dumps({**run.config, "progress": False}), encoding="utf-8")
        proc = self.procs.get(slot) or self._spawn(slot)
        self.running[slot] = run
        with contextlib.suppress(OSError):  # a worker that died between runs: wait reads its EOF
            proc.stdin.write(f"{path}\n")
            proc.stdin.flush()

    def wait(self, timeout: float) -> list[tuple[int, str | None]]:
        """The runs that ended: a worker's answer line, or its end (EOF) while it held a run."""
        ended = []
        for key, _ in self.selector.select(timeout):
            slot = key.data
            proc = self.procs[slot]
            line = proc.stdout.readline()
            if line:
                try:
                    answer = json.loads(line)
                except json.JSONDecodeError:  # not an answer (the worker's output goes to its log)
                    continue
                if slot in self.running and isinstance(answer, dict):
                    self.running.pop(slot)
                    ended.append((slot, answer.get("error")))
                continue
            code = self._drop(slot)  # EOF: the worker ended
            if slot in self.running:
                self.running.pop(slot)
                ended.append(
                    (slot, f"the worker process ended (exit code {code}) during this run; see {proc.log.name}")
                )
        return ended

    def _drop(self, slot: int) -> int | None:
        """Forget the slot's ended worker (its next run starts a new one); its exit code."""
        proc = self.procs.pop(slot)
        self.selector.unregister(proc.stdout)
        try:
            code = proc.wait(timeout=WORKER_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        self._close_files(proc)
        return code

    @staticmethod
    def _close_files(proc: subprocess.Popen) -> None:
        for f in (proc.stdin, proc.stdout, proc.log):  # type: ignore[attr-defined]
            with contextlib.suppress(OSError):  # a worker that died leaves a broken stdin pipe
                f.close()

    def close(self) -> None:
        """End every worker: idle ones at the end of their input, busy ones by SIGTERM (stop this
        sweep's workers only; each writes a checkpoint), any still there after WORKER_STOP_S killed."""
        for slot, proc in self.procs.items():
            with contextlib.suppress(OSError):
                proc.stdin.close()  # an idle worker reads EOF and exits
            if slot in self.running and proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + WORKER_STOP_S
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._close_files(proc)
        self.procs.clear()
        self.running.clear()
        self.selector.close()
