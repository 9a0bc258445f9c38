"""Our Llama-style decoder (oelm.models.llama): shapes, causality, RoPE, GQA, KV cache, FLOPs, methods, training."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from oelm import apply_method
from oelm.core.audit import audit_model, verify_audit
from oelm.core.flops import executed_flops, training_flops_per_token
from oelm.core.freezing import optimizer_groups
from oelm.core.orthogonal import orthogonality_error
from oelm.core.targets import find_targets
from oelm.models.catalog import PRESETS, build_lm, config_from_meta, config_meta, preset_config
from oelm.models.llama import Llama, LlamaConfig, apply_rope, llama_config, rope_tables
from oelm.utils.errors import UserError
from train_utils import one_thread, synthetic_lm_dir, tiny_config, tinystories_dir

VOCAB, SEQ = 61, 12


def tiny(**overrides) -> LlamaConfig:
    base = {"vocab_size": VOCAB, "block_size": 16, "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2}
    return LlamaConfig(**{**base, **overrides})


def model(seed: int = 0, **overrides) -> Llama:
    torch.manual_seed(seed)
    return Llama(tiny(**overrides)).eval()


def ids(batch: int = 2, length: int = SEQ, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_forward_shapes_loss_and_logits_free_loss_agree():
    m, x = model(), ids()
    logits, loss = m(x, x)
    assert logits.shape == (2, SEQ, VOCAB)
    ref = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), x.flatten())
    assert torch.allclose(loss, ref)
    none, fast = m(x, x, return_logits=False)
    assert none is None and torch.allclose(fast, loss, atol=1e-6)
    assert m(x, x, return_logits=False, reduction="none")[1].shape == (2, SEQ)


def test_tied_and_untied_heads_and_bias_free_projections():
    tied, untied = model(), model(tie_embeddings=False)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    extra = VOCAB * 32
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == extra
    assert not any(name.endswith("bias") for name, _ in tied.named_parameters())


def test_lm_is_causal():
    m, x = model(), ids()
    y = x.clone()
    y[:, 7] = (y[:, 7] + 1) % VOCAB
    a, b = m(x)[0], m(y)[0]
    assert torch.equal(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_rope_scores_depend_on_relative_position_only():
    cfg = tiny()
    inv = Llama(cfg).model.inv_freq
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)

    def score(m: int, n: int) -> float:
        cq, sq = rope_tables(inv, m, 1, torch.float32)
        ck, sk = rope_tables(inv, n, 1, torch.float32)
        return float((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum())

    assert score(5, 2) == pytest.approx(score(9, 6), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    # The whole model: a sequence read from position 4 on gives the logits it gives from 0.
    m, x = model(), ids(length=8)
    assert torch.allclose(m.model(x, start=4), m.model(x), atol=1e-5)


def test_grouped_query_attention_equals_multi_head_with_shared_kv_heads():
    gqa = model(n_kv_head=2)
    mha = model(n_kv_head=4)
    sd = gqa.state_dict()
    for i in range(2):
        for p in "kv":
            w = sd[f"model.layers.{i}.self_attn.{p}_proj.weight"].view(2, 8, 32)  # [kv heads, dh, d]
            sd[f"model.layers.{i}.self_attn.{p}_proj.weight"] = w.repeat_interleave(2, dim=0).reshape(32, 32)
    mha.load_state_dict(sd)
    x = ids()
    assert gqa.model.layers[0].self_attn.k_proj.weight.shape == (16, 32)
    assert torch.allclose(gqa(x)[0], mha(x)[0], atol=1e-5)


def test_qk_norm_normalizes_each_head_before_rope():
    m = model(qk_norm=True)
    attn = m.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (8,) and attn.k_norm.weight.shape == (8,)
    with torch.no_grad():
        attn.k_proj.weight.mul_(100.0)  # per-head RMSNorm makes the scores blind to K's scale
    ref = model(qk_norm=True)
    x = ids()
    assert torch.allclose(m(x)[0], ref(x)[0], atol=1e-4)


@pytest.mark.parametrize("overrides", [{}, {"n_kv_head": 4, "qk_norm": True}])
def test_kv_cache_generate_equals_no_cache_greedy_also_past_the_context(overrides):
    m, prompt = model(**overrides), ids(length=5)
    for n in (4, 15):  # 5 + 15 tokens outgrow block_size 16: both re-read the last 16
        fast = m.generate(prompt, n, temperature=0)
        slow = m.generate(prompt, n, temperature=0, use_cache=False)
        assert torch.equal(fast, slow)
    short = m.generate(prompt, 6, temperature=0, context=4)  # a sliding window of 4 from the start
    assert torch.equal(short, m.generate(prompt, 6, temperature=0, context=4, use_cache=False))
    assert torch.equal(short[:, 5:6], m(prompt[:, -4:])[0][:, -1:].argmax(-1))
    with pytest.raises(UserError, match="context"):
        m.generate(prompt, 1, context=17)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = m.generate(prompt, 6, temperature=1.0, top_k=5, generator=g1)
    b = m.generate(prompt, 6, temperature=1.0, top_k=5, generator=g2, use_cache=False)
    assert torch.equal(a, b)


def test_targets_find_q_per_query_head_and_k_per_kv_head():
    m = model()
    t = find_targets(m)
    assert t.family == "oelm-llama" and len(t.layers) == 2
    layer = t.layers[0]
    assert (layer.n_heads, layer.n_kv_heads) == (4, 2)
    assert layer.q.shape_out_in == (32, 32) and layer.k.shape_out_in == (16, 32) and layer.v.shape_out_in == (16, 32)
    assert [p.name.rsplit(".", 1)[-1] for p in layer.ffn] == ["gate_proj", "up_proj", "down_proj"]


def _train_step(m: Llama, x: torch.Tensor) -> None:
    m.zero_grad(set_to_none=True)
    m(x, x, return_logits=False)[1].backward()


@pytest.mark.parametrize("method", ["baseline", "oelm-freeze", "oelm-freeze-q"])
@pytest.mark.parametrize("overrides", [{}, {"qk_norm": True, "tie_embeddings": False}])
def test_training_flops_equal_flop_counter_and_frozen_rows_are_saved(method, overrides):
    m, x = model(**overrides).train(), ids()
    apply_method(m, method, seed=0)
    counted = executed_flops(lambda: _train_step(m, x))
    assert counted == training_flops_per_token(m, SEQ) * x.numel()


def test_freezing_saves_exactly_the_q_and_k_weight_gradients():
    x = ids()
    runs = {}
    for method in ("baseline", "oelm-freeze"):
        m = model().train()
        apply_method(m, method, seed=0)
        runs[method] = executed_flops(lambda m=m: _train_step(m, x))
    qk = 2 * (32 * 32 + 16 * 32) * x.numel() * 2  # 2 FLOPs per MAC, Q and K rows, 2 layers
    assert runs["baseline"] - runs["oelm-freeze"] == qk


def test_oelm_freeze_keeps_qk_bit_identical_and_orthonormal_per_head_after_adamw():
    m, x = model().train(), ids()
    apply_method(m, "oelm-freeze", seed=0)
    audit = audit_model(m)
    t = find_targets(m)
    before = {p.name: p.weight.detach().clone() for layer in t.layers for p in (layer.q, layer.k, layer.v)}
    opt = torch.optim.AdamW(optimizer_groups(m, weight_decay=0.1), lr=1e-2)
    for _ in range(2):
        _train_step(m, x)
        opt.step()
    for layer in t.layers:
        assert torch.equal(layer.q.weight, before[layer.q.name]) and torch.equal(layer.k.weight, before[layer.k.name])
        assert not torch.equal(layer.v.weight, before[layer.v.name])
        assert orthogonality_error(layer.q.get(), 4) < 1e-5  # per query head
        assert orthogonality_error(layer.k.get(), 2) < 1e-5  # per key/value head
        assert not layer.q.weight.requires_grad and layer.v.weight.requires_grad
    assert verify_audit(m, audit, optimizer=opt).ok


def test_q_identity_is_the_identity_query_with_no_q_matmul():
    ident = model(q_identity=True)
    assert ident.model.layers[0].self_attn.q_proj is None
    full = model()
    ident.load_state_dict({k: v for k, v in full.state_dict().items() if "q_proj" not in k})
    with torch.no_grad():
        for block in full.model.layers:
            block.self_attn.q_proj.weight.copy_(torch.eye(32))
    x = ids()
    assert torch.allclose(ident(x)[0], full(x)[0], atol=1e-5)
    ident.train(), full.train()
    saved = executed_flops(lambda: _train_step(full, x)) - executed_flops(lambda: _train_step(ident, x))
    assert saved == 3 * 2 * 32 * 32 * x.numel() * 2  # forward, input and weight gradient of Q, 2 layers


@pytest.mark.parametrize("method", ["identity-q", "oelm-thin-keys"])
def test_architecture_changing_methods_apply_and_count_exactly(method):
    from oelm.training.task import checked_model_config

    cfg = checked_model_config("llama-tiny", {"vocab_size": VOCAB, "block_size": 16, "d_model": 32}, method)
    torch.manual_seed(0)
    m, x = build_lm(cfg).train(), ids()
    apply_method(m, method, seed=0)
    if method == "identity-q":  # switched on through the config: no Q, the published halved scale
        assert m.config.q_identity and m.config.attn_scale == 0.5
        assert m.model.layers[0].self_attn.q_proj is None
    else:  # thin keys: Q at a quarter of the width, K at its GQA share of that
        assert m.model.layers[0].self_attn.q_proj.weight.shape == (8, 32)
        assert m.model.layers[0].self_attn.k_proj.weight.shape == (4, 32)
    assert executed_flops(lambda: _train_step(m, x)) == training_flops_per_token(m, SEQ) * x.numel()


def test_reconfigure_switches_q_identity_and_scale_on_a_built_model():
    m = model()
    m.reconfigure(q_identity=True, attn_scale=0.5)
    assert m.config.q_identity and m.model.layers[1].self_attn.q_proj is None
    assert m.model.layers[1].self_attn.scale == pytest.approx(0.5 / 8**0.5)
    assert torch.isfinite(m(ids())[0]).all()
    with pytest.raises(UserError, match="only"):
        m.reconfigure(n_layer=3)


def test_grad_checkpoint_gives_the_same_gradients():
    x = ids()
    grads, calls = [], []
    for flag in (False, True):
        m = model(grad_checkpoint=flag).train()
        seen = []
        m.model.layers[0].register_forward_pre_hook(lambda *_, seen=seen: seen.append(1))
        _train_step(m, x)
        grads.append([p.grad.clone() for p in m.parameters()])
        calls.append(len(seen))
    assert calls == [1, 2]  # checkpointed: the block runs again in backward
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def test_presets_span_cpu_tiny_to_350m_and_configs_round_trip():
    assert {"llama-tiny", "llama-narrow", "llama-small", "llama-gpt2s", "llama-350m"} <= set(PRESETS)
    gpt2s = preset_config("llama-gpt2s")
    assert (gpt2s.n_layer, gpt2s.d_model, gpt2s.n_head) == (12, 768, 12)
    with torch.device("meta"):
        big = build_lm(preset_config("llama-350m"))
    n = sum(p.numel() for p in big.parameters())
    assert 330e6 < n < 370e6, n
    cfg = llama_config("llama-tiny", vocab_size=300, d_model=64)
    assert cfg.d_ff == 192  # SwiGLU width follows d_model
    meta = {k: json.dumps(v) for k, v in config_meta(cfg).items()}
    assert config_from_meta(meta) == cfg


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"n_kv_head": 3}, "n_kv_head"),
        ({"qk_dim": 24, "q_identity": True}, "q_identity"),
        ({"qk_norm": "yes"}, "qk_norm"),
        ({"rope_theta": 0}, "rope_theta"),
        ({"n_head": 8, "qk_dim": 8}, "even head size"),
    ],
)
def test_bad_configs_get_one_clear_error(fields, match):
    with pytest.raises(UserError, match=match):
        tiny(**fields)
    with pytest.raises(UserError, match="unknown LlamaConfig field"):
        llama_config("llama-tiny", n_kv_heads=2)


def test_oelm_train_runs_a_llama_preset_end_to_end(tmp_path: Path):
    from oelm.cli import main

    data = synthetic_lm_dir(tmp_path / "data", vocab=64, n_train=4000)
    cfg = tiny_config(data, tmp_path / "run", model="llama-tiny", steps=8, eval_every=4, checkpoint_every=4)
    cfg["model_overrides"] = {"n_layer": 1, "d_model": 32, "n_head": 4, "n_kv_head": 2, "block_size": 32}
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    with one_thread():
        assert main(["train", str(tmp_path / "c.yaml"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "complete" and results["freeze_check"]["ok"]
    assert (
        results["model"] == "llama-tiny" and results["frozen_params"] == 32 * 32 + 16 * 32
    )  # Q and K of the one layer
    from oelm.training.runs import load_model

    loaded = load_model(tmp_path / "run")
    assert isinstance(loaded, Llama) and loaded.config.n_kv_head == 2


def test_llama_presets_are_refused_for_classification():
    from oelm.training.config import make_config

    with pytest.raises(UserError, match="no classifier"):
        make_config({"task": "classification", "model": "llama-tiny", "data": "x"})


def test_save_and_from_pretrained_round_trip_with_the_method(tmp_path: Path):
    import oelm

    m = model()
    apply_method(m, "oelm-freeze", seed=0)
    oelm.save_pretrained(m, tmp_path / "m")
    back = oelm.from_pretrained(tmp_path / "m")
    x = ids()
    assert isinstance(back, Llama)
    assert torch.equal(back.eval()(x)[0], m(x)[0])
    assert not back.model.layers[0].self_attn.q_proj.weight.requires_grad
    copy.deepcopy(back)  # a plain module: no hooks that break copying


def _varied(m: Llama) -> Llama:
    """Norm gains away from 1, so a mapping that dropped or swapped them would show."""
    with torch.no_grad():
        for p in m.parameters():
            if p.ndim == 1:
                p.mul_(torch.rand(p.shape, generator=torch.Generator().manual_seed(p.numel())) + 0.5)
    return m


@pytest.mark.parametrize(
    "overrides, cls",
    [
        ({}, "LlamaForCausalLM"),
        ({"n_kv_head": 4, "tie_embeddings": False, "rope_theta": 500.0, "norm_eps": 1e-6}, "LlamaForCausalLM"),
        ({"qk_norm": True}, "Qwen3ForCausalLM"),
    ],
)
def test_hugging_face_export_gives_equal_logits_with_plain_transformers(tmp_path: Path, overrides, cls):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers {transformers.__version__} has no {cls} (QK-norm exports to Qwen3: >= 4.51)")
    from oelm.hf.export import max_logit_diff, to_hf

    m = _varied(model(**overrides))
    hf = to_hf(m)
    assert type(hf).__name__ == cls
    hf.save_pretrained(tmp_path / "hf")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = ids(length=16)
    with torch.no_grad():
        assert (m(x)[0] - back(input_ids=x).logits).abs().max() <= 1e-5
    assert max_logit_diff(m, back) <= 1e-5


@pytest.mark.parametrize(
    "overrides, match",
    [({"qk_dim": 16}, "thin keys"), ({"q_identity": True}, "W_Q = I"), ({"attn_scale": 0.5}, "scale")],
)
def test_export_refuses_what_hugging_face_llama_cannot_hold(overrides, match):
    pytest.importorskip("transformers")
    from oelm.hf.export import to_hf

    with pytest.raises(UserError, match=match):
        to_hf(model(**overrides))


def test_export_cli_writes_a_llama_folder_that_keeps_the_method(tmp_path: Path, capsys):
    transformers = pytest.importorskip("transformers")
    import oelm
    from oelm.cli import main
    from oelm.training.runs import load_model

    data = synthetic_lm_dir(tmp_path / "data", vocab=64, n_train=4000)
    cfg = tiny_config(data, tmp_path / "run", model="llama-tiny", steps=4, eval_every=2, checkpoint_every=2)
    cfg["model_overrides"] = {"n_layer": 1, "d_model": 32, "n_head": 4, "n_kv_head": 2, "block_size": 32}
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    with one_thread():
        assert main(["train", str(tmp_path / "c.yaml"), "--no-progress"]) == 0
    assert main(["export", str(tmp_path / "run"), "--to", "hf", str(tmp_path / "hf")]) == 0
    assert "wrote LlamaForCausalLM" in capsys.readouterr().out
    ours = load_model(tmp_path / "run")
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(x)[0] - plain(input_ids=x).logits).abs().max() <= 1e-5
    restored = oelm.from_pretrained(tmp_path / "hf")  # the method record travels: Q/K frozen, bytes checked
    attn = restored.model.layers[0].self_attn
    assert not attn.q_proj.weight.requires_grad and not attn.k_proj.weight.requires_grad
    assert attn.v_proj.weight.requires_grad
    assert "LlamaForCausalLM" in (tmp_path / "hf" / "README.md").read_text()


@pytest.mark.slow
def test_llama_tiny_learns_tinystories_and_samples_through_the_cli(tmp_path: Path, capsys):
    from oelm.cli import main
    from oelm.training.sample import load_run_model

    data = tinystories_dir(tmp_path / "ts", max_docs=200)
    cfg = tiny_config(data, tmp_path / "run", model="llama-tiny", steps=40, lr=1e-2, eval_every=20)
    cfg["model_overrides"] = {"n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2, "block_size": 64}
    cfg["seq_len"] = 64
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    with one_thread():
        assert main(["train", str(tmp_path / "c.yaml"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["val_loss"] < 0.8 * torch.log(torch.tensor(257.0)).item()  # well below a uniform guess over bytes
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "run"), "--prompt", "Once upon", "--tokens", "12", "--temperature", "0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Once upon") and len(text.encode()) > len("Once upon")
    m, _ = load_run_model(tmp_path / "run")
    prompt = torch.tensor([list(b"Once upon")])
    assert torch.equal(m.generate(prompt, 12, temperature=0), m.generate(prompt, 12, temperature=0, use_cache=False))
