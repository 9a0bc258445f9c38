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


def _parts(t: torch.Tensor | None, rows: Sequence[int]) -> Sequence[torch.Tensor | None]:
    """t split into row blocks of the given sizes (views; no op for a single block)."""
    if t is None:
        return [None] * len(rows)
    return [t] if len(rows) == 1 else t.split(list(rows))


class FusedRowsLinear(torch.autograd.Function):
    """y = x @ cat(W_q, W_k, W_v).T (+ cat(b)); weight gradients only for blocks that need them."""

    @staticmethod
    def forward(ctx, x, wq, wk, wv, bq, bk, bv):  # type: ignore[override]
        dt = compute_dtype(x)
        ws, bs = (wq, wk, wv), (bq, bk, bv)
        w = torch.cat(ws).to(dt)
        b = torch.cat(bs).to(dt) if bq is not None else None
        xc = x.to(dt)
        ctx.save_for_backward(xc, w)
        ctx.rows = [t.shape[0] for t in ws]
        ctx.w_dtypes = [t.dtype for t in ws]
        ctx.b_dtypes = [t.dtype if t is not None else None for t in bs]
        ctx.x_dtype = x.dtype
        return F.linear(xc, w, b)

    @staticmethod
    def backward(ctx, grad_y):  # type: ignore[override]
        xc, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        g2 = grad_y.to(w.dtype).reshape(-1, grad_y.shape[-1])
        gx = g2.mm(w).view(*grad_y.shape[:-1], w.shape[1]).to(ctx.x_dtype) if need[0] else None
        gws: list[torch.Tensor | None] = [None, None, None]
        gbs: list[torch.Tensor | None] = [None, None, None]
        flags = [need[1 + i] or need[4 + i] for i in range(3)]
        if any(flags):
            x2 = xc.reshape(-1, xc.shape[-1])
            starts = [sum(ctx.rows[:i]) for i in range(4)]
            for a, e in _runs(flags):
                g = g2 if e - a == 3 else g2[:, starts[a] : starts[e]]
                # One GEMM and one cast per run (not per block): fewer kernel launches in eager mode.
                gw = (g.t() @ x2).to(ctx.w_dtypes[a]) if any(need[1 + a : 1 + e]) else None
                gb = g.sum(0).to(ctx.b_dtypes[a] or g.dtype) if any(need[4 + a : 4 + e]) else None
                for i, gwi, gbi in zip(range(a, e), _parts(gw, ctx.rows[a:e]), _parts(gb, ctx.rows[a:e])):
                    if need[1 + i]:
                        gws[i] = gwi.to(ctx.w_dtypes[i])  # no-op unless blocks' dtypes differ
                    if need[4 + i]:
                        gbs[i] = gbi.to(ctx.b_dtypes[i])
        return gx, *gws, *gbs


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
