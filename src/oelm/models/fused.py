"""One GEMM for a projection split into row blocks (fused Q/K/V) that stay separate parameters.

Forward concatenates the blocks' weights ([rows_i, in] each; 3*d*d elements, cheap next to the
B*T*d activations) and runs one matmul. Backward computes the input gradient for all blocks in
one matmul and the weight (and bias) gradient only for blocks whose parameter requires grad when
the forward ran, one matmul per contiguous run of trainable blocks. So a frozen Q/K spends no
weight-gradient FLOPs, while each block keeps its own nn.Parameter, requires_grad flag,
optimizer membership and state-dict key. When every weight block trains (or none does) there is
nothing to skip: `fused_qkv` then runs autograd's own linear on the concatenated weight, the same
GEMMs with no Python in the backward and fewer dispatched ops (the step is launch-bound at small
batch in eager mode).

Why concatenation rather than one fused storage with the blocks as views: `module.to()` replaces
each parameter's `.data` separately (which unties views), and safetensors refuses tensors that
share storage, so views would need re-tying hooks in several places for a 3*d*d copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The matmul dtype: autocast's dtype when autocast is on for x's device, else x's dtype."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def _runs(flags: Sequence[bool]) -> list[tuple[int, int]]:
    """[start, end) index ranges of consecutive True flags."""
    out: list[tuple[int, int]] = []
    for i, f in enumerate(flags):
        if f and out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        elif f:
            out.append((i, i + 1))
    return out


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype, without a dispatched no-op `to` when it already is (Python cost per call)."""
    return t if t.dtype == dtype else t.to(dtype)


class FusedRowsLinear(torch.autograd.Function):
    """y = x @ cat(W_q, W_k, W_v).T (+ cat(b)); weight gradients only for blocks that need them.

    The forward works out which weight-gradient GEMMs the backward runs (one per contiguous run of
    blocks that need a weight or bias gradient) and the backward runs only those, calling torch no
    more than the GEMMs and casts need: the Function's Python is a fixed cost per layer per step,
    paid where small-batch eager steps are launch-bound (`benchmarks/fused_qkv.py` times it).
    """

    @staticmethod
    def forward(ctx, x, wq, wk, wv, bq, bk, bv):  # type: ignore[override]
        dt = compute_dtype(x)
        w = _cast(torch.cat((wq, wk, wv)), dt)
        b = None if bq is None else _cast(torch.cat((bq, bk, bv)), dt)
        xc = _cast(x, dt)
        ctx.save_for_backward(xc, w)
        need = ctx.needs_input_grad
        ws, bs = (wq, wk, wv), (bq, bk, bv)
        rows = [t.shape[0] for t in ws]
        starts = [0, rows[0], rows[0] + rows[1], rows[0] + rows[1] + rows[2]]
        # Per run: (lo, hi) columns of the output gradient, the dtype the run's weight / bias
        # gradient is cast to once (None: not wanted), and per block its index, its row range
        # inside the run and the dtype of its weight / bias gradient (None: not wanted).
        plan = []
        for a, e in _runs([need[1 + i] or need[4 + i] for i in range(3)]):
            blocks = [
                (
                    i,
                    starts[i] - starts[a],
                    starts[i + 1] - starts[a],
                    ws[i].dtype if need[1 + i] else None,
                    bs[i].dtype if need[4 + i] else None,
                )
                for i in range(a, e)
            ]
            w_dt = b_dt = None
            for blk in blocks:  # the first wanted dtype of each kind
                w_dt = w_dt or blk[3]
                b_dt = b_dt or blk[4]
            plan.append((starts[a], starts[e], w_dt, b_dt, blocks))
        ctx.plan, ctx.x_dtype, ctx.total = plan, x.dtype, starts[3]
        return F.linear(xc, w, b)

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        xc, w = ctx.saved_tensors
        g2 = _cast(grad_y.reshape(-1, grad_y.shape[-1]), w.dtype)
        out: list[torch.Tensor | None] = [None] * 7
        if ctx.needs_input_grad[0]:
            out[0] = _cast(g2.mm(w).view(*grad_y.shape[:-1], w.shape[1]), ctx.x_dtype)
        if ctx.plan:
            x2 = xc.reshape(-1, xc.shape[-1])
        for lo, hi, run_w_dt, run_b_dt, blocks in ctx.plan:
            g = g2 if hi - lo == ctx.total else g2[:, lo:hi]
            # One GEMM, one sum and one cast per run (not per block): fewer kernel launches in eager
            # mode. The run's blocks share a dtype unless the caller mixed them (then a cast each).
            gw = _cast(g.t() @ x2, run_w_dt) if run_w_dt is not None else None
            gb = _cast(g.sum(0), run_b_dt) if run_b_dt is not None else None
            whole = len(blocks) == 1
            for i, r0, r1, w_dt, b_dt in blocks:
                if w_dt is not None:
                    out[1 + i] = _cast(gw if whole else gw[r0:r1], w_dt)
                if b_dt is not None:
                    out[4 + i] = _cast(gb if whole else gb[r0:r1], b_dt)
        return tuple(out)


def fused_qkv(
    x: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    bq: torch.Tensor | None = None,
    bk: torch.Tensor | None = None,
    bv: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., in] -> [..., rows_q + rows_k + rows_v] in one GEMM; weights are [rows, in]."""
    if (bq is None) != (bk is None) or (bq is None) != (bv is None):
        raise ValueError("give a bias for all of Q, K, V or for none")
    if torch.is_grad_enabled() and not (wq.requires_grad == wk.requires_grad == wv.requires_grad):
        return FusedRowsLinear.apply(x, wq, wk, wv, bq, bk, bv)
    # No weight gradient to skip: the same GEMMs through autograd's linear and cat.
    dt = compute_dtype(x)
    b = torch.cat((bq, bk, bv)).to(dt) if bq is not None else None
    return F.linear(x.to(dt), torch.cat((wq, wk, wv)).to(dt), b)


class IdentityQKV(torch.autograd.Function):
    """(q, kv) = (x, x @ cat(W_k, W_v).T) for W_Q = I, with the input gradient in one GEMM.

    q is x in the matmul dtype: the same cast the K/V GEMM reads, not a second one. Backward
    folds q's gradient into the input gradient's GEMM (dx = dq + dkv @ W, one addmm) instead of a
    separate add: without this a W_Q = I model ran three extra elementwise kernels per layer (a
    cast, an add and a copy) that cost more than the Q matmul it removes (an H100 profile in
    docs/results/vs_reference). Weight gradients: one GEMM over the blocks that want one.
    """

    @staticmethod
    def forward(ctx, x, wk, wv):  # type: ignore[override]
        dt = compute_dtype(x)
        w = _cast(torch.cat((wk, wv)), dt)
        xc = _cast(x, dt)
        x2 = xc.reshape(-1, xc.shape[-1])
        ctx.save_for_backward(x2 if (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]) else None, w)
        ctx.x_dtype, ctx.x_shape, ctx.rows = x.dtype, x.shape, (wk.shape[0], wv.shape[0])
        ctx.w_dtypes = (wk.dtype, wv.dtype)
        kv = x2.mm(w.t()).view(*x.shape[:-1], w.shape[0])
        # q aliases x when no cast is needed; a view keeps autograd's bookkeeping of outputs simple.
        return xc.view_as(xc), kv

    @staticmethod
    def backward(ctx, dq, dkv):  # type: ignore[override]
        x2, w = ctx.saved_tensors
        g2 = _cast(dkv.reshape(-1, dkv.shape[-1]), w.dtype)
        dx = None
        if ctx.needs_input_grad[0]:
            if dq is None:
                dx = g2.mm(w)
            else:
                dx = torch.addmm(_cast(dq.reshape(-1, dq.shape[-1]), w.dtype), g2, w)
            dx = _cast(dx.view(ctx.x_shape), ctx.x_dtype)
        need_k, need_v = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        gk = gv = None
        rk = ctx.rows[0]
        if need_k and need_v:
            gw = g2.t() @ x2
            gk, gv = _cast(gw[:rk], ctx.w_dtypes[0]), _cast(gw[rk:], ctx.w_dtypes[1])
        elif need_k:
            gk = _cast(g2[:, :rk].t() @ x2, ctx.w_dtypes[0])
        elif need_v:
            gv = _cast(g2[:, rk:].t() @ x2, ctx.w_dtypes[1])
        return dx, gk, gv


def identity_qkv(x: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, kv) for W_Q = I: q is x in the matmul dtype, kv = x @ cat(W_k, W_v).T [..., rows_k + rows_v]."""
    if torch.is_grad_enabled() and (x.requires_grad or wk.requires_grad or wv.requires_grad):
        return IdentityQKV.apply(x, wk, wv)
    dt = compute_dtype(x)
    xc = _cast(x, dt)
    return xc, F.linear(xc, _cast(torch.cat((wk, wv)), dt))
