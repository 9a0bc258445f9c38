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

    python benchmarks/vs_reference.py --device cuda --json out.json              # batch 8 and 32
    python benchmarks/vs_reference.py --device cuda --compile --json out.json
    python benchmarks/vs_reference.py --device cpu --quick --json out.json       # < 5 min, 2 cores
    python benchmarks/vs_reference.py --device cpu --quick --processes 3 --json out.json  # 3 fresh processes
    python benchmarks/vs_reference.py --count-ops --json ops.json                # ~1 min on CPU
    python benchmarks/vs_reference.py --table out.json [more.json ...]           # markdown summary of stored runs

`--profile-ops` says where a difference comes from: it profiles every arm with torch.profiler in the
same balanced rounds and prints, per arm, the ops whose self time per step differs most from the
baseline's (self CPU time on CPU; on CUDA, each kernel's device time), with calls per step. The
profiler adds a cost to every op it records and charges it to the enclosing range, so Python-heavy
ranges (a custom autograd Function's forward and backward) look dearer than they run: read it for
attribution, and the timed rows for the size of a difference.

    python benchmarks/vs_reference.py --device cpu --quick --profile-ops --json ops-profile.json

`--count-ops` times nothing: after one warm-up step it counts, per arm, the aten ops one training
step dispatches (forward, backward, optimizer step + zero_grad; what autograd and autocast leave,
each op one dispatch and, unless a view, usually one kernel launch) and the Python function calls
it makes. Both are deterministic, so they compare launch-bound (small-batch eager) overhead on a
machine where timings are noise. Every device counts the CUDA step: bf16 autocast and fused AdamW.
Counts do not depend on batch, sequence length or vocabulary, so the defaults there are small.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC2701  (torch has no public op-counting mode)

# ---------------------------------------------------------------- the plain reference model ----


class RefAttention(nn.Module):
    """Causal self-attention: one fused QKV linear, SDPA, output projection; no biases."""

    def __init__(self, d: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class RefBlock(nn.Module):
    """Pre-LayerNorm block with a GELU MLP; no biases."""

    def __init__(self, d: int, n_head: int, d_ff: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, bias=False)
        self.attn = RefAttention(d, n_head)
        self.ln_2 = nn.LayerNorm(d, bias=False)
        self.fc = nn.Linear(d, d_ff, bias=False)
        self.proj = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class RefGPT(nn.Module):
    """Token + learned position embeddings, blocks, final LayerNorm, head tied to the embedding."""

    def __init__(self, vocab: int, block: int, n_layer: int, n_head: int, d: int, d_ff: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.h = nn.ModuleList(RefBlock(d, n_head, d_ff) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# ---------------------------------------------------------------------------- measurement ----

METHODS = ("baseline", "oelm-freeze", "oelm-qk-ffn")
NOBIAS = "baseline-nobias"
LOGITS = "baseline-logits"  # the loss through materialized logits, as the reference computes it
ARMS = ("reference", *METHODS, "baseline-AA", NOBIAS, LOGITS)
COUNT_ARMS = ("reference", *METHODS, NOBIAS, LOGITS)  # the A/A arm measures timing noise: nothing to count
# Quick CPU shape: gpt-medium-512 at vocab 50,257 takes seconds per step on 2 cores.
CPU_QUICK = {"n_layer": 4, "n_head": 4, "d_model": 256, "d_ff": 1024, "vocab_size": 8192}


def _state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[int, int]:
    """(parameter + optimizer-state bytes held between steps, gradient bytes made by a step)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    state = sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.ndim
    )
    return params + state, grads


class Timed:
    """Step timing shared by every arm: per-step times and per-round medians (for paired ratios)."""

    name: str
    cuda: bool

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu_times: list[float] = []  # CPU only: process CPU seconds, steadier than wall time under load
        self.round_medians: list[float] = []  # one per round: rounds pair the arms in time
        self.round_cpu_medians: list[float] = []
        self._events: list[tuple[Any, Any]] = []
        self._wall: list[float] = []
        self._cpu: list[float] = []

    def step(self) -> None:
        raise NotImplementedError

    def timed(self, n: int, record: bool) -> None:
        """n steps; CUDA events are recorded around each and read later in `collect`."""
        for _ in range(n):
            if self.cuda:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                self.step()
                e.record()
                if record:
                    self._events.append((s, e))
            else:
                t0, c0 = time.perf_counter(), time.process_time()
                self.step()
                if record:
                    self._wall.append(time.perf_counter() - t0)
                    self._cpu.append(time.process_time() - c0)

    def collect(self) -> None:
        """End of a round (after its synchronize): read CUDA events, keep the round's medians."""
        self._wall.extend(s.elapsed_time(e) / 1000.0 for s, e in self._events)
        self._events.clear()
        if self._wall:
            self.times.extend(self._wall)
            self.round_medians.append(statistics.median(self._wall))
        if self._cpu:
            self.cpu_times.extend(self._cpu)
            self.round_cpu_medians.append(statistics.median(self._cpu))
        self._wall, self._cpu = [], []


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

    def count(self) -> dict[str, Any]:
        """aten ops per phase of one step and Python calls per step, after a warm-up step."""
        self.step()  # lazy optimizer state, first-call caches
        fwd, bwd, opt = OpCounter(), OpCounter(), OpCounter()
        with fwd:
            loss = self.forward()
        with bwd:
            loss.backward()
        with opt:
            self.update()
        ops = fwd.ops + bwd.ops + opt.ops
        return {
            "aten_ops_per_step": ops.total(),
            "aten_ops_forward": fwd.ops.total(),
            "aten_ops_backward": bwd.ops.total(),
            "aten_ops_optimizer": opt.ops.total(),
            "aten_view_ops_per_step": fwd.views + bwd.views + opt.views,
            "python_calls_per_step": python_calls(self.step),
            "aten_ops_by_name": dict(sorted(ops.items())),
        }

    def measure_memory(self) -> None:
        """Peak bytes of this arm: persistent state + one step's transient peak.

        CUDA: the allocator's peak. CPU: the peak of live tensor bytes from torch.profiler's memory
        events (op granularity: an allocation counts from its op's start, a free from its op's
        end, so a buffer an op allocates and frees inside itself is not seen), with where in the
        step the peak falls. On both, the gradients of this step are part of the transient peak
        only if they are alive at that moment.
        """
        held, self.grad_bytes = _state_bytes(self.model, self.opt)
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


def _sync(args: argparse.Namespace) -> None:
    if args.device == "cuda":
        torch.cuda.synchronize()


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


def build_arms(args: argparse.Namespace, batch: int, names: tuple[str, ...] = ARMS) -> list[Arm]:
    """The named arms (default: the reference, the three methods and the A/A baseline), all from seed 0."""
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


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """Median of per-round values with a distribution-free interval for it (order statistics).

    The interval runs from the j-th to the (n+1-j)-th smallest value, j the largest rank with
    P(Binomial(n, 1/2) < j) <= (1 - confidence) / 2: no assumption on the noise's shape, and one
    disturbed round moves it by one rank, not by its size. None where n is too small (n < 6 at 95%).
    """
    from scipy.stats import binom

    vals = sorted(v for v in values if math.isfinite(v))
    n = len(vals)
    if n == 0:
        return None, None, None
    med = statistics.median(vals)
    j = int(binom.ppf((1 - confidence) / 2, n, 0.5))  # P(X <= j-1) <= alpha/2 < P(X <= j)
    if binom.cdf(j, n, 0.5) <= (1 - confidence) / 2:
        j += 1
    if j < 1:
        return med, None, None
    return med, vals[j - 1], vals[n - j]


def paired_ratio(num: list[float], den: list[float]) -> tuple[float | None, float | None, float | None]:
    """Median over rounds of num_r / den_r with its 95% interval: each round pairs the arms in time,
    so slow drift of the machine cancels within a round and the interval is the noise that remains."""
    return median_ci([a / b for a, b in zip(num, den)])


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


def _fresh_compile_caches(args: argparse.Namespace) -> None:
    """With --compile: the GPT arms share GPT.forward's code object, so fresh caches and room for every arm's graph."""
    if not args.compile:
        return
    torch._dynamo.reset()
    for limit in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))


def interleaved_rounds(timed: list[Timed], rounds: int, steps: int, cuda: bool) -> Iterator[int]:
    """Run `rounds` rounds of `steps` recorded steps per item, in a carryover-balanced order (each
    item follows every other equally often over a cycle); after each round synchronize, collect
    every item's times and yield the number of rounds done (break out to stop early)."""
    from oelm.training.timing import balanced_orders

    orders = balanced_orders(len(timed))
    for r in range(rounds):
        for i in orders[r % len(orders)]:
            timed[i].timed(steps, record=True)
        if cuda:
            torch.cuda.synchronize()
        for t in timed:
            t.collect()
        yield r + 1


def run(args: argparse.Namespace) -> list[dict]:
    """Measure every batch size; print rows and rewrite the JSON as results come in."""
    from oelm.training.timing import balanced_orders

    done: list[dict] = []
    for batch in args.batch:
        _fresh_compile_caches(args)
        arms = build_arms(args, batch)
        skipped = {a.name: SkippedWork(a) for a in arms if a.frozen_bytes}
        order = [*arms, *skipped.values()]
        # Whole cycles of the balanced order unless --rounds says otherwise.
        rounds = args.rounds or (3 if args.quick else 1) * len(balanced_orders(len(order)))
        print(f"\n# batch {batch} x seq {args.seq}: warm-up {args.warmup} step(s) per arm", flush=True)
        for a in order:  # warm-up: compile, allocator, lazy optimizer state, kernel choice
            a.timed(args.warmup, record=False)
        _sync(args)
        start, rounds_done = time.perf_counter(), 0
        for rounds_done in interleaved_rounds(order, rounds, args.steps, args.device == "cuda"):
            line = "  ".join(f"{a.name} {1e3 * statistics.median(a.times):.1f}ms" for a in order)
            print(f"round {rounds_done}/{rounds}: {line}", flush=True)
            _write(args, done + rows_of(arms, args, batch, rounds_done, complete=False, skipped=skipped))
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
        _write(args, done)
        del arms, skipped, order
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return done


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
            **a.count(),
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
    _write(args, rows)
    return rows


def profile_ops(args: argparse.Namespace) -> list[dict]:
    """Self time and calls per op per step of every arm (batch args.batch[0]), from torch.profiler in
    balanced rounds of args.steps steps; print each arm's largest differences from the baseline."""
    from torch.profiler import ProfilerActivity, profile

    from oelm.training.timing import balanced_orders

    batch, cuda = args.batch[0], args.device == "cuda"
    _fresh_compile_caches(args)
    arms = build_arms(args, batch)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    for a in arms:  # warm-up: compile, allocator, lazy optimizer state, kernel choice
        a.timed(args.warmup, record=False)
    _sync(args)
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
                _sync(args)
            names = _graph_names(prof)
            for e in prof.key_averages():
                us = _kernel_us(e) if cuda else e.self_cpu_time_total
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
    _write(args, rows)
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


def _graph_names(prof: Any) -> dict[str, str]:
    """Compiled graphs by their place in the step ("compiled graph 1" runs first: the forward), not by
    their hash, which differs between arms, so one arm's graph lines up with the baseline's (the
    caller likewise drops the compile ids from "Torch-Compiled Region: 1/0")."""
    tag = "## Call CompiledFxGraph"
    keys = [e.key for e in sorted(prof.events(), key=lambda e: e.time_range.start) if e.key.startswith(tag)]
    return {k: f"## compiled graph {i + 1} ##" for i, k in enumerate(dict.fromkeys(keys))}


def _kernel_us(event: Any) -> float:
    """Device time (us) of a profiler average, counted as torch's own table totals it: only device
    events (the kernels, under their own names), since a CPU op's device time is its kernels' time
    again and a user annotation's spans the kernels inside it."""
    from torch.autograd import DeviceType

    if event.device_type == DeviceType.CPU or getattr(event, "is_user_annotation", False):
        return 0.0
    us = getattr(event, "self_device_time_total", None)  # torch < 2.4 named it self_cuda_time_total
    return float(us if us is not None else getattr(event, "self_cuda_time_total", 0.0))


TABLE_HEADER = (
    "| run | batch | baseline vs reference | baseline-nobias vs reference | loss without logits vs through "
    "logits | oelm-freeze vs baseline (theor.) | realized of FLOP saving | skipped GEMMs' share of step | "
    "saved of their time | oelm-qk-ffn vs baseline (theor.) | realized | A/A | baseline ms |"
)


def table(paths: list[Path]) -> list[str]:
    """Markdown lines summarizing timed JSON files: one line per file, process and batch, each ratio with
    its 95% interval (how the tables of docs/results/vs_reference are made from the stored rows)."""

    def ratio(v: float | None, ci: list | None, pct: bool = False) -> str:
        if v is None:
            return "n/a"
        value = _pct(v) if pct else f"{v:.3f}"
        return f"{value} {_ci(ci, 100 if pct else 1.0, '')}".rstrip()

    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    for path in paths:
        rows = json.loads(Path(path).read_text())
        if not isinstance(rows, list) or not rows or "speedup_vs_baseline" not in rows[0]:
            raise SystemExit(
                f"{path}: not the rows of a timed vs_reference run (--count-ops and --profile-ops "
                "files have no ratios to tabulate)"
            )
        for key in dict.fromkeys((r.get("process", 0), r["batch"]) for r in rows):
            arm = {r["name"]: r for r in rows if (r.get("process", 0), r["batch"]) == key}
            get = lambda name, field: arm.get(name, {}).get(field)  # noqa: E731
            fz, qk = arm.get("oelm-freeze", {}), arm.get("oelm-qk-ffn", {})
            cells = [
                f"{Path(path).stem}, {key[0] + 1}",
                str(key[1]),
                ratio(get("baseline", "vs_reference"), get("baseline", "vs_reference_ci")),
                ratio(get(NOBIAS, "vs_reference"), get(NOBIAS, "vs_reference_ci")),
                ratio(*_without_logits(arm[LOGITS]) if LOGITS in arm else (None, None)),
                ratio(fz.get("speedup_vs_baseline"), fz.get("speedup_vs_baseline_ci"))
                + (f" ({fz['theoretical_speedup']:.3f})" if fz.get("theoretical_speedup") else ""),
                ratio(fz.get("saving_realized"), fz.get("saving_realized_ci"), pct=True),
                f"{100 * fz['skipped_work_share_of_baseline']:.2f}%"
                if fz.get("skipped_work_share_of_baseline")
                else "n/a",
                ratio(fz.get("skipped_time_saved"), fz.get("skipped_time_saved_ci"), pct=True),
                ratio(qk.get("speedup_vs_baseline"), qk.get("speedup_vs_baseline_ci"))
                + (f" ({qk['theoretical_speedup']:.3f})" if qk.get("theoretical_speedup") else ""),
                ratio(qk.get("saving_realized"), qk.get("saving_realized_ci"), pct=True),
                ratio(get("baseline-AA", "speedup_vs_baseline"), get("baseline-AA", "speedup_vs_baseline_ci")),
                f"{1e3 * get('baseline', 'step_time_median_s'):.0f}"
                if get("baseline", "step_time_median_s")
                else "n/a",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _write(args: argparse.Namespace, rows: list[dict]) -> None:
    if args.json:
        tmp = Path(str(args.json) + ".tmp")
        tmp.write_text(json.dumps(rows, indent=2))
        os.replace(tmp, args.json)


def _without_logits(logits_row: dict) -> tuple[float | None, list | None]:
    """The baseline's speed over the baseline-logits arm's, with its interval: that arm's
    speedup_vs_baseline (baseline time / its time) inverted."""
    v, ci = logits_row.get("speedup_vs_baseline"), logits_row.get("speedup_vs_baseline_ci")
    return (1 / v if v else None), ([1 / ci[1], 1 / ci[0]] if ci and ci[0] else None)


def _pct(v: float | None, digits: int = 0) -> str:
    return f"{100 * v:.{digits}f}%" if v is not None else "n/a"


def _ci(ci: list | None, scale: float = 1.0, unit: str = "x") -> str:
    """'[lo, hi]' of a 95% interval over rounds, or '' when there are too few rounds for one."""
    if not ci or ci[0] is None:
        return ""
    digits = 0 if scale == 100 else 3
    return f"[{scale * ci[0]:.{digits}f}{unit}, {scale * ci[1]:.{digits}f}{unit}]"


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
    args.device_name = torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)"
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
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            print(f"\n## process {i + 1} of {args.processes}", flush=True)
            out = Path(tmp) / f"rows-{i}.json"
            # Given last, these win over any `--flag=value` spelling left in child_argv.
            subprocess.run([sys.executable, __file__, *child_argv, "--processes", "1", "--json", str(out)], check=True)
            done += [{**r, "process": i} for r in json.loads(out.read_text())]
            _write(args, done)
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
            aa = next(x for x in rows if x["name"] == "baseline-AA" and x["batch"] == r["batch"])
            print(
                f"batch {r['batch']} {r['name']}: speed-up {r['speedup_vs_baseline']:.3f}x {_ci(r['speedup_vs_baseline_ci'])} "
                f"vs theoretical {r['theoretical_speedup']:.3f}x (realized {_pct(r['saving_realized'])} "
                f"{_ci(r['saving_realized_ci'], 100, '%')} of the FLOP saving; A/A {aa['speedup_vs_baseline']:.3f}x "
                f"{_ci(aa['speedup_vs_baseline_ci'])}); memory -{r['memory_saving_vs_baseline_bytes'] / 2**20:.1f} MiB "
                f"(frozen grads + AdamW state {r['frozen_grad_and_optimizer_bytes'] / 2**20:.1f} MiB, the moments alone "
                f"{r['frozen_optimizer_state_bytes'] / 2**20:.1f} MiB)"
                + (f"; the step's peak is in {r['peak_phase']}, at {r['peak_op']}" if r["peak_op"] else ""),
                flush=True,
            )
            if r["skipped_work_s"]:
                print(
                    f"batch {r['batch']} {r['name']}: the skipped work alone takes {1e3 * r['skipped_work_s']:.2f} ms "
                    f"= {_pct(r['skipped_work_share_of_baseline'], 2)} of the baseline step (ceiling "
                    f"{r['skipped_work_speedup_ceiling']:.3f}x); the step saved {_pct(r['skipped_time_saved'])} "
                    f"{_ci(r['skipped_time_saved_ci'], 100, '%')} of that time",
                    flush=True,
                )
    for (b, name), r in base.items():
        print(f"batch {b} oelm {name} vs reference: {r['vs_reference']:.3f}x {_ci(r['vs_reference_ci'])}", flush=True)
        if name == LOGITS:
            speed, ci = _without_logits(r)
            peaks = (r["peak_memory_bytes"], base[(b, "baseline")]["peak_memory_bytes"])
            print(
                f"batch {b} oelm baseline, loss without logits vs through logits: {speed:.3f}x "
                f"{_ci(ci)} the speed"
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
