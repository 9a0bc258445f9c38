"""The fine-tuning field as arms: LoRA, (IA)^3, BitFit, LayerNorm tuning, and the freezing controls."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from oelm.core.audit import audit_model, verify_audit  # noqa: E402
from oelm.core.flops import theoretical_saving  # noqa: E402
from oelm.core.freezing import apply_method, trainable_parameters  # noqa: E402
from oelm.core.methods import Method, get_method  # noqa: E402
from oelm.core.tuning import tuning_flops_per_token  # noqa: E402
from oelm.models.gpt import GPT, gpt_config  # noqa: E402
from oelm.utils.errors import UserError  # noqa: E402


def tiny_bert(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=3,
    )
    return transformers.BertForSequenceClassification(cfg).eval()


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, 64, (4, 12), generator=g), "labels": torch.randint(0, 3, (4,), generator=g)}


def trained_names(method: str, **options) -> tuple[torch.nn.Module, set[str]]:
    model = tiny_bert()
    apply_method(model, method, seed=0, **options)
    return model, {n for n, p in model.named_parameters() if p.requires_grad}


def is_head(name: str) -> bool:
    return name.startswith("classifier.")


@pytest.mark.parametrize(
    ("method", "expect"),
    [
        ("lora", lambda n: "lora_" in n and (".query." in n or ".value." in n)),
        ("ia3", lambda n: "ia3_" in n and any(f".{r}." in n for r in ("key", "value", "output.dense"))),
        ("bitfit", lambda n: n.endswith(".bias")),
        ("ln-tuning", lambda n: "LayerNorm" in n),
    ],
)
def test_tuning_method_trains_exactly_its_tensors_and_the_head(method, expect):
    model, trained = trained_names(method)
    head = {n for n in trained if is_head(n)}
    assert head == {"classifier.weight", "classifier.bias"}
    body = trained - head
    assert body and all(expect(n) for n in body), sorted(body)[:5]
    # And every tensor of that kind trains (none left out), outside the head.
    every = {n for n, _ in model.named_parameters() if expect(n) and not is_head(n)}
    assert body == every


@pytest.mark.parametrize("method", ["lora", "ia3", "bitfit", "ln-tuning", "freeze-qk-weights", "freeze-vo"])
def test_two_adamw_steps_move_trainable_and_keep_frozen_bit_identical(method):
    model, trained = trained_names(method)
    audit = audit_model(model)
    assert audit.fingerprints, "a fine-tuning method freezes something"
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-2, weight_decay=0.1)
    for step in range(2):
        opt.zero_grad()
        model(**batch(step)).loss.backward()
        opt.step()
    check = verify_audit(model, audit, opt)
    assert check.ok, check.problems
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    # LoRA's B starts at zero, so A gets no gradient on the first step; both move by the second.
    assert moved == trained


def test_controls_freeze_what_they_name():
    _, trained = trained_names("freeze-qk-weights")
    layer = "bert.encoder.layer.0.attention.self"
    assert f"{layer}.query.weight" not in trained and f"{layer}.key.weight" not in trained
    assert f"{layer}.query.bias" in trained and f"{layer}.key.bias" in trained
    _, qk = trained_names("freeze-qk")
    _, vo = trained_names("freeze-vo")
    _, base = trained_names("baseline")
    params = dict(tiny_bert().named_parameters())
    frozen = {name: sum(params[n].numel() for n in base - kept) for name, kept in (("qk", qk), ("vo", vo))}
    # The equal-share control freezes exactly as many weights as frozen Q/K in a BERT layer.
    assert frozen["qk"] == frozen["vo"] > 0
    _, k = trained_names("freeze-k")
    assert f"{layer}.query.weight" in k and f"{layer}.key.weight" not in k


def test_freeze_qk_keeps_pretrained_values_where_oelm_freeze_orthogonalizes():
    reference = dict(tiny_bert().named_parameters())
    name = "bert.encoder.layer.1.attention.self.key.weight"
    kept, _ = trained_names("freeze-qk")
    assert torch.equal(dict(kept.named_parameters())[name], reference[name])
    ortho, _ = trained_names("oelm-freeze", qk_init="orthogonalize")
    assert not torch.equal(dict(ortho.named_parameters())[name], reference[name])


def test_lora_options_take_effect_and_flops_match_the_counter():
    model, trained = trained_names("lora", rank=2, targets="q,k,v,o")
    assert any(".key." in n for n in trained) and any("attention.output.dense.lora_" in n for n in trained)
    a = next(p for n, p in model.named_parameters() if n.endswith("query.lora_A.default.weight"))
    assert a.shape[0] == 2
    plain = tiny_bert()
    b = batch()
    tokens = b["input_ids"].numel()
    with FlopCounterMode(display=False) as with_lora:
        model(input_ids=b["input_ids"])
    with FlopCounterMode(display=False) as without:
        plain(input_ids=b["input_ids"])
    added = with_lora.get_total_flops() - without.get_total_flops()
    assert added == tokens * tuning_flops_per_token(model) > 0
    # The count enters the saving as an added cost: LoRA saves less than freezing everything.
    bit, _ = trained_names("bitfit")
    assert theoretical_saving(model, 12) < theoretical_saving(bit, 12)


@pytest.mark.parametrize(
    ("method", "options", "match"),
    [
        ("lora", {"targets": "q,x"}, "targets"),
        ("lora", {"rank": 0}, "rank"),
        ("ia3", {"targets": ""}, "targets"),
        ("bitfit", {"rank": 2}, "unknown method option"),
    ],
)
def test_bad_options_are_refused_before_the_model_changes(method, options, match):
    model = tiny_bert()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(UserError, match=match):
        apply_method(model, method, **options)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert all(p.requires_grad for p in model.parameters())


def test_a_bare_backbone_is_refused_and_a_tied_lm_head_stays_frozen():
    with pytest.raises(UserError, match="bare backbone"):
        apply_method(transformers.BertModel(tiny_bert().config), "bitfit")
    lm = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16))
    apply_method(lm, "ln-tuning")
    tied = lm.lm_head.weight
    assert tied is lm.transformer.wte.weight and not tied.requires_grad
    assert any(p.requires_grad for p in lm.parameters())


def test_a_tuning_record_cannot_also_freeze():
    with pytest.raises(UserError, match="chooses its trainable tensors"):
        Method("bad", "lora that also freezes q", freeze=frozenset({"q"}), tune="lora")
    assert get_method("lora").tune == "lora"


def test_peft_methods_refuse_oelm_gpt_whose_fused_qkv_bypasses_peft_layers():
    from oelm.models.gpt import GPTClassifier

    clf = GPTClassifier(gpt_config("gpt-tiny", vocab_size=64, block_size=16), 2)
    with pytest.raises(UserError, match="fused GEMM"):
        apply_method(clf, "lora")
    apply_method(GPTClassifier(gpt_config("gpt-tiny", vocab_size=64, block_size=16), 2), "bitfit")


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
@pytest.mark.parametrize("method", ["lora", "ia3", "bitfit", "ln-tuning", "freeze-vo"])
def test_the_board_arms_apply_to_other_encoder_families(family, method):
    """The fine-tuning spec runs unchanged on roberta-base (and distilbert): same arms, same heads."""
    if family == "roberta":
        cfg = transformers.RobertaConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=40,
            num_labels=2,
        )
        model, head = transformers.RobertaForSequenceClassification(cfg), "classifier."
    else:
        cfg = transformers.DistilBertConfig(
            vocab_size=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=40, num_labels=2
        )
        model, head = transformers.DistilBertForSequenceClassification(cfg), "classifier."
    apply_method(model, method)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(n.startswith(head) for n in trained) and any(
        not n.startswith(("classifier.", "pre_classifier.")) for n in trained
    )
    out = model(input_ids=torch.randint(0, 64, (2, 8)), labels=torch.tensor([0, 1]))
    out.loss.backward()
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
