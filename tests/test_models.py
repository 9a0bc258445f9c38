"""The study's GPT and the GPT classifier."""

import pytest
import torch

from oelm.models.gpt import GPT, GPTClassifier, count_parameters, gpt_config
from oelm.utils.errors import UserError


def tiny(**kw):
    return gpt_config("gpt-tiny", vocab_size=64, block_size=32, **kw)


def test_gpt_medium_512_has_the_studys_parameter_count():
    assert count_parameters(GPT(gpt_config("gpt-medium-512"))) == 44_896_768


def test_lm_head_is_tied_and_loss_is_mean_token_ce():
    torch.manual_seed(0)
    m = GPT(tiny())
    assert m.lm_head.weight is m.transformer.wte.weight
    x = torch.randint(0, 64, (2, 16))
    logits, loss = m(x, x)
    assert logits.shape == (2, 16, 64)
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), x.reshape(-1))
    assert torch.allclose(loss, ref)


def test_bias_free_config_drops_only_the_layernorm_and_mlp_biases():
    with_bias, without = GPT(tiny()), GPT(tiny(bias=False))
    keys, kept = set(with_bias.state_dict()), set(without.state_dict())
    assert kept == {k for k in keys if not k.endswith(".bias")}
    assert {k.split(".")[-2] for k in keys - kept} == {"ln_1", "ln_2", "ln_f", "fc_in", "fc_out"}
    x = torch.randint(0, 64, (2, 16))
    without(x, x)[1].backward()
    assert all(p.grad is not None for p in without.parameters())


def test_lm_is_causal():
    torch.manual_seed(0)
    m = GPT(tiny()).eval()
    x = torch.randint(0, 64, (1, 12))
    y = x.clone()
    y[0, -1] = (y[0, -1] + 1) % 64
    assert torch.allclose(m(x)[0][:, :-1], m(y)[0][:, :-1], atol=1e-6)


def test_classifier_pools_last_real_token_whatever_the_padding_side():
    torch.manual_seed(0)
    m = GPTClassifier(tiny(), num_labels=3).eval()
    ids = torch.randint(1, 64, (1, 5))
    right = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    mask_r = torch.tensor([[1] * 5 + [0] * 3])
    mask_l = torch.tensor([[0] * 3 + [1] * 5])
    plain = m(ids)[0]
    # Positions differ between left and right padding, so compare each with its own unpadded twin.
    assert torch.allclose(m(right, mask_r)[0], plain, atol=1e-5)
    # Left padding: the pooled token is the last position, whose hidden state we rebuild by hand.
    from oelm.models.gpt import attention_bias

    hidden = m.transformer(left, causal=False, attn_mask=attention_bias(mask_l.bool(), False))
    assert torch.allclose(m(left, mask_l)[0], m.score(hidden[:, -1]), atol=1e-6)
    # And padding content is invisible: changing pad ids does not change the logits.
    assert torch.allclose(m(left, mask_l)[0], m(left.masked_fill(mask_l == 0, 5), mask_l)[0], atol=1e-6)


def test_classifier_is_bidirectional_by_default_and_causal_on_request():
    torch.manual_seed(0)
    x = torch.randint(1, 64, (1, 6))
    y = x.clone()
    y[0, 0] = (y[0, 0] + 1) % 64
    bi = GPTClassifier(tiny(), num_labels=2).eval()
    assert not torch.allclose(bi(x)[0], bi(y)[0])
    causal = GPTClassifier(tiny(), num_labels=2, causal=True).eval()
    # Last-token pooling under causal attention still sees the first token.
    assert not torch.allclose(causal(x)[0], causal(y)[0])


def test_padding_does_not_leak_into_the_pooled_representation():
    torch.manual_seed(0)
    m = GPTClassifier(tiny(), num_labels=2).eval()
    ids = torch.randint(1, 64, (1, 6))
    pad_a = torch.cat([ids, torch.full((1, 2), 7)], 1)
    pad_b = torch.cat([ids, torch.full((1, 2), 9)], 1)
    mask = torch.tensor([[1] * 6 + [0] * 2])
    assert torch.allclose(m(pad_a, mask)[0], m(pad_b, mask)[0], atol=1e-6)


def test_bad_configs_are_rejected_clearly():
    with pytest.raises(UserError, match="not divisible"):
        gpt_config("gpt-tiny", n_head=3)
    with pytest.raises(UserError, match="unknown GPT preset"):
        gpt_config("gpt-huge")
    with pytest.raises(UserError, match="unknown GPTConfig field"):
        gpt_config("gpt-tiny", width=3)


@pytest.mark.parametrize("kw", [{}, {"qk_dim": 16}, {"q_identity": True, "attn_scale": 0.5}])
def test_kv_cache_generate_equals_the_uncached_loop(kw):
    torch.manual_seed(0)
    m = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16, n_layer=2, d_model=32, n_head=4, **kw)).eval()
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    for n, context in ((4, None), (15, None), (8, 6)):  # within the window, past the block size, a short window
        fast = m.generate(prompt, n, temperature=0, context=context)
        assert torch.equal(fast, m.generate(prompt, n, temperature=0, context=context, use_cache=False))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = m.generate(prompt, 6, temperature=1.0, top_k=5, generator=g1)
    assert torch.equal(a, m.generate(prompt, 6, temperature=1.0, top_k=5, generator=g2, use_cache=False))
    # The cache's first step is the plain forward over the prompt: its hidden states are the model's.
    caches = [[] for _ in m.transformer.h]
    h = m.transformer(prompt, causal=True, caches=caches)
    assert torch.allclose(h, m.transformer(prompt, causal=True), atol=1e-6)
    assert caches[0][0].shape == (2, 4, 5, 4 if kw.get("qk_dim") else 8)  # K: [B, H, T, qk head size]


def test_grad_checkpoint_recomputes_blocks_with_the_same_gradients():
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    grads, calls = [], []
    for flag in (False, True):
        torch.manual_seed(0)
        m = GPT(tiny(n_layer=2, dropout=0.0, grad_checkpoint=flag)).train()
        seen = []
        m.transformer.h[0].register_forward_pre_hook(lambda *_: seen.append(1))
        m(x, x, return_logits=False)[1].backward()
        grads.append([p.grad for p in m.parameters()])
        calls.append(len(seen))
    assert calls == [1, 2]  # checkpointed: the block runs again in backward
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
    with pytest.raises(UserError, match="grad_checkpoint"):
        tiny(grad_checkpoint="yes")
