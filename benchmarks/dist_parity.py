"""Do several processes train like one? Loss curves, frozen tensors and bytes per step, per strategy.

For `baseline` and `oelm-freeze`, each column trains the same model from the same seed with the
same global batch, and is compared with one process:
  one       one process (`oelm train`, tiny GPT), the reference of the GPT columns
  ddp-2     torchrun, 2 gloo processes, DDP (`oelm train`)
  fsdp-2    torchrun, 2 processes, `oelm train --strategy fsdp` (FSDP2), when this oelm has it
  zero3-2   torchrun, 2 processes, DeepSpeed ZeRO-3 through transformers.Trainer on a tiny BERT
            (examples/hf_trainer_dist.py), compared with that example on one process
Per column: the largest |loss - loss of one process| over the logged training steps; whether the
frozen tensors are bit-identical at the end (to their start, and for the GPT columns also to the
one-process run's); bytes all-reduced per step (DDP's comm hook, `timing_stats.json`), or
reduce-scattered and all-gathered under FSDP2 (`timing_stats.json`, where this oelm records them)
and ZeRO-3 (DeepSpeed's comms logger); and the gradient bytes per step.

    python -m benchmarks.dist_parity                                   # writes docs/results/distributed/
    python -m benchmarks.dist_parity --steps 3 --columns one ddp-2 --out /tmp/parity

CPU only (gloo); a failed run is reported in its cell, never hidden.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

import oelm
from oelm.utils.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["one", "ddp-2", "fsdp-2", "zero3-2"]
METHODS = ["baseline", "oelm-freeze"]
DEFAULT_OUT = Path("docs/results/distributed")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--columns", nargs="+", default=COLUMNS, choices=COLUMNS)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=4, help="per process of the 2-process columns")
    p.add_argument("--data", default=None, help="a prepared LM folder (default: builtin:tales, 300 docs, bytes)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for dist_parity.json and README.md")
    p.add_argument("--work", default=None, help="folder for the runs (default: a temporary one)")
    return p.parse_args(argv)


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(pkg: str) -> str | None:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "threads_per_process": 1,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        **{pkg: version(pkg) for pkg in ("torch", "transformers", "accelerate", "deepspeed")},
        "oelm": oelm.__version__,
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def launch(cmd: list[str], log: Path) -> str | None:
    """Run `cmd` from the repository root, its output kept in `log`; None when it succeeded, else
    the exit code and the first error line of its output (or its last lines)."""
    done = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(done.stdout + "\n" + done.stderr)
    if done.returncode == 0:
        return None
    lines = [x.strip() for x in done.stderr.splitlines() if x.strip()]
    marks = ("Error", "what():", "terminate called", "Exception", "Signal ")
    hits = [x for x in lines if any(m in x for m in marks)]
    return f"exit code {done.returncode}: " + (hits[0] if hits else " | ".join(lines[-3:]))[-400:]


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]


def fsdp_available() -> str | None:
    """None when `oelm train --strategy fsdp` exists and can run here, else why not."""
    from oelm.training.config import TrainConfig

    if "strategy" not in TrainConfig.model_fields:
        return "not available: this oelm has no `oelm train --strategy fsdp`"
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return "not available: this torch has no FSDP2 (torch.distributed.fsdp.fully_shard)"
    return None


def gpt_config(data: Path, out: Path, method: str, steps: int, batch: int) -> dict[str, Any]:
    return {
        "data": str(data),
        "out": str(out),
        "model": "gpt-tiny",
        "model_overrides": {"n_layer": 2, "d_model": 64, "n_head": 4, "block_size": 64},
        "method": method,
        "steps": steps,
        "batch_size": batch,
        "seq_len": 64,
        "lr": 3e-3,
        "warmup": 2,
        "eval_every": 0,
        "eval_batches": 2,
        "final_eval_batches": 2,
        "checkpoint_every": 0,
        "log_every": 1,
        "progress": False,
        "tensorboard": False,
        "device": "cpu",
        "seed": 0,
    }


def train_losses(run: Path) -> list[float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["loss"] for r in lines if r.get("kind") == "train"]


def frozen_tensors(run: Path) -> dict[str, torch.Tensor]:
    model = oelm.load_model(run, which="latest")
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def gpt_cell(work: Path, data: Path, method: str, column: str, a: argparse.Namespace) -> dict[str, Any]:
    """Train one GPT column; its record (losses, freeze check, bytes), or its error."""
    run = work / "gpt" / method / column
    nproc = 1 if column == "one" else 2
    cfg = gpt_config(data, run, method, a.steps, a.batch_size * (2 // nproc))
    if column == "fsdp-2":
        cfg["strategy"] = "fsdp"
    config = work / "gpt" / f"{method}-{column}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(cfg))
    train = ["-m", "oelm", "train", str(config), "--no-progress"]
    started = time.monotonic()
    error = launch([sys.executable, *train] if nproc == 1 else [*torchrun(nproc), *train], run.parent / f"{column}.log")
    cell: dict[str, Any] = {"processes": nproc, "wall_s": round(time.monotonic() - started, 1)}
    if error:
        return {**cell, "error": error}
    results = json.loads((run / "results.json").read_text())
    timing = json.loads((run / "timing_stats.json").read_text())
    return {
        **cell,
        "losses": train_losses(run),
        "world_size": results["world_size"],
        "global_batch_size": results["global_batch_size"],
        "freeze_check_ok": results["freeze_check"]["ok"],
        "trainable_params": results["trainable_params"],
        "frozen_params": results["frozen_params"],
        "gradient_bytes_per_step": timing.get("gradient_bytes_per_step"),
        "allreduce_bytes_per_step": timing.get("allreduce_bytes_per_step"),
        # under FSDP2, when this oelm records them (f3db625 on)
        **{
            k: timing[k]
            for k in ("reduce_scatter_bytes_per_step", "allgather_bytes_per_step")
            if timing.get(k) is not None
        },
        "_run": run,
    }


def zero_config(work: Path) -> Path:
    """examples/deepspeed_zero3.json with DeepSpeed's comms logger on (it counts the bytes)."""
    cfg = json.loads((ROOT / "examples" / "deepspeed_zero3.json").read_text())
    cfg["comms_logger"] = {"enabled": True, "prof_all": True, "verbose": False}
    path = work / "hf" / "zero3-comms.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=2))
    return path


def hf_cell(work: Path, method: str, nproc: int, a: argparse.Namespace) -> dict[str, Any]:
    """examples/hf_trainer_dist.py on one process, or on 2 under ZeRO-3."""
    out = work / "hf" / method / ("one" if nproc == 1 else "zero3-2")
    script = [str(ROOT / "examples" / "hf_trainer_dist.py"), "--out", str(out), "--method", method]
    script += ["--steps", str(a.steps), "--rows", str(2 * a.batch_size * a.steps)]
    script += ["--batch-size", str(a.batch_size * (2 // nproc))]
    if nproc > 1:
        script += ["--deepspeed", str(zero_config(work))]
    started = time.monotonic()
    error = launch(
        [sys.executable, *script] if nproc == 1 else [*torchrun(nproc), *script], out.parent / f"{out.name}.log"
    )
    cell: dict[str, Any] = {"processes": nproc, "wall_s": round(time.monotonic() - started, 1)}
    if error:
        return {**cell, "error": error}
    s = json.loads((out / "summary.json").read_text())
    comm = s.get("comm_bytes_per_step") or {}
    return {
        **cell,
        "losses": s["losses"],
        "world_size": s["world_size"],
        "global_batch_size": s["world_size"] * a.batch_size * (2 // nproc),
        "freeze_check_ok": s["frozen_identical"],
        "frozen_tensors": s["frozen_tensors"],
        "trainable_params": s["trainable_params"],
        "record_saved": s["record_saved"],
        "gradient_bytes_per_step": s["gradient_bytes_per_step"],
        "reduce_scatter_bytes_per_step": comm.get("reduce_scatter_tensor"),
        "allreduce_bytes_per_step": comm.get("all_reduce"),
        "allgather_bytes_per_step": comm.get("all_gather_into_tensor"),
    }


def max_abs_diff(a: list[float], b: list[float]) -> float | None:
    if len(a) != len(b) or not a:
        return None
    return max(abs(x - y) for x, y in zip(a, b))


def compare(cell: dict[str, Any], ref: dict[str, Any] | None, ref_frozen: dict[str, torch.Tensor] | None) -> None:
    """Add the comparison with the one-process reference to `cell` (in place)."""
    run = cell.pop("_run", None)
    if "error" in cell:
        return
    if ref is None or "error" in ref:
        cell["max_abs_loss_diff"] = None
        cell["note"] = "no one-process reference"
        return
    cell["max_abs_loss_diff"] = max_abs_diff(cell["losses"], ref["losses"])
    if ref_frozen is None or run is None:  # the ZeRO column: checked against the start in-process
        cell["frozen_equal_one_process"] = None
        return
    mine = frozen_tensors(run)
    cell["frozen_equal_one_process"] = set(mine) == set(ref_frozen) and all(
        torch.equal(mine[n], ref_frozen[n]) for n in mine
    )


def frozen_verdict(cell: dict[str, Any]) -> str:
    if "error" in cell:
        return "failed"
    if not cell.get("frozen_tensors", cell.get("frozen_params")):
        return "n/a (none frozen)"
    same = cell["freeze_check_ok"] and cell.get("frozen_equal_one_process") is not False
    return "yes" if same else "no"


def fmt_bytes(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def fmt_diff(v: float | None) -> str:
    if v is None:
        return "n/a"
    return "0" if v == 0 else f"{v:.1e}"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Distributed parity: several processes against one",
        "",
        f"Generated by `{report['command']}` (commit {report['git_commit']}); do not edit by hand.",
        f"Machine: {m['cpu']}, {m['cpu_cores']} cores, {m['os']}, one torch thread per process; "
        f"torch {m['torch']}, transformers {m['transformers']}, deepspeed {m['deepspeed']}. "
        f"{report['steps']} steps, global batch {report['global_batch']} (2 x {report['batch_size']}).",
        "",
        f"GPT columns: `oelm train`, a 2-layer GPT (d_model 64) on {report['data']}, compared with",
        "`one`. ZeRO column: `examples/hf_trainer_dist.py` (tiny BERT, transformers.Trainer), compared",
        "with that example on one process. `frozen identical`: every frozen tensor bit-identical to its",
        "start at the end (and, for the GPT columns, to the one-process run's). `bytes/step`: per process,",
        "all-reduced by DDP's comm hook; under FSDP2 the reduce-scattered bytes as `oelm train` counts",
        "them, under ZeRO-3 as DeepSpeed's comms logger does (all-gathers listed below the table).",
        "`gradient bytes`: the trainable tensors' gradients, 4 bytes per trainable parameter.",
        "",
        "| method | column | processes | max abs loss diff vs 1 process | frozen identical | bytes/step | gradient bytes | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, cols in report["results"].items():
        for col, c in cols.items():
            if "unavailable" in c:
                lines.append(f"| {method} | {col} | - | {c['unavailable']} | - | - | - | - |")
                continue
            if "error" in c:
                lines.append(f"| {method} | {col} | {c['processes']} | failed: {c['error']} | - | - | - | - |")
                continue
            moved = c.get("reduce_scatter_bytes_per_step", c.get("allreduce_bytes_per_step"))
            if col == "one":
                moved = 0
            kind = " (reduce-scatter)" if "reduce_scatter_bytes_per_step" in c else ""
            if moved is None and col == "fsdp-2":
                moved, kind = None, " (not recorded under fsdp)"
            lines.append(
                f"| {method} | {col} | {c['processes']} | {fmt_diff(c.get('max_abs_loss_diff'))} | "
                f"{frozen_verdict(c)} | {fmt_bytes(moved)}{kind} | {fmt_bytes(c.get('gradient_bytes_per_step'))} | "
                f"{c['wall_s']} |"
            )
    gathers = [
        f"{method} {col}: {fmt_bytes(c['allgather_bytes_per_step'])}"
        for method, cols in report["results"].items()
        for col, c in cols.items()
        if c.get("allgather_bytes_per_step") is not None
    ]
    if gathers:
        lines += ["", "All-gathered bytes per step (parameters gathered for forward and backward, frozen ones too):"]
        lines += ["", "; ".join(gathers) + "."]
    lines += ["", "The loss curves and every figure above: [dist_parity.json](dist_parity.json).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="oelm-dist-parity-"))
    work.mkdir(parents=True, exist_ok=True)
    data = Path(a.data) if a.data else work / "data"
    if not a.data and not (data / "meta.json").is_file():
        prep = ["-m", "oelm", "prepare", "lm", "builtin:tales", "--tokenizer", "byte", "--max-docs", "300"]
        error = launch([sys.executable, *prep, "--out", str(data)], work / "prepare.log")
        if error:
            print(f"preparing the data failed: {error}", file=sys.stderr)
            return 1
    fsdp_reason = fsdp_available()
    zero_reason = None if importlib.util.find_spec("deepspeed") else "not available: deepspeed is not installed"
    results: dict[str, dict[str, Any]] = {}
    for method in a.methods:
        cols: dict[str, Any] = {}
        needs_ref = any(c in a.columns for c in ("one", "ddp-2", "fsdp-2"))
        ref = gpt_cell(work, data, method, "one", a) if needs_ref else None
        ref_frozen = frozen_tensors(ref["_run"]) if ref and "error" not in ref else None
        if "one" in a.columns:
            cols["one"] = ref
        for col in a.columns:
            if col == "one":
                continue
            if col == "fsdp-2" and fsdp_reason:
                cols[col] = {"unavailable": fsdp_reason}
                continue
            if col == "zero3-2":
                if zero_reason:
                    cols[col] = {"unavailable": zero_reason}
                    continue
                hf_ref = hf_cell(work, method, 1, a)
                cell = hf_cell(work, method, 2, a)
                compare(cell, hf_ref, None)
                cell["reference_losses"] = hf_ref.get("losses")
            else:
                cell = gpt_cell(work, data, method, col, a)
                compare(cell, ref, ref_frozen)
            cols[col] = cell
            print(f"{method} {col}: {json.dumps({k: v for k, v in cell.items() if k != 'losses'})}")
        if "one" in cols and cols["one"] is not None:
            cols["one"].pop("_run", None)
            if "error" not in cols["one"]:
                cols["one"]["max_abs_loss_diff"] = 0.0
                cols["one"]["frozen_equal_one_process"] = True
        results[method] = cols
    report = {
        "command": "python -m benchmarks.dist_parity " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": git_commit(),
        "machine": machine(),
        "steps": a.steps,
        "batch_size": a.batch_size,
        "global_batch": 2 * a.batch_size,
        "data": "300 built-in tales (bytes)" if not a.data else "the data given by --data",
        "results": results,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "dist_parity.json", json.dumps(report, indent=2, allow_nan=False) + "\n")
    atomic_write_text(out / "README.md", markdown(report))
    print(markdown(report))
    failed = [
        (m, c) for m, cols in results.items() for c, cell in cols.items() if isinstance(cell, dict) and "error" in cell
    ]
    if failed:
        print(f"failed: {failed}; every run's output is kept in {work}", file=sys.stderr)
    elif not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
