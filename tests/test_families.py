"""Every supported model family, one table row each (as PEFT's test suite does): build a tiny model
offline, apply oelm-freeze, train, and check exactly the Q/K rows are frozen and counted."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import oelm
from oelm.core.audit import audit_model, verify_audit
from oelm.core.flops import (
    executed_flops,
    forward_flops_per_token,
    frozen_weight_grad_flops_per_token,
    theoretical_saving,
)
from oelm.core.freezing import optimizer_groups
from oelm.core.orthogonal import orthogonality_error
from oelm.core.targets import SplitLinear, SplitQKV, find_targets
from oelm.utils.errors import UserError

T = pytest.importorskip("transformers")

VOCAB, D, LAYERS, SEQ = 97, 32, 2, 8
IDS = {"vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
LLAMA_LIKE = {"hidden_size": D, "num_hidden_layers": LAYERS, "num_attention_heads": 4, "intermediate_size": 64}
GQA = {**LLAMA_LIKE, "num_key_value_heads": 2}
BART = {
    "d_model": D,
    "encoder_layers": LAYERS,
    "decoder_layers": LAYERS,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 40,
    "decoder_start_token_id": 2,
}
T5 = {"d_model": D, "d_kv": 8, "d_ff": 64, "num_layers": LAYERS, "num_heads": 4, "decoder_start_token_id": 0}


@dataclass(frozen=True)
class Row:
    """One family: its tiny config, how its Q/K/V are stored, and its head counts."""

    id: str
    config: Callable[[], object]
    layout: str  # "separate", or the fused row order the model's own code reads: "blocks" / "groups"
    heads: tuple[int, int]  # (query heads, key/value heads)
    head: str = "lm"  # "lm": causal LM; "cls": sequence classifier; "seq2seq": encoder-decoder LM
    ffn: bool = True  # FFN as [out, in] weights (methods acting on it apply)
    family: str | None = None  # the family find_targets reports (default: the config's model_type)

    @property
    def head_dim(self) -> int:
        return D // self.heads[0]

    @property
    def blocks(self) -> int:
        """Attention blocks: one per layer; an encoder-decoder's decoder layers add cross attention."""
        return 3 * LAYERS if self.head == "seq2seq" else LAYERS


ROWS = [
    # Encoders.
    Row("bert", lambda: T.BertConfig(**LLAMA_LIKE, **IDS), "separate", (4, 4), "cls"),
    Row("roberta", lambda: T.RobertaConfig(**LLAMA_LIKE, max_position_embeddings=40, **IDS), "separate", (4, 4), "cls"),
    Row("xlm-roberta", lambda: T.XLMRobertaConfig(**LLAMA_LIKE, max_position_embeddings=40, **IDS), "separate", (4, 4), "cls"),
    Row("electra", lambda: T.ElectraConfig(**LLAMA_LIKE, embedding_size=16, **IDS), "separate", (4, 4), "cls"),
    Row("deberta", lambda: T.DebertaConfig(**LLAMA_LIKE, max_position_embeddings=40, **IDS), "groups", (4, 4), "cls"),
    Row("deberta-v2", lambda: T.DebertaV2Config(**LLAMA_LIKE, max_position_embeddings=40, **IDS), "separate", (4, 4), "cls"),
    Row("distilbert", lambda: T.DistilBertConfig(dim=D, n_layers=LAYERS, n_heads=4, hidden_dim=64, **IDS), "separate", (4, 4), "cls"),
    # Decoders with separate Q/K/V (grouped-query where the family has it).
    Row("llama", lambda: T.LlamaConfig(**GQA, **IDS), "separate", (4, 2)),
    Row("mistral", lambda: T.MistralConfig(**GQA, **IDS), "separate", (4, 2)),
    Row("qwen2", lambda: T.Qwen2Config(**GQA, **IDS), "separate", (4, 2)),
    Row("qwen3", lambda: T.Qwen3Config(**GQA, head_dim=8, **IDS), "separate", (4, 2)),
    Row("gemma", lambda: T.GemmaConfig(**GQA, head_dim=8, **IDS), "separate", (4, 2)),
    Row("gemma2", lambda: T.Gemma2Config(**GQA, head_dim=8, **IDS), "separate", (4, 2)),
    Row("gemma3_text", lambda: T.Gemma3TextConfig(**GQA, head_dim=8, **IDS), "separate", (4, 2)),
    Row("stablelm", lambda: T.StableLmConfig(**GQA, **IDS), "separate", (4, 2)),
    Row("phi", lambda: T.PhiConfig(**GQA, **IDS), "separate", (4, 2)),
    Row("mixtral", lambda: T.MixtralConfig(**GQA, num_local_experts=2, num_experts_per_tok=1, **IDS), "separate", (4, 2), ffn=False),
    Row("opt", lambda: T.OPTConfig(**LLAMA_LIKE, ffn_dim=64, word_embed_proj_dim=D, max_position_embeddings=40, **IDS), "separate", (4, 4)),
    Row("gptj", lambda: T.GPTJConfig(n_embd=D, n_layer=LAYERS, n_head=4, rotary_dim=4, n_positions=40, **IDS), "separate", (4, 4)),
    Row("gpt_neo", lambda: T.GPTNeoConfig(hidden_size=D, num_layers=LAYERS, num_heads=4, attention_types=[[["global", "local"], 1]], max_position_embeddings=40, **IDS), "separate", (4, 4)),
    # Found by naming convention: no row of their own.
    Row("starcoder2 (discovered)", lambda: T.Starcoder2Config(**GQA, **IDS), "separate", (4, 2), family="starcoder2"),
    Row("qwen3_moe (discovered)", lambda: T.Qwen3MoeConfig(**GQA, head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, **IDS), "separate", (4, 2), ffn=False, family="qwen3_moe"),
    # Decoders with a fused Q/K/V weight.
    Row("gpt2", lambda: T.GPT2Config(n_embd=D, n_layer=LAYERS, n_head=4, n_positions=40, **IDS), "blocks", (4, 4)),
    Row("gpt_neox", lambda: T.GPTNeoXConfig(**LLAMA_LIKE, **IDS), "groups", (4, 4)),
    Row("phi3", lambda: T.Phi3Config(**GQA, **IDS), "blocks", (4, 2)),
    Row("falcon (multi-query)", lambda: T.FalconConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=4, multi_query=True, **IDS), "blocks", (4, 1), family="falcon"),
    Row("falcon (grouped, new layout)", lambda: T.FalconConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=4, num_kv_heads=2, new_decoder_architecture=True, **IDS), "groups", (4, 2), family="falcon"),
    Row("falcon (multi-head)", lambda: T.FalconConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=4, multi_query=False, bias=True, **IDS), "groups", (4, 4), family="falcon"),
    Row("bloom", lambda: T.BloomConfig(hidden_size=D, n_layer=LAYERS, n_head=4, **IDS), "groups", (4, 4)),
    Row("gpt_bigcode (multi-query)", lambda: T.GPTBigCodeConfig(n_embd=D, n_layer=LAYERS, n_head=4, n_positions=40, multi_query=True, **IDS), "blocks", (4, 1), family="gpt_bigcode"),
    Row("gpt_bigcode (multi-head)", lambda: T.GPTBigCodeConfig(n_embd=D, n_layer=LAYERS, n_head=4, n_positions=40, multi_query=False, **IDS), "groups", (4, 4), family="gpt_bigcode"),
    # Encoder-decoders: self attention in both stacks, cross attention in the decoder.
    Row("bart", lambda: T.BartConfig(**BART, **IDS), "separate", (4, 4), "seq2seq"),
    Row("mbart", lambda: T.MBartConfig(**BART, **IDS), "separate", (4, 4), "seq2seq"),
    Row("marian", lambda: T.MarianConfig(**BART, **IDS), "separate", (4, 4), "seq2seq"),
    Row("pegasus", lambda: T.PegasusConfig(**BART, **IDS), "separate", (4, 4), "seq2seq"),
    Row("t5", lambda: T.T5Config(**T5, **IDS), "separate", (4, 4), "seq2seq"),
    Row("mt5 (gated FFN)", lambda: T.MT5Config(**T5, **IDS), "separate", (4, 4), "seq2seq", family="mt5"),
    Row("mpt", lambda: T.MptConfig(d_model=D, n_layers=LAYERS, n_heads=4, expansion_ratio=2, max_seq_len=40, **IDS), "blocks", (4, 4)),
]  # fmt: skip
FUSED = [r for r in ROWS if r.layout != "separate"]
SEQ2SEQ = [r for r in ROWS if r.head == "seq2seq"]


def build(row: Row):
    torch.manual_seed(0)
    try:
        cfg = row.config()
    except AttributeError as err:  # a family newer than the installed transformers (the CI floor stage)
        pytest.skip(f"transformers {T.__version__} has no config class for {row.id}: {err}")
    if row.head == "cls":
        cfg.num_labels = 3
        return T.AutoModelForSequenceClassification.from_config(cfg)
    if row.head == "seq2seq":
        return T.AutoModelForSeq2SeqLM.from_config(cfg)
    return T.AutoModelForCausalLM.from_config(cfg)


def logits_of(row: Row, model, x: torch.Tensor) -> torch.Tensor:
    if row.head == "seq2seq":  # decoder as long as encoder: every projection sees the same tokens
        return model(input_ids=x, decoder_input_ids=x).logits
    return model(input_ids=x).logits


def tokens(seq: int = SEQ) -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, seq), generator=torch.Generator().manual_seed(1))


def loss_of(row: Row, model, x: torch.Tensor) -> torch.Tensor:
    if row.head == "cls":
        return model(input_ids=x, labels=torch.arange(x.shape[0]) % 3).loss
    return model(input_ids=x, labels=x).loss


def fused_qkv_rows(row: Row, n_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of Q, K, V in a fused weight, read the way each family's own attention code reads its output."""
    n, g = row.heads
    r = torch.arange(n_rows)
    if row.layout == "blocks":  # e.g. Phi-3: qkv[..., :n*d], [n*d : (n+g)*d], the rest
        q, k, v = r.split([n * row.head_dim, g * row.head_dim, g * row.head_dim])
        return q, k, v
    # e.g. GPT-NeoX view(..., -1, 3 * head_size).chunk(3); Falcon-40B view(..., -1, n // g + 2, head_dim)
    grid = r.view(g, n // g + 2, row.head_dim)
    return grid[:, :-2].flatten(), grid[:, -2].flatten(), grid[:, -1].flatten()


def fused_weight(row: Row, state_dict: dict, layer) -> torch.Tensor:
    """A layer's fused Q/K/V weight from a state_dict, as [out, in] (GPT-2's Conv1D stores [in, out])."""
    w = state_dict[layer.q.name.rsplit(".", 1)[0] + ".weight"]
    return w.T if row.id == "gpt2" else w


def qk_weight_grad_flops_per_token(row: Row) -> int:
    """By hand: each layer's frozen Q [n*d, D] and K [g*d, D] skip a 2*in*out weight gradient per token."""
    n, g = row.heads
    return row.blocks * 2 * D * (n + g) * row.head_dim


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_oelm_freeze_freezes_exactly_the_qk_rows(row, tmp_path):
    model = build(row)
    fixed = {id(p) for p in model.parameters() if not p.requires_grad}  # e.g. Marian's sinusoidal positions
    state = oelm.apply_method(model, "oelm-freeze", seed=0)
    targets = find_targets(model)
    assert targets.family == (row.family or model.config.model_type) == state.family
    assert len(targets.layers) == row.blocks
    assert sum(layer.kind == "cross" for layer in targets.layers) == (LAYERS if row.head == "seq2seq" else 0)
    n, g = row.heads
    for layer in targets.layers:
        assert (layer.n_heads, layer.n_kv_heads) == (n, g)
        assert layer.q.shape_out_in == (n * row.head_dim, D) and layer.k.shape_out_in == (g * row.head_dim, D)
        # Q orthonormal per query head, K per key/value head.
        assert orthogonality_error(layer.q.get(), n) < 1e-5
        assert orthogonality_error(layer.k.get(), g) < 1e-5
        assert isinstance(layer.q.module, (SplitLinear, SplitQKV)) == (row.layout != "separate")
        assert bool(layer.ffn) == (row.ffn and layer.kind == "self")
    # Two AdamW steps with weight decay: exactly Q/K stay bit-identical, everything else moves.
    audit = audit_model(model)
    frozen = {id(p) for layer in targets.layers for proj in (layer.q, layer.k) for _, p in proj.params()}
    assert {id(p) for p in model.parameters() if not p.requires_grad} == frozen | fixed
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    fused_before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(optimizer_groups(model, weight_decay=0.1), lr=1e-2)
    for _ in range(2):
        loss_of(row, model, tokens()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) == (id(p) in frozen | fixed), name
    check = verify_audit(model, audit, opt)
    assert check.ok, check.problems
    if row.layout != "separate":  # the fused weight on disk: Q/K rows identical, V rows moved
        after = model.state_dict()
        for layer in targets.layers:
            w0, w1 = fused_weight(row, fused_before, layer), fused_weight(row, after, layer)
            rows_q, rows_k, rows_v = fused_qkv_rows(row, w0.shape[0])
            qk = torch.cat([rows_q, rows_k])
            assert torch.equal(w0[qk], w1[qk])
            assert not torch.equal(w0[rows_v], w1[rows_v])
    # The FLOP saving counted is the Q/K weight gradient, by hand and as executed.
    saved = frozen_weight_grad_flops_per_token(model)
    assert saved == qk_weight_grad_flops_per_token(row)
    full = 3 * forward_flops_per_token(model, SEQ, adapters=False)
    assert theoretical_saving(model, SEQ) == pytest.approx(saved / full) and saved > 0
    # Save and reload: same logits, through oelm and (fused layout on disk) through transformers alone.
    model.eval()
    x = tokens()
    model.save_pretrained(tmp_path)
    again = oelm.from_pretrained(tmp_path).eval()
    plain = type(model).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        logits = logits_of(row, model, x)
        assert torch.allclose(logits_of(row, again, x), logits, atol=1e-5)
        assert torch.allclose(logits_of(row, plain, x), logits, atol=1e-5)
    assert plain.state_dict().keys() == model.state_dict().keys()
    assert not any(p.requires_grad for layer in find_targets(again).layers for p in (layer.q.weight, layer.k.weight))


@pytest.mark.parametrize("row", FUSED, ids=lambda r: r.id)
def test_a_split_fused_qkv_computes_what_the_fused_weight_did(row):
    model = build(row).eval()
    reference = copy.deepcopy(model)
    x = tokens()
    targets = find_targets(model)  # splits in place
    with torch.no_grad():
        assert torch.allclose(model(input_ids=x).logits, reference(input_ids=x).logits, atol=1e-6)
    # The same tensors on disk, bit for bit.
    split_sd, ref_sd = model.state_dict(), reference.state_dict()
    assert split_sd.keys() == ref_sd.keys()
    assert all(torch.equal(split_sd[k], ref_sd[k]) for k in ref_sd)
    # The split reads Q, K, V from the rows the model's own attention code does.
    for layer in targets.layers:
        fused = fused_weight(row, ref_sd, layer)
        for proj, rows in zip((layer.q, layer.k, layer.v), fused_qkv_rows(row, fused.shape[0])):
            assert torch.equal(proj.get(), fused[rows])
        if isinstance(layer.q.module, SplitLinear):  # model code that reads .weight still gets the fused one
            assert torch.equal(layer.q.module.weight, fused)
    # And loading the fused state_dict back splits it the same way.
    fresh = copy.deepcopy(reference)
    find_targets(fresh)
    fresh.load_state_dict(ref_sd)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters()))


@pytest.mark.parametrize("row", FUSED, ids=lambda r: r.id)
def test_one_token_attention_gives_qk_rows_no_gradient(row):
    """With one token, softmax over one key is 1: Q and K rows get no gradient (up to rounding), V's do.

    An independent check that the split took Q/K rows and V rows where the model's code does.
    """
    model = build(row)
    find_targets(model)
    model(input_ids=tokens(1)).logits.pow(2).mean().backward()
    for layer in find_targets(model).layers:
        v = layer.v.weight.grad.abs().max()
        assert v > 0
        assert layer.q.weight.grad.abs().max() < 1e-6 * v and layer.k.weight.grad.abs().max() < 1e-6 * v


@pytest.mark.parametrize("row", FUSED + SEQ2SEQ, ids=lambda r: r.id)
def test_frozen_qk_computes_no_weight_gradient(row):
    """Executed FLOPs: freezing skips exactly the Q/K weight gradients (cross attention's K on encoder tokens)."""
    x = tokens()
    counts = {}
    for method in ("baseline", "oelm-freeze"):
        model = build(row)
        oelm.apply_method(model, method, seed=0)
        counts[method] = executed_flops(lambda: loss_of(row, model, x).backward())
    assert counts["baseline"] - counts["oelm-freeze"] == x.numel() * qk_weight_grad_flops_per_token(row)


@pytest.mark.parametrize("row", [r for r in SEQ2SEQ if r.id in ("bart", "t5")], ids=lambda r: r.id)
def test_a_method_may_leave_cross_attention_alone(row):
    self_only = dataclasses.replace(oelm.get_method("oelm-freeze"), name="oelm-freeze-self", cross_attention=False)
    model, untouched = build(row), build(row)
    oelm.apply_method(model, self_only, seed=0)
    for layer, ref in zip(find_targets(model).layers, find_targets(untouched).layers):
        for proj, ref_proj in ((layer.q, ref.q), (layer.k, ref.k)):
            if layer.kind == "cross":  # default init, trainable
                assert proj.weight.requires_grad and torch.equal(proj.get(), ref_proj.get())
            else:
                assert not proj.weight.requires_grad and orthogonality_error(proj.get(), layer.n_heads) < 1e-5


@pytest.mark.parametrize("row", [r for r in ROWS if not r.ffn], ids=lambda r: r.id)
@pytest.mark.parametrize("method", ["oelm-qk-ffn", "ffn-only"])
def test_methods_on_an_ffn_that_is_not_linear_weights_refuse_the_model(row, method):
    model = build(row)
    with pytest.raises(UserError, match="FFN"):
        oelm.apply_method(model, method, seed=0)
    assert all(p.requires_grad for p in model.parameters())  # nothing frozen on the way


def test_an_unknown_family_is_a_clear_error():
    class Mystery(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("Config", (), {"model_type": "mystery"})()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

    for model in (Mystery(), torch.nn.Linear(3, 3)):
        with pytest.raises(UserError, match="no known Q/K layout.*supported families: oelm-gpt, oelm-llama, bert"):
            oelm.apply_method(model, "oelm-freeze")
    # Several stacks of layers (an encoder-decoder without a row) are never guessed at.
    whisper = T.WhisperModel(T.WhisperConfig(**BART, **IDS))
    with pytest.raises(UserError, match="no known Q/K layout.*several layer stacks"):
        oelm.apply_method(whisper, "oelm-freeze")


GLOBAL_ATTENTION = {
    "longformer": lambda: T.LongformerConfig(**LLAMA_LIKE, attention_window=4, max_position_embeddings=40, **IDS),
    "led": lambda: T.LEDConfig(**BART, attention_window=4, max_encoder_position_embeddings=40, **IDS),
}


@pytest.mark.parametrize("family", sorted(GLOBAL_ATTENTION))
@pytest.mark.parametrize("method", ["oelm-freeze", "oelm-freeze-k", "baseline"])
def test_a_family_with_global_attention_projections_is_refused_before_any_change(family, method):
    """Longformer's query_global / key_global compute attention scores too; LED's encoder is a
    Longformer under a BART-named decoder. Leaving them trainable would not be the method named."""
    model = T.AutoModel.from_config(GLOBAL_ATTENTION[family]())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(UserError, match=r"(query|key)(_global)?: this .* refused"):
        oelm.apply_method(model, method, seed=0)
    assert all(p.requires_grad and torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_big_bird_reuses_its_qk_for_global_tokens_and_every_one_is_frozen():
    model = T.AutoModel.from_config(T.BigBirdConfig(**LLAMA_LIKE, max_position_embeddings=64, **IDS))
    oelm.apply_method(model, "oelm-freeze", seed=0)
    qk = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n.rpartition(".")[2] in ("query", "key")
    ]
    assert len(qk) == 2 * LAYERS
    assert all(not m.weight.requires_grad for n, m in model.named_modules() if n in qk)


@pytest.mark.parametrize("row", [r for r in FUSED if r.id in ("gpt_neox", "phi3")], ids=lambda r: r.id)
@pytest.mark.parametrize("method", ["oelm-qknorm", "oelm-lowrank"])
def test_adapters_on_a_split_fused_qk_train_and_reload(row, method, tmp_path):
    """An adapter wraps its part's output before the split puts the columns back in the fused order."""
    model = build(row)
    oelm.apply_method(model, method, seed=0)
    audit = audit_model(model)
    opt = torch.optim.AdamW(optimizer_groups(model, weight_decay=0.1), lr=1e-2)
    for _ in range(2):
        loss_of(row, model, tokens()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert verify_audit(model, audit, opt).ok
    model.eval().save_pretrained(tmp_path)
    again = oelm.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.allclose(logits_of(row, again, tokens()), logits_of(row, model, tokens()), atol=1e-5)
