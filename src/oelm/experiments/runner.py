"""Execute a sweep: prepare data, skip finished runs, resume the rest, then write the report."""

from __future__ import annotations

import json
import logging
import os
import signal
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
from oelm.experiments.dispatch import RunQueue, drive
from oelm.experiments.executors import ExecutorSpec, make_pool
from oelm.experiments.prepare import check_passes, data_summary, ensure_lm_data
from oelm.experiments.resolve import resolve_config
from oelm.experiments.sweep import RunSpec, SweepSpec, check_stored_runs, extend_grids
from oelm.records.sweep import SWEEP_FILE, SweepRecord, read_sweep_record, record_from_mapping
from oelm.reports.aggregate import Comparison
from oelm.reports.report import write_report
from oelm.training.distributed import resolve_device
from oelm.training.loop import train
from oelm.utils.errors import Interrupted, UserError
from oelm.utils.io import atomic_write_yaml
from oelm.utils.lock import dir_lock

LOCAL = ExecutorSpec()
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


def _check_existing(spec: SweepSpec) -> SweepRecord | None:
    """Refuse to mix a different base config into an existing sweep directory; the stored record."""
    stored = read_sweep_record(spec.out)
    diff = spec.same_budget(stored) if stored is not None else []
    if diff:
        raise UserError(
            f"{spec.out} already holds a sweep with a different base config, grid or method options (differs in: "
            f"{', '.join(diff)}); equal budgets need the same base: use another --out"
        )
    check_stored_runs(spec)
    return stored


def _write_spec(spec: SweepSpec, stored: SweepRecord | None) -> SweepRecord:
    """Write SWEEP/sweep.yaml atomically (stored seeds/LRs are kept, so an extended sweep lists
    everything) and keep the record it holds on the spec: the report reads it from memory."""
    merged = spec.merged(stored)
    atomic_write_yaml(spec.out / SWEEP_FILE, merged)
    spec.record = record_from_mapping(merged, spec.out)
    return spec.record


def _prepare_data(spec: SweepSpec, verbose: bool) -> None:
    """Build the LM data directory from the recipe when it is missing."""
    if spec.base.get("task", "lm") != "lm":
        return

    data = Path(spec.base["data"])
    if not spec.prepare:
        read_meta(data)  # missing or corrupt data is one clear error before any run starts
    else:
        ensure_lm_data(spec.prepare, data)
        if verbose:
            log.info(f"data: {data_summary(data)}")
    _check_passes(spec, verbose)


def _check_passes(spec: SweepSpec, verbose: bool) -> None:
    """State the passes the runs plan over the train split; refuse, before any run, a budget that
    plans another number than the base config states (`passes:`, experiments.prepare.check_passes)."""
    planned: dict[tuple, float] = {}
    for run in spec.selected_runs():
        cfg = resolve_config(run.config).config
        key = (cfg.steps, cfg.batch_size, cfg.grad_accum, cfg.seq_len, cfg.model, repr(cfg.model_overrides))
        if key not in planned:
            passes = check_passes(cfg, spec.passes, f"the sweep {spec.name}'s base config")
            if passes is not None:
                planned[key] = passes
    if verbose and planned:
        low, high = min(planned.values()), max(planned.values())
        span = f"{low:.3g}" if low == high else f"{low:.3g} to {high:.3g}"
        log.info(f"budget: {span} passes over the train split per run")


def _run_inline(run: RunSpec, progress: bool) -> None:
    """Train one run in this process (the loop resumes or reuses what the directory holds)."""

    train({**run.config, "progress": progress})


def _logs(spec: SweepSpec) -> Path:
    """Folder for subprocess output and configs (outside the run directories, which the loop owns)."""
    return spec.out / "logs"


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
    spec: SweepSpec,
    pending: list[RunSpec],
    outcome: SweepOutcome,
    bar: tqdm,
    parallel: int,
    threads: int | None,
    grow: Callable[[list[str]], list[RunSpec]],
    queue_class: type[RunQueue],
    executor: ExecutorSpec = LOCAL,
) -> None:
    """N slots fed from one queue: a slot takes the longest expected pending run when it finishes
    one (experiments.dispatch). Local slots are worker processes on `threads` (default cores // N)
    threads; a remote executor's are jobs (experiments.executors). An arm whose runs are all
    finished extends its grid at once, and the new runs join the queue."""
    queue = queue_class(pending, finished=[*outcome.skipped, *outcome.trained], slots=parallel)
    shown = ""

    def on_done(run: RunSpec, error: str | None) -> list[RunSpec]:
        if error is None and run.finished():
            outcome.trained.append(run)
        else:
            outcome.failed.append((run, error or "ended without a finished results.json"))
        bar.update(1)
        if not run.finished():  # failed (a diverged run is finished: its arm may extend)
            return []
        before = len(outcome.extended)
        todo = grow([run.method])
        if len(outcome.extended) > before:
            bar.total += len(outcome.extended) - before
            bar.update(len(outcome.extended) - before - len(todo))  # replayed: finished already
        return todo

    labels, drawn = "", 0.0

    def on_change(running: list[RunSpec]) -> None:
        nonlocal shown, labels, drawn
        now, names = time.monotonic(), ", ".join(r.label for r in running)
        if names == labels and now - drawn < STEPS_REDRAW_S:
            return  # the running set is unchanged: step counts redraw every few seconds, not every poll
        labels, drawn = names, now
        text = ", ".join(f"{r.label}{steps_done(r)}" for r in running) + f" ({len(queue) + len(running)} left)"
        if text != shown:  # redraw only on change: logs stay readable when piped
            bar.set_postfix_str(text)
            shown = text

    # Interrupted or done, leaving the pool stops only the workers this sweep started: SIGTERM lets
    # a busy one finish its step and write a checkpoint; one that does not stop in time is killed.
    with make_pool(executor, _logs(spec), parallel, threads) as pool:
        drive(queue, pool, on_done, on_change)


STEPS_REDRAW_S = 5.0  # how often the bar's step counts of running runs refresh


def steps_done(run: RunSpec) -> str:
    """' (step N/M)': the last training step a running run logged (the tail of its metrics.jsonl),
    so the sweep's bar moves during a run, not only between runs; '' before its first log line."""
    path = Path(run.run_dir) / "metrics.jsonl"
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if '"kind": "train"' not in line:
            continue
        try:
            step = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
        return f" (step {step}/{run.config.get('steps', '?')})"
    return ""


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
    queue_class: type[RunQueue] = RunQueue,
    executor: ExecutorSpec = LOCAL,
) -> SweepOutcome:
    """Train every unfinished run of the sweep, then write SWEEP/report/report.md.

    `executor` says where runs train: local worker processes (default), Slurm through submitit, or
    Ray (experiments.executors); `parallel` is then the number of runs in flight.

    `threads` sets torch's intra-op threads per run; on a shared, busy machine 1 thread per run
    avoids the oversubscription that otherwise slows every step several-fold. `epilogue` adds
    closing markdown lines to the report (the quickstart's plain-language reading). With
    `parallel` > 1, `queue_class` decides which run a free worker takes next (the default:
    longest expected first; benchmarks/sweep_queue.py passes the old up-front dealing).
    """
    if parallel < 1 or (threads is not None and threads < 1):
        raise UserError(f"--parallel and --threads must be at least 1, got {parallel} and {threads}")

    with dir_lock(spec.out, "sweep"), _stop_on_signals():
        return _run_locked(
            spec, parallel, progress, inner_progress, report, on_report, threads, epilogue, queue_class, executor
        )


def _grow(spec: SweepSpec, known: set[Path], outcome: SweepOutcome, methods: list[str] | None = None) -> list[RunSpec]:
    """Extend the grids of `methods` (default: every arm trained) while a validation choice sits at
    an edge (sweep.extend_grids); record the new runs in `outcome` and return those to train.

    Grids extend on the side where a validation choice sits at an edge, until it is interior or
    max_extend LRs were added on that side. A re-run replays the same extensions: their runs are
    finished, so the loop goes on to the next extension and nothing trains twice.
    """
    todo = []
    while added := extend_grids(spec, methods):
        for line in added:
            log.info(f"grid extension: {line}")
        _write_spec(spec, spec.record)
        new = [r for r in spec.selected_runs() if r.run_dir not in known]
        known.update(r.run_dir for r in new)
        outcome.extended += new
        for run in new:
            (todo if not run.finished() else outcome.skipped).append(run)
    return todo


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
    grow: Callable[[list[str]], list[RunSpec]],
    queue_class: type[RunQueue],
    executor: ExecutorSpec = LOCAL,
) -> None:
    """Train the pending runs, one at a time in this process or in `parallel` slots."""
    with _bar(total, done, progress) as bar:
        if parallel == 1 and executor.kind == "local":
            with _torch_threads(threads):
                _run_sequential(spec, pending, outcome, bar, inner_progress)
        else:
            _run_parallel(spec, pending, outcome, bar, parallel, threads, grow, queue_class, executor)


def _run_locked(
    spec: SweepSpec,
    parallel: int,
    progress: bool,
    inner_progress: bool,
    report: bool,
    on_report: Callable[[Comparison], None] | None,
    threads: int | None,
    epilogue: Callable[[Comparison], list[str]] | None = None,
    queue_class: type[RunQueue] = RunQueue,
    executor: ExecutorSpec = LOCAL,
) -> SweepOutcome:
    """run_sweep's body, holding the sweep directory's lock."""

    start = time.perf_counter()
    runs = spec.selected_runs()
    if runs:  # a device that is not there fails before any run starts (specs validate anywhere)
        resolve_device(str(runs[0].config.get("device", "auto")))
    stored = _check_existing(spec)
    _prepare_data(spec, progress)
    _write_spec(spec, stored)
    outcome = SweepOutcome(skipped=[r for r in runs if r.finished()])
    pending = [r for r in runs if not r.finished()]
    if progress:
        log.info(
            f"sweep {spec.name}: {len(runs)} runs ({len(outcome.skipped)} finished, {len(pending)} to run) -> {spec.out}"
        )
    known = {r.run_dir for r in runs}

    def grow(methods: list[str] | None = None) -> list[RunSpec]:
        return _grow(spec, known, outcome, methods)

    train_args = (parallel, progress, inner_progress, threads, grow, queue_class, executor)
    if parallel > 1:  # arms finished before this call extend now, so their new runs share the queue
        pending += grow()
    total = len(runs) + len(outcome.extended)
    _train(spec, pending, outcome, total, total - len(pending), *train_args)
    # One run at a time, grids extend after all runs, then the new runs train (until no arm's
    # choice sits at an edge). In parallel the queue extends an arm as soon as its runs are
    # finished, so nothing is left to add here.
    while True:
        before = len(outcome.extended)
        todo = grow()
        if not todo:
            break
        added = len(outcome.extended) - before
        _train(spec, todo, outcome, added, added - len(todo), *train_args)
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
            sweep=spec.record,
        )
        if on_report:
            on_report(outcome.comparison)
    outcome.wall_time = time.perf_counter() - start
    return outcome
