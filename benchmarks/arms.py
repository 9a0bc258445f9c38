"""The arms of `vs_reference`: each one model + AdamW + a fixed batch, stepped in a tight loop.

`build_arms` makes them all from seed 0 at one shape: `reference` (benchmarks.reference_model),
oelm's `baseline`, `oelm-freeze`, `oelm-qk-ffn`, `baseline-AA` (a second baseline: the timing noise
floor), `baseline-nobias` (the reference's exact shape) and `baseline-logits` (the loss through
materialized logits, as the reference computes it). A frozen arm's `SkippedWork` is the GEMMs its
freezing removes, run alone; `Arm.measure_memory` (with `step_memory_profile` on CPU) gives an
arm's peak memory and where in the step it falls.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

from .harness import Timed
from .reference_model import RefGPT

METHODS = ("baseline", "oelm-freeze", "oelm-qk-ffn")
NOBIAS = "baseline-nobias"
LOGITS = "baseline-logits"  # the loss through materialized logits, as the reference computes it
ARMS = ("reference", *METHODS, "baseline-AA", NOBIAS, LOGITS)
COUNT_ARMS = ("reference", *METHODS, NOBIAS, LOGITS)  # the A/A arm measures timing noise: nothing to count


def state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, int]:
    """(parameter + optimizer-state bytes held between steps, gradient bytes made by a step)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    state = sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.ndim
    )
    return params + state, grads


class Arm(Timed):
    """One model + optimizer + fixed batch, stepped in a tight loop."""

    def __init__(
        self,
        name: str,
        model: nn.Module,
        args: argparse.Namespace,
        batch: int,
        flops: float | None,
        saving: float | None,
    ) -> None:
        super().__init__()
        dev = torch.device(args.device)
        self.name, self.batch, self.seq = name, batch, args.seq
        self.model = model.to(dev)
        params = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in params if p.ndim >= 2]
        rest = [p for p in params if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
        self.cuda = dev.type == "cuda"
        like_cuda = self.cuda or args.count_ops  # op counts are of the CUDA step on any device
        self.opt = torch.optim.AdamW(groups, lr=1e-4, fused=True)  # fused on CPU too (torch >= 2.4)
        self.fwd = torch.compile(self.model, mode=args.compile_mode) if args.compile else self.model
        vocab = args.vocab
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, vocab, (batch, args.seq), generator=g).to(dev)
        self.y = torch.randint(0, vocab, (batch, args.seq), generator=g).to(dev)
        self.amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=like_cuda)
        self.matmul_dtype = torch.bfloat16 if like_cuda else torch.float32
        self.flops, self.saving = flops, saving
        # The reference takes (x, y); our GPT is called as `oelm train` calls it, except the
        # baseline-logits arm, which keeps the plain loss for comparison.
        self.call_kw = {} if name in ("reference", LOGITS) else {"return_logits": False}
        self.peak_where: dict[str, Any] | None = None  # CPU: where in the step the peak falls
        self.grad_bytes: int | None = None
        self.peak: int | None = None
        # Bytes of the frozen tensors: freezing drops their gradient (1x) and AdamW moments (2x).
        self.frozen_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters() if not p.requires_grad)

    def forward(self) -> torch.Tensor:
        with self.amp:
            return self.fwd(self.x, self.y, **self.call_kw)[1]

    def update(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        """Forward + backward + optimizer step, nothing else."""
        self.forward().backward()
        self.update()

    def measure_memory(self) -> None:
        """Peak bytes of this arm: persistent state + one step's transient peak.

        CUDA: the allocator's peak. CPU: the peak of live tensor bytes from torch.profiler's memory
        events (op granularity: an allocation counts from its op's start, a free from its op's
        end, so a buffer an op allocates and frees inside itself is not seen), with where in the
        step the peak falls. On both, the gradients of this step are part of the transient peak
        only if they are alive at that moment.
        """
        held, self.grad_bytes = state_bytes(self.model, self.opt)
        if not self.cuda:
            prof = step_memory_profile(self.forward, self.update)
            self.peak = held + prof["peak_bytes"]
            self.peak_where = prof
            return
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        self.step()
        torch.cuda.synchronize()
        self.peak = held + torch.cuda.max_memory_allocated() - before


def step_memory_profile(forward: Any, update: Any) -> dict[str, Any]:
    """Peak live tensor bytes of one CPU step above its start, and the phase and op where it falls.

    From torch.profiler's per-op memory accounting (`profile_memory=True`): each op's own
    allocations minus frees, placed at its start when positive and at its end when negative.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    def mark(phase: str) -> None:  # an empty range: a timestamp, owning no allocation or free
        with record_function("phase: " + phase):
            pass

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        mark("forward")
        loss = forward()
        mark("backward")
        loss.backward()
        mark("optimizer")
        update()
        del loss
    events = list(prof.events())
    marks = sorted((e.time_range.start, e.name.split(": ", 1)[1]) for e in events if e.name.startswith("phase: "))
    points = []
    for e in events:
        m = e.self_cpu_memory_usage
        if m:
            points.append((e.time_range.start if m > 0 else e.time_range.end, m, e.name))
    points.sort(key=lambda t: (t[0], -t[1]))
    live = peak = 0
    at: tuple[float, str] | None = None
    for t, m, name in points:
        live += m
        if live > peak:
            peak, at = live, (t, name)
    phase = next((ph for t, ph in reversed(marks) if at and t <= at[0]), None)
    return {"peak_bytes": peak, "peak_phase": phase, "peak_op": at[1] if at else None}


class SkippedWork(Timed):
    """The GEMMs freezing removes from a step, run alone: the measured cost behind the FLOP saving.

    For each frozen weight [out, in] of `arm`: its weight-gradient GEMM (grad_out[N, out]^T @
    input[N, in], N = batch x seq tokens, in the step's matmul dtype, cast to the weight's dtype);
    for each frozen vector, its gradient's sum over N. Exactly the FLOPs of the arm's theoretical
    saving. A FLOP share assumes the whole step runs at the speed of these GEMMs; timing them in the
    same rounds says how much time freezing can save on this device, so a shortfall splits into
    "the step spends time elsewhere" (the GEMMs take less than their FLOP share) and "the
    implementation leaves saving on the table" (the step got faster by less than they take).
    The optimizer's share is left out: timed alone, one AdamW call over the frozen shapes is mostly
    the call's fixed cost, which freezing does not remove; so a step can save more than 100% of this.
    """

    def __init__(self, arm: Arm) -> None:
        super().__init__()
        self.name, self.cuda = f"{arm.name} skipped work", arm.cuda
        dev = arm.x.device
        dt = arm.matmul_dtype
        n = arm.batch * arm.seq
        g = torch.Generator(device=dev).manual_seed(0)
        frozen = [p for p in arm.model.parameters() if not p.requires_grad]
        self.dtypes = [p.dtype for p in frozen]
        self.inputs = [
            (
                torch.randn(n, p.shape[0], generator=g, device=dev, dtype=dt),
                torch.randn(n, p.shape[1], generator=g, device=dev, dtype=dt) if p.ndim == 2 else None,
            )
            for p in frozen
        ]
        self.flops = sum(2.0 * n * p.numel() for p in frozen if p.ndim == 2)

    def step(self) -> None:
        for dtype, (go, x) in zip(self.dtypes, self.inputs):
            (go.t() @ x if x is not None else go.sum(0)).to(dtype)


def build_arms(args: argparse.Namespace, batch: int, names: tuple[str, ...] = ARMS) -> list[Arm]:
    """The named arms (default: every arm of ARMS), all from seed 0."""
    from oelm import apply_method
    from oelm.core.flops import theoretical_saving, training_flops_per_token
    from oelm.models.gpt import GPT, gpt_config

    shape = {"n_layer": args.n_layer, "n_head": args.n_head, "d_model": args.d_model, "d_ff": args.d_ff}
    tokens = batch * args.seq
    arms = []
    full_flops = None
    for name in names:
        torch.manual_seed(0)
        if name == "reference":
            model = RefGPT(args.vocab, args.seq, args.n_layer, args.n_head, args.d_model, args.d_ff)
            arms.append(Arm(name, model, args, batch, None, None))
            continue
        model = GPT(gpt_config(args.preset, vocab_size=args.vocab, block_size=args.seq, bias=name != NOBIAS, **shape))
        apply_method(model, name if name in METHODS else "baseline", seed=0)
        flops = training_flops_per_token(model, args.seq) * tokens
        full_flops = full_flops or flops
        arms.append(Arm(name, model, args, batch, flops, theoretical_saving(model, args.seq)))
    arms[0].flops = full_flops  # same matmuls as the oelm baseline (LM head and attention included)
    return arms
