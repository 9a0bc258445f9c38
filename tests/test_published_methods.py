"""The published variants: identity-Q without its Q matmul (arXiv 2510.23912) and Frozen-QK (arXiv 2506.01115)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from oelm import apply_method
from oelm.core.audit import audit_model
from oelm.core.flops import executed_flops, theoretical_saving, training_flops_per_token
from oelm.core.freezing import method_weight_decay, optimizer_groups
from oelm.core.methods import twin_of
from oelm.models.gpt import GPT, gpt_config
from oelm.utils.errors import UserError

VOCAB, D, H, L, T = 50, 32, 4, 2, 16


def tiny_gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    cfg = {"vocab_size": VOCAB, "block_size": T, "n_layer": L, "d_model": D, "n_head": H} | overrides
    return GPT(gpt_config("gpt-tiny", **cfg))


def test_identity_q_has_no_q_weight_and_its_attention_reads_the_normed_input():
    model = tiny_gpt()
    base_total = sum(p.numel() for p in model.parameters())
    apply_method(model, "identity-q", seed=0, attn_scale=0.5)
    assert model.config.q_identity and model.config.attn_scale == 0.5
    assert not any("q_proj" in n for n, _ in model.named_parameters())
    assert sum(p.numel() for p in model.parameters()) == base_total - L * D * D
    totals = audit_model(model).totals
    assert totals["total"] == base_total - L * D * D
    assert totals["q_identity"] == {"layers": L, "absent": L * D * D} and "q" not in totals["by_role"]
    # One layer by hand: q = ln_1(x) split into heads, logits scaled by 0.5 / sqrt(head_dim).
    block, x = model.transformer.h[0], torch.randn(2 * T, D)
    attn = block.attn
    k, v = (p(x).view(2, T, H, -1).transpose(1, 2) for p in (attn.k_proj, attn.v_proj))
    q = x.view(2, T, H, -1).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5 / math.sqrt(D // H))
    want = attn.o_proj(y.transpose(1, 2).reshape(2 * T, D))
    assert torch.allclose(attn(x, 2, causal=True), want, atol=1e-6)


def test_identity_q_drops_exactly_the_q_matmul_forward_and_backward():
    x = torch.randint(0, VOCAB, (2, T))
    counts = {}
    for method in ("baseline", "identity-q", "oelm-freeze"):
        model = tiny_gpt()
        apply_method(model, method, seed=0)
        counts[method] = executed_flops(lambda m=model: m(x, x)[1].backward())
        assert counts[method] == pytest.approx(training_flops_per_token(model, T) * x.numel(), rel=1e-12)
    # Forward, input gradient and weight gradient of Q (2 FLOPs per multiply-add) in every layer.
    assert counts["baseline"] - counts["identity-q"] == L * 3 * 2 * x.numel() * D * D
    # Freezing Q and K saves their weight gradients only: two thirds of that.
    assert counts["baseline"] - counts["oelm-freeze"] == L * 2 * 2 * x.numel() * D * D
    # Each step of the fused and the three-GEMM paths: the same FLOPs and the same loss.
    model = tiny_gpt()
    apply_method(model, "identity-q", seed=0)
    fused = model(x, x)[1]
    for block in model.transformer.h:
        block.attn.fused = False
    assert executed_flops(lambda: model(x, x)[1].backward()) == counts["identity-q"]
    assert torch.allclose(model(x, x)[1], fused)


def test_identity_q_saves_more_than_oelm_freeze_at_every_named_shape():
    for preset, overrides, seq in (
        ("gpt-tiny", {}, 512),
        ("gpt-small", {}, 512),
        ("gpt-small", {"n_layer": 12, "d_model": 768, "n_head": 12, "block_size": 1024}, 1024),  # GPT-2 small
    ):
        savings = {}
        for method in ("oelm-freeze", "identity-q"):
            with torch.device("meta"):  # shapes only: no memory, no init
                model = GPT(gpt_config(preset, **overrides))
            apply_method(model, method, seed=0)
            savings[method] = theoretical_saving(model, seq)
        # Q's three matmuls against Q's and K's weight gradients: 3 / 4 of d*d per layer more.
        assert savings["identity-q"] == pytest.approx(1.5 * savings["oelm-freeze"], rel=1e-9), preset


def test_attn_scale_multiplies_the_logits():
    """Scores are linear in K: attn_scale = s equals attn_scale = 1 with every K weight times s."""
    x = torch.randint(0, VOCAB, (2, T))
    half, one = tiny_gpt(), tiny_gpt()
    apply_method(half, "identity-q", seed=0, attn_scale=0.5)
    apply_method(one, "identity-q", seed=0, attn_scale=1.0)
    assert one.transformer.h[0].attn.scale is None  # SDPA's own 1/sqrt(head_dim)
    assert not torch.allclose(half(x)[0], one(x)[0])
    with torch.no_grad():
        for block in one.transformer.h:
            block.attn.k_proj.weight.mul_(0.5)
    assert torch.allclose(half(x)[0], one(x)[0], atol=1e-5)


def test_the_weight_decay_option_reaches_the_optimizer():
    model = tiny_gpt()
    apply_method(model, "identity-q", seed=0)
    groups = optimizer_groups(model, weight_decay=0.1)
    assert [g["weight_decay"] for g in groups] == [0.03, 0.0]  # the paper's 0.03 replaces the run's 0.1
    assert method_weight_decay(model, 0.1) == 0.03
    other = tiny_gpt()
    apply_method(other, "identity-q", seed=0, weight_decay=0.2)
    assert {g["weight_decay"] for g in optimizer_groups(other, 0.1, layer_lr_decay=0.5)} == {0.2, 0.0}
    plain = tiny_gpt()
    apply_method(plain, "oelm-freeze", seed=0)
    assert [g["weight_decay"] for g in optimizer_groups(plain, 0.1)] == [0.1, 0.0]


def test_identity_q_trains_through_oelm_train_with_its_weight_decay_and_reloads(tmp_path: Path):
    from oelm.training.checkpoint import STATE, step_dir_name
    from oelm.training.loop import train
    from oelm.training.runs import load_model
    from train_utils import one_thread, synthetic_lm_dir, tiny_config

    data = synthetic_lm_dir(tmp_path / "data", n_train=4000)
    cfg = tiny_config(
        data,
        tmp_path / "run",
        method="identity-q",
        steps=3,
        eval_every=0,
        checkpoint_every=0,
        model_overrides={"n_layer": 2, "d_model": 32, "n_head": 4, "block_size": 32},
        timing_warmup=0,
    )
    with one_thread():
        results = train(cfg)
    assert results["freeze_check"]["ok"], results["freeze_check"]
    # The optimizer the loop built (its checkpoint): the arm's 0.03, not the config's weight_decay.
    assert cfg.get("weight_decay", 0.1) != 0.03
    state = torch.load(tmp_path / "run" / "checkpoints" / step_dir_name(3) / STATE, weights_only=False)
    assert sorted(g["weight_decay"] for g in state["optimizer"]["param_groups"]) == [0.0, 0.03]
    model = load_model(tmp_path / "run", which="latest")
    assert model.config.q_identity and model.config.attn_scale == 0.5
    assert not any("q_proj" in n for n, _ in model.named_parameters())
    x = torch.randint(0, 60, (1, 8))
    assert torch.isfinite(model(x)[0]).all()


def test_bad_identity_q_options_and_models_are_refused_before_any_change():
    with pytest.raises(UserError, match=r"attn_scale must lie in"):
        apply_method(tiny_gpt(), "identity-q", attn_scale=0.0)
    with pytest.raises(UserError, match=r"weight_decay must lie in"):
        apply_method(tiny_gpt(), "identity-q", weight_decay=-0.1)
    with pytest.raises(UserError, match="weight_decay must be float"):
        apply_method(tiny_gpt(), "identity-q", weight_decay="low")
    with pytest.raises(UserError, match="every layer"):
        apply_method(tiny_gpt(), "identity-q", layers=[0])
    thin = tiny_gpt(qk_dim=D // 2)
    with pytest.raises(UserError, match="q_identity needs Q as wide as the model"):
        apply_method(thin, "identity-q")
    assert thin.transformer.h[0].attn.q_proj is not None  # untouched
    with pytest.raises(UserError, match="q_identity needs Q as wide"):
        gpt_config("gpt-tiny", qk_dim=64, q_identity=True)
    with pytest.raises(UserError, match="attn_scale must be a positive"):
        gpt_config("gpt-tiny", attn_scale=-1.0)
    # A model built without Q refuses methods that initialize, freeze or adapt Q.
    for method in ("oelm-freeze", "oelm-identity-q", "frozen-qk", "oelm-temp"):
        with pytest.raises(UserError, match="no Q projection"):
            apply_method(tiny_gpt(q_identity=True), method)
    apply_method(tiny_gpt(q_identity=True), "baseline")  # leaves Q alone: fine
    transformers = pytest.importorskip("transformers")
    bert = transformers.BertModel(
        transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    )
    with pytest.raises(UserError, match="no q_identity flag"):
        apply_method(bert, "identity-q")


def test_frozen_qk_draws_width_scaled_random_q_k_and_has_a_twin():
    model = tiny_gpt(d_model=128, n_head=4)
    apply_method(model, "frozen-qk", seed=0)
    attn = model.transformer.h[0].attn
    for w in (attn.q_proj.weight, attn.k_proj.weight):
        assert not w.requires_grad
        assert float(w.std()) == pytest.approx(1 / math.sqrt(128), rel=0.05)
    assert not torch.equal(attn.q_proj.weight, attn.k_proj.weight)
    custom = tiny_gpt(d_model=128, n_head=4)
    apply_method(custom, "frozen-qk", seed=0, qk_std=0.02)
    assert float(custom.transformer.h[0].attn.q_proj.weight.std()) == pytest.approx(0.02, rel=0.05)
    twin = tiny_gpt(d_model=128, n_head=4)
    apply_method(twin, "frozen-qk-nofreeze", seed=0)
    assert torch.equal(twin.transformer.h[0].attn.q_proj.weight, attn.q_proj.weight)  # same init, trainable
    assert twin.transformer.h[0].attn.q_proj.weight.requires_grad
    assert twin_of("frozen-qk") == "frozen-qk-nofreeze"
    with pytest.raises(UserError, match=r"qk_std must lie in"):
        apply_method(tiny_gpt(), "frozen-qk", qk_std=0.0)


@pytest.mark.parametrize("method", ["identity-q", "frozen-qk"])
def test_the_published_methods_apply_to_the_llama_family(method):
    """Both switch on through the generic path: Q removed (config flag) or random frozen Q/K, FLOPs exact."""
    from oelm.core.audit import verify_audit
    from oelm.models.llama import Llama, llama_config

    def tiny_llama() -> Llama:
        torch.manual_seed(0)
        return Llama(llama_config("llama-tiny", vocab_size=VOCAB, block_size=T, d_model=D, n_head=H, n_kv_head=2))

    x = torch.randint(0, VOCAB, (2, T))
    base = tiny_llama()
    apply_method(base, "baseline", seed=0)
    model = tiny_llama()
    apply_method(model, method, seed=0)
    flops = executed_flops(lambda: model(x, x)[1].backward())
    assert flops == pytest.approx(training_flops_per_token(model, T) * x.numel(), rel=1e-12)
    saved = executed_flops(lambda: base(x, x)[1].backward()) - flops
    kv_rows = D // H * 2  # grouped-query K: 2 key/value heads of head_dim D / H
    if method == "identity-q":
        assert model.config.q_identity and model.config.attn_scale == 0.5
        assert not any("q_proj" in n for n, _ in model.named_parameters())
        assert saved == L * 3 * 2 * x.numel() * D * D  # Q's forward, input and weight gradient
    else:
        q = model.model.layers[0].self_attn.q_proj.weight
        assert not q.requires_grad and float(q.std()) == pytest.approx(1 / math.sqrt(D), rel=0.15)
        assert saved == L * 2 * x.numel() * (D * D + kv_rows * D)  # Q's and K's weight gradients
    audit = audit_model(model)
    opt = torch.optim.AdamW(optimizer_groups(model, 0.1), lr=1e-2)
    for _ in range(2):
        model(x, x)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    check = verify_audit(model, audit, opt)
    assert check.ok, check.problems
