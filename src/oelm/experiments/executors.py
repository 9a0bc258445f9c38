"""Where a sweep's runs train: local worker processes (default), Slurm through submitit, or Ray.

Every executor is a `Pool` of `oelm.experiments.dispatch` (slots that train one run each), fed by
the same queue, running the same run configs through the same `train`, writing the same run
directories and records: a run trained on a cluster is the run a local worker would train (bit
for bit on the same machine: same config, same seeds, same code). What differs is only where the
process lives.

- `local`: `dispatch.WorkerPool`, persistent worker processes on this machine.
- `submitit`: one job per run through submitit's `AutoExecutor` (Slurm when `sbatch` is there,
  else local processes), or its `LocalExecutor` with `cluster=local`. Options: `partition`,
  `gpus_per_run`, `cpus_per_run`, `timeout_min`, `mem_gb`, `account`, `qos`, `constraint`,
  `cluster` (auto / slurm / local / debug). Job logs: SWEEP/logs/submitit/.
- `ray`: one Ray task per run, on the cluster at `address` (`ray start --head` there), or on a
  local Ray instance started here when no address is given. Options: `address`, `gpus_per_run`,
  `cpus_per_run`.

The retry policy, stated once for every executor: a run that ends in a crash (any exception
but a `UserError`, a killed or preempted job, a lost node) is submitted once more; it resumes
from its last checkpoint (runs are planned with `resume`). A `UserError` (bad input) is not
retried: the same input fails the same way. A second crash fails the run; the sweep goes on and
reports it. One run never trains twice at the same time: a slot holds its run until the job ends,
and the run directory's lock refuses a second process.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oelm.experiments.dispatch import WorkerPool
from oelm.experiments.sweep import RunSpec
from oelm.utils.errors import UserError

EXECUTORS = ("local", "submitit", "ray")
RETRIES = 1  # extra submissions after a crash (not after a UserError)
OPTIONS = {
    "local": (),
    "submitit": (
        "partition",
        "gpus_per_run",
        "cpus_per_run",
        "timeout_min",
        "mem_gb",
        "account",
        "qos",
        "constraint",
        "cluster",
    ),
    "ray": ("address", "gpus_per_run", "cpus_per_run"),
}
INTS = ("gpus_per_run", "cpus_per_run", "timeout_min", "mem_gb")


@dataclass(frozen=True)
class ExecutorSpec:
    """Which executor and its options (validated before any run starts)."""

    kind: str = "local"
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, kind: str, pairs: list[str] | None = None) -> ExecutorSpec:
        """From `--executor KIND` and `--executor-option KEY=VALUE` flags; a UserError names a bad one."""
        if kind not in EXECUTORS:
            raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")
        options: dict[str, Any] = {}
        for pair in pairs or []:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise UserError(f"--executor-option takes KEY=VALUE, got {pair!r}")
            if key not in OPTIONS[kind]:
                valid = ", ".join(OPTIONS[kind]) or "none"
                raise UserError(f"--executor-option {key!r} is not an option of the {kind} executor (options: {valid})")
            if key in INTS:
                try:
                    options[key] = int(value)
                except ValueError:
                    raise UserError(f"--executor-option {key} must be an integer, got {value!r}") from None
                least = 0 if key == "gpus_per_run" else 1  # a job of 0 CPUs, 0 minutes or 0 GB never runs
                if options[key] < least:
                    raise UserError(f"--executor-option {key} must be at least {least}, got {value}")
            else:
                options[key] = value
        if kind == "submitit" and options.get("cluster", "auto") not in ("auto", "slurm", "local", "debug"):
            raise UserError(
                f"--executor-option cluster must be auto, slurm, local or debug, got {options['cluster']!r}"
            )
        _require(kind)
        if kind == "ray" and options.get("address"):
            check_ray_address(options["address"])
        return cls(kind, options)


def installed(package: str) -> bool:
    """Whether a package can be imported here (without importing it)."""
    return importlib.util.find_spec(package) is not None


def _require(kind: str) -> None:
    """A clear error, before any run, when the executor's package is missing."""
    if kind != "local" and not installed(kind):
        raise UserError(
            f"--executor {kind} needs the {kind} package: pip install 'oelm[cluster]' (or pip install {kind})"
        )


RAY_CONNECT_S = 5.0  # how long the address check waits for a Ray head to accept a connection


def check_ray_address(address: str, wait_s: float = RAY_CONNECT_S) -> None:
    """A Ray address must have a head listening there: ray.init would otherwise wait with no answer.

    HOST:PORT (the head's GCS) or ray://HOST:PORT (Ray Client) is tried with one TCP connection
    bounded by `wait_s`; `auto` and `local` are Ray's own words and left to it.
    """
    if address in ("auto", "local"):
        return
    where = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = where.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(
            f"--executor-option address={address!r} is not HOST:PORT (or ray://HOST:PORT, auto); "
            "pass the address `ray start --head` printed"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=wait_s):
            pass
    except OSError as err:
        why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__)
        raise UserError(
            f"--executor-option address={address!r}: no Ray head answers there ({why} within {wait_s:g} s); "
            f"start one there with `ray start --head --port {port}`, or drop the address to start Ray on this machine"
        ) from None


def train_run(config: dict[str, Any], cwd: str, threads: int | None) -> dict[str, Any]:
    """The job every remote executor runs: train one run config, as a local worker would.

    Paths in run configs are relative to the directory the sweep was started in (`cwd`), which a
    cluster shares; a UserError comes back as an answer (not retried), any other exception raises
    (the executor sees a crash and the retry policy applies).
    """
    import torch  # heavy optional dependency: imported on use (in the job's process)

    from oelm.training.loop import train  # the job's process imports the training stack itself

    os.chdir(cwd)
    if threads:
        torch.set_num_threads(threads)
    try:
        train(config)
    except UserError as err:
        return {"out": config.get("out"), "error": str(err), "retry": False}
    return {"out": config.get("out"), "error": None}


@dataclass
class _Job:
    run: RunSpec
    handle: Any
    attempts: int = 1


class JobPool:
    """A `Pool` whose slots are jobs of a remote executor: `start` submits, `wait` polls.

    Subclasses say how to submit a job and how to see whether it ended (`_submit`, `_ended`).
    """

    def __init__(self, logs: Path, slots: int, threads: int | None, options: dict[str, Any]) -> None:
        self.logs, self.slots, self.threads, self.options = logs, slots, threads, options
        self.jobs: dict[int, _Job] = {}
        self.cwd = os.getcwd()
        self.retried: list[str] = []  # labels of runs submitted again after a crash

    def __enter__(self) -> JobPool:
        self.logs.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _config(self, run: RunSpec) -> dict[str, Any]:
        return {**run.config, "progress": False}

    def start(self, slot: int, run: RunSpec) -> None:
        """Submit the run as one job on the slot."""
        self.jobs[slot] = _Job(run, self._submit(self._config(run)))

    def wait(self, timeout: float) -> list[tuple[int, str | None]]:
        """Slots whose job ended: None (trained) or the error; a crash is resubmitted once."""
        deadline = time.monotonic() + timeout
        while True:
            ended = []
            for slot, job in list(self.jobs.items()):
                done, answer, crash = self._ended(job.handle)
                if not done:
                    continue
                if crash is not None and job.attempts <= RETRIES:
                    self.retried.append(job.run.label)
                    last = crash.strip().splitlines()[-1] if crash.strip() else "a crash"
                    with (self.logs / "retries.log").open("a", encoding="utf-8") as log:
                        log.write(f"{job.run.label}: submitted again after: {last}\n")
                    job.handle, job.attempts = self._submit(self._config(job.run)), job.attempts + 1
                    continue
                self.jobs.pop(slot)
                ended.append((slot, crash if crash is not None else (answer or {}).get("error")))
            if ended or time.monotonic() >= deadline:
                return ended
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _submit(self, config: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _ended(self, handle: Any) -> tuple[bool, dict[str, Any] | None, str | None]:
        """(ended, the job's answer, the crash text or None)."""
        raise NotImplementedError

    def close(self) -> None:
        """Cancel the jobs still running (each resumes from its checkpoint on the next call)."""
        self.jobs.clear()


class SubmititPool(JobPool):
    """One submitit job per run: Slurm (or submitit's local processes)."""

    def __init__(self, logs: Path, slots: int, threads: int | None, options: dict[str, Any]) -> None:
        super().__init__(logs, slots, threads, options)
        import submitit  # heavy optional dependency: imported on use

        folder = logs / "submitit"
        cluster = options.get("cluster", "auto")
        if cluster == "local":
            self.executor = submitit.LocalExecutor(folder=folder)
        elif cluster == "debug":
            self.executor = submitit.DebugExecutor(folder=folder)
        else:
            self.executor = submitit.AutoExecutor(folder=folder, cluster=None if cluster == "auto" else cluster)
        params: dict[str, Any] = {"timeout_min": options.get("timeout_min", 60), "nodes": 1, "tasks_per_node": 1}
        params["cpus_per_task"] = options.get("cpus_per_run", threads or 1)
        if options.get("gpus_per_run"):
            params["gpus_per_node"] = options["gpus_per_run"]
        if options.get("mem_gb"):
            params["mem_gb"] = options["mem_gb"]
        slurm = {k: options[k] for k in ("partition", "account", "qos", "constraint") if k in options}
        if isinstance(self.executor, submitit.AutoExecutor):
            params.update({f"slurm_{k}": v for k, v in slurm.items()})
        elif slurm:
            raise UserError(f"--executor-option {', '.join(slurm)} apply to Slurm; drop them with cluster={cluster}")
        if cluster in ("local", "debug"):
            params = {
                k: v for k, v in params.items() if k in ("timeout_min", "gpus_per_node", "tasks_per_node", "nodes")
            }
        self.executor.update_parameters(**params)

    def _submit(self, config: dict[str, Any]) -> Any:
        return self.executor.submit(train_run, config, self.cwd, self.threads)

    def _ended(self, handle: Any) -> tuple[bool, dict[str, Any] | None, str | None]:
        if not handle.done():
            return False, None, None
        try:
            return True, handle.result(), None
        except Exception as err:  # noqa: BLE001 (a crashed, killed or preempted job: the retry policy decides)
            return True, None, f"{type(err).__name__}: {err}"

    def close(self) -> None:
        for job in self.jobs.values():
            if not job.handle.done():
                job.handle.cancel(check=False)
        super().close()


class RayPool(JobPool):
    """One Ray task per run, on a Ray cluster (or a local instance started here)."""

    def __init__(self, logs: Path, slots: int, threads: int | None, options: dict[str, Any]) -> None:
        super().__init__(logs, slots, threads, options)
        import ray  # heavy optional dependency: imported on use

        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            try:
                ray.init(address=options.get("address"), include_dashboard=False, log_to_driver=False)
            except (ConnectionError, TimeoutError, RuntimeError, ValueError) as err:
                raise UserError(
                    f"--executor ray: could not connect to Ray at {options.get('address') or 'a new local instance'} "
                    f"({type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}); check that "
                    "`ray status` answers there"
                ) from None
        resources = {"num_cpus": options.get("cpus_per_run", threads or 1), "num_gpus": options.get("gpus_per_run", 0)}
        # max_retries=0: the retry policy is ours (a UserError is an answer, not a crash).
        self.task = ray.remote(max_retries=0, **resources)(train_run)

    def _submit(self, config: dict[str, Any]) -> Any:
        return self.task.remote(config, self.cwd, self.threads)

    def _ended(self, handle: Any) -> tuple[bool, dict[str, Any] | None, str | None]:
        ready, _ = self.ray.wait([handle], timeout=0)
        if not ready:
            return False, None, None
        try:
            return True, self.ray.get(handle), None
        except Exception as err:  # noqa: BLE001 (a crashed task or a lost node: the retry policy decides)
            return True, None, "".join(traceback.format_exception_only(type(err), err)).strip()

    def close(self) -> None:
        for job in self.jobs.values():
            self.ray.cancel(job.handle, force=True)
        super().close()
        if self.started:
            self.ray.shutdown()


def make_pool(executor: ExecutorSpec, logs: Path, slots: int, threads: int | None) -> Any:
    """The Pool for an executor (local: the persistent worker processes)."""
    if executor.kind == "submitit":
        return SubmititPool(logs, slots, threads, executor.options)
    if executor.kind == "ray":
        return RayPool(logs, slots, threads, executor.options)
    return WorkerPool(logs, slots, threads or max(1, (os.cpu_count() or 1) // slots))
