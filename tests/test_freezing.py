"""apply_method on every supported family: orthonormal heads, real freezing, audit, save/reload."""

from __future__ import annotations

import pytest
import torch

from oelm import apply_method, get_method, list_methods
from oelm.core.audit import audit_model, verify_audit
from oelm.core.flops import executed_flops
from oelm.core.freezing import optimizer_groups
from oelm.core.orthogonal import orthogonality_error
from oelm.core.targets import find_targets
from oelm.models.gpt import GPT, GPTClassifier, gpt_config
from oelm.models.llama import Llama, llama_config
from oelm.utils.errors import UserError

VOCAB = 97


def _hf(name: str):
    import transformers as T

    common = {"vocab_size": VOCAB, "num_labels": 3, "pad_token_id": 0}
    cfg = {
        "bert": lambda: T.BertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **common
        ),
        "roberta": lambda: T.RobertaConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=80,
            **common,
        ),
        "distilbert": lambda: T.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64, **common),
        "gpt2": lambda: T.GPT2Config(
            n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=1, **common
        ),
        "llama": lambda: T.LlamaConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            bos_token_id=1,
            eos_token_id=1,
            **common,
        ),
    }[name]()
    return T.AutoModelForSequenceClassification.from_config(cfg)


def make(family: str):
    torch.manual_seed(0)
    if family == "oelm-gpt":
        return GPT(gpt_config("gpt-tiny", vocab_size=VOCAB, block_size=32))
    if family == "oelm-gpt-classifier":
        return GPTClassifier(gpt_config("gpt-tiny", vocab_size=VOCAB, block_size=32), num_labels=3)
    if family == "oelm-llama":
        return Llama(llama_config("llama-tiny", vocab_size=VOCAB, block_size=32))
    return _hf(family)


def loss_of(model, x: torch.Tensor) -> torch.Tensor:
    if isinstance(model, (GPT, Llama)):
        return model(x, x)[1]
    y = torch.arange(x.shape[0]) % 3
    if isinstance(model, GPTClassifier):
        return model(x, labels=y)[1]
    return model(input_ids=x, labels=y).loss


FAMILIES = ["oelm-gpt", "oelm-gpt-classifier", "oelm-llama", "bert", "roberta", "distilbert", "gpt2", "llama"]


@pytest.mark.parametrize("family", FAMILIES)
def test_oelm_freeze_gives_orthonormal_frozen_heads(family):
    model = make(family)
    state = apply_method(model, "oelm-freeze", seed=0)
    layers = find_targets(model).layers
    assert len(layers) == 2
    for layer in layers:
        assert orthogonality_error(layer.q.get(), layer.n_heads) < 1e-5
        assert orthogonality_error(layer.k.get(), layer.n_kv_heads) < 1e-5
        for proj in (layer.q, layer.k):
            assert all(not p.requires_grad for _, p in proj.params())  # biases frozen too
        for proj in (layer.v, layer.o, *layer.ffn):
            assert all(p.requires_grad for _, p in proj.params())
    assert audit_model(model).totals["max_orthogonality_error"] < 1e-5
    assert state.method.name == "oelm-freeze"


def test_gqa_keys_have_fewer_heads_than_queries():
    model = make("llama")
    apply_method(model, "oelm-freeze", seed=0)
    layer = find_targets(model).layers[0]
    assert layer.n_kv_heads == 2 and layer.n_heads == 4
    assert layer.k.shape_out_in == (16, 32) and layer.q.shape_out_in == (32, 32)


@pytest.mark.parametrize("family", FAMILIES)
def test_frozen_tensors_are_bit_identical_after_adamw_with_weight_decay(family):
    model = make(family)
    apply_method(model, "oelm-freeze", seed=0)
    audit = audit_model(model)
    trainable_before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(optimizer_groups(model, weight_decay=0.1), lr=1e-2)
    x = torch.randint(1, VOCAB, (4, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        loss_of(model, x).backward()
        for name, p in model.named_parameters():
            if not p.requires_grad:
                assert p.grad is None, name
        opt.step()
        opt.zero_grad(set_to_none=True)
    check = verify_audit(model, audit, opt)
    assert check.ok, check.problems
    n_frozen = sum(1 for p in model.parameters() if not p.requires_grad)
    assert check.n_frozen_checked == n_frozen >= 4
    moved = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad and n in trainable_before and not torch.equal(p, trainable_before[n])
    ]
    assert moved, "training should move the trainable tensors"


def test_verify_audit_catches_a_moved_frozen_tensor_and_a_bad_optimizer():
    model = make("oelm-gpt")
    apply_method(model, "oelm-freeze", seed=0)
    audit = audit_model(model)
    with torch.no_grad():
        model.transformer.h[0].attn.q_proj.weight.add_(1e-3)
    bad_opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # includes frozen tensors
    check = verify_audit(model, audit, bad_opt)
    assert not check.ok
    assert any("changed during training" in p for p in check.problems)
    assert any("frozen but held by the optimizer" in p for p in check.problems)


def test_weight_decay_groups_exclude_frozen_and_1d_tensors():
    model = make("oelm-gpt")
    apply_method(model, "oelm-freeze", seed=0)
    decay, no_decay = optimizer_groups(model, 0.1)
    frozen = {id(p) for p in model.parameters() if not p.requires_grad}
    assert all(p.ndim >= 2 and id(p) not in frozen for p in decay["params"])
    assert all(p.ndim < 2 for p in no_decay["params"])
    held = len(decay["params"]) + len(no_decay["params"])
    assert held == sum(1 for p in model.parameters() if p.requires_grad)


def test_gpt2_fused_c_attn_computes_only_vs_weight_gradient():
    x = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    counts = {}
    for method in ("baseline", "oelm-freeze"):
        model = make("gpt2")
        apply_method(model, method, seed=0)
        counts[method] = executed_flops(lambda: loss_of(model, x).backward())
    d, layers, tokens = 32, 2, x.numel()
    # Exactly the Q and K weight gradients (2 * tokens * d * d FLOPs each, per layer) are skipped.
    assert counts["baseline"] - counts["oelm-freeze"] == layers * 2 * (2 * tokens * d * d)


@pytest.mark.parametrize("family", ["bert", "distilbert", "gpt2", "llama"])
def test_hf_model_saves_and_reloads_after_the_method(family, tmp_path):
    import transformers as T

    model = make(family).eval()
    apply_method(model, "oelm-freeze", seed=0)
    model.save_pretrained(tmp_path)
    again = T.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    x = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(model(input_ids=x).logits, again(input_ids=x).logits, atol=1e-6)
    assert model.state_dict().keys() == again.state_dict().keys()


def test_methods_differ_only_where_they_say():
    base, freeze = make("oelm-gpt"), make("oelm-gpt")
    apply_method(base, "baseline", seed=0)
    apply_method(freeze, "oelm-freeze", seed=0)
    for (name, a), b in zip(base.named_parameters(), freeze.parameters()):
        is_qk = ".q_proj." in name or ".k_proj." in name
        assert torch.equal(a, b) != is_qk, name


@pytest.mark.parametrize(
    "method,qk_frozen,ffn_frozen",
    [
        ("oelm-nofreeze", False, False),
        ("oelm-qk-ffn", True, True),
        ("ffn-only", False, True),
        ("oelm-global", True, False),
    ],
)
def test_variants_freeze_what_their_record_says(method, qk_frozen, ffn_frozen):
    model = make("oelm-gpt")
    apply_method(model, method, seed=0)
    layer = find_targets(model).layers[0]
    assert layer.q.weight.requires_grad != qk_frozen
    assert all(p.requires_grad != ffn_frozen for proj in layer.ffn for _, p in proj.params())
    if method == "oelm-global":
        assert orthogonality_error(layer.q.get(), 1) < 1e-5  # all rows mutually orthonormal
    if method == "oelm-qk-ffn":
        w = layer.ffn[0].get()  # [d_ff, d]: orthonormal columns
        assert torch.allclose(w.T @ w, torch.eye(w.shape[1]), atol=1e-5)


def test_random_ablations_are_not_orthogonal():
    for method in ("oelm-random", "oelm-random-scaled"):
        model = make("oelm-gpt")
        apply_method(model, method, seed=0)
        layer = find_targets(model).layers[0]
        assert orthogonality_error(layer.q.get(), layer.n_heads) > 1e-2
        assert not layer.q.weight.requires_grad
        assert audit_model(model).totals["max_orthogonality_error"] == 0.0


def test_unsupported_family_and_double_application_are_clear_errors():
    with pytest.raises(UserError, match="supported families: oelm-gpt, oelm-llama, bert"):
        apply_method(torch.nn.Linear(3, 3), "oelm-freeze")
    model = make("oelm-gpt")
    apply_method(model, "oelm-freeze")
    with pytest.raises(UserError, match="already applied"):
        apply_method(model, "oelm-freeze")
    with pytest.raises(UserError, match="unknown method 'oelm-frozen'"):
        apply_method(make("oelm-gpt"), "oelm-frozen")


def test_registry_has_the_studys_methods():
    names = [m.name for m in list_methods()]
    for required in (
        "baseline",
        "oelm-freeze",
        "oelm-random",
        "oelm-random-scaled",
        "oelm-global",
        "oelm-nofreeze",
        "oelm-qk-ffn",
        "ffn-only",
    ):
        assert required in names
    assert get_method("oelm-freeze").freeze_qk


def test_audit_rows_have_roles_and_json(tmp_path):
    model = make("bert")
    apply_method(model, "oelm-freeze", seed=0)
    audit = audit_model(model)
    roles = {r.role for r in audit.rows}
    assert {"q", "k", "v", "o", "ffn", "embedding", "norm", "head"} <= roles
    d = audit.to_dict()
    assert d["totals"]["frozen"] == sum(r["numel"] for r in d["rows"] if not r["trainable"])
    assert all(r["fingerprint"] for r in d["rows"] if not r["trainable"])
    assert "FROZEN" in audit.table()


def test_qk_init_is_validated_and_ignored_by_methods_that_leave_qk_alone():
    base = make("bert")
    apply_method(base, "baseline", seed=0, qk_init="orthogonalize")  # same sweep config, baseline arm
    assert all(p.requires_grad for p in base.parameters())
    with pytest.raises(UserError, match="qk_init must be one of"):
        apply_method(make("bert"), "oelm-freeze", qk_init="orthogonal")
    with pytest.raises(UserError, match="needs an orthogonal method"):
        apply_method(make("bert"), "oelm-random", qk_init="orthogonalize")


def test_peak_flops_are_given_for_bf16_and_fp16_compute_only(monkeypatch):
    """MFU is against dense bf16/fp16 tensor-core peaks: a float32 run gets none, and says why."""
    from oelm.core import flops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert flops.device_peak_flops("cuda", torch.bfloat16) == flops.PEAK_FLOPS["H100"]
    assert flops.device_peak_flops("cuda", torch.float16) == flops.PEAK_FLOPS["H100"]
    assert flops.device_peak_flops("cuda", None) is None and flops.device_peak_flops("cuda", torch.float32) is None
    assert "float32" in flops.peak_flops_note("cuda", None) and flops.peak_flops_note("cuda", torch.bfloat16) is None
    assert "CPU" in flops.peak_flops_note("cpu", torch.bfloat16) and flops.device_peak_flops("cpu") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert flops.device_peak_flops("cuda") is None and "PEAK_FLOPS" in flops.peak_flops_note("cuda", torch.bfloat16)
