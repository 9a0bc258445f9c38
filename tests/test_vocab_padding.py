"""Vocabulary padding (`vocab_multiple`): the padded model computes exactly what the unpadded one does.

The padded rows are filled with large noise before each comparison: whatever they hold, no loss,
logit, gradient or sampled token may depend on them (with zeros, as they start, an unmasked
softmax would still differ, but less visibly).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from oelm import apply_method
from oelm.core.audit import audit_model
from oelm.core.flops import executed_flops, training_flops_per_token
from oelm.models.catalog import build_lm, config_from_meta, config_meta
from oelm.models.gpt import GPT, GPTConfig, count_parameters
from oelm.models.llama import LlamaConfig
from oelm.models.loss import linear_cross_entropy
from oelm.utils.errors import UserError
from train_utils import one_thread, synthetic_lm_dir, tiny_config

VOCAB, MULTIPLE, PADDED, SEQ = 61, 16, 64, 12
SHAPE = {"vocab_size": VOCAB, "block_size": 16, "n_layer": 2, "d_model": 32, "n_head": 4}
FAMILIES = {
    "gpt": (GPTConfig, {}),
    "llama": (LlamaConfig, {"n_kv_head": 2}),
    "llama-untied": (LlamaConfig, {"tie_embeddings": False}),
}


def pair(family: str, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(unpadded, padded) models of one family built from the same seed, padded rows set to noise."""
    cls, extra = FAMILIES[family]
    models = []
    for multiple in (1, MULTIPLE):
        torch.manual_seed(seed)
        models.append(build_lm(cls(**SHAPE, **extra, vocab_multiple=multiple)))
    plain, padded = models
    with torch.no_grad():
        for w in vocab_weights(padded):
            w[VOCAB:] = 3.0 * torch.randn(PADDED - VOCAB, w.shape[1], generator=torch.Generator().manual_seed(1))
    return plain, padded


def vocab_weights(m: torch.nn.Module) -> list[torch.Tensor]:
    emb = m.transformer.wte.weight if isinstance(m, GPT) else m.model.embed_tokens.weight
    return [emb] if m.lm_head.weight is emb else [emb, m.lm_head.weight]


def ids(batch: int = 2, length: int = SEQ, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("cls", [GPTConfig, LlamaConfig])
@pytest.mark.parametrize("bad", [0, -64, 1.5, True, "64"])
def test_a_bad_multiple_is_refused_naming_the_field(cls, bad):
    with pytest.raises(UserError, match=r"vocab_multiple must be an integer >= 1"):
        cls(**SHAPE, vocab_multiple=bad)


def test_default_is_unpadded_and_the_multiple_rounds_up():
    assert GPTConfig().vocab_multiple == 1 and GPTConfig().padded_vocab == 50257
    assert GPTConfig(vocab_multiple=64).padded_vocab == 50304
    assert LlamaConfig(vocab_size=50304, vocab_multiple=64).padded_vocab == 50304
    cfg = LlamaConfig(**SHAPE, vocab_multiple=MULTIPLE)
    assert config_from_meta(config_meta(cfg)) == cfg  # checkpoints keep the field


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_gives_the_same_real_weights_and_zero_padding(family):
    plain, padded = pair(family)
    torch.manual_seed(0)
    fresh = build_lm(padded.config)  # before the test's noise
    ref, got = plain.state_dict(), fresh.state_dict()
    assert ref.keys() == got.keys()
    for k, v in ref.items():
        if got[k].shape[0] == PADDED and v.shape[0] == VOCAB:
            assert torch.equal(got[k][:VOCAB], v) and not got[k][VOCAB:].any(), k
        else:
            assert torch.equal(got[k], v), k
    assert fresh.lm_head.out_features == PADDED


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("path", ["logits-free", "logits"])
def test_loss_and_gradients_equal_the_unpadded_model_and_padding_gets_none(family, path):
    plain, padded = pair(family)
    x = ids()
    y = ids(seed=1)
    y[0, :3] = -100  # ignored targets too
    grads = []
    for m in (plain, padded):
        m.train()
        logits, loss = m(x, y, return_logits=path == "logits")
        (2.0 * loss).backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
        if path == "logits":
            assert logits.shape == (2, SEQ, VOCAB)
    torch.testing.assert_close(padded(x, y, return_logits=path == "logits")[1], plain(x, y)[1], rtol=0, atol=1e-6)
    ref, got = grads
    for name, g in ref.items():
        if got[name].shape[0] == PADDED:
            torch.testing.assert_close(got[name][:VOCAB], g, rtol=1e-5, atol=1e-7)
            assert torch.equal(got[name][VOCAB:], torch.zeros_like(got[name][VOCAB:])), name
        else:
            torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("family", FAMILIES)
def test_evaluation_logits_and_per_token_losses_are_the_unpadded_ones(family):
    plain, padded = pair(family)
    plain.eval(), padded.eval()
    x, y = ids(), ids(seed=1)
    with torch.no_grad():
        torch.testing.assert_close(padded(x)[0], plain(x)[0], rtol=0, atol=1e-6)
        ref = plain(x, y, return_logits=False, reduction="none")[1]
        got = padded(x, y, return_logits=False, reduction="none")[1]
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    # The per-token losses with autograd (the plain path inside linear_cross_entropy) as well.
    torch.testing.assert_close(padded(x, y, return_logits=False, reduction="none")[1], ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_never_picks_a_padded_id_and_equals_the_unpadded_model(family, use_cache):
    plain, padded = pair(family)
    plain.eval(), padded.eval()
    prompt = ids(length=4)
    for temperature in (0.0, 1.0):
        runs = [
            m.generate(
                prompt, 8, temperature=temperature, generator=torch.Generator().manual_seed(3), use_cache=use_cache
            )
            for m in (plain, padded)
        ]
        assert torch.equal(runs[0], runs[1]) and int(runs[1].max()) < VOCAB


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_rows_stay_zero_under_adamw_with_weight_decay(family):
    torch.manual_seed(0)
    cls, extra = FAMILIES[family]
    m = build_lm(cls(**SHAPE, **extra, vocab_multiple=MULTIPLE)).train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(2):
        m(ids(seed=step), ids(seed=step + 5), return_logits=False)[1].backward()
        opt.step()
        opt.zero_grad()
    for w in vocab_weights(m):
        assert not w[VOCAB:].any() and w[:VOCAB].any()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method", ["baseline", "oelm-freeze"])
def test_flop_count_includes_the_padded_head_and_equals_the_flop_counter(family, method):
    x = ids()
    counted = {}
    for m in pair(family):
        m.train()
        apply_method(m, method, seed=0)

        def step(m=m):
            m.zero_grad(set_to_none=True)
            m(x, x, return_logits=False)[1].backward()

        counted[m.config.vocab_multiple] = executed_flops(step)
        assert counted[m.config.vocab_multiple] == training_flops_per_token(m, SEQ) * x.numel()
    # The head's forward, input-gradient and weight-gradient GEMMs over the padding rows.
    assert counted[MULTIPLE] - counted[1] == 3 * 2 * (PADDED - VOCAB) * 32 * x.numel()


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_counts_are_the_real_ones_and_the_audit_says_the_padding(family):
    plain, padded = pair(family)
    for m in (plain, padded):
        apply_method(m, "oelm-freeze", seed=0)
    ref, got = audit_model(plain), audit_model(padded)
    for key in ("total", "trainable", "frozen", "frozen_fraction", "by_role"):
        assert got.totals[key] == ref.totals[key], key
    tied = len(vocab_weights(padded))
    assert got.totals["vocab_padding"] == {"vocab_size": VOCAB, "rows": PADDED, "params": tied * 3 * 32}
    assert "vocab_padding" not in ref.totals
    assert f"padded from {VOCAB} to {PADDED} rows: {tied * 3 * 32} padding parameters" in got.table()
    assert count_parameters(padded) == count_parameters(plain) == ref.totals["total"]


def test_linear_cross_entropy_leaves_the_padding_classes_out():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(9, 8, generator=g).requires_grad_()
    w = (2.0 * torch.randn(12, 8, generator=g)).requires_grad_()
    y = torch.randint(0, 10, (9,), generator=g)
    ref = F.cross_entropy((h @ w[:10].t()).float(), y)
    ref_g = torch.autograd.grad(ref, (h, w))
    for chunk_bytes in (4 * 12 * 9, 4 * 12 * 2):  # one chunk, uneven chunks
        got = linear_cross_entropy(h, w, y, chunk_bytes=chunk_bytes, classes=10)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
        for a, b in zip(torch.autograd.grad(got, (h, w)), ref_g):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="classes must be in 1..12"):
        linear_cross_entropy(h, w, y, classes=13)


@pytest.mark.parametrize("family", FAMILIES)
def test_hugging_face_export_writes_the_real_vocabulary_with_equal_logits(family, tmp_path):
    transformers = pytest.importorskip("transformers")
    from oelm.hf.export import max_logit_diff, to_hf

    _, padded = pair(family)
    padded.eval()
    hf = to_hf(padded)
    assert hf.config.vocab_size == VOCAB and hf.get_input_embeddings().weight.shape[0] == VOCAB
    hf.save_pretrained(tmp_path / "hf")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert back.get_output_embeddings().weight.shape[0] == VOCAB
    x = ids(length=16)
    with torch.no_grad():
        assert (padded(x)[0] - back(input_ids=x).logits).abs().max() <= 1e-5
    assert max_logit_diff(padded, back) <= 1e-5


def test_gpu_presets_benchmark_times_padded_and_unpadded_side_by_side(load_benchmark, tmp_path, capsys):
    bench = load_benchmark("presets_gpu")
    tiny = ["--batch", "1", "--seq", "8", "--vocab", "61", "--warmup", "1", "--rounds", "2", "--steps", "1"]
    argv = ["--cpu", "--presets", "gpt-tiny", "--methods", "baseline", "oelm-freeze", *tiny]
    rows = bench.main([*argv, "--vocab-multiple", "1", "64", "--json", str(tmp_path / "gpu.json")])
    assert [(r["method"], r["vocab_multiple"]) for r in rows] == [
        ("baseline", 1),
        ("baseline", 64),
        ("oelm-freeze", 1),
        ("oelm-freeze", 64),
    ]
    assert {r["speedup_vs"] for r in rows} == {"baseline"} and "baseline+vocab64" in capsys.readouterr().out
    assert rows[0]["params"] == rows[1]["params"] and rows[2]["trainable"] == rows[3]["trainable"]
    assert rows[1]["speedup"] > 0 and rows[1]["tokens_per_s"] > 0
    with pytest.raises(SystemExit):
        bench.main([*argv, "--vocab-multiple", "0"])


@pytest.mark.slow
def test_a_padded_run_trains_resumes_and_exports_as_the_unpadded_one(tmp_path):
    from oelm.hf.export import max_logit_diff, to_hf
    from oelm.training.loop import train
    from oelm.training.runs import load_model

    data = synthetic_lm_dir(tmp_path / "data")
    shape = {"n_layer": 1, "d_model": 64, "n_head": 4, "block_size": 32, "vocab_size": 100}
    results = {}
    with one_thread():
        for multiple in (1, 64):
            out = tmp_path / f"v{multiple}"
            cfg = tiny_config(data, out, model_overrides={**shape, "vocab_multiple": multiple}, steps=4, warmup=1)
            cfg.update(eval_every=2, checkpoint_every=2)
            train(cfg)
            results[multiple] = train({**cfg, "steps": 6, "resume": True, "allow_change": ["steps"]})
            model = load_model(out, "last")
            assert model.lm_head.weight.shape[0] == (100 if multiple == 1 else 128)
            assert not model.lm_head.weight[100:].any()
            hf = to_hf(model)
            assert hf.config.vocab_size == 100 and max_logit_diff(model, hf) <= 1e-5
    for key in ("val_loss", "test_loss", "trainable_params", "frozen_params"):
        assert results[64][key] == pytest.approx(results[1][key], rel=0, abs=1e-6), key
