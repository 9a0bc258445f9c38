"""Training throughput of baseline vs oelm-freeze through the real loop (`oelm.train`).

Each configuration is a short `train()` run on random tokens; the numbers come from the run's
timing_stats.json (warm-up steps excluded, data loading excluded, CUDA events on GPU). Beside each
`train` row a `bare` row times the same model's own forward + backward + AdamW step in a tight
loop (same batch, dtype, compile mode, gradient clipping and timer), so `vs bare` is the loop's
overhead. Each measurement runs in a fresh process and is printed as soon as it is taken; on a
shared CPU, processes differ by a few percent, so read `vs bare` over several `--repeats`.

    python -m benchmarks.train_throughput                      # gpt-small on CPU, gpt-medium-512 on CUDA
    python -m benchmarks.train_throughput --models gpt-medium-512 --compile --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oelm.training.loop import train


def make_data(root: Path, vocab: int, n_tokens: int, seed: int = 0) -> Path:
    """A random-token LM data directory (throughput does not depend on the text)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    sizes = {"train": n_tokens, "val": max(n_tokens // 50, 4096)}
    dtype = np.uint16 if vocab <= 65536 else np.uint32
    for split, n in sizes.items():
        rng.integers(0, vocab, size=n).astype(dtype).tofile(root / f"{split}.bin")
    meta = {
        "source": "random",
        "tokenizer": "byte",
        "vocab_size": vocab,
        "eot_id": vocab - 1,
        "dtype": np.dtype(dtype).name,
        "splits": sizes,
        "split_origin": {"val": "holdout"},
        "holdout": None,
    }
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def bare_one(args: argparse.Namespace, model: str, method: str, compiled: bool) -> dict[str, Any]:
    """The model's own step in a tight loop, timed like the loop times its steps."""
    from oelm import apply_method
    from oelm.models.gpt import GPT, gpt_config
    from oelm.training.distributed import resolve_device
    from oelm.training.loop import make_adamw, resolve_amp
    from oelm.training.timing import StepTimer, summarize

    device = resolve_device(args.device, 0)
    amp = resolve_amp(args.dtype, device)
    torch.manual_seed(0)
    net = GPT(gpt_config(model, vocab_size=args.vocab, block_size=args.seq_len))
    apply_method(net, method, seed=0)
    net = net.to(device)
    params = [p for p in net.parameters() if p.requires_grad]
    opt = make_adamw(params, lr=3e-4)  # as `oelm train` builds it
    fwd = torch.compile(net, mode=args.compile_mode) if compiled else net
    x = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=device)
    timer = StepTimer(device)
    for _ in range(args.steps):
        timer.start()
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = fwd(x, x, return_logits=False)[1]  # as `oelm train` calls it
        loss.backward()
        if args.clip > 0:  # the recipe's clipping, as `oelm train` does it: not loop overhead
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        timer.stop()
    st = summarize(timer.resolve(), args.warmup)
    return {
        "runner": "bare",
        "model": model,
        "method": method,
        "compiled": compiled,
        "device": str(device),
        "dtype": str(amp).removeprefix("torch.") if amp else "float32",
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "steps_timed": st["count"],
        "step_ms_median": 1e3 * st["median"],
        "step_ms_mean": 1e3 * st["mean"],
        "step_ms_p95": 1e3 * st["p95"],
        "tokens_per_second": args.batch_size * args.seq_len / st["median"],
        "mfu": None,
        "theoretical_flops_saving": None,
        "peak_memory_bytes": None,
        "memory_kind": "-",
    }


def bench_one(
    args: argparse.Namespace, data: Path, out: Path, model: str, method: str, compiled: bool
) -> dict[str, Any]:
    """Train briefly and return the throughput figures of that run."""
    cfg = {
        "data": str(data),
        "out": str(out),
        "model": model,
        "method": method,
        "seed": 0,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "warmup": 0,
        "schedule": "constant",
        "lr": 3e-4,
        "timing_warmup": args.warmup,
        "clip": args.clip,
        "eval_every": 0,
        "eval_batches": 1,
        "final_eval_batches": 1,
        "checkpoint_every": 0,
        "log_every": args.steps,
        "device": args.device,
        "dtype": args.dtype,
        "compile": compiled,
        "compile_mode": args.compile_mode if compiled else None,
        "progress": False,
        "tensorboard": False,
        "overwrite": True,
    }
    results = train(cfg)
    timing = json.loads((out / "timing_stats.json").read_text())
    st = timing["step_time"]
    return {
        "runner": "train",
        "model": model,
        "method": method,
        "compiled": compiled,
        "device": timing["device"],
        "dtype": timing["compute_dtype"],
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "steps_timed": st["count"],
        "step_ms_median": 1e3 * st["median"],
        "step_ms_mean": 1e3 * st["mean"],
        "step_ms_p95": 1e3 * st["p95"],
        "tokens_per_second": timing["tokens_per_second_median"],
        "mfu": timing["mfu"],
        "theoretical_flops_saving": timing["theoretical_flops_saving"],
        "peak_memory_bytes": timing["peak_memory_bytes"],
        "memory_kind": timing["memory_kind"],
        "trainable_params": results["trainable_params"],
        "frozen_params": results["frozen_params"],
    }


def merge(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated measurements: medians of the timing fields."""
    row = dict(reps[0])
    for key in ("step_ms_median", "step_ms_mean", "step_ms_p95", "tokens_per_second", "peak_memory_bytes"):
        values = [r[key] for r in reps if r[key] is not None]
        row[key] = statistics.median(values) if values else None
    row["repeats"] = len(reps)
    row["step_ms_median_each"] = [r["step_ms_median"] for r in reps]
    return row


def order(key: tuple, args: argparse.Namespace) -> tuple:
    """Sort rows by model, mode, the method order given on the command line, then runner."""
    model, compiled, method, runner = key
    return args.models.index(model), compiled, args.methods.index(method), runner != "train"


def print_table(rows: list[dict[str, Any]]) -> None:
    """Side-by-side table, with each oelm row's measured speed-up over its baseline."""
    base = {(r["model"], r["compiled"], r["runner"]): r for r in rows if r["method"] == "baseline"}
    bare = {(r["model"], r["compiled"], r["method"]): r for r in rows if r["runner"] == "bare"}
    print(
        f"{'model':<15} {'method':<12} {'runner':<6} {'mode':<8} {'ms/step':>9} {'p95':>8} {'tok/s':>10} "
        f"{'speedup':>8} {'theory':>7} {'vs bare':>8} {'MFU':>6} {'peak MiB':>9}"
    )
    for r in rows:
        b = base.get((r["model"], r["compiled"], r["runner"]))
        speed = b["step_ms_median"] / r["step_ms_median"] if b else float("nan")
        bb = bare.get((r["model"], r["compiled"], r["method"]))
        vs_bare = f"{r['step_ms_median'] / bb['step_ms_median']:.3f}" if bb and r["runner"] == "train" else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "-"
        mem = f"{r['peak_memory_bytes'] / 2**20:,.0f}" if r["peak_memory_bytes"] else "-"
        theory = f"{1 / (1 - r['theoretical_flops_saving']):.3f}x" if r["theoretical_flops_saving"] is not None else "-"
        print(
            f"{r['model']:<15} {r['method']:<12} {r['runner']:<6} {'compiled' if r['compiled'] else 'eager':<8} "
            f"{r['step_ms_median']:>9.1f} {r['step_ms_p95']:>8.1f} {r['tokens_per_second']:>10,.0f} "
            f"{speed:>7.3f}x {theory:>7} {vs_bare:>8} {mfu:>6} {mem:>9}"
        )
    print(
        f"device: {rows[0]['device']}, dtype {rows[0]['dtype']}; memory = {rows[0]['memory_kind']}; "
        "speedup = baseline median / method median (same runner); theory = FLOP ratio from oelm.core.flops; "
        "vs bare = train median / bare-step median (loop overhead)"
    )


def main() -> None:
    """Parse arguments, run every (model, method, mode) and report."""
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["gpt-medium-512"] if cuda else ["gpt-small"])
    p.add_argument("--methods", nargs="+", default=["baseline", "oelm-freeze"])
    p.add_argument("--steps", type=int, default=60 if cuda else 16)
    p.add_argument("--warmup", type=int, default=10 if cuda else 4, help="timed steps excluded")
    p.add_argument("--batch-size", type=int, default=16 if cuda else 4)
    p.add_argument("--seq-len", type=int, default=512 if cuda else 128)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--compile", action="store_true", help="also time torch.compile (slow on CPU)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. reduce-overhead (CUDA graphs)")
    p.add_argument("--no-bare", action="store_true", help="skip the bare model-step rows")
    p.add_argument(
        "--clip",
        type=float,
        default=1.0,
        help="gradient-norm clipping in both runners "
        "(`oelm train`'s default 1.0; 0 disables it), so `vs bare` is the loop's overhead alone",
    )
    p.add_argument("--repeats", type=int, default=2, help="rounds, methods alternating; medians reported")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args()
    modes = [False, True] if args.compile else [False]
    runs: dict[tuple, list[dict[str, Any]]] = {}
    # A fresh process per measurement: clean peak memory, no order effects from warm allocators.
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        n_tokens = max(200_000, 4 * args.batch_size * (args.seq_len + 1))
        data = make_data(Path(tmp) / "data", args.vocab, n_tokens)
        for rnd in range(args.repeats):
            for model in args.models:
                for compiled in modes:
                    methods = args.methods if rnd % 2 == 0 else args.methods[::-1]
                    for method in methods:
                        jobs = [(bench_one, (args, data, Path(tmp) / "run", model, method, compiled))]
                        if not args.no_bare:
                            jobs.append((bare_one, (args, model, method, compiled)))
                        for fn, fn_args in jobs[:: 1 if rnd % 2 == 0 else -1]:
                            with ctx.Pool(1) as pool:
                                row = pool.apply(fn, fn_args)
                            runs.setdefault((model, compiled, method, row["runner"]), []).append(row)
                            print(
                                f"# round {rnd + 1}: {row['runner']} {model} {method} "
                                f"{'compiled' if compiled else 'eager'}: median {row['step_ms_median']:.1f} ms, "
                                f"p95 {row['step_ms_p95']:.1f} ms",
                                file=sys.stderr,
                                flush=True,
                            )
    rows = [merge(v) for k, v in sorted(runs.items(), key=lambda kv: order(kv[0], args))]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
