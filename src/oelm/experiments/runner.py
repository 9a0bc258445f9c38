"""Execute a sweep: prepare data, skip finished runs, resume the rest, then write the report."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from oelm.data.lm import read_meta
from oelm.experiments.prepare import data_summary, ensure_lm_data
from oelm.experiments.sweep import RunSpec, SweepSpec, extend_grids
from oelm.records.sweep import SWEEP_FILE, read_sweep_record
from oelm.reports.aggregate import Comparison
from oelm.reports.report import write_report
from oelm.training.distributed import resolve_device
from oelm.training.loop import train
from oelm.utils.errors import Interrupted, UserError
from oelm.utils.io import atomic_write_yaml
from oelm.utils.lock import dir_lock

log = logging.getLogger(__name__)


@dataclass
class SweepOutcome:
    """What a sweep did: runs trained now, skipped as finished, failed; and its report."""

    trained: list[RunSpec] = field(default_factory=list)
    skipped: list[RunSpec] = field(default_factory=list)
    failed: list[tuple[RunSpec, str]] = field(default_factory=list)
    extended: list[RunSpec] = field(default_factory=list)  # runs the automatic grid extension added
    report: Path | None = None
    comparison: Comparison | None = None
    wall_time: float = 0.0


def _check_existing(spec: SweepSpec) -> None:
    """Refuse to mix a different base config into an existing sweep directory."""
    stored = read_sweep_record(spec.out)
    diff = spec.same_budget(stored) if stored is not None else []
    if diff:
        raise UserError(
            f"{spec.out} already holds a sweep with a different base config, grid or method options (differs in: "
            f"{', '.join(diff)}); equal budgets need the same base: use another --out"
        )


def _write_spec(spec: SweepSpec) -> None:
    """Write SWEEP/sweep.yaml atomically: stored seeds/LRs are kept so an extended sweep lists everything."""

    atomic_write_yaml(spec.out / SWEEP_FILE, spec.merged(read_sweep_record(spec.out)))


def _prepare_data(spec: SweepSpec, verbose: bool) -> None:
    """Build the LM data directory from the recipe when it is missing."""
    if spec.base.get("task", "lm") != "lm":
        return

    data = Path(spec.base["data"])
    if not spec.prepare:
        read_meta(data)  # missing or corrupt data is one clear error before any run starts
        return
    ensure_lm_data(spec.prepare, data)
    if verbose:
        log.info(f"data: {data_summary(data)}")


def _run_inline(run: RunSpec, progress: bool) -> None:
    """Train one run in this process (the loop resumes or reuses what the directory holds)."""

    train({**run.config, "progress": progress})


def _logs(spec: SweepSpec) -> Path:
    """Folder for subprocess output and configs (outside the run directories, which the loop owns)."""
    logs = spec.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs


def _start_worker(spec: SweepSpec, index: int, runs: list[RunSpec], threads: int) -> subprocess.Popen:
    """Launch one worker process that trains its share of the runs one after another."""
    paths = []
    for run in runs:
        path = _logs(spec) / f"{run.method}_{run.run_dir.parent.name}_seed{run.seed}.json"
        path.write_text(json.dumps({**run.config, "progress": False}), encoding="utf-8")
        paths.append(str(path))
    env = {**os.environ, "OELM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    log = open(_logs(spec) / f"worker{index}.log", "a", encoding="utf-8")  # noqa: SIM115 (closed by the poller)
    # One process per worker, not per run: importing torch for every run would dominate tiny runs.
    proc = subprocess.Popen(
        [sys.executable, "-m", "oelm.experiments.worker", *paths], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    proc.log = log  # type: ignore[attr-defined]
    return proc


def _bar(total: int, done: int, show: bool) -> tqdm:
    """Progress over runs: which run, how many left, ETA."""
    return tqdm(
        total=total,
        initial=done,
        desc="sweep",
        unit="run",
        disable=not show,
        dynamic_ncols=True,
        position=0,
        leave=True,
    )


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Use `threads` torch threads inside the block, then restore the caller's setting."""
    if not threads:
        yield
        return

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run_sequential(
    spec: SweepSpec, pending: list[RunSpec], outcome: SweepOutcome, bar: tqdm, inner_progress: bool
) -> None:
    """One run after another in this process; a failed run is reported and the sweep goes on."""
    for run in pending:
        bar.set_postfix_str(f"{run.label} ({len(pending) - pending.index(run)} left)")
        bar.refresh()
        try:
            _run_inline(run, inner_progress)
            outcome.trained.append(run)
        except Interrupted:  # the run wrote its checkpoint; the sweep stops with it
            raise
        except UserError as err:
            outcome.failed.append((run, str(err)))
        except Exception:  # noqa: BLE001 (one run's crash must not lose the others)
            outcome.failed.append((run, traceback.format_exc(limit=3)))
        bar.update(1)


def _run_parallel(
    spec: SweepSpec, pending: list[RunSpec], outcome: SweepOutcome, bar: tqdm, parallel: int, threads: int | None
) -> None:
    """N worker processes, each on `threads` (default cores // N) threads, runs dealt round-robin."""
    threads = threads or max(1, (os.cpu_count() or 1) // parallel)
    shares = [pending[i::parallel] for i in range(parallel) if pending[i::parallel]]
    workers = [(share, _start_worker(spec, i, share, threads)) for i, share in enumerate(shares)]
    waiting, shown = list(pending), ""
    try:
        while waiting:
            time.sleep(0.5)
            for run in [r for r in waiting if r.finished()]:
                waiting.remove(run)
                outcome.trained.append(run)
                bar.update(1)
            for share, proc in workers:
                if proc.poll() is not None:  # a worker ended: its unfinished runs failed
                    for run in [r for r in share if r in waiting and not r.finished()]:
                        waiting.remove(run)
                        outcome.failed.append((run, f"did not finish; see {proc.log.name}"))
                        bar.update(1)
            running = [next((r for r in share if r in waiting), None) for share, _ in workers]
            text = ", ".join(r.label for r in running if r) + f" ({len(waiting)} left)"
            if text != shown:  # redraw only on change: logs stay readable when piped
                bar.set_postfix_str(text)
                shown = text
    finally:
        # Interrupted or done: stop only the workers this sweep started. SIGTERM lets each one
        # finish its step and write a checkpoint; one that does not stop in time is killed.
        for _, proc in workers:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + WORKER_STOP_S
        for _, proc in workers:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.log.close()


WORKER_STOP_S = 120.0  # how long stopped workers get to write their checkpoint


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT/SIGTERM raise Interrupted in the sweep's process, so its cleanup stops the workers
    (a plain SIGTERM would end the parent at once and leave them training)."""

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(
            f"{signal.Signals(signum).name}: the sweep stopped; finished runs are kept and runs in progress "
            "wrote a checkpoint; run the same command again to continue",
            signum,
        )

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run_sweep(
    spec: SweepSpec,
    parallel: int = 1,
    progress: bool = True,
    inner_progress: bool = False,
    report: bool = True,
    on_report: Callable[[Comparison], None] | None = None,
    threads: int | None = None,
    epilogue: Callable[[Comparison], list[str]] | None = None,
) -> SweepOutcome:
    """Train every unfinished run of the sweep, then write SWEEP/report/report.md.

    `threads` sets torch's intra-op threads per run; on a shared, busy machine 1 thread per run
    avoids the oversubscription that otherwise slows every step several-fold. `epilogue` adds
    closing markdown lines to the report (the quickstart's plain-language reading).
    """
    if parallel < 1 or (threads is not None and threads < 1):
        raise UserError(f"--parallel and --threads must be at least 1, got {parallel} and {threads}")

    with dir_lock(spec.out, "sweep"), _stop_on_signals():
        return _run_locked(spec, parallel, progress, inner_progress, report, on_report, threads, epilogue)


def _train(
    spec: SweepSpec,
    pending: list[RunSpec],
    outcome: SweepOutcome,
    total: int,
    done: int,
    parallel: int,
    progress: bool,
    inner_progress: bool,
    threads: int | None,
) -> None:
    """Train the pending runs, one at a time in this process or in `parallel` workers."""
    with _bar(total, done, progress) as bar:
        if parallel == 1:
            with _torch_threads(threads):
                _run_sequential(spec, pending, outcome, bar, inner_progress)
        else:
            _run_parallel(spec, pending, outcome, bar, parallel, threads)


def _run_locked(
    spec: SweepSpec,
    parallel: int,
    progress: bool,
    inner_progress: bool,
    report: bool,
    on_report: Callable[[Comparison], None] | None,
    threads: int | None,
    epilogue: Callable[[Comparison], list[str]] | None = None,
) -> SweepOutcome:
    """run_sweep's body, holding the sweep directory's lock."""

    start = time.perf_counter()
    runs = spec.selected_runs()
    if runs:  # a device that is not there fails before any run starts (specs validate anywhere)
        resolve_device(str(runs[0].config.get("device", "auto")))
    _check_existing(spec)
    _prepare_data(spec, progress)
    _write_spec(spec)
    outcome = SweepOutcome(skipped=[r for r in runs if r.finished()])
    pending = [r for r in runs if not r.finished()]
    if progress:
        log.info(
            f"sweep {spec.name}: {len(runs)} runs ({len(outcome.skipped)} finished, {len(pending)} to run) -> {spec.out}"
        )
    _train(spec, pending, outcome, len(runs), len(outcome.skipped), parallel, progress, inner_progress, threads)
    # Grids extend on the side where a validation choice sits at an edge, until it is interior or
    # max_extend LRs were added on that side (a re-run replays the same extensions: their runs are
    # finished, so nothing trains twice).
    while added := extend_grids(spec):
        for line in added:
            log.info(f"grid extension: {line}")
        _write_spec(spec)
        known = {r.run_dir for r in runs}
        new = [r for r in spec.selected_runs() if r.run_dir not in known]
        runs += new
        outcome.extended += new
        outcome.skipped += [r for r in new if r.finished()]
        todo = [r for r in new if not r.finished()]
        _train(spec, todo, outcome, len(new), len(new) - len(todo), parallel, progress, inner_progress, threads)
    for run, err in outcome.failed:
        log.warning(f"run failed: {run.label}: {err.strip().splitlines()[-1]}")
    if report:
        outcome.report, outcome.comparison = write_report(
            [spec.out / "runs"],
            spec.out / "report",
            spec.baseline,
            spec.study_numbers,
            extend=spec.extend,
            epilogue=epilogue,
        )
        if on_report:
            on_report(outcome.comparison)
    outcome.wall_time = time.perf_counter() - start
    return outcome
