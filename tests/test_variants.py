"""The frozen-Q/K variants: each trains, frozen stays bit-identical, added tensors train, counts exact."""

from __future__ import annotations

import math

import pytest
import torch

import oelm
from oelm import apply_method
from oelm.core.adapters import iter_adapters
from oelm.core.audit import audit_model, fingerprint, verify_audit
from oelm.core.flops import theoretical_saving
from oelm.core.freezing import optimizer_groups, sync_optimizer
from oelm.core.methods import get_method, list_methods, validate_method_options
from oelm.core.schedules import make_schedule
from oelm.models.gpt import GPT, gpt_config
from oelm.utils.errors import UserError

VOCAB, D, H, L, T = 50, 32, 4, 2, 16
QK = D * D  # one Q or K weight of our GPT (bias-free)


def tiny_gpt(n_layer: int = L) -> GPT:
    torch.manual_seed(0)
    return GPT(gpt_config("gpt-tiny", vocab_size=VOCAB, block_size=T, n_layer=n_layer, d_model=D, n_head=H))


# method, options, frozen Q/K numel at the start, adapter numel
CASES = [
    ("oelm-freeze-q", {}, L * QK, 0),
    ("oelm-freeze-k", {}, L * QK, 0),
    ("oelm-temp", {}, 2 * L * QK, L * H),
    ("oelm-gain", {}, 2 * L * QK, L * D),
    ("oelm-qknorm", {}, 2 * L * QK, L * 2 * (D // H)),
    ("oelm-lowrank", {"rank": 2}, 2 * L * QK, L * 2 * 2 * (D + D)),
    ("oelm-qbias", {}, 2 * L * QK, L * D),
    ("oelm-late-freeze", {"f": 0.5}, 0, 0),
    ("oelm-late-freeze", {"f": 0.5, "on_freeze": "reorthogonalize"}, 0, 0),
    ("oelm-unfreeze", {"f": 0.5}, 2 * L * QK, 0),
    ("oelm-lower-half", {}, 2 * QK, 0),
    ("oelm-upper-half", {}, 2 * QK, 0),
    ("oelm-alternate", {}, 2 * QK, 0),
    ("oelm-freeze", {"layers": [1]}, 2 * QK, 0),
    ("baseline-scaled", {}, 0, 0),
    ("baseline-torch", {}, 0, 0),
    ("oelm-identity-q", {}, L * QK, L * H),
    ("oelm-mimetic", {}, 2 * L * QK, 0),
    ("oelm-mimetic-nofreeze", {}, 0, 0),
    ("identity-q", {}, 0, 0),
    ("identity-q", {"attn_scale": 1.0, "weight_decay": 0.1}, 0, 0),
    ("frozen-qk", {}, 2 * L * QK, 0),
    ("frozen-qk", {"qk_std": 0.02}, 2 * L * QK, 0),
    ("frozen-qk-nofreeze", {}, 0, 0),
]
# Parameters a method removes from the model (W_Q = I: no Q projection at all).
REMOVED = {"identity-q": L * QK}


def train_steps(model: GPT, steps: int = 6, lr: float = 1e-2):
    """A few AdamW steps with the schedule driven by step, as the loop does; returns the audit."""
    audit = audit_model(model)
    schedule = make_schedule(model, steps)
    opt = torch.optim.AdamW(optimizer_groups(model, 0.1), lr=lr)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        if schedule is not None and schedule.update(step, audit):
            sync_optimizer(opt, model, 0.1)
        x = torch.randint(0, VOCAB, (4, T), generator=gen)
        model(x, x)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return audit, opt


@pytest.mark.parametrize("method,options,frozen,added", CASES)
def test_variant_trains_frozen_stays_added_moves_counts_exact(method, options, frozen, added):
    model = tiny_gpt()
    base_total = sum(p.numel() for p in model.parameters())
    apply_method(model, method, seed=0, **options)
    audit = audit_model(model)
    t = audit.totals
    assert t["frozen"] == frozen
    assert t["trainable"] == base_total + added - frozen - REMOVED.get(method, 0)
    assert t["by_role"].get("adapter", {"trainable": 0})["trainable"] == added
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    audit, opt = train_steps(model)
    check = verify_audit(model, audit, opt)
    assert check.ok, check.problems
    for row in audit.rows:  # frozen at the end: bit-identical since start (or since the switch)
        if not row.trainable:
            assert fingerprint(dict(model.named_parameters())[row.name]) == row.fingerprint
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    adapters = {n for n, _ in model.named_parameters() if ".oelm_adapter." in n}
    assert len(adapters) == (0 if not added else L * len(get_adapter_roles(method)))
    assert adapters <= moved, "the added tensors must train"
    assert "transformer.h.0.attn.v_proj.weight" in moved


def get_adapter_roles(method: str) -> tuple[str, ...]:
    from oelm.core.adapters import adapter_class

    m = get_method(method)
    n_params = {"temp": 1, "gain": 1, "qknorm": 1, "lowrank": 2, "qbias": 1}[m.adapter]
    return adapter_class(m.adapter).roles * n_params


def test_schedules_switch_at_their_step():
    late, unfreeze = tiny_gpt(), tiny_gpt()
    apply_method(late, "oelm-late-freeze", seed=0, f=0.5, on_freeze="reorthogonalize")
    apply_method(unfreeze, "oelm-unfreeze", seed=0, f=0.5)
    q = "transformer.h.0.attn.q_proj.weight"
    start = late.get_parameter(q).detach().clone()
    audit, _ = train_steps(late)
    assert not late.get_parameter(q).requires_grad and audit.schedule["switched"]
    assert not torch.equal(late.get_parameter(q), start), "Q trained before the freeze"
    assert audit.totals["max_orthogonality_error"] == 0.0  # totals describe the start
    assert audit_model(late).totals["max_orthogonality_error"] < 1e-5  # reorthogonalized heads
    frozen_q = unfreeze.get_parameter(q).detach().clone()
    audit, _ = train_steps(unfreeze)
    assert unfreeze.get_parameter(q).requires_grad and audit.schedule["at_step"] == 3
    assert not torch.equal(unfreeze.get_parameter(q), frozen_q), "Q trains after the unfreeze"


def test_unfreeze_flags_a_tensor_that_moved_before_its_step():
    model = tiny_gpt()
    apply_method(model, "oelm-unfreeze", seed=0, f=0.5)
    audit = audit_model(model)
    schedule = make_schedule(model, 10)
    with torch.no_grad():
        model.transformer.h[0].attn.k_proj.weight.add_(1e-3)
    assert schedule.update(5, audit)
    check = verify_audit(model, audit)
    assert not check.ok and any("changed before its unfreeze step 5" in p for p in check.problems)


def test_adapters_at_init_leave_the_function_unchanged_and_apply_through_adapt():
    x = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    ref = tiny_gpt()
    apply_method(ref, "oelm-freeze", seed=0)
    for method in ("oelm-temp", "oelm-gain", "oelm-lowrank", "oelm-qbias"):
        model = tiny_gpt()
        apply_method(model, method, seed=0)
        assert torch.equal(model(x)[0], ref(x)[0]), method  # identity at init (ones, B = 0)
        with torch.no_grad():
            for _, a in iter_adapters(model):
                next(iter(reversed(list(a.parameters())))).add_(0.5)
        assert not torch.allclose(model(x)[0], ref(x)[0]), method


def test_options_are_typed_with_defaults_and_a_typo_names_the_valid_keys():
    opts = validate_method_options("oelm-lowrank", {})
    assert opts == {"qk_init": None, "layers": "all", "rank": 8}
    assert validate_method_options("oelm-late-freeze", {"f": 1})["f"] == 1.0
    with pytest.raises(UserError, match="unknown method option 'bogus'.*valid options: qk_init, layers, rank"):
        validate_method_options("oelm-lowrank", {"bogus": 1})
    with pytest.raises(UserError, match="did you mean 'rank'"):
        validate_method_options("oelm-lowrank", {"rnak": 4})
    with pytest.raises(UserError, match="method_options.rank must be int"):
        validate_method_options("oelm-lowrank", {"rank": "big"})
    with pytest.raises(UserError, match=r"method_options.f must lie in \[0.0, 1.0\]"):
        validate_method_options("oelm-unfreeze", {"f": 1.5})
    with pytest.raises(UserError, match="on_freeze must be one of"):
        validate_method_options("oelm-late-freeze", {"on_freeze": "melt"})
    with pytest.raises(UserError, match="out of range"):
        apply_method(tiny_gpt(), "oelm-freeze", layers=[5])
    assert validate_method_options("baseline", {"qk_init": "keep"})["qk_init"] == "keep"


def test_every_registered_method_validates_its_defaults():
    for m in list_methods():
        opts = validate_method_options(m.name, {})
        assert set(opts) == {o.name for o in m.all_options()}


def test_theoretical_saving_covers_adapters_schedules_and_layer_subsets():
    def saving(method: str, **options) -> float:
        model = tiny_gpt()
        apply_method(model, method, seed=0, **options)
        make_schedule(model, 100)
        return theoretical_saving(model, T)

    full = saving("oelm-freeze")
    assert saving("oelm-temp") == pytest.approx(full)  # elementwise adapters: no matmul FLOPs
    assert saving("oelm-lowrank", rank=2) < full
    assert saving("oelm-late-freeze", f=0.25) == pytest.approx(0.75 * full)
    assert saving("oelm-early-freeze") == pytest.approx(0.8 * full)  # f defaults to 0.2
    assert saving("oelm-unfreeze", f=0.25) == pytest.approx(0.25 * full)
    assert saving("oelm-lower-half") == pytest.approx(full / 2)
    assert saving("oelm-freeze-q") == pytest.approx(full / 2)
    model = tiny_gpt()
    apply_method(model, "oelm-lowrank", seed=0, rank=2)
    from oelm.core.flops import executed_flops

    x = torch.randint(0, VOCAB, (2, T))
    ref = tiny_gpt()
    apply_method(ref, "oelm-freeze", seed=0)
    extra = executed_flops(lambda: model(x, x)[1].backward()) - executed_flops(lambda: ref(x, x)[1].backward())
    # Low-rank on Q and K of each layer: forward, input gradient and both weight gradients.
    assert extra == 3 * L * 2 * x.numel() * 2 * 2 * (D + D)


def test_layer_lr_decay_scales_groups_by_depth():
    model = tiny_gpt()
    apply_method(model, "oelm-freeze", seed=0)
    groups = optimizer_groups(model, 0.1, layer_lr_decay=0.5)
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    assert scale[id(model.transformer.wte.weight)] == 0.5 ** (L + 1)
    assert scale[id(model.transformer.h[0].attn.v_proj.weight)] == 0.5**L
    assert scale[id(model.transformer.h[L - 1].mlp.fc_in.bias)] == 0.5
    assert scale[id(model.transformer.ln_f.weight)] == 1.0
    assert id(model.transformer.h[0].attn.q_proj.weight) not in scale  # frozen: in no group
    assert all(g["weight_decay"] == 0.0 for g in groups if any(p.ndim < 2 for p in g["params"]))


def _hf_lm(family: str):
    import transformers as tf

    torch.manual_seed(0)
    common = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 1}
    if family == "gpt2":
        cfg = tf.GPT2Config(n_embd=D, n_layer=L, n_head=H, n_positions=T, **common)
    else:
        cfg = tf.LlamaConfig(
            hidden_size=D,
            num_hidden_layers=L,
            num_attention_heads=H,
            num_key_value_heads=2,
            intermediate_size=64,
            **common,
        )
    return tf.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["oelm-temp", "oelm-gain", "oelm-qknorm", "oelm-lowrank"])
def test_adapters_work_on_hugging_face_families(family, method):
    x = torch.randint(2, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    ref, model = _hf_lm(family).eval(), _hf_lm(family).eval()
    apply_method(ref, "oelm-freeze", seed=0)
    apply_method(model, method, seed=0)
    keys, ref_keys = set(model.state_dict()), set(ref.state_dict())
    assert ref_keys <= keys and all(".oelm_adapter." in k for k in keys - ref_keys)  # originals stable
    added = {n: p for n, p in model.named_parameters() if ".oelm_adapter." in n}
    n_kv = 2 if family == "llama" else H
    per_layer = {
        "oelm-temp": H,
        "oelm-gain": D,
        "oelm-qknorm": 2 * (D // H),
        "oelm-lowrank": 8 * (D + D) + 8 * (D + n_kv * (D // H)),
    }[method]
    assert sum(p.numel() for p in added.values()) == L * per_layer
    audit = audit_model(model)
    assert audit.totals["by_role"]["adapter"]["trainable"] == L * per_layer
    q_row = next(r for r in audit.rows if r.role == "q" and r.name.endswith("weight"))
    assert q_row.init == "headwise-orthogonal" and not q_row.trainable  # real names, also GPT-2's split Q
    if method != "oelm-qknorm":  # identity at init
        assert torch.allclose(model(input_ids=x).logits, ref(input_ids=x).logits, atol=1e-6)
    with torch.no_grad():
        for p in added.values():
            p.add_(0.1)  # the adapter is on the forward path
    assert not torch.allclose(model(input_ids=x).logits, ref(input_ids=x).logits, atol=1e-4)
    model(input_ids=x, labels=x).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in added.values())
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)


def test_the_trainable_baselines_start_q_k_at_their_stated_inits() -> None:
    """baseline (N(0, 0.02)), baseline-torch (nn.Linear's U(+-1/sqrt(d))) and baseline-scaled (unit-norm
    rows, the orthogonal init's scale): the three inits a frozen variant is compared against."""
    stds = {}
    for method in ("baseline", "baseline-torch", "baseline-scaled", "oelm-freeze"):
        model = GPT(gpt_config("gpt-tiny", vocab_size=VOCAB, block_size=T))
        oelm.apply_method(model, method, seed=0)
        q = model.transformer.h[0].attn.q_proj.weight
        assert q.requires_grad == (method != "oelm-freeze")
        stds[method] = float(q.std())
        d = q.shape[1]
        if method == "baseline-torch":
            assert float(q.abs().max()) <= 1 / math.sqrt(d)
            assert float(q.std()) == pytest.approx(1 / math.sqrt(3 * d), rel=0.05)
        if method == "baseline-scaled":
            assert torch.allclose(q.norm(dim=1), torch.ones(q.shape[0]), atol=1e-5)
    assert stds["baseline"] == pytest.approx(0.02, rel=0.05)
    assert stds["baseline-scaled"] == pytest.approx(stds["oelm-freeze"], rel=0.05)  # scale-matched


def test_identity_q_passes_its_input_through():
    model = tiny_gpt()
    apply_method(model, "oelm-identity-q", seed=0)
    for block in model.transformer.h:
        w = block.attn.q_proj.weight
        assert torch.equal(w, torch.eye(w.shape[0], dtype=w.dtype))
        assert not w.requires_grad and block.attn.k_proj.weight.requires_grad


def test_mimetic_heads_fit_alpha_z_plus_beta_i():
    """Each head's Q_h^T K_h is the best rank-head_dim fit of a matrix near 0.7 I: its trace shows the identity part."""
    from oelm.core import orthogonal as ortho

    n_heads, head_dim, d = 4, 8, 32
    q, k = ortho.mimetic_pair(n_heads, head_dim, d, ortho.make_generator(0, "t"))
    assert q.shape == k.shape == (n_heads * head_dim, d)
    for h in range(n_heads):
        qh, kh = q[h * head_dim : (h + 1) * head_dim], k[h * head_dim : (h + 1) * head_dim]
        m = qh.T @ kh  # [d, d], rank head_dim
        assert torch.linalg.matrix_rank(m) == head_dim
        # Diagonal-heavy: the mean diagonal entry is well above the mean |off-diagonal| entry.
        off = (m - torch.diag(torch.diagonal(m))).abs().sum() / (d * d - d)
        assert torch.diagonal(m).mean() > 3 * off
    # Same seed, same pair; another seed, another pair.
    q2, _ = ortho.mimetic_pair(n_heads, head_dim, d, ortho.make_generator(0, "t"))
    q3, _ = ortho.mimetic_pair(n_heads, head_dim, d, ortho.make_generator(1, "t"))
    assert torch.equal(q, q2) and not torch.equal(q, q3)


def test_identity_q_refuses_a_non_square_projection():
    from oelm.core import orthogonal as ortho

    with pytest.raises(UserError, match="square"):
        ortho.identity(16, 32)


def thin_gpt(qk_dim: int = D // 4) -> GPT:
    torch.manual_seed(0)
    return GPT(gpt_config("gpt-tiny", vocab_size=VOCAB, block_size=T, n_layer=L, d_model=D, n_head=H, qk_dim=qk_dim))


def test_thin_keys_needs_a_thin_model_and_freezes_exactly_its_qk():
    with pytest.raises(UserError, match="qk_dim=8"):
        apply_method(tiny_gpt(), "oelm-thin-keys", seed=0)
    transformers = pytest.importorskip("transformers")
    bert = transformers.BertModel(
        transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    )
    with pytest.raises(UserError, match="only oelm's own"):
        apply_method(bert, "oelm-thin-keys", seed=0)
    model = thin_gpt()
    apply_method(model, "oelm-thin-keys", seed=0)
    audit, opt = train_steps(model)
    assert audit.totals["frozen"] == 2 * L * D * (D // 4)
    check = verify_audit(model, audit, opt)
    assert check.ok, check.problems
    # Each head's Q rows (head_dim / 4 of them) are orthonormal.
    from oelm.core.orthogonal import orthogonality_error

    assert orthogonality_error(model.transformer.h[0].attn.q_proj.weight, H) < 1e-6


def test_thin_keys_flops_are_counted_as_executed_and_saved_against_full_width():
    from oelm.core.flops import executed_flops, training_flops_per_token

    x = torch.randint(0, VOCAB, (2, T))
    counts = {}
    for method, model in (("oelm-thin-keys-nofreeze", thin_gpt()), ("oelm-thin-keys", thin_gpt())):
        apply_method(model, method, seed=0)
        counts[method] = executed_flops(lambda m=model: m(x, x)[1].backward())
        assert counts[method] == pytest.approx(training_flops_per_token(model, T) * x.numel(), rel=1e-9)
    # Freezing skips exactly the thin Q/K weight gradients.
    assert counts["oelm-thin-keys-nofreeze"] - counts["oelm-thin-keys"] == 2 * L * 2 * x.numel() * D * (D // 4)
    full = tiny_gpt()
    apply_method(full, "oelm-freeze", seed=0)
    thin = thin_gpt()
    apply_method(thin, "oelm-thin-keys", seed=0)
    twin = thin_gpt()
    apply_method(twin, "oelm-thin-keys-nofreeze", seed=0)
    # Against the full-width model: the thin twin already saves (narrower Q/K and scores); the
    # frozen one saves more than oelm-freeze.
    assert 0 < theoretical_saving(twin, T) < theoretical_saving(thin, T)
    assert theoretical_saving(thin, T) > theoretical_saving(full, T)
    base = tiny_gpt()
    apply_method(base, "baseline", seed=0)
    f_base = training_flops_per_token(base, T)
    assert theoretical_saving(twin, T) == pytest.approx(1 - training_flops_per_token(twin, T) / f_base)


def test_trainers_build_the_thin_width_for_a_thin_method():
    from oelm.training.task import checked_model_config

    assert checked_model_config("gpt-tiny", {}, "oelm-thin-keys").qk_dim == 32
    assert checked_model_config("gpt-tiny", {}, "oelm-freeze").qk_width == 128
    assert checked_model_config("gpt-tiny", {"qk_dim": 64}, "oelm-freeze").qk_dim == 64
    with pytest.raises(UserError, match="multiple of n_head"):
        checked_model_config("gpt-tiny", {"n_head": 64}, "oelm-thin-keys")
    with pytest.raises(UserError, match="qk_dim"):
        gpt_config("gpt-tiny", qk_dim=30)


def test_each_frozen_init_finds_its_same_init_trainable_twin():
    from oelm.core.methods import twin_of

    assert twin_of("oelm-freeze") == "oelm-nofreeze"
    assert twin_of("oelm-late-freeze") == "oelm-nofreeze"
    assert twin_of("oelm-qknorm") == "oelm-nofreeze"
    assert twin_of("oelm-random-scaled") == "baseline-scaled"
    assert twin_of("oelm-mimetic") == "oelm-mimetic-nofreeze"
    assert twin_of("oelm-thin-keys") == "oelm-thin-keys-nofreeze"
    # No registered twin: K keeps its default init in freeze-q; identity Q has no trainable record.
    assert twin_of("oelm-freeze-q") is None
    assert twin_of("oelm-identity-q") is None
    assert twin_of("baseline") is None and twin_of("oelm-nofreeze") is None
