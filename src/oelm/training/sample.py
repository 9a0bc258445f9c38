"""Text generation from a run directory's checkpoint with the run's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from oelm.errors import UserError
from oelm.training.checkpoint import read_metadata, resolve_checkpoint
from oelm.training.distributed import resolve_device


def load_run_model(run_dir: str | Path, checkpoint: str = "best", device: str = "cpu"):
    """(GPT in eval mode, tokenizer spec) from a run's checkpoint; the weights file is self-describing.

    The recorded method is re-applied before loading, so tensors it added (adapters) load too.
    """
    from oelm.models.gpt import GPT, GPTConfig
    from oelm.training.checkpoint import apply_recorded_method, load_weights

    path = resolve_checkpoint(Path(run_dir), checkpoint)
    meta = read_metadata(path)
    if "gpt_config" not in meta:
        raise UserError(f"{str(path)!r} is not a language-model checkpoint (no gpt_config); sample needs an LM run")
    model = GPT(GPTConfig(**json.loads(meta["gpt_config"])))
    apply_recorded_method(model, meta)
    load_weights(model, path)
    return model.to(resolve_device(device)).eval(), meta.get("tokenizer", "")


def sample(
    run_dir: str | Path,
    prompt: str,
    tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    checkpoint: str = "best",
    device: str = "cpu",
) -> str:
    """Continue `prompt` by `tokens` tokens (temperature 0 = greedy); returns prompt + continuation."""
    from oelm.data.tokenizers import load_tokenizer

    if tokens < 1:
        raise UserError(f"--tokens must be at least 1, got {tokens}")
    if temperature < 0:
        raise UserError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise UserError(f"--top-k must be at least 1 (or left out), got {top_k}")
    resolve_device(device)  # an unknown or missing device fails before any loading
    model, spec = load_run_model(run_dir, checkpoint, device)
    tok = load_tokenizer(spec)
    ids = tok.encode(prompt) or [tok.eot_id]  # an empty prompt starts from end-of-text
    idx = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    gen = torch.Generator(device=idx.device).manual_seed(seed)
    out = model.generate(idx, tokens, temperature=temperature, top_k=top_k, generator=gen)
    return tok.decode(out[0].tolist())
