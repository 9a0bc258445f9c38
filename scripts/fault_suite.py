"""Fault suite (not in CI; minutes on CPU): kill -9 `oelm train` and `oelm sweep` at random moments,
resume, and compare with uninterrupted runs; kill -9 rank 1 or rank 0 of a 2-process gloo job (DDP
and FSDP) mid-step, mid-save and at the final evaluation; race two sweeps; answer every generated
bad input.

    PYTHONPATH=src python scripts/fault_suite.py [--kills 24] [--sweep-kills 6] [--seed 0] [--work DIR]

Prints the counts and exits non-zero when anything was lost, differed or answered badly.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the shared fixtures and generated bad inputs

from bad_input_cases import all_cases, run_case  # noqa: E402
from oelm.reports.comparison import page_sections  # noqa: E402
from oelm.training import checkpoint as ckpt  # noqa: E402
from test_train_ddp import torchrun_with_rank1_hook  # noqa: E402
from train_utils import synthetic_lm_dir  # noqa: E402

ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "OELM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    "HF_HUB_OFFLINE": "1",
    "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
}
STEP_TIME = re.compile(r"its mean step time was [^;]*\)")  # wall-clock: differs between runs
TIMING = re.compile(r"time|tok_s|tokens_per|wall|mfu|memory|seconds|throughput", re.I)


def oelm(*args: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import torch,sys; torch.set_num_threads(1); from oelm.cli import main; sys.exit(main(sys.argv[1:]))",
        *args,
    ]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    fh = open(log, "ab")  # noqa: SIM115 (closed when the process is reaped)
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=ENV, cwd=REPO, start_new_session=True)
    proc.log = fh  # type: ignore[attr-defined]
    return proc


def kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the whole group: nothing of the killed run survives
    proc.wait()
    proc.log.close()


def finish(proc: subprocess.Popen, timeout: float = 600) -> int:
    rc = proc.wait(timeout=timeout)
    proc.log.close()
    return rc


def max_step(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return max((json.loads(x)["step"] for x in lines if x.endswith("}")), default=0)


def check_no_half_checkpoint(run: Path) -> list[str]:
    """Every visible step_N directory is complete and loadable (temp dirs are ignored by design)."""
    bad = []
    root = run / "checkpoints"
    for d in sorted(root.glob("step_*")) if root.is_dir() else []:
        if not ((d / ckpt.WEIGHTS).is_file() and (d / ckpt.STATE).is_file()):
            bad.append(f"incomplete {d.name}")
            continue
        try:
            ckpt.load_state(d)
            load_file(d / ckpt.WEIGHTS)
        except Exception as err:  # noqa: BLE001
            bad.append(f"unloadable {d.name}: {err}")
    return bad


# ------------------------------------------------------------------------------ train kills


def train_kills(work: Path, kills: int, rng: random.Random) -> dict:
    data = synthetic_lm_dir(work / "data", n_train=20_000)
    cfg = {
        "data": str(data),
        "model": "gpt-tiny",
        "method": "oelm-freeze",
        "steps": 200,
        "batch_size": 4,
        "seq_len": 32,
        "lr": 3e-3,
        "warmup": 5,
        "grad_accum": 2,
        "eval_every": 7,
        "eval_batches": 2,
        "final_eval_batches": 2,
        "checkpoint_every": 3,
        "keep_last": 2,
        "log_every": 1,
        "progress": False,
        "tensorboard": False,
        "device": "cpu",
        "seed": 0,
        "model_overrides": {"n_layer": 1, "d_model": 64, "n_head": 4, "block_size": 32, "dropout": 0.1},
    }
    (work / "train.yaml").write_text(yaml.safe_dump(cfg))
    ref, run = work / "ref", work / "killed"
    rc = finish(start(oelm("train", str(work / "train.yaml"), "--out", str(ref)), work / "ref.log"))
    assert rc == 0, (work / "ref.log").read_text()[-2000:]

    stats = {
        "kills": 0,
        "during_checkpoint_write": 0,
        "during_startup": 0,
        "resumes": 0,
        "half_checkpoints_seen": 0,
        "problems": [],
    }
    cmd = oelm("train", str(work / "train.yaml"), "--out", str(run), "--resume")
    while stats["kills"] < kills:
        proc = start(cmd, work / "killed.log")
        mode = rng.choice(["startup", "progress", "progress", "checkpoint"])
        before = max_step(run)
        deadline = time.monotonic() + 120
        if mode == "startup":
            time.sleep(rng.uniform(0.05, 3.0))
        else:
            target = before + rng.randint(1, 12)
            while proc.poll() is None and time.monotonic() < deadline:
                if mode == "checkpoint" and any((run / "checkpoints").glob(".tmp_*")):
                    break
                if mode == "progress" and max_step(run) >= target:
                    break
                time.sleep(0.002)
        if proc.poll() is not None:  # it ended before the kill landed (finished, or failed)
            proc.log.close()
            if proc.returncode != 0:
                stats["problems"].append(f"a resume exited {proc.returncode}")
            break
        writing = any((run / "checkpoints").glob(".tmp_*")) if (run / "checkpoints").is_dir() else False
        kill(proc)
        stats["kills"] += 1
        stats["during_checkpoint_write"] += writing
        stats["during_startup"] += mode == "startup" and max_step(run) == before
        half = check_no_half_checkpoint(run)
        stats["half_checkpoints_seen"] += len(half)
        stats["problems"] += half
    rc = finish(start(cmd, work / "killed.log"))  # the last resume runs to the end
    stats["resumes"] = stats["kills"]
    if rc != 0:
        stats["problems"].append(f"final resume exited {rc}: {(work / 'killed.log').read_text()[-1500:]}")

    final = f"step_{cfg['steps']:07d}"
    for name in (f"{final}/{ckpt.WEIGHTS}", f"best/{ckpt.WEIGHTS}"):
        a, b = load_file(ref / "checkpoints" / name), load_file(run / "checkpoints" / name)
        if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
            stats["problems"].append(f"{name} differs from the uninterrupted run")
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (ref, run))
    for key in ("best_step", "best_val_loss", "val_loss", "test_loss", "tokens_seen", "freeze_check"):
        if ra.get(key) != rb.get(key):
            stats["problems"].append(f"results[{key}] differs: {ra.get(key)} vs {rb.get(key)}")
    ma, mb = (_metrics(d) for d in (ref, run))
    if ma != mb:
        stats["problems"].append("metrics.jsonl differs (beyond timing)")
    stats["bit_identical"] = not stats["problems"]
    return stats


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not TIMING.search(k)} for r in rows]


# ------------------------------------------------------------------------------ sweep kills


def _sweep_spec(work: Path, out: Path) -> Path:
    spec = {
        "name": "faults",
        "out": str(out),
        "config": {
            "data": str(work / "data"),
            "model": "gpt-tiny",
            "steps": 24,
            "warmup": 2,
            "batch_size": 4,
            "seq_len": 32,
            "eval_every": 6,
            "eval_batches": 2,
            "final_eval_batches": 2,
            "checkpoint_every": 4,
            "device": "cpu",
            "progress": False,
            "tensorboard": False,
            "model_overrides": {"n_layer": 1, "d_model": 64, "n_head": 4, "block_size": 32},
        },
        "methods": {"baseline": {"lr": [3e-3]}, "oelm-freeze": {"lr": [3e-3]}},
        "seeds": [0, 1, 2],
    }
    path = work / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _report(out: Path) -> object:
    def clean(x: object) -> object:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if not TIMING.search(k)}
        if isinstance(x, list):
            return [clean(v) for v in x]
        if isinstance(x, str):  # measured step times in the plain-words reading are wall-clock
            return STEP_TIME.sub("its mean step time was <measured>)", x.replace(str(out), "SWEEP"))
        return x

    return clean(page_sections(out / "report" / "report.json"))


def sweep_kills(work: Path, kills: int, rng: random.Random) -> dict:
    ref = work / "sweep-ref"
    rc = finish(start(oelm("sweep", str(_sweep_spec(work, ref))), work / "sweep-ref.log"))
    assert rc == 0, (work / "sweep-ref.log").read_text()[-2000:]
    out = work / "sweep-killed"
    spec = _sweep_spec(work, out)
    stats = {"kills": 0, "reruns": 0, "retrained_finished_runs": 0, "problems": []}
    for _ in range(kills):
        finished = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/*/results.json")}
        proc = start(oelm("sweep", str(spec), "--no-report"), work / "sweep-killed.log")
        time.sleep(rng.uniform(1.0, 10.0))
        if proc.poll() is None:
            kill(proc)
            stats["kills"] += 1
        else:
            proc.log.close()
        stats["reruns"] += 1
        stats["retrained_finished_runs"] += sum(p.stat().st_mtime_ns != t for p, t in finished.items() if p.exists())
        for run in out.glob("runs/*/*/*"):
            stats["problems"] += [f"{run.name}: {x}" for x in check_no_half_checkpoint(run)]
    finished = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/*/results.json")}
    rc = finish(start(oelm("sweep", str(spec)), work / "sweep-killed.log"))
    stats["reruns"] += 1
    stats["retrained_finished_runs"] += sum(p.stat().st_mtime_ns != t for p, t in finished.items())
    if rc != 0:
        stats["problems"].append(f"final sweep exited {rc}")
    elif _report(out) != _report(ref):
        stats["problems"].append("report differs from the uninterrupted sweep")
    if stats["retrained_finished_runs"]:
        stats["problems"].append(f"{stats['retrained_finished_runs']} finished runs were trained again")
    stats["report_identical"] = rc == 0 and _report(out) == _report(ref)
    return stats


def sweep_race(work: Path) -> dict:
    """Two sweeps on one directory at once: one refuses with exit code 2, the other finishes."""
    out = work / "sweep-race"
    spec = _sweep_spec(work, out)
    # Started together: whichever takes SWEEP/.lock first trains, the other must refuse.
    a = start(oelm("sweep", str(spec)), work / "race-a.log")
    b = start(oelm("sweep", str(spec)), work / "race-b.log")
    ra, rb = finish(a), finish(b)
    refusal = (work / ("race-b.log" if rb == 2 else "race-a.log")).read_text()
    ok = sorted([ra, rb]) == [0, 2] and "another sweep" in refusal and _report(out) == _report(work / "sweep-ref")
    return {
        "first_rc": ra,
        "second_rc": rb,
        "one_refused_nothing_corrupted": ok,
        "problems": [] if ok else [f"race: rc {ra}/{rb}: {refusal[-500:]}"],
    }


# ------------------------------------------------------------------------------ bad inputs


def bad_inputs(work: Path) -> dict:
    root = work / "bad"
    os.chdir(REPO)
    torch.set_num_threads(1)
    outcomes = [run_case(c, root) for c in all_cases()]
    # The hub-name cases once more as a user without HF_HUB_OFFLINE on a machine without network.
    saved = {v: os.environ.pop(v, None) for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")}
    hub_times = []
    try:
        import oelm.utils.hub

        oelm.utils.hub.hub_reachable.cache_clear()
        for case in [c for c in all_cases() if "offline" in c.id]:
            t = time.perf_counter()
            outcomes.append(run_case(case, root))
            hub_times.append(time.perf_counter() - t)
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
    failed = [o for o in outcomes if not o.ok]
    return {
        "cases": len(outcomes),
        "answered": len(outcomes) - len(failed),
        "commands": sorted({o.case.id.split("-")[0] for o in outcomes}),
        "offline_hub_error_s_max": round(max(hub_times), 3) if hub_times else None,
        "problems": [f"{o.case.id}: {o.problems} {o.stderr[-200:]}" for o in failed],
    }


def _kill_rank(where: str, n: int) -> str:
    """sitecustomize body for the rank to kill: SIGKILL itself at its n-th forward (step), on entering
    its n-th checkpoint save (save: under FSDP every rank writes its shard), inside its n-th
    checkpoint's write with the temporary folder half written (write: rank 0, which writes state.pt),
    or on entering the final evaluation (final: after the last step and its checkpoint)."""
    head = "    import os, signal\n    calls = []\n"
    if where == "final":
        return head + (
            "    from oelm.training.lm import LMTask\n    real = LMTask.evaluate\n"
            "    def evaluate(self, model, split, final):\n"
            "        if final:\n            os.kill(os.getpid(), signal.SIGKILL)\n"
            "        return real(self, model, split, final)\n    LMTask.evaluate = evaluate\n"
        )
    if where == "write":
        return head + (
            "    import torch\n    real = torch.save\n"
            "    def save(obj, f, *a, **k):\n"
            "        if str(f).endswith('state.pt') and '.tmp' in str(f):\n            calls.append(1)\n"
            f"            if len(calls) == {n}:\n                os.kill(os.getpid(), signal.SIGKILL)\n"
            "        return real(obj, f, *a, **k)\n    torch.save = save\n"
        )
    if where == "step":
        return head + (
            "    from oelm.training.lm import LMTask\n    real = LMTask.loss\n"
            "    def loss(self, model, batch):\n        calls.append(1)\n"
            f"        if len(calls) == {n}:\n            os.kill(os.getpid(), signal.SIGKILL)\n"
            "        return real(self, model, batch)\n    LMTask.loss = loss\n"
        )
    return head + (
        "    from oelm.training import strategy as S\n"
        "    for cls in (S.DDPStrategy, S.FSDPStrategy):\n        real = cls.save_checkpoint\n"
        "        def save(self, *a, _real=real, **k):\n            calls.append(1)\n"
        f"            if len(calls) == {n}:\n                os.kill(os.getpid(), signal.SIGKILL)\n"
        "            return _real(self, *a, **k)\n        cls.save_checkpoint = save\n"
    )


# (rank killed, where): rank 1 and rank 0 mid-step and mid-save, rank 0 inside its write (it alone
# renames checkpoints into place), and either rank at the final evaluation.
DIST_KILLS = [(1, "step"), (1, "save"), (1, "final"), (0, "step"), (0, "save"), (0, "write"), (0, "final")]


def distributed_kills(
    work: Path, rng: random.Random, steps: int = 16, strategies: tuple[str, ...] = ("ddp", "fsdp")
) -> dict:
    """Rank 1 or rank 0 of a 2-process gloo job killed mid-step, mid-save and at the final evaluation
    (DDP, FSDP): the job must end with one line naming the lost rank and --resume (no backend
    traceback of ours), the last complete checkpoint must stay in place with no temporary folder
    beside it, no results.json may be written, and the same command with --resume must finish with
    the uninterrupted job's numbers."""
    problems, cases = [], []
    cfg = {"checkpoint_every": 4, "eval_every": 4}
    for strategy in strategies:
        ref_dir = work / f"dist-{strategy}-ref"
        ref_dir.mkdir(parents=True, exist_ok=True)
        ref, _ = torchrun_with_rank1_hook(ref_dir, "    pass\n", steps, {**cfg, "strategy": strategy})
        if ref.returncode != 0:
            problems.append(f"{strategy}: the uninterrupted job failed: {ref.stderr[-500:]}")
            continue
        expected = json.loads((ref_dir / "ddp" / "results.json").read_text())
        for rank, where in DIST_KILLS:
            n = {"step": rng.randint(5, steps - 2), "final": 1}.get(where, rng.randint(2, steps // 4 - 1))
            at = {"step": "at forward", "save": "entering save", "write": "inside the write of save"}.get(where)
            name = f"{strategy} rank {rank} killed " + (f"{at} {n}" if at else "at the final evaluation")
            folder = work / f"dist-{strategy}-{rank}-{where}"
            folder.mkdir(parents=True, exist_ok=True)
            monitor = ("--monitor-interval", "5")  # the survivor's time to report (docs/training.md)
            done, _ = torchrun_with_rank1_hook(
                folder, _kill_rank(where, n), steps, {**cfg, "strategy": strategy}, monitor, rank=rank
            )
            lines = [x for x in done.stderr.splitlines() if x.startswith("oelm: error:")]
            root = folder / "ddp" / "checkpoints"
            last = ckpt.latest_checkpoint(root)
            debris = [str(p.relative_to(root)) for p in root.rglob(".*tmp*")] if root.is_dir() else []
            bad = []
            if done.returncode == 0:
                bad.append("exit code 0")
            if len(lines) != 1 or f"lost rank {rank}" not in lines[0] or "--resume" not in lines[0]:
                bad.append(f"not one line naming rank {rank} and --resume: {lines or done.stderr[-800:]}")
            if f"[rank{1 - rank}]: Traceback" in done.stderr:
                bad.append(f"rank {1 - rank} ended in a traceback")
            if last is None or debris:
                bad.append(f"last checkpoint {last}, debris {debris}")
            if (folder / "ddp" / "results.json").exists():
                bad.append("results.json written by a job that lost a rank")
            again, _ = torchrun_with_rank1_hook(
                folder, "    pass\n", steps, {**cfg, "strategy": strategy, "resume": True}
            )
            got = json.loads((folder / "ddp" / "results.json").read_text()) if again.returncode == 0 else {}
            if again.returncode != 0:
                bad.append(f"--resume failed: {again.stderr[-800:]}")
            elif diff := [
                k for k in ("steps", "best_val_loss", "val_loss", "test_loss") if got.get(k) != expected.get(k)
            ]:
                bad.append(f"resumed run differs from the uninterrupted one on {diff}: {got} vs {expected}")
            cases.append({"case": name, "kept": last.name if last else None, "ok": not bad})
            problems += [f"{name}: {b}" for b in bad]
    return {"cases": cases, "problems": problems}


def fuzz(examples: int) -> dict:
    """tests/test_fuzz_inputs.py with many more generated inputs (the CI run draws a few dozen)."""
    env = {**os.environ, "OELM_FUZZ_EXAMPLES": str(examples)}
    test = Path(__file__).resolve().parents[1] / "tests" / "test_fuzz_inputs.py"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        env=env,
        capture_output=True,
        text=True,
    )
    tail = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
    return {
        "examples_each": examples,
        "summary": tail,
        "problems": [] if done.returncode == 0 else [done.stdout[-3000:]],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=24, help="SIGKILLs of `oelm train` (default 24)")
    ap.add_argument("--sweep-kills", type=int, default=6, help="SIGKILLs of `oelm sweep` (default 6)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="work folder (default: a temp folder, removed at the end)")
    ap.add_argument("--only", nargs="+", default=["train", "sweep", "dist", "race", "bad", "fuzz"])
    ap.add_argument("--fuzz", type=int, default=5000, help="generated configs, tables, YAML files each (default 5000)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="oelm-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    started = time.perf_counter()
    try:
        if "train" in args.only or "sweep" in args.only or "race" in args.only:
            results["train_kills"] = train_kills(work, args.kills, rng) if "train" in args.only else None
        if "sweep" in args.only or "race" in args.only:
            if not (work / "data" / "meta.json").is_file():
                synthetic_lm_dir(work / "data", n_train=20_000)
            results["sweep_kills"] = sweep_kills(work, args.sweep_kills, rng)
        if "dist" in args.only:
            results["distributed_kills"] = distributed_kills(work, rng)
        if "race" in args.only:
            results["sweep_race"] = sweep_race(work)
        if "bad" in args.only:
            results["bad_inputs"] = bad_inputs(work)
        if "fuzz" in args.only:
            results["fuzz"] = fuzz(args.fuzz)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    problems = sum(len(r["problems"]) for r in results.values() if r)
    results["problems_total"] = problems
    results["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(results, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
