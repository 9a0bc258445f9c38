"""The LM loss without materialized logits equals F.cross_entropy over the logits, value and gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from oelm.models.gpt import GPT, gpt_config
from oelm.models.loss import LinearCrossEntropy, linear_cross_entropy

N, D, V = 37, 16, 101


def _inputs(ignore_every: int | None = 5):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(N, D, generator=g).requires_grad_()
    w = (0.3 * torch.randn(V, D, generator=g)).requires_grad_()
    y = torch.randint(0, V, (N,), generator=g)
    if ignore_every:
        y[::ignore_every] = -100
    return h, w, y


@pytest.mark.parametrize("rows_per_chunk", [N, 8, 1], ids=["one-chunk", "uneven-chunks", "row-chunks"])
def test_value_and_gradients_match_cross_entropy(rows_per_chunk):
    h, w, y = _inputs()
    ref = F.cross_entropy((h @ w.t()).float(), y, ignore_index=-100)
    ref_g = torch.autograd.grad(3.0 * ref, (h, w))  # a non-unit upstream gradient is applied too
    got = linear_cross_entropy(h, w, y, chunk_bytes=4 * V * rows_per_chunk)
    got_g = torch.autograd.grad(3.0 * got, (h, w))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    for a, b in zip(got_g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert got_g[1][:, :].abs().sum() > 0 and got_g[0][::5].abs().sum() == 0  # ignored rows get no gradient


def test_only_the_inputs_that_need_a_gradient_get_one():
    h, w, y = _inputs()
    frozen_w = w.detach()
    (gh,) = torch.autograd.grad(linear_cross_entropy(h, frozen_w, y), (h,))
    torch.testing.assert_close(gh, torch.autograd.grad(F.cross_entropy(h @ frozen_w.t(), y), (h,))[0])
    (gw,) = torch.autograd.grad(linear_cross_entropy(h.detach(), w, y), (w,))
    torch.testing.assert_close(gw, torch.autograd.grad(F.cross_entropy(h.detach() @ w.t(), y), (w,))[0])
    with torch.no_grad():
        calls = []
        real_mm = torch.Tensor.__matmul__
        torch.Tensor.__matmul__ = lambda a, b: calls.append(1) or real_mm(a, b)
        try:
            loss = linear_cross_entropy(h, w, y)
        finally:
            torch.Tensor.__matmul__ = real_mm
    assert not loss.requires_grad and len(calls) == 1  # the logits GEMM only: no gradient GEMMs
    torch.testing.assert_close(loss, F.cross_entropy(h @ w.t(), y))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_stays_within_half_precision_error_and_keeps_parameter_dtypes(dtype):
    h, w, y = _inputs()
    with torch.autocast("cpu", dtype=dtype):
        ref = F.cross_entropy((h @ w.t()).float(), y)
        got = linear_cross_entropy(h, w, y, chunk_bytes=4 * V * 8)
    ref_g, got_g = torch.autograd.grad(ref, (h, w)), torch.autograd.grad(got, (h, w))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)  # the same half-precision logits, a float32 softmax
    for a, b in zip(got_g, ref_g):
        assert a.dtype == torch.float32
        assert float((a - b).abs().max() / b.abs().max()) < 2e-2  # rounding of the half-precision GEMMs


def test_all_targets_ignored_gives_nan_as_cross_entropy_does():
    h, w, _ = _inputs()
    h, w = h.detach(), w.detach()
    y = torch.full((N,), -100)
    assert math.isnan(float(linear_cross_entropy(h, w, y)))
    assert math.isnan(float(F.cross_entropy(h @ w.t(), y)))
    assert math.isnan(float(linear_cross_entropy(h[:0], w, y[:0])))  # no tokens at all: nan too


def test_a_second_backward_through_the_same_loss_is_refused_not_scaled_twice():
    h, w, y = _inputs()
    loss = linear_cross_entropy(h, w, y)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("rows_per_chunk", [N, 8], ids=["one-chunk", "uneven-chunks"])
def test_per_token_losses_match_cross_entropy_and_need_no_logits(rows_per_chunk):
    h, w, y = _inputs()
    ref = F.cross_entropy((h @ w.t()).float(), y, reduction="none")
    with torch.no_grad():
        got = linear_cross_entropy(h, w, y, chunk_bytes=4 * V * rows_per_chunk, reduction="none")
    assert got.shape == (N,) and not got.requires_grad
    torch.testing.assert_close(got, ref.detach(), rtol=1e-6, atol=1e-6)
    assert torch.equal(got[::5], torch.zeros_like(got[::5]))  # ignored targets: 0, as torch gives
    # Where autograd needs them, per-token losses come from the plain path, with gradients.
    with_grad = linear_cross_entropy(h, w, y, reduction="none")
    torch.testing.assert_close(torch.autograd.grad(with_grad.sum(), (h,))[0], torch.autograd.grad(ref.sum(), (h,))[0])
    with pytest.raises(ValueError, match="reduction must be"):
        linear_cross_entropy(h, w, y, reduction="sum")


def test_shape_mismatch_is_named():
    h, w, y = _inputs()
    with pytest.raises(ValueError, match="need h"):
        linear_cross_entropy(h, w[:, :-1], y)


def _gpt():
    torch.manual_seed(0)
    return GPT(gpt_config("gpt-tiny", vocab_size=97, block_size=16))


def test_gpt_training_loss_without_logits_matches_the_plain_path():
    model = _gpt()
    x = torch.randint(0, 97, (3, 16))
    y = torch.randint(0, 97, (3, 16))
    y[:, :4] = -100
    logits, plain = model(x, y)
    plain_g = torch.autograd.grad(plain, list(model.parameters()))
    none, fused = model(x, y, return_logits=False)
    fused_g = torch.autograd.grad(fused, list(model.parameters()))
    assert none is None and logits.shape == (3, 16, 97)
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)
    for a, b in zip(fused_g, plain_g):  # the tied embedding gets both of its gradients
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_gpt_per_token_losses_for_evaluation():
    model = _gpt().eval()
    x = torch.randint(0, 97, (3, 16))
    with torch.no_grad():
        logits, plain = model(x, x, reduction="none")
        none, fused = model(x, x, return_logits=False, reduction="none")
    assert none is None and plain.shape == fused.shape == (3, 16)
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(plain.mean(), model(x, x)[1])


def test_a_hooked_head_takes_the_plain_path(monkeypatch):
    model = _gpt()
    x = torch.randint(0, 97, (2, 16))
    model.lm_head.register_forward_hook(lambda mod, args, out: 2 * out)
    called = []
    monkeypatch.setattr(LinearCrossEntropy, "apply", lambda *a: called.append(1))
    logits, loss = model(x, x, return_logits=False)
    assert not called and logits is not None
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), x.flatten()))
