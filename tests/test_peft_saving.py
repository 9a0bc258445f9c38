"""The method record travels with PEFT saves: merged, adapter-only and Trainer checkpoints (issue 30).

A record's frozen set is the method's (not every tensor PEFT froze); an adapter saved with its
record goes back onto a stock base model with the method re-applied and checked; LoRA on a fused
Q/K/V that OELM split is refused with the modules to target instead.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

import oelm
from oelm.core.record import METHOD_RECORD_FILE, method_frozen, read_record
from oelm.core.targets import find_targets
from oelm.utils.errors import UserError
from test_freezing import VOCAB, make

peft = pytest.importorskip("peft", reason="PEFT tests need peft (pip install -e '.[test]')")

from oelm.hf.peft import get_peft_model, load_adapter, lora_target_modules  # noqa: E402
from oelm.hf.wrappers import underlying  # noqa: E402

X = torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))


def _logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        if isinstance(underlying(model), oelm.GPT):
            return model(X)[0]
        return model(input_ids=X).logits


def _qk_names(model) -> set[str]:
    """The method's frozen tensors of oelm-freeze, by name: every layer's Q/K weight and bias."""
    ids = {id(p) for layer in find_targets(model).layers for proj in (layer.q, layer.k) for _, p in proj.params()}
    return {n for n, p in underlying(model).named_parameters() if id(p) in ids}


def _lora(family: str, wrap=get_peft_model):
    """make(family) with oelm-freeze and LoRA on V/O/FFN, its adapters moved off zero (as if trained)."""
    model = make(family)
    oelm.apply_method(model, "oelm-freeze", seed=0)
    heads = None if family == "oelm-gpt" else ["classifier", "score"]
    cfg = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=lora_target_modules(model),
        modules_to_save=heads,
        fan_in_fan_out=family == "gpt2",
    )
    wrapped = wrap(model, cfg)
    with torch.no_grad():
        g = torch.Generator().manual_seed(2)
        for p in wrapped.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return wrapped


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_a_merged_lora_model_records_and_restores_the_methods_freeze_only(family, tmp_path):
    wrapped = _lora(family)
    expected = _qk_names(wrapped)
    assert len(expected) == (2 * 2 * 2 if family != "llama" else 2 * 2)  # layers x Q/K x weight(/bias)
    merged = wrapped.merge_and_unload()
    assert len([p for p in merged.parameters() if not p.requires_grad]) > len(expected)  # PEFT froze the rest
    merged.save_pretrained(tmp_path / "own")  # the model's own save (the record hook)
    oelm.save_pretrained(merged, tmp_path / "oelm")
    for folder in ("own", "oelm"):
        record = read_record(tmp_path / folder)
        assert set(record["frozen"]) == expected
        again = oelm.from_pretrained(tmp_path / folder)
        assert {n for n, p in again.named_parameters() if not p.requires_grad} == expected
        assert torch.equal(_logits(again), _logits(merged))
    record = json.loads((tmp_path / "own" / METHOD_RECORD_FILE).read_text())
    record["frozen"].popitem()  # tampered: the digest written with it no longer matches
    (tmp_path / "own" / METHOD_RECORD_FILE).write_text(json.dumps(record))
    with pytest.raises(UserError, match="frozen differ from the digests"):
        oelm.from_pretrained(tmp_path / "own")


def test_an_old_record_listing_every_frozen_tensor_still_loads_with_a_warning(tmp_path, caplog):
    merged = _lora("bert").merge_and_unload()
    oelm.save_pretrained(merged, tmp_path)
    record = json.loads((tmp_path / METHOD_RECORD_FILE).read_text())
    del record["identity"]  # as written before the digests existed
    old = {n: None for n, p in merged.named_parameters() if not p.requires_grad}
    from oelm.core.audit import fingerprint

    params = dict(merged.named_parameters())
    record["frozen"] = {n: fingerprint(params[n]) for n in old}  # as written before the frozen set was the method's
    (tmp_path / METHOD_RECORD_FILE).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="oelm"):
        again = oelm.from_pretrained(tmp_path)
    assert {n for n, p in again.named_parameters() if not p.requires_grad} == set(old)
    assert "the method does not freeze" in caplog.text


@pytest.mark.parametrize("family", ["oelm-gpt", "bert", "gpt2"])
@pytest.mark.parametrize("how", ["hooked", "oelm.save_pretrained"])
def test_an_adapter_saves_its_record_and_loads_onto_a_stock_base_with_equal_logits(family, how, tmp_path):
    if how == "hooked":  # oelm.hf.peft.get_peft_model: PEFT's own save_pretrained writes the record
        wrapped = _lora(family)
        wrapped.save_pretrained(tmp_path)
    else:  # plain peft.get_peft_model, saved through oelm.save_pretrained
        wrapped = _lora(family, peft.get_peft_model)
        oelm.save_pretrained(wrapped, tmp_path)
    assert (tmp_path / "adapter_config.json").is_file() and (tmp_path / METHOD_RECORD_FILE).is_file()
    record = read_record(tmp_path)
    assert set(record["frozen"]) == _qk_names(wrapped) == set(method_frozen(underlying(wrapped)))
    trained = _logits(wrapped)

    stock = peft.PeftModel.from_pretrained(make(family), tmp_path)  # no method: the Q/K differ
    assert not torch.equal(_logits(stock), trained)
    loaded = load_adapter(make(family), tmp_path)  # the same config and seed as before apply_method
    assert torch.equal(_logits(loaded), trained)
    assert {n for n, p in underlying(loaded).named_parameters() if "lora_" not in n and not p.requires_grad} >= set(
        record["frozen"]
    )
    loaded.save_pretrained(tmp_path / "again")  # a loaded adapter saves its record too
    assert read_record(tmp_path / "again")["frozen"] == record["frozen"]
    with pytest.raises(UserError, match="holds a PEFT adapter"):
        oelm.from_pretrained(tmp_path)


def test_an_adapter_is_refused_on_a_base_with_other_weights_naming_the_tensor(tmp_path):
    wrapped = _lora("bert")
    wrapped.save_pretrained(tmp_path)
    other = make("bert")
    with torch.no_grad():
        other.bert.encoder.layer[1].intermediate.dense.weight.add_(1e-3)
    with pytest.raises(UserError, match=r"other tensors differ.*encoder\.layer\.1\.intermediate\.dense\.weight"):
        load_adapter(other, tmp_path)
    pretrained_like = make("bert")  # a method keeping the base's Q/K: a different base shows in `frozen`
    with torch.no_grad():
        pretrained_like.bert.encoder.layer[0].attention.self.key.bias.add_(1e-3)
    with pytest.raises(UserError, match=r"frozen tensors differ.*layer\.0\.attention\.self\.key\.bias"):
        load_adapter(pretrained_like, tmp_path)
    seeded = make("bert")
    oelm.apply_method(seeded, "oelm-freeze", seed=1)
    with pytest.raises(UserError, match="the adapter was trained with"):
        load_adapter(seeded, tmp_path)
    record = json.loads((tmp_path / METHOD_RECORD_FILE).read_text())
    record["base_tensors"].popitem()
    (tmp_path / METHOD_RECORD_FILE).write_text(json.dumps(record))
    with pytest.raises(UserError, match="base_tensors"):
        load_adapter(make("bert"), tmp_path)


def test_a_trainer_checkpoint_of_a_peft_model_carries_the_record(tmp_path):
    from oelm.hf.trainer import HF_AUDIT_FILE, OELMCallback
    from test_hf_stack import make_trainer

    model = make("bert")
    oelm.apply_method(model, "oelm-freeze", seed=0)
    cfg = peft.LoraConfig(r=4, target_modules=lora_target_modules(model), modules_to_save=["classifier"])
    wrapped = peft.get_peft_model(model, cfg)  # plain PEFT: the callback keeps the record
    trainer = make_trainer(wrapped, tmp_path / "run", [OELMCallback()], steps=2)
    trainer.train()
    ckpt = tmp_path / "run" / "checkpoint-2"
    assert (ckpt / "adapter_config.json").is_file() and (ckpt / HF_AUDIT_FILE).is_file()
    record = read_record(ckpt)
    assert set(record["frozen"]) == _qk_names(wrapped)
    trainer.save_model(str(tmp_path / "final"))  # the PEFT model's save_pretrained, hooked by the callback
    assert read_record(tmp_path / "final")["frozen"] == record["frozen"]
    loaded = load_adapter(make("bert"), ckpt)
    assert torch.equal(_logits(loaded), _logits(wrapped))
    other = make("bert")
    with torch.no_grad():
        other.bert.embeddings.word_embeddings.weight.add_(1e-3)
    with pytest.raises(UserError, match=r"other tensors differ.*word_embeddings\.weight"):
        load_adapter(other, ckpt)


@pytest.mark.parametrize("targets", [["c_attn"], None, r".*\.attn\.c_attn"])
def test_lora_on_gpt2s_split_c_attn_is_refused_naming_the_modules_to_target(targets):
    model = make("gpt2")
    oelm.apply_method(model, "oelm-freeze", seed=0)
    cfg = peft.LoraConfig(r=2, target_modules=targets)  # None: PEFT's default for gpt2 is c_attn
    with pytest.raises(UserError, match=r"transformer\.h\.0\.attn\.c_attn.*SplitQKV.*transformer\.h\.0\.attn\.c_proj"):
        get_peft_model(model, cfg)
    fine = get_peft_model(model, peft.LoraConfig(r=2, target_modules=["c_proj"], fan_in_fan_out=True))
    assert any("lora_A" in n for n, _ in fine.named_parameters())
