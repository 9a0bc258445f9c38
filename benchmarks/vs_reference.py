"""oelm's GPT against a plain reference GPT of the same shape, measured side by side in one process.

Rows: `reference` (a minimal nanoGPT-style model written below: fused QKV nn.Linear, SDPA, no
biases, tied head, no toolkit code), oelm `baseline`, `oelm-freeze`, `oelm-qk-ffn`, `baseline-AA`
(a second baseline: the timing noise floor), `baseline-nobias` (our baseline at the
reference's exact shape: GPTConfig(bias=False) drops the LayerNorm and MLP biases) and
`baseline-logits` (our baseline with the loss through materialized logits and F.cross_entropy,
as the reference computes it; every other oelm arm calls the model as `oelm train` does, with
return_logits=False, so its loss never materializes the logits). Every arm runs the same loop:
forward + backward + fused AdamW step, bf16 autocast on CUDA, float32 on CPU. Arms are
interleaved in rounds so drift hits them alike, in a carryover-balanced order (a Williams design:
over a cycle of rounds every arm takes every position and follows every other arm equally often;
a merely rotating order made each arm always follow the same one, and two copies of one model
then ran 0.7-2.7% apart for a whole process on CPU); warm-up steps are excluded.
CUDA steps are timed with CUDA events read after each round (no host sync inside a step); CPU
steps with wall time and, steadier on a shared machine, process CPU time.

Ratios are medians over rounds of the ratio within each round, with a distribution-free 95%
interval: a round runs the arms side by side, so the machine's slow drift cancels within it and the
interval is the noise that remains (the A/A row's interval is the noise floor). A frozen arm is
shadowed by its skipped work, timed in the same rounds: the weight-gradient GEMMs (and gradient
sums) its freezing removes, run alone, exactly the FLOPs of its "theoretical" saving. That time
says how much of the step those FLOPs really take on this device, and `skipped_time_saved` how much
of it the step saved: near 1.0, freezing realizes what it can, and the rest of a FLOP target is time
the step spends on work FLOPs do not count (softmax, norms, elementwise ops, the optimizer, launches).
Timings vary between processes more than within one (memory placement, thread scheduling): compare
the intervals of repeated runs before reading a difference of a percent or two.

Each round prints a progress line and rewrites the JSON (a list of rows), so a run stopped early
keeps its figures. Memory per arm: the arm's parameters and optimizer state plus one step's
transient peak: on CUDA the allocator's peak above what the other arms hold, on CPU the peak of
live tensor bytes from torch.profiler's memory events, with the phase and op where it falls (the
RSS of one process holding every arm would say nothing per arm). Freezing lowers the peak by the
frozen tensors' AdamW moments, and by their gradients only if those are alive at the peak.

    python -m benchmarks.vs_reference --device cuda --json out.json              # batch 8 and 32
    python -m benchmarks.vs_reference --device cuda --compile --json out.json
    python -m benchmarks.vs_reference --device cpu --quick --json out.json       # < 5 min, 2 cores
    python -m benchmarks.vs_reference --device cpu --quick --processes 3 --json out.json  # 3 fresh processes
    python -m benchmarks.vs_reference --count-ops --json ops.json                # ~1 min on CPU
    python -m benchmarks.vs_reference --table out.json [more.json ...]           # markdown summary of stored runs

`--profile-ops` says where a difference comes from: it profiles every arm with torch.profiler in the
same balanced rounds and prints, per arm, the ops whose self time per step differs most from the
baseline's (self CPU time on CPU; on CUDA, each kernel's device time), with calls per step. The
profiler adds a cost to every op it records and charges it to the enclosing range, so Python-heavy
ranges (a custom autograd Function's forward and backward) look dearer than they run: read it for
attribution, and the timed rows for the size of a difference.

    python -m benchmarks.vs_reference --device cpu --quick --profile-ops --json ops-profile.json

`--count-ops` times nothing: after one warm-up step it counts, per arm, the aten ops one training
step dispatches (forward, backward, optimizer step + zero_grad; what autograd and autocast leave,
each op one dispatch and, unless a view, usually one kernel launch) and the Python function calls
it makes. Both are deterministic, so they compare launch-bound (small-batch eager) overhead on a
machine where timings are noise. Every device counts the CUDA step: bf16 autocast and fused AdamW.
Counts do not depend on batch, sequence length or vocabulary, so the defaults there are small.

The parts: the arms (benchmarks/arms.py) and the reference model (benchmarks/reference_model.py),
timed by the shared harness (benchmarks/harness.py: balanced rounds, medians with intervals, the
incremental JSON); `--count-ops` is benchmarks/count_ops.py, `--profile-ops` benchmarks/profile_ops.py,
`--table` benchmarks/tables.py. Run from the repository root; benchmarks/README.md lists every script.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .arms import ARMS, LOGITS, NOBIAS, Arm, SkippedWork, build_arms
from .count_ops import count
from .harness import (
    balanced_orders,
    device_name,
    fmt_ci,
    fmt_pct,
    fresh_compile_caches,
    interleaved_rounds,
    median_ci,
    paired_ratio,
    sync,
    write_rows,
)
from .profile_ops import profile_ops
from .tables import table, without_logits

ROOT = Path(__file__).resolve().parents[1]  # the repository root, where `python -m benchmarks.vs_reference` runs
MODULE = "benchmarks.vs_reference"  # what --processes runs in each fresh process

# Quick CPU shape: gpt-medium-512 at vocab 50,257 takes seconds per step on 2 cores.
CPU_QUICK = {"n_layer": 4, "n_head": 4, "d_model": 256, "d_ff": 1024, "vocab_size": 8192}


def _peak_flops(args: argparse.Namespace) -> tuple[float | None, str]:
    """Peak FLOP/s for MFU and where the figure comes from."""
    if args.peak_flops:
        return args.peak_flops, "--peak-flops"
    if args.device == "cuda":
        from oelm.core.flops import device_peak_flops, peak_flops_note

        peak = device_peak_flops(args.device, torch.bfloat16)  # the benchmark's CUDA step is bf16 autocast
        return peak, "dense bf16 peak of " + torch.cuda.get_device_name() if peak else peak_flops_note(
            args.device, torch.bfloat16
        )
    return None, "CPU: no peak assumed (pass --peak-flops to get MFU)"


def rows_of(
    arms: list[Arm],
    args: argparse.Namespace,
    batch: int,
    rounds_done: int,
    complete: bool,
    skipped: dict[str, SkippedWork] | None = None,
) -> list[dict]:
    """One row per arm with times, throughput, memory, MFU and ratios to baseline/reference.

    Every ratio is the median over rounds of the ratio within each round (the arms of a round ran
    side by side), with a distribution-free 95% interval (`*_ci`). A frozen arm's row also has the
    measured time of the GEMMs its freezing skips (`skipped_work_*`) and how much of it the step saved.
    """
    skipped = skipped or {}
    peak, peak_src = _peak_flops(args)
    med = {a.name: statistics.median(a.times) if a.times else math.nan for a in arms}
    by_name = {a.name: a for a in arms}
    base_arm, ref_arm = by_name["baseline"], by_name["reference"]
    base = med["baseline"]
    rows = []
    for a in arms:
        m = med[a.name]
        p95 = float(np.percentile(a.times, 95)) if a.times else math.nan
        mem_saving = (base_arm.peak - a.peak) if a.peak is not None and base_arm.peak else None
        b_r, a_r = base_arm.round_medians, a.round_medians
        speedup, *speedup_ci = paired_ratio(b_r, a_r)
        vs_ref, *vs_ref_ci = paired_ratio(ref_arm.round_medians, a_r)
        realized, *realized_ci = (
            median_ci([(1 - y / x) / a.saving for x, y in zip(b_r, a_r)]) if a.saving else (None, None, None)
        )
        sk = skipped.get(a.name)
        sk_med = statistics.median(sk.times) if sk and sk.times else None
        saved, *saved_ci = (
            median_ci([(x - y) / z for x, y, z in zip(b_r, a_r, sk.round_medians)]) if sk else (None, None, None)
        )
        rows.append(
            {
                "name": a.name,
                "batch": batch,
                "seq": args.seq,
                "shape": args.shape_note,
                "device": args.device_name,
                "compiled": bool(args.compile),
                "compile_mode": args.compile_mode,
                "dtype": "bfloat16 autocast" if args.device == "cuda" else "float32",
                "steps_timed": len(a.times),
                "rounds_done": rounds_done,
                "load_average_1min": os.getloadavg()[0],
                "cpu_count": os.cpu_count(),
                "complete": complete,
                "tokens_per_s": batch * args.seq / m if a.times else None,
                "step_time_median_s": m,
                "step_time_p95_s": p95,
                "p95_over_median": p95 / m if a.times else None,
                "peak_memory_bytes": a.peak,
                "memory_kind": "cuda: persistent state + one step's allocator peak"
                if args.device == "cuda"
                else "cpu: persistent state + one step's peak of live tensor bytes (torch.profiler memory events)",
                "peak_phase": (a.peak_where or {}).get("peak_phase"),
                "peak_op": (a.peak_where or {}).get("peak_op"),
                "grad_bytes": a.grad_bytes,
                "frozen_optimizer_state_bytes": 2 * a.frozen_bytes,  # the AdamW moments alone
                "memory_saving_vs_baseline_bytes": mem_saving,
                "frozen_grad_and_optimizer_bytes": 3 * a.frozen_bytes,
                "flops_per_step": a.flops,
                "achieved_flops_per_s": a.flops / m if a.flops and a.times else None,
                "mfu": a.flops / m / peak if peak and a.flops and a.times else None,
                "peak_flops": peak,
                "peak_flops_source": peak_src,
                "theoretical_saving": a.saving,
                "theoretical_speedup": 1 / (1 - a.saving) if a.saving is not None else None,
                "speedup_vs_baseline": speedup,
                "speedup_vs_baseline_ci": speedup_ci,
                "saving_realized": realized,
                "saving_realized_ci": realized_ci if a.saving else None,
                "vs_reference": vs_ref,
                "vs_reference_ci": vs_ref_ci,
                "rounds_paired": min(len(b_r), len(a_r)),
                "skipped_work_s": sk_med,
                "skipped_work_flops": sk.flops if sk else None,
                "skipped_work_share_of_baseline": sk_med / base if sk_med else None,
                "skipped_work_speedup_ceiling": base / (base - sk_med) if sk_med else None,
                "skipped_time_saved": saved,
                "skipped_time_saved_ci": saved_ci if sk else None,
                "cpu_seconds_median": statistics.median(a.cpu_times) if a.cpu_times else None,
                "speedup_vs_baseline_cpu_time": paired_ratio(base_arm.round_cpu_medians, a.round_cpu_medians)[0]
                if a.cpu_times
                else None,
                "vs_reference_cpu_time": paired_ratio(ref_arm.round_cpu_medians, a.round_cpu_medians)[0]
                if a.cpu_times
                else None,
            }
        )
    return rows


def _fmt(r: dict) -> str:
    mem = f"{r['peak_memory_bytes'] / 2**20:9.1f}" if r["peak_memory_bytes"] else f"{'n/a':>9}"
    theo = f"{100 * r['theoretical_saving']:6.2f}%" if r["theoretical_saving"] is not None else f"{'':>7}"
    mfu = f"{100 * r['mfu']:5.1f}%" if r["mfu"] else f"{'n/a':>6}"
    return (
        f"{r['name']:<15} {r['batch']:>5} {r['tokens_per_s'] or 0:>12,.0f} {1e3 * r['step_time_median_s']:>9.2f} "
        f"{1e3 * r['step_time_p95_s']:>8.2f} {mem} {mfu} {theo} {r['speedup_vs_baseline']:>8.3f} {r['vs_reference']:>7.3f}"
    )


HEADER = (
    f"{'name':<15} {'batch':>5} {'tokens/s':>12} {'med ms':>9} {'p95 ms':>8} {'peak MiB':>9} {'MFU':>6} "
    f"{'theo':>7} {'vs base':>8} {'vs ref':>7}"
)


def run(args: argparse.Namespace) -> list[dict]:
    """Measure every batch size; print rows and rewrite the JSON as results come in."""
    done: list[dict] = []
    for batch in args.batch:
        fresh_compile_caches(args.compile)
        arms = build_arms(args, batch, args.arms)
        skipped = {a.name: SkippedWork(a) for a in arms if a.frozen_bytes}
        order = [*arms, *skipped.values()]
        # Whole cycles of the balanced order unless --rounds says otherwise.
        rounds = args.rounds or (3 if args.quick else 1) * len(balanced_orders(len(order)))
        print(f"\n# batch {batch} x seq {args.seq}: warm-up {args.warmup} step(s) per arm", flush=True)
        for a in order:  # warm-up: compile, allocator, lazy optimizer state, kernel choice
            a.timed(args.warmup, record=False)
        sync(args.device == "cuda")
        start, rounds_done = time.perf_counter(), 0
        for rounds_done in interleaved_rounds(order, rounds, args.steps, args.device == "cuda"):
            line = "  ".join(f"{a.name} {1e3 * statistics.median(a.times):.1f}ms" for a in order)
            print(f"round {rounds_done}/{rounds}: {line}", flush=True)
            write_rows(args.json, done + rows_of(arms, args, batch, rounds_done, complete=False, skipped=skipped))
            over = args.time_budget and time.perf_counter() - start > args.time_budget
            if over and 2 <= rounds_done < rounds:  # at least 2 rounds, for a paired ratio
                print(f"# time budget {args.time_budget:.0f}s spent: stopping after {rounds_done} rounds", flush=True)
                break
        for a in arms:
            a.measure_memory()
        rows = rows_of(arms, args, batch, rounds_done, complete=True, skipped=skipped)
        print(HEADER, flush=True)
        for row in rows:
            print(_fmt(row), flush=True)
        done += rows
        write_rows(args.json, done)
        del arms, skipped, order
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return done


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="few rounds; on CPU also a smaller shape")
    p.add_argument("--compile", action="store_true", help="torch.compile every arm (the reference too)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. reduce-overhead (CUDA graphs)")
    p.add_argument("--batch", type=int, nargs="+", help="batch sizes (default 8 32 on CUDA, 4 on CPU)")
    p.add_argument("--seq", type=int, help="sequence length (default 512; 128 for CPU --quick)")
    p.add_argument("--preset", default="gpt-medium-512")
    p.add_argument("--vocab", type=int, help="vocabulary (default 50257; 8192 for CPU --quick)")
    p.add_argument(
        "--rounds",
        type=int,
        help="interleaved rounds (default one cycle of the balanced order, 18 "
        "with every arm; --quick three cycles, 54, within the time budget)",
    )
    p.add_argument("--steps", type=int, help="steps per arm per round (default 10 on CUDA, 3 on CPU)")
    p.add_argument("--warmup", type=int, help="untimed steps per arm (default 5 on CUDA, 1 on CPU; +compile)")
    p.add_argument(
        "--arms",
        nargs="+",
        default=list(ARMS),
        choices=list(ARMS),
        metavar="ARM",
        help=f"the arms to time, reference and baseline among them (default every one: {', '.join(ARMS)})",
    )
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument(
        "--time-budget",
        type=float,
        help="stop timing rounds after this many seconds per batch "
        "size (at least 2 rounds; default 150 with --quick, else none)",
    )
    p.add_argument("--peak-flops", type=float, help="peak FLOP/s for MFU (needed on CPU)")
    p.add_argument("--json", type=Path, help="write the rows here (rewritten after every round)")
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="repeat the whole measurement in this many fresh "
        "processes, one after another (timings vary more between processes than within one); "
        "the JSON gets every process's rows, tagged, and the printout the spread across them",
    )
    p.add_argument(
        "--count-ops",
        action="store_true",
        help="count aten ops and Python calls per training step "
        "instead of timing (deterministic; defaults: batch 1, seq 32, vocab 1024)",
    )
    p.add_argument(
        "--profile-ops",
        action="store_true",
        help="instead of timing, profile every arm with "
        "torch.profiler in balanced rounds (--rounds, default one cycle; --steps) and print the ops whose "
        "self time per step differs most from the baseline's (where a saving or a cost comes from)",
    )
    p.add_argument("--top", type=int, default=12, help="ops printed per arm with --profile-ops (default 12)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA device is visible; use --device cpu")
    if args.count_ops and args.compile:
        p.error("--count-ops counts eager dispatches; drop --compile")
    if args.count_ops and args.profile_ops:
        p.error("--count-ops and --profile-ops are two different runs; give one")
    if args.processes < 1 or (args.processes > 1 and (args.count_ops or args.profile_ops)):
        p.error("--processes must be >= 1, and 1 with --count-ops or --profile-ops")
    if args.top < 1:
        p.error("--top must be >= 1")
    if not {"reference", "baseline"} <= set(args.arms):
        p.error("--arms must include reference and baseline (the ratios are taken against them)")
    args.arms = tuple(dict.fromkeys(args.arms))
    return _defaults(args)


def _defaults(args: argparse.Namespace) -> argparse.Namespace:
    from oelm.models.gpt import PRESETS

    cuda = args.device == "cuda"
    cfg = PRESETS[args.preset]
    shape = {
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "d_model": cfg.d_model,
        "d_ff": cfg.d_ff,
        "vocab_size": 50257,
    }
    small = args.quick and not cuda
    if small:
        shape.update(CPU_QUICK)
    args.n_layer, args.n_head, args.d_model, args.d_ff = (shape[k] for k in ("n_layer", "n_head", "d_model", "d_ff"))
    counting = args.count_ops  # counts do not depend on batch, sequence or vocabulary
    args.vocab = args.vocab or (1024 if counting else shape["vocab_size"])
    args.seq = args.seq or (32 if counting else 128 if small else 512)
    args.batch = args.batch or ([1] if counting else [8, 32] if cuda else [4])
    # Rounds (unless given): whole cycles of the balanced order, counted in run() where the arms
    # are known; one, or three with --quick (54 rounds, about 125 s of timing at the CPU quick
    # shape, cut by the time budget on a slower machine), since the interval over rounds is what
    # says whether a 3% saving is resolved.
    args.steps = args.steps or (10 if cuda else 3)
    args.time_budget = args.time_budget or (150.0 if args.quick else None)
    args.warmup = args.warmup or ((3 if cuda else 1) + (2 if args.compile else 0))
    args.shape_note = (
        f"{'CPU quick shape (smaller than ' + args.preset + ')' if small else args.preset}: "
        f"{args.n_layer} layers, d={args.d_model}, heads={args.n_head}, d_ff={args.d_ff}, vocab={args.vocab}"
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device_name = device_name(args.device)
    return args


SPREAD = ("speedup_vs_baseline", "saving_realized", "skipped_time_saved", "vs_reference")


def repeat(args: argparse.Namespace, argv: list[str]) -> list[dict]:
    """Run the measurement in args.processes fresh processes; tag, pool and write their rows."""
    import subprocess
    import tempfile

    child_argv = list(argv)
    for flag in ("--processes", "--json"):  # the children write their own files; the parent pools them
        while flag in child_argv:
            i = child_argv.index(flag)
            del child_argv[i : i + 2]
    done: list[dict] = []
    # The children import this package from the repository root, wherever the parent was started.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            print(f"\n## process {i + 1} of {args.processes}", flush=True)
            out = Path(tmp) / f"rows-{i}.json"
            # Given last, these win over any `--flag=value` spelling left in child_argv.
            cmd = [sys.executable, "-m", MODULE, *child_argv, "--processes", "1", "--json", str(out)]
            subprocess.run(cmd, check=True, env=env)
            done += [{**r, "process": i} for r in json.loads(out.read_text())]
            write_rows(args.json, done)
    print(f"\n## across {args.processes} processes (each a median over its rounds): min / median / max", flush=True)
    for batch, name in dict.fromkeys((r["batch"], r["name"]) for r in done):
        rows = [r for r in done if r["batch"] == batch and r["name"] == name]
        parts = []
        for key in SPREAD:
            vals = sorted(r[key] for r in rows if r.get(key) is not None)
            if (
                vals
                and not (key == "speedup_vs_baseline" and name == "baseline")
                and not (key == "vs_reference" and name == "reference")
            ):
                parts.append(f"{key} {vals[0]:.3f} / {statistics.median(vals):.3f} / {vals[-1]:.3f}")
        if parts:
            print(f"batch {batch} {name}: " + "; ".join(parts), flush=True)
    return done


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--table"]:  # summarize stored files: no arms, no device
        if len(argv) < 2:
            raise SystemExit("--table needs one or more JSON files written by a timed run")
        print("\n".join(table([Path(a) for a in argv[1:]])))
        return 0
    args = parse(argv)
    if args.processes > 1:
        repeat(args, argv)
        return 0
    if args.count_ops:
        print(
            f"# aten ops and Python calls per training step; {args.shape_note}; seq {args.seq}; "
            f"device {args.device_name}; torch {torch.__version__}",
            flush=True,
        )
        count(args)
        return 0
    mode = f"compiled ({args.compile_mode or 'default'})" if args.compile else "eager"
    if args.profile_ops:
        print(
            f"# per-op profile; {args.shape_note}; {mode}; device {args.device_name}; torch {torch.__version__}",
            flush=True,
        )
        profile_ops(args)
        return 0
    print(f"# {args.shape_note}; {mode}; device {args.device_name}; torch {torch.__version__}", flush=True)
    rounds = f"{args.rounds} rounds" if args.rounds else f"{'three cycles' if args.quick else 'one cycle'} of rounds"
    print(
        f"# {rounds} x {args.steps} steps per arm, in a carryover-balanced order; MFU peak: {_peak_flops(args)[1]}",
        flush=True,
    )
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1):
        print(
            f"# warning: load average {load:.1f} on {os.cpu_count()} cores; other processes are competing", flush=True
        )
    rows = run(args)
    base = {(r["batch"], r["name"]): r for r in rows if r["name"] in ("baseline", NOBIAS, LOGITS)}
    for r in rows:
        if r["name"] in ("oelm-freeze", "oelm-qk-ffn"):
            aa = next((x for x in rows if x["name"] == "baseline-AA" and x["batch"] == r["batch"]), None)
            aa_note = (
                "no A/A arm"
                if aa is None
                else f"A/A {aa['speedup_vs_baseline']:.3f}x {fmt_ci(aa['speedup_vs_baseline_ci'])}"
            )
            print(
                f"batch {r['batch']} {r['name']}: speed-up {r['speedup_vs_baseline']:.3f}x {fmt_ci(r['speedup_vs_baseline_ci'])} "
                f"vs theoretical {r['theoretical_speedup']:.3f}x (realized {fmt_pct(r['saving_realized'])} "
                f"{fmt_ci(r['saving_realized_ci'], 100, '%')} of the FLOP saving; {aa_note}); memory -{r['memory_saving_vs_baseline_bytes'] / 2**20:.1f} MiB "
                f"(frozen grads + AdamW state {r['frozen_grad_and_optimizer_bytes'] / 2**20:.1f} MiB, the moments alone "
                f"{r['frozen_optimizer_state_bytes'] / 2**20:.1f} MiB)"
                + (f"; the step's peak is in {r['peak_phase']}, at {r['peak_op']}" if r["peak_op"] else ""),
                flush=True,
            )
            if r["skipped_work_s"]:
                print(
                    f"batch {r['batch']} {r['name']}: the skipped work alone takes {1e3 * r['skipped_work_s']:.2f} ms "
                    f"= {fmt_pct(r['skipped_work_share_of_baseline'], 2)} of the baseline step (ceiling "
                    f"{r['skipped_work_speedup_ceiling']:.3f}x); the step saved {fmt_pct(r['skipped_time_saved'])} "
                    f"{fmt_ci(r['skipped_time_saved_ci'], 100, '%')} of that time",
                    flush=True,
                )
    for (b, name), r in base.items():
        print(
            f"batch {b} oelm {name} vs reference: {r['vs_reference']:.3f}x {fmt_ci(r['vs_reference_ci'])}", flush=True
        )
        if name == LOGITS:
            speed, ci = without_logits(r)
            peaks = (r["peak_memory_bytes"], base[(b, "baseline")]["peak_memory_bytes"])
            print(
                f"batch {b} oelm baseline, loss without logits vs through logits: {speed:.3f}x "
                f"{fmt_ci(ci)} the speed"
                + (f", peak memory -{(peaks[0] - peaks[1]) / 2**20:.1f} MiB" if None not in peaks else ""),
                flush=True,
            )
    if args.device == "cpu":  # wall time on a shared machine is noisy; CPU seconds less so
        for r in rows:
            print(
                f"batch {r['batch']} {r['name']}: CPU time per step {r['cpu_seconds_median']:.3f}s, "
                f"vs baseline {r['speedup_vs_baseline_cpu_time']:.3f}x, vs reference {r['vs_reference_cpu_time']:.3f}x",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
