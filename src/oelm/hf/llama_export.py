"""Our Llama-style decoder as a Hugging Face `LlamaForCausalLM` (or `Qwen3ForCausalLM` with QK-norm).

The two compute the same function: our module and state-dict names are Hugging Face's, RoPE
uses its rotate_half convention on the two halves of each head with the same inverse
frequencies, RMSNorm the same formula, SwiGLU the same gate/up/down, attention scale
1/sqrt(head_dim), bias-free projections, the same tied or untied head. So the export copies
tensors under the same keys, permuting nothing. Per-head QK RMSNorm before RoPE has no place in
LlamaForCausalLM; Qwen3 has exactly that (q_norm / k_norm over head_dim, then RoPE), so a
QK-norm model goes to `Qwen3ForCausalLM` (transformers >= 4.51).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from oelm.models.llama import Llama
from oelm.utils.errors import UserError


def check_llama_maps(model: Llama) -> None:
    """Raise naming the architecture detail of `model` that has no exact Hugging Face counterpart."""
    c = model.config
    if c.qk_width != c.d_model:
        raise UserError(
            f"this Llama has thin keys (qk_dim={c.qk_width} < d_model={c.d_model}); Hugging Face Llama gives "
            "Q, K and V one head size, so it cannot be exported exactly; sample it with `oelm sample`"
        )
    if c.q_identity or c.attn_scale != 1.0:
        raise UserError(
            f"this Llama has W_Q = I without a Q projection (q_identity={c.q_identity}) or an attention scale "
            f"x{c.attn_scale}; its export is not written yet (the method record has no Q to restore); "
            "sample it with `oelm sample`"
        )
    added = sorted({k.split(".oelm_adapter")[0] for k in model.state_dict() if "oelm_adapter" in k})
    if added:
        raise UserError(
            f"the run's method adds adapter modules (e.g. at {added[0]}) that Hugging Face Llama has no place "
            "for; export supports methods without adapters"
        )
    if c.qk_norm:
        import transformers  # heavy optional dependency: imported on use

        if not hasattr(transformers, "Qwen3ForCausalLM"):
            raise UserError(
                f"this Llama has QK-norm, which exports to Qwen3ForCausalLM, absent from transformers "
                f"{transformers.__version__}; pip install 'transformers>=4.51'"
            )


def llama_hf_config(model: Llama, eot_id: int | None = None, n_positions: int | None = None) -> Any:
    """The transformers config (LlamaConfig, or Qwen3Config with QK-norm) equal to our LlamaConfig."""
    import transformers  # heavy optional dependency: imported on use

    c = model.config
    eot = c.vocab_size - 1 if eot_id is None else eot_id
    fields = {
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.d_ff,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": n_positions or c.block_size,
        "rms_norm_eps": c.norm_eps,
        "rope_theta": c.rope_theta,
        "attention_bias": False,
        "attention_dropout": c.dropout,
        "initializer_range": c.init_std,
        "tie_word_embeddings": c.tie_embeddings,
        "bos_token_id": eot,
        "eos_token_id": eot,
    }
    if c.qk_norm:
        return transformers.Qwen3Config(**fields, use_sliding_window=False)
    return transformers.LlamaConfig(**fields, mlp_bias=False)


def to_llama(model: Llama, eot_id: int | None = None, n_positions: int | None = None) -> nn.Module:
    """A LlamaForCausalLM (Qwen3ForCausalLM with QK-norm) computing our Llama's logits, in eval mode."""
    import transformers  # heavy optional dependency: imported on use

    check_llama_maps(model)
    if n_positions is not None and not 0 < n_positions <= model.config.block_size:
        raise UserError(f"n_positions {n_positions} must be in 1..{model.config.block_size} (the block size)")
    config = llama_hf_config(model, eot_id, n_positions)
    cls = transformers.Qwen3ForCausalLM if model.config.qk_norm else transformers.LlamaForCausalLM
    hf = cls(config)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    for key in ("model.embed_tokens.weight", "lm_head.weight"):  # a padded vocabulary's rows cut off
        if key in state:
            state[key] = state[key][: model.config.vocab_size].clone()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    buffers = {n for n, _ in hf.named_buffers()}
    # A tied head is one tensor: Hugging Face may list lm_head.weight as missing and fill it by tying.
    tied = {"lm_head.weight"} if model.config.tie_embeddings else set()
    if set(missing) - buffers - tied or unexpected:
        raise UserError(
            f"{cls.__name__} mapping incomplete: missing {sorted(set(missing) - buffers - tied)[:4]}, "
            f"unexpected {unexpected[:4]}"
        )
    if model.config.tie_embeddings and hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        raise UserError(f"{cls.__name__} did not tie its head to the embedding; not exporting an unequal model")
    return hf.eval()
