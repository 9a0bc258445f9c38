"""`vs_reference --count-ops`: aten ops and Python calls per training step of every arm, timing nothing.

After one warm-up step it counts, per arm, the aten ops one training step dispatches (forward,
backward, optimizer step + zero_grad; what autograd and autocast leave, each op one dispatch and,
unless a view, usually one kernel launch) and the Python function calls it makes. Both are
deterministic, so they compare launch-bound (small-batch eager) overhead on a machine where
timings are noise. Every device counts the CUDA step: bf16 autocast and fused AdamW.
"""

from __future__ import annotations

import argparse
import collections
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC2701  (torch has no public op-counting mode)

from .arms import COUNT_ARMS, Arm, build_arms
from .harness import write_rows


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while active, by name: what is left below autograd and autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.views = 0  # ops that only make a view of an input: no kernel

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "aten":
            self.ops[func.overloadpacket.__name__] += 1
            # _unsafe_view (matmul's reshape of its result) is a view its schema does not declare.
            self.views += func.is_view or func.overloadpacket is torch.ops.aten._unsafe_view
        return func(*args, **(kwargs or {}))


def python_calls(fn: Any) -> int:
    """Python function calls (Python and builtin) made while running fn() on this thread.

    On CPU the backward runs on this thread too; on CUDA autograd runs it on a device thread, so
    the Python of custom autograd Functions' backward is not counted there.
    """
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def count_step(arm: Arm) -> dict[str, Any]:
    """aten ops per phase of one step and Python calls per step, after a warm-up step."""
    arm.step()  # lazy optimizer state, first-call caches
    fwd, bwd, opt = OpCounter(), OpCounter(), OpCounter()
    with fwd:
        loss = arm.forward()
    with bwd:
        loss.backward()
    with opt:
        arm.update()
    ops = fwd.ops + bwd.ops + opt.ops
    return {
        "aten_ops_per_step": ops.total(),
        "aten_ops_forward": fwd.ops.total(),
        "aten_ops_backward": bwd.ops.total(),
        "aten_ops_optimizer": opt.ops.total(),
        "aten_view_ops_per_step": fwd.views + bwd.views + opt.views,
        "python_calls_per_step": python_calls(arm.step),
        "aten_ops_by_name": dict(sorted(ops.items())),
    }


COUNT_HEADER = (
    f"{'name':<16} {'forward':>8} {'backward':>9} {'optimizer':>10} {'ops/step':>9} {'views':>6} "
    f"{'vs ref':>7} {'py calls':>9}"
)


def count(args: argparse.Namespace) -> list[dict]:
    """aten ops and Python calls per training step of every arm (batch args.batch[0]); print and write rows."""
    batch = args.batch[0]
    arms = build_arms(args, batch, COUNT_ARMS)
    rows = [
        {
            "name": a.name,
            "batch": batch,
            "seq": args.seq,
            "shape": args.shape_note,
            "device": args.device_name,
            "dtype": "bfloat16 autocast",
            "optimizer": "AdamW, fused",
            **count_step(a),
        }
        for a in arms
    ]
    ref = rows[0]["aten_ops_per_step"]
    print(COUNT_HEADER, flush=True)
    for r in rows:
        r["aten_ops_vs_reference"] = r["aten_ops_per_step"] / ref
        print(
            f"{r['name']:<16} {r['aten_ops_forward']:>8} {r['aten_ops_backward']:>9} {r['aten_ops_optimizer']:>10} "
            f"{r['aten_ops_per_step']:>9} {r['aten_view_ops_per_step']:>6} {r['aten_ops_vs_reference']:>7.3f} "
            f"{r['python_calls_per_step']:>9}",
            flush=True,
        )
    write_rows(args.json, rows)
    return rows
