"""The fused Q/K/V projection alone: what freezing Q/K saves in it, against what it could save.

vs_reference measures freezing on the whole training step, where a saving of ~3% sits in the
noise of everything else. This isolates the one place the saving comes from: the fused QKV
projection's forward + backward (`oelm.models.fused.fused_qkv`, x [tokens, d] -> [tokens, 3d]), timed
side by side in interleaved rounds (carryover-balanced order), with

  trainable      every block trains: autograd's own linear over the concatenated weight
  frozen         Q and K frozen: the custom Function, weight gradient for the V rows only
  skipped        the two [d, tokens] @ [tokens, d] weight-gradient GEMMs freezing removes, run
                 alone (what vs_reference's "skipped work" times; exactly the FLOPs saved)
  full wgrad     the trainable arm's weight-gradient GEMM, [3d, tokens] @ [tokens, d]
  V-rows wgrad   the frozen arm's, over the V columns of the same [tokens, 3d] gradient

Read: `saved` = trainable - frozen. Against `skipped` it is the share of the FLOPs' stand-alone
time the layer realizes; against the Q/K rows' marginal cost inside the fused GEMM (full wgrad -
V-rows wgrad: one large GEMM is more efficient than its parts, so removing two thirds of it saves
less than two separate GEMMs take) it is how much of the achievable saving the implementation
keeps. The rest is the Function's fixed Python cost, which a tiny shape shows on its own (there
`saved` goes negative). Each figure: median over rounds with a distribution-free 95% interval.

    python -m benchmarks.fused_qkv --device cpu                       # quick shape + a tiny one
    python -m benchmarks.fused_qkv --device cuda --shapes 4096x512 16384x512 --json out.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from oelm.models.fused import fused_qkv

from .harness import Timed, device_name, interleaved_rounds, median_ci, write_rows


class Call(Timed):
    """A named callable timed like a training step (CUDA events, or wall and CPU time)."""

    def __init__(self, name: str, fn: Any, cuda: bool, weights: list[torch.Tensor] | None = None) -> None:
        super().__init__()
        self.name, self.fn, self.cuda, self.weights = name, fn, cuda, weights or []

    def step(self) -> None:
        self.fn()


def arms(tokens: int, d: int, device: torch.device, amp: bool) -> list[Call]:
    """The five timed calls at one shape, from fixed random inputs."""
    g = torch.Generator(device=device).manual_seed(0)
    dt = torch.bfloat16 if amp else torch.float32

    def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=dtype)

    x = rand(tokens, d).requires_grad_()
    grad_y = rand(tokens, 3 * d, dtype=dt)  # the projection's output dtype (bf16 under autocast)
    trainable = [rand(d, d).mul_(d**-0.5).requires_grad_() for _ in range(3)]
    frozen = [rand(d, d).mul_(d**-0.5).requires_grad_(i == 2) for i in range(3)]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)

    def fwd_bwd(ws: list[torch.Tensor]) -> Any:
        def call() -> None:
            x.grad = None
            for w in ws:
                w.grad = None
            with autocast:
                y = fused_qkv(x, *ws)
            y.backward(grad_y)

        return call

    go, xs, g3 = rand(tokens, d, dtype=dt), rand(tokens, d, dtype=dt), rand(tokens, 3 * d, dtype=dt)
    cuda = device.type == "cuda"
    return [
        Call("trainable", fwd_bwd(trainable), cuda, trainable),
        Call("frozen", fwd_bwd(frozen), cuda, frozen),
        # Weight gradients land in the float32 weights' dtype (a cast after a bf16 GEMM; none on CPU).
        Call("skipped", lambda: ((go.t() @ xs).float(), (go.t() @ xs).float()), cuda),
        Call("full wgrad", lambda: (g3.t() @ xs).float(), cuda),
        Call("V-rows wgrad", lambda: (g3[:, 2 * d :].t() @ xs).float(), cuda),
    ]


def measure(tokens: int, d: int, args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    calls = arms(tokens, d, device, amp=args.device == "cuda")
    for c in calls:
        c.timed(args.warmup, record=False)
    for _ in interleaved_rounds(calls, args.rounds, args.steps, device.type == "cuda"):
        pass
    t = {c.name: c.round_medians for c in calls}

    def us(name: str) -> float:
        return 1e6 * statistics.median(t[name])

    def ci(values: list[float]) -> dict[str, Any]:
        med, lo, hi = median_ci(values)
        return {"median": med, "ci": [lo, hi]}

    saved = [a - b for a, b in zip(t["trainable"], t["frozen"])]
    marginal = [a - b for a, b in zip(t["full wgrad"], t["V-rows wgrad"])]
    marginal_ci = ci([1e6 * m for m in marginal])
    resolved = marginal_ci["ci"][0] is not None and marginal_ci["ci"][0] > 0
    return {
        "tokens": tokens,
        "d": d,
        "device": args.device_name,
        "dtype": "bfloat16 autocast" if device.type == "cuda" else "float32",
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "median_us": {c.name: us(c.name) for c in calls},
        "saved_us": ci([1e6 * s for s in saved]),
        "saved_of_skipped": ci([s / k for s, k in zip(saved, t["skipped"])]),
        # Where the rows cost nothing measurable (a tiny shape) there is no share to give.
        "saved_of_marginal": ci([s / m for s, m in zip(saved, marginal)])
        if resolved
        else {"median": None, "ci": [None, None]},
        "marginal_us": marginal_ci,
    }


def _fmt_ci(x: dict[str, Any], scale: float = 100.0, unit: str = "%") -> str:
    if x["median"] is None:
        return "n/a"
    lo, hi = x["ci"]
    inner = f" [{scale * lo:.0f}, {scale * hi:.0f}]" if lo is not None else ""
    return f"{scale * x['median']:.0f}{unit}{inner}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--shapes",
        nargs="+",
        help="TOKENSxD, e.g. 512x256 (default: 512x256 and 8x32 on CPU, "
        "4096x512 16384x512 and 8x32 on CUDA; the tiny one shows the fixed per-call cost)",
    )
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--steps", type=int, default=5, help="calls per arm per round (the round keeps their median)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA device is visible; use --device cpu")
    shapes = args.shapes or (["4096x512", "16384x512", "8x32"] if args.device == "cuda" else ["512x256", "8x32"])
    try:
        parsed = [tuple(int(v) for v in s.lower().split("x")) for s in shapes]
        assert all(len(s) == 2 and min(s) > 0 for s in parsed)
    except (ValueError, AssertionError):
        p.error(f"--shapes takes TOKENSxD with positive integers, e.g. 512x256; got {shapes}")
    if args.rounds < 6:
        p.error("--rounds must be at least 6 (fewer give no 95% interval for a median)")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device_name = device_name(args.device)
    print(
        f"# fused QKV projection, forward + backward; device {args.device_name}; torch {torch.__version__}; "
        f"{args.rounds} rounds x {args.steps} calls per arm, carryover-balanced order",
        flush=True,
    )
    rows = []
    for tokens, d in parsed:
        row = measure(tokens, d, args)
        rows.append(row)
        m = row["median_us"]
        print(f"tokens {tokens} d {d}: " + "  ".join(f"{k} {v:.1f}us" for k, v in m.items()), flush=True)
        print(
            f"  freezing Q/K saves {_fmt_ci(row['saved_us'], 1.0, 'us')}: {_fmt_ci(row['saved_of_skipped'])} of the "
            f"skipped GEMMs' stand-alone time, {_fmt_ci(row['saved_of_marginal'])} of the Q/K rows' marginal cost "
            f"in the fused GEMM ({_fmt_ci(row['marginal_us'], 1.0, 'us')})",
            flush=True,
        )
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
