"""Tokens/s and peak memory of each of our presets (gpt-*, llama-*) on the GPU at hand.

Every preset is timed the way a GPU run trains it: bf16 autocast, torch.compile, the fused QKV
path, fused AdamW, the logits-free loss. Per preset, its methods (default: baseline and
oelm-freeze) run side by side in balanced rounds (benchmarks.harness), so each method's
speed-up over the baseline comes with a 95% interval; then one step per method measures the
peak memory (parameters, gradients, AdamW state and the step's activations). Presets run one
after another, each freed before the next; a preset that does not fit gets an out-of-memory row
and the next one runs. The JSON is rewritten after every preset, so a run stopped early keeps
what it measured.

    python -m benchmarks.presets_gpu --json gpu.json                  # every preset, on the CUDA GPU
    python -m benchmarks.presets_gpu --presets llama-gpt2s llama-350m --methods baseline identity-q --batch 16
    python -m benchmarks.presets_gpu --cpu --presets gpt-tiny llama-tiny   # the tiny ones on CPU (float32, eager)
    python -m benchmarks.presets_gpu --presets gpt-gpt2s llama-gpt2s --methods baseline --vocab-multiple 1 64

`--vocab-multiple 1 64` times every method unpadded and with its vocabulary padded to a multiple
of 64 (`vocab_multiple`: 50,257 -> 50,304 rows, aligned LM-head GEMMs) as arms of the same
rounds, so the padding's speed-up comes with its interval; rows carry `vocab_multiple`, and
their `params` / `trainable` count the real rows (the padding is not a parameter of the model).

On a machine without CUDA it refuses unless --cpu is given (CPU figures are not GPU figures).
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch

from .arms import Arm
from .harness import (
    device_name,
    fmt_ci,
    fresh_compile_caches,
    interleaved_rounds,
    machine,
    median_ci,
    paired_ratio,
    sync,
    write_rows,
)

DEFAULT_METHODS = ("baseline", "oelm-freeze")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from oelm.models.catalog import PRESETS

    p = argparse.ArgumentParser(prog="python -m benchmarks.presets_gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS), metavar="PRESET")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), help="first one is the reference arm")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: min(block size, 1024))")
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary (GPT-2's by default)")
    p.add_argument(
        "--vocab-multiple",
        type=int,
        nargs="+",
        default=[1],
        metavar="N",
        help="pad the vocabulary to a multiple of N (1 = unpadded); several: each method at each, side by side",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per arm first (compilation happens here)")
    p.add_argument("--rounds", type=int, default=6, help="balanced rounds (6 or more give a 95%% interval)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per arm per round")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="eager mode (default on CUDA: compile)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    p.add_argument(
        "--cpu", action="store_true", help="run on CPU (float32, eager): to try the script, not to time GPUs"
    )
    p.add_argument(
        "--grad-checkpoint", action="store_true", help="activation checkpointing (less memory, more compute)"
    )
    p.add_argument("--json", type=Path, default=None, help="write the rows here (rewritten after every preset)")
    args = p.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        p.exit(
            2,
            "presets_gpu: no CUDA GPU here, and CPU figures are not GPU figures; run it on a GPU machine, "
            "or pass --cpu (with small presets, e.g. --presets gpt-tiny llama-tiny) to try it on CPU\n",
        )
    for name in ("batch", "rounds", "steps", "vocab"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if min(args.vocab_multiple) < 1 or len(set(args.vocab_multiple)) < len(args.vocab_multiple):
        p.error("--vocab-multiple takes distinct integers of at least 1 (1 = unpadded)")
    args.device = "cpu" if args.cpu else "cuda"
    args.compile = args.compile and not args.cpu
    args.count_ops = False  # Arm reads it: bf16 autocast follows the device
    return args


def build_preset(args: argparse.Namespace, preset: str) -> tuple[list[Arm], int]:
    """One Arm per method and vocab multiple of `preset` (same seed: the same init but what the method
    changes; a padded vocabulary holds the same real rows), and the sequence length."""
    from oelm import apply_method
    from oelm.core.flops import theoretical_saving, training_flops_per_token
    from oelm.models.catalog import PRESETS, build_lm, preset_config

    seq = args.seq or min(PRESETS[preset].block_size, 1024)
    arm_args = copy.copy(args)
    arm_args.seq = seq
    arms = []
    for method in args.methods:
        for multiple in args.vocab_multiple:
            torch.manual_seed(0)
            block = max(seq, PRESETS[preset].block_size)
            cfg = preset_config(
                preset,
                vocab_size=args.vocab,
                block_size=block,
                grad_checkpoint=args.grad_checkpoint,
                vocab_multiple=multiple,
            )
            model = build_lm(cfg)
            apply_method(model, method, seed=0)
            flops = training_flops_per_token(model, seq) * args.batch * seq  # the padded head's GEMMs included
            name = method if multiple == 1 else f"{method}+vocab{multiple}"
            arm = Arm(name, model, arm_args, args.batch, flops, theoretical_saving(model, seq))
            arm.method, arm.vocab_multiple = method, multiple
            arms.append(arm)
    return arms, seq


def real_params(model: torch.nn.Module, trainable: bool = False) -> int:
    """Parameters of the model (those that train, with trainable=True), a padded vocabulary's padding rows left out."""
    padding = model.vocab_padding()
    return sum(p.numel() - padding.get(id(p), 0) for p in model.parameters() if p.requires_grad or not trainable)


def measure_preset(args: argparse.Namespace, preset: str) -> list[dict[str, Any]]:
    """Rows of one preset: per method tokens/s, step time, speed-up over the first method, peak memory."""
    from oelm.core.flops import device_peak_flops

    cuda = args.device == "cuda"
    fresh_compile_caches(args.compile)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    arms, seq = build_preset(args, preset)
    warm_s = {}
    for arm in arms:
        t0 = time.perf_counter()
        arm.timed(args.warmup, record=False)
        sync(cuda)
        warm_s[arm.name] = time.perf_counter() - t0
    for _ in interleaved_rounds(arms, args.rounds, args.steps, cuda):
        pass
    for arm in arms:
        arm.measure_memory()
    peak = device_peak_flops(args.device, torch.bfloat16 if cuda else torch.float32)
    ref = arms[0]
    tokens = args.batch * seq
    rows = []
    for arm in arms:
        tok_s = median_ci([tokens / t for t in arm.round_medians])
        step = median_ci(arm.round_medians)
        ratio = paired_ratio(ref.round_medians, arm.round_medians)  # > 1: faster than the reference arm
        rows.append(
            {
                "preset": preset,
                "method": arm.method,
                "vocab_multiple": arm.vocab_multiple,
                "device": device_name(args.device),
                "dtype": "bfloat16" if cuda else "float32",
                "compile": bool(args.compile),
                "grad_checkpoint": args.grad_checkpoint,
                "batch": args.batch,
                "seq": seq,
                "params": real_params(arm.model),
                "trainable": real_params(arm.model, trainable=True),
                "tokens_per_s": tok_s[0],
                "tokens_per_s_ci": list(tok_s[1:]),
                "step_ms": 1e3 * step[0],
                "speedup_vs": ref.name,
                "speedup": ratio[0],
                "speedup_ci": list(ratio[1:]),
                "theoretical_saving": arm.saving,
                "mfu": arm.flops / step[0] / peak if peak else None,
                "peak_memory_bytes": arm.peak,
                "warmup_s": warm_s[arm.name],
                "rounds": len(arm.round_medians),
            }
        )
    return rows


def out_of_memory_row(args: argparse.Namespace, preset: str, err: BaseException) -> dict[str, Any]:
    return {
        "preset": preset,
        "device": device_name(args.device),
        "batch": args.batch,
        "error": f"out of memory: {err}"[:300],
    }


def print_rows(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if "error" in r:
            print(f"{r['preset']:<14} {r['error'][:80]}")
            continue
        mem = f"{r['peak_memory_bytes'] / 2**30:.2f} GiB" if r["peak_memory_bytes"] is not None else "n/a"
        mfu = f"MFU {100 * r['mfu']:.0f}%" if r["mfu"] is not None else ""
        arm = r["method"] if r.get("vocab_multiple", 1) == 1 else f"{r['method']}+vocab{r['vocab_multiple']}"
        ratio = "" if arm == r["speedup_vs"] else f"x{r['speedup']:.3f} {fmt_ci(r['speedup_ci'])}"
        print(
            f"{r['preset']:<14} {arm:<14} {r['tokens_per_s']:>12,.0f} tok/s {r['step_ms']:>9.1f} ms  "
            f"{mem:>10}  {ratio} {mfu}".rstrip()
        )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    out: list[dict[str, Any]] = []
    header = {"machine": machine(), "device": device_name(args.device), "torch": torch.__version__}
    print(f"# {header['device']}, torch {header['torch']}, batch {args.batch}, methods {', '.join(args.methods)}")
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    for preset in args.presets:
        try:
            rows = measure_preset(args, preset)
        except oom as err:
            rows = [out_of_memory_row(args, preset, err)]
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        for r in rows:
            r.update(machine=header["machine"], torch=header["torch"])
        out.extend(rows)
        print_rows(rows)
        sys.stdout.flush()
        write_rows(args.json, out)
    return out


if __name__ == "__main__":
    main()
