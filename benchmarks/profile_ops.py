"""`vs_reference --profile-ops`: where a difference between arms comes from, op by op.

It profiles every arm with torch.profiler in the same balanced rounds the timed run uses and
prints, per arm, the ops whose self time per step differs most from the baseline's (self CPU time
on CPU; on CUDA, each kernel's device time), with calls per step. The profiler adds a cost to
every op it records and charges it to the enclosing range, so Python-heavy ranges (a custom
autograd Function's forward and backward) look dearer than they run: read it for attribution,
and the timed rows for the size of a difference. Compiled graphs are named by their place in the
step (`graph_names`), so one arm's graph lines up with the baseline's.
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

from .arms import build_arms
from .harness import balanced_orders, fresh_compile_caches, sync, write_rows


def profile_ops(args: argparse.Namespace) -> list[dict]:
    """Self time and calls per op per step of every arm (batch args.batch[0]), from torch.profiler in
    balanced rounds of args.steps steps; print each arm's largest differences from the baseline."""
    from torch.profiler import ProfilerActivity, profile

    batch, cuda = args.batch[0], args.device == "cuda"
    fresh_compile_caches(args.compile)
    arms = build_arms(args, batch)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    for a in arms:  # warm-up: compile, allocator, lazy optimizer state, kernel choice
        a.timed(args.warmup, record=False)
    sync(cuda)
    orders = balanced_orders(len(arms))
    rounds = args.rounds or len(orders)
    per_step = 1.0 / (rounds * args.steps)
    ms = {a.name: collections.Counter() for a in arms}
    calls = {a.name: collections.Counter() for a in arms}
    for r in range(rounds):
        for i in orders[r % len(orders)]:
            a = arms[i]
            with profile(activities=activities) as prof:
                a.timed(args.steps, record=False)
                sync(cuda)
            names = graph_names(prof)
            for e in prof.key_averages():
                us = kernel_us(e) if cuda else e.self_cpu_time_total
                key = names.get(e.key, e.key.split(":")[0] if e.key.startswith("Torch-Compiled Region") else e.key)
                ms[a.name][key] += us / 1000 * per_step
                calls[a.name][key] += e.count * per_step
        print(f"profiled round {r + 1}/{rounds}", flush=True)
    kind = "self CUDA time (kernels)" if cuda else "self CPU time"
    rows = []
    for a in arms:
        ops = {
            k: {"ms_per_step": ms[a.name][k], "calls_per_step": calls[a.name][k]}
            for k in sorted(ms[a.name], key=lambda k: -ms[a.name][k])
            if ms[a.name][k] > 0 or calls[a.name][k] > 0
        }
        rows.append(
            {
                "name": a.name,
                "batch": batch,
                "seq": args.seq,
                "shape": args.shape_note,
                "device": args.device_name,
                "compiled": args.compile,
                "rounds": rounds,
                "steps_per_round": args.steps,
                "time_kind": kind,
                "total_ms_per_step": sum(ms[a.name].values()),
                "ops": ops,
            }
        )
    base = next(r for r in rows if r["name"] == "baseline")
    for row in rows:
        row["total_vs_baseline_ms"] = row["total_ms_per_step"] - base["total_ms_per_step"]
    write_rows(args.json, rows)
    print(
        f"\n# {kind} per step, each arm against the baseline (batch {batch} x seq {args.seq}; {rounds} rounds "
        f"x {args.steps} steps); the profiler's own cost per recorded op inflates Python-heavy ranges",
        flush=True,
    )
    for row in rows:
        if row is base:
            continue
        print(
            f"\n## {row['name']}: {row['total_ms_per_step']:.2f} ms per step, baseline "
            f"{base['total_ms_per_step']:.2f} ms ({row['total_vs_baseline_ms']:+.2f} ms)",
            flush=True,
        )
        keys = set(row["ops"]) | set(base["ops"])
        get = lambda r, k, f: r["ops"].get(k, {}).get(f, 0.0)  # noqa: E731
        diff = lambda k: get(row, k, "ms_per_step") - get(base, k, "ms_per_step")  # noqa: E731
        for k in sorted(keys, key=lambda k: -abs(diff(k)))[: args.top]:
            print(
                f"  {diff(k):+9.3f} ms  {get(base, k, 'ms_per_step'):9.3f} -> {get(row, k, 'ms_per_step'):9.3f}  "
                f"calls {get(base, k, 'calls_per_step'):g} -> {get(row, k, 'calls_per_step'):g}  {k[:90]}",
                flush=True,
            )
    return rows


def graph_names(prof: Any) -> dict[str, str]:
    """Compiled graphs by their place in the step ("compiled graph 1" runs first: the forward), not by
    their hash, which differs between arms, so one arm's graph lines up with the baseline's (the
    caller likewise drops the compile ids from "Torch-Compiled Region: 1/0")."""
    tag = "## Call CompiledFxGraph"
    keys = [e.key for e in sorted(prof.events(), key=lambda e: e.time_range.start) if e.key.startswith(tag)]
    return {k: f"## compiled graph {i + 1} ##" for i, k in enumerate(dict.fromkeys(keys))}


def kernel_us(event: Any) -> float:
    """Device time (us) of a profiler average, counted as torch's own table totals it: only device
    events (the kernels, under their own names), since a CPU op's device time is its kernels' time
    again and a user annotation's spans the kernels inside it."""
    from torch.autograd import DeviceType

    if event.device_type == DeviceType.CPU or getattr(event, "is_user_annotation", False):
        return 0.0
    us = getattr(event, "self_device_time_total", None)  # torch < 2.4 named it self_cuda_time_total
    return float(us if us is not None else getattr(event, "self_cuda_time_total", 0.0))
