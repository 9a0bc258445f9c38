"""Cross-entropy of a linear LM head without keeping the [tokens, vocab] logits.

`F.cross_entropy(h @ W.T, y)` in eager mode materializes the logits, their float32 copy, the
log-softmax (kept for backward), a dense gradient the size of the logits (filled with zeros, then
scattered) and the log-softmax backward's output: some six passes over tokens x vocab floats, and
three such float32 buffers alive at once early in backward. At gpt-medium-512 (vocab 50,257) that
is the whole step's memory peak (measured: every arm peaks at `_log_softmax_backward_data`).

`linear_cross_entropy` computes the loss and both gradients in the forward, a chunk of rows at
a time: logits -> log-softmax (float32; over the logits in place when they are float32 on CPU)
-> loss from the targets' entries -> softmax written straight into the matmul dtype with the
target entries set to p - 1 from float32 -> the two gradient GEMMs. The backward only scales
the stored gradients by the incoming scalar. Same FLOPs as the plain path (one forward and two
backward GEMMs), no extra GEMM for recomputation, and the per-row 1/N (and ignore_index mask)
is applied to the [rows, d] operands and results, not to the [rows, vocab] block. What stays
alive until backward is the gradient of the hidden states and of the head weight (the tied
embedding), [tokens, d] and [vocab, d]. Under no_grad only the loss is computed.

Memory per chunk: float32 (CPU) one logits-sized block, overwritten in place through to the
softmax; under bf16 autocast the chunk's bf16 logits, the float32 copy the log-softmax makes of
them and its float32 output (about 10 bytes per logit, briefly), then 2 bytes per logit for the
gradient GEMMs. The plain path holds about 12 bytes per logit of the whole batch into backward,
so in half precision the saving comes mostly from chunking (batches of more than one chunk).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from oelm.models.fused import compute_dtype

# Rows per chunk: as many as keep one chunk's float32 logits under this many bytes. One chunk
# covers the CPU shapes and gpt-medium-512 at batch 8 (the weight gradient is then one GEMM);
# batch 32 x 512 takes four (the head's weight gradient is accumulated once per chunk).
CHUNK_BYTES = 1 << 30


def _chunk_log_softmax(h_rows: torch.Tensor, w: torch.Tensor, classes: int) -> torch.Tensor:
    """float32 log-softmax of h_rows @ w.T ([rows, V]), over the logits in place when they are
    float32 on CPU (one chunk-sized buffer, not two). Columns from `classes` on (a padded
    vocabulary's rows) are set to -inf first: log-probability -inf, probability and gradient 0."""
    logits = h_rows @ w.t()
    if classes < logits.shape[1]:
        logits[:, classes:] = float("-inf")
    inplace = logits.dtype == torch.float32 and logits.device.type == "cpu"
    return torch.log_softmax(logits, dim=-1, dtype=torch.float32, out=logits if inplace else None)


def _operands(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, ignore_index: int):
    """(matmul dtype, h and w in it, mask of counted targets, [N, 1] target columns; ignored rows
    point at column 0, and their weight is 0 wherever they are used)."""
    dt = compute_dtype(h)
    valid = targets != ignore_index
    return dt, h.to(dt), w.to(dt), valid, (targets * valid)[:, None]


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of (h @ w.T) against targets; gradients made in the forward."""

    @staticmethod
    def forward(ctx, h, w, targets, ignore_index, chunk_rows, classes):  # type: ignore[override]
        dt, hc, wc, valid, col = _operands(h, w, targets, ignore_index)
        n = h.shape[0]
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        vf = valid.to(torch.float32)
        count = vf.sum()
        # 1/N for counted rows, 0 for ignored ones (0/0 = nan when all are ignored, as F.cross_entropy)
        scale = vf / count
        # The head's gradient takes 1/N in two halves, 1/sqrt(N) on the rows of h (in the matmul
        # dtype) and 1/sqrt(N) on the float32 result (in backward, with the incoming gradient):
        # h / N would fall into float16's subnormals at N ~ 16k tokens, and an unscaled sum over
        # N rows could overflow it.
        root = count.rsqrt()
        row_w = (vf * root).to(dt)
        total: torch.Tensor | None = None
        ghs: list[torch.Tensor] = []
        gw: torch.Tensor | None = None
        for s in range(0, n, chunk_rows):
            e = min(n, s + chunk_rows)
            lp = _chunk_log_softmax(hc[s:e], wc, classes)
            lpt = lp.gather(1, col[s:e])  # [rows, 1] log-probabilities of the targets
            r = scale[s:e]
            part_loss = torch.dot(lpt.view(-1), r)
            total = part_loss if total is None else total + part_loss
            if not (want_h or want_w):
                continue
            g = lp if dt == torch.float32 else torch.empty(lp.shape, dtype=dt, device=lp.device)
            torch.exp(lp, out=g)  # softmax, cast on the way out
            del lp  # in a half-precision step the float32 block is free before the gradient GEMMs
            g.scatter_(1, col[s:e], torch.expm1(lpt).to(dt))  # p - 1 at the targets, from float32
            if want_h:
                ghs.append((g @ wc) * r[:, None])
            if want_w:
                part = g.t() @ (hc[s:e] * row_w[s:e, None])
                gw = part.to(w.dtype) if gw is None else gw.add_(part)
        gh = None if not want_h else (ghs[0] if len(ghs) == 1 else torch.cat(ghs)).to(h.dtype)
        loss = -total
        ctx.save_for_backward(gh, gw, root)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):  # type: ignore[override]
        # In place: no second [vocab, d] buffer, and autograd's accumulation takes the tensor over.
        # A second backward through the same loss (retain_graph=True) is refused by autograd's
        # check that saved tensors were not modified, rather than scaling twice.
        gh, gw, root = ctx.saved_tensors
        return (
            gh.mul_(grad_loss) if gh is not None else None,
            gw.mul_(grad_loss * root) if gw is not None else None,
            None,
            None,
            None,
            None,
        )


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_bytes: int = CHUNK_BYTES,
    reduction: str = "mean",
    classes: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of `h @ weight.T` (h [N, d], weight [V, d], targets [N]) over the
    targets that are not ignore_index; equals `F.cross_entropy((h @ weight.T).float(), targets)`
    (under autocast: with the GEMMs in autocast's dtype) without materializing the logits.

    reduction="none" gives the [N] per-token losses (0 for ignored targets, as F.cross_entropy),
    chunked without gradients (evaluation); where autograd needs them it takes the plain path.
    classes: the first `classes` rows of weight are the real classes, the rest padding (a padded
    vocabulary, `oelm.models.vocab`): their logits are left out of the softmax, as if weight had
    `classes` rows, and their rows get zero gradient (None: all V rows are classes).
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    if h.ndim != 2 or weight.ndim != 2 or targets.shape != h.shape[:1] or h.shape[1] != weight.shape[1]:
        raise ValueError(
            f"need h [N, d], weight [V, d], targets [N]; got {tuple(h.shape)}, "
            f"{tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    classes = weight.shape[0] if classes is None else classes
    if not 0 < classes <= weight.shape[0]:
        raise ValueError(f"classes must be in 1..{weight.shape[0]} (the weight's rows), got {classes}")
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    if h.shape[0] == 0 or (reduction == "none" and grad):  # torch's answer (nan when empty), with autograd
        logits = (h @ weight.t())[:, :classes].float()
        return F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction=reduction)
    rows = max(1, chunk_bytes // (4 * weight.shape[0]))
    if reduction == "none":
        return _token_losses(h, weight, targets, ignore_index, rows, classes)
    if not grad:  # the Function would still see requires_grad and make gradients
        h, weight = h.detach(), weight.detach()
    return LinearCrossEntropy.apply(h, weight, targets, ignore_index, rows, classes)


@torch.no_grad()
def _token_losses(
    h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, ignore_index: int, chunk_rows: int, classes: int
) -> torch.Tensor:
    """[N] float32 cross-entropy per row, a chunk of rows at a time; 0 where the target is ignored."""
    _, hc, wc, valid, col = _operands(h, w, targets, ignore_index)
    out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    for s in range(0, h.shape[0], chunk_rows):
        e = min(h.shape[0], s + chunk_rows)
        out[s:e] = _chunk_log_softmax(hc[s:e], wc, classes).gather(1, col[s:e]).view(-1)
    return out.neg_().masked_fill_(~valid, 0.0)
