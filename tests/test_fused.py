"""Fused QKV: same numbers as three projections, and no weight-gradient FLOPs for frozen blocks."""

from __future__ import annotations

import copy

import pytest
import torch

from oelm import apply_method
from oelm.core.audit import audit_model, verify_audit
from oelm.core.flops import executed_flops
from oelm.models.fused import FusedRowsLinear, IdentityQKV, fused_qkv, identity_qkv
from oelm.models.gpt import GPT, SelfAttention, gpt_config
from oelm.training import checkpoint as ckpt

VOCAB = 97


def _pair(method: str) -> tuple[GPT, GPT]:
    """A fused GPT under `method` and an unfused copy with identical weights."""
    torch.manual_seed(0)
    fused = GPT(gpt_config("gpt-tiny", vocab_size=VOCAB, block_size=32))
    apply_method(fused, method, seed=0)
    plain = copy.deepcopy(fused)
    for m in plain.modules():
        if isinstance(m, SelfAttention):
            m.fused = False
    return fused, plain


def _loss_and_grads(model: GPT, x: torch.Tensor, bf16: bool) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits, loss = model(x, x)
    loss.backward()
    return logits.detach().float(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("method", ["baseline", "oelm-freeze", "oelm-qk-ffn", "identity-q"])
@pytest.mark.parametrize("bf16,rtol", [(False, 1e-5), (True, 2e-2)])
def test_fused_matches_unfused_outputs_and_gradients(method, bf16, rtol):
    fused, plain = _pair(method)
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    out_f, grads_f = _loss_and_grads(fused, x, bf16)
    out_p, grads_p = _loss_and_grads(plain, x, bf16)
    assert torch.allclose(out_f, out_p, rtol=rtol, atol=rtol * out_p.abs().max().item())
    for name, gp in grads_p.items():
        gf = grads_f[name]
        assert (gf is None) == (gp is None), name  # frozen tensors get no gradient on either path
        if gp is not None:
            assert gf.dtype == gp.dtype and (gf - gp).abs().max() <= rtol * gp.abs().max() + 1e-12, name


def test_frozen_blocks_execute_no_weight_gradient_flops():
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    counts = {}
    for method in ("baseline", "oelm-freeze"):
        fused, plain = _pair(method)
        counts[method] = executed_flops(lambda: fused(x, x)[1].backward())
        assert counts[method] == executed_flops(lambda: plain(x, x)[1].backward())
    d, layers, tokens = 128, 2, x.numel()
    # Exactly the Q and K weight gradients (2 * tokens * d * d FLOPs each, per layer) are skipped.
    assert counts["baseline"] - counts["oelm-freeze"] == layers * 2 * (2 * tokens * d * d)


@pytest.mark.parametrize(
    "trainable", [(True, False, True), (False, True, False), (True, True, True), (False, False, True)]
)
def test_function_gradients_for_any_trainable_blocks_with_biases(trainable):
    """Uneven (GQA-like) blocks with biases; gradcheck in float64 for every frozen/trainable mix."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, dtype=torch.float64, generator=g, requires_grad=True)
    rows = (4, 2, 2)
    ws = [torch.randn(r, 5, dtype=torch.float64, generator=g, requires_grad=t) for r, t in zip(rows, trainable)]
    bs = [torch.randn(r, dtype=torch.float64, generator=g, requires_grad=t) for r, t in zip(rows, trainable)]
    assert torch.autograd.gradcheck(lambda *a: fused_qkv(*a), (x, *ws, *bs))
    fused_qkv(x, *ws, *bs).square().sum().backward()
    for w, b, t in zip(ws, bs, trainable):
        assert (w.grad is not None) == t and (b.grad is not None) == t


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_all_trainable_shortcut_is_bit_identical_to_the_function(bf16, bias):
    """With nothing to skip, fused_qkv runs autograd's linear: same outputs and gradients, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 16, generator=g)
    rows = (16, 8, 8)
    ws = [torch.randn(r, 16, generator=g) for r in rows]
    bs = [torch.randn(r, generator=g) if bias else None for r in rows]
    results = []
    for fn in (fused_qkv, FusedRowsLinear.apply):
        leaves = [t.clone().requires_grad_() for t in (x, *ws, *(b for b in bs if b is not None))]
        args = leaves[:4] + (leaves[4:] if bias else [None] * 3)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = fn(*args)
        y.float().square().sum().backward()
        results.append([y, *(t.grad for t in leaves)])
    for a, b in zip(*results):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_requires_grad_is_read_at_call_time():
    fused, _ = _pair("baseline")
    attn = fused.transformer.h[0].attn
    x = torch.randint(0, VOCAB, (2, 8))
    attn.q_proj.weight.requires_grad_(False)  # a schedule freezing Q mid-run
    fused(x, x)[1].backward()
    assert attn.q_proj.weight.grad is None and attn.k_proj.weight.grad is not None
    attn.q_proj.weight.requires_grad_(True)
    fused(x, x)[1].backward()
    assert attn.q_proj.weight.grad is not None


def test_state_dict_keys_checkpoint_round_trip_and_audit(tmp_path):
    fused, _ = _pair("oelm-freeze")
    keys = set(fused.state_dict())
    assert "transformer.h.0.attn.q_proj.weight" in keys and not any("qkv" in k for k in keys)
    audit = audit_model(fused)
    opt = torch.optim.AdamW([p for p in fused.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    x = torch.randint(0, VOCAB, (2, 16))
    for _ in range(2):
        fused(x, x)[1].backward()
        opt.step()
        opt.zero_grad()
    assert verify_audit(fused, audit, optimizer=opt).ok
    ckpt.save_best(tmp_path, fused, {"step": 2})
    again, _ = _pair("oelm-freeze")
    ckpt.load_weights(again, tmp_path / "best" / ckpt.WEIGHTS)
    assert torch.equal(again(x)[0], fused(x)[0])


@pytest.mark.slow  # inductor compiles forward and backward on CPU: ~1 min
def test_fused_path_compiles_without_graph_breaks():
    """Fused QKV with frozen blocks and the logits-free loss, called as training calls the model."""
    fused, plain = _pair("oelm-freeze")
    compiled = torch.compile(fused, fullgraph=True)
    x = torch.randint(0, VOCAB, (2, 16))
    loss = compiled(x, x, return_logits=False)[1]
    loss.backward()
    ref = plain(x, x)[1]
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            assert torch.allclose(p.grad, q.grad, atol=1e-5), name


def test_bias_all_or_none():
    w = torch.ones(2, 2)
    with pytest.raises(ValueError, match="all of Q, K, V"):
        fused_qkv(torch.ones(1, 2), w, w, w, torch.ones(2), None, None)


@pytest.mark.parametrize("train_k,train_v", [(True, True), (False, True), (True, False), (False, False)])
def test_identity_qkv_gradients_match_autograd_for_any_trainable_blocks(train_k, train_v):
    """W_Q = I: q is x, kv one GEMM; the input gradient (dq folded into one addmm) and each
    wanted weight gradient equal autograd's on the plain expression; unwanted ones are None."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=g, requires_grad=True)
    wk = torch.randn(4, 8, dtype=torch.float64, generator=g, requires_grad=train_k)
    wv = torch.randn(8, 8, dtype=torch.float64, generator=g, requires_grad=train_v)
    assert torch.autograd.gradcheck(lambda *a: IdentityQKV.apply(*a), (x, wk, wv))
    q, kv = identity_qkv(x, wk, wv)
    dq, dkv = torch.randn_like(q), torch.randn_like(kv)
    grads = torch.autograd.grad((q * dq).sum() + (kv * dkv).sum(), [t for t in (x, wk, wv) if t.requires_grad])
    ref_x = x.detach().clone().requires_grad_()
    ref_k, ref_v = wk.detach().clone().requires_grad_(train_k), wv.detach().clone().requires_grad_(train_v)
    ref = (ref_x * dq).sum() + (ref_x @ torch.cat((ref_k, ref_v)).t() * dkv).sum()
    expect = torch.autograd.grad(ref, [t for t in (ref_x, ref_k, ref_v) if t.requires_grad])
    assert len(grads) == len(expect) and all(torch.allclose(a, b) for a, b in zip(grads, expect))


def test_identity_qkv_reads_one_cast_of_x_and_runs_one_input_gradient_gemm():
    """Under bf16 autocast q is the bf16 copy the K/V GEMM reads, and backward runs the input
    gradient as one addmm (no separate add of q's gradient): the kernels an H100 profile found."""
    x = torch.randn(6, 8, requires_grad=True)
    wk, wv = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, kv = identity_qkv(x, wk, wv)
    assert q.dtype == kv.dtype == torch.bfloat16
    loss = q.float().sum() + kv.float().sum()
    with torch.profiler.profile() as prof:
        loss.backward()
    names = [e.name for e in prof.events()]
    assert "aten::addmm" in names and "aten::add" not in names and "aten::add_" not in names
    assert x.grad.dtype == torch.float32 and wk.grad.dtype == wv.grad.dtype == torch.float32
