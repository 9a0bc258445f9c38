"""Text generation from a run directory's checkpoint with the run's tokenizer."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from oelm.core.audit import check_finite
from oelm.data.tokenizers import load_tokenizer
from oelm.models.gpt import GPT
from oelm.models.llama import Llama
from oelm.training.checkpoint import read_metadata, resolve_checkpoint
from oelm.training.distributed import resolve_device
from oelm.training.runs import existing_run_dir, load_checkpoint, run_tokenizer_spec
from oelm.utils.errors import UserError
from oelm.utils.io import read_yaml

log = logging.getLogger(__name__)


def load_run_model(
    run_dir: str | Path, checkpoint: str = "best", device: str = "cpu", text: bool = True
) -> tuple[GPT | Llama, str]:
    """(GPT or Llama in eval mode, tokenizer spec) of a language-model run, through the one run loader
    (`oelm.training.runs.load_model`: method re-applied, freeze audit verified). With text=False
    (the probe reports) a probe run's decoder loads too, with no tokenizer ("")."""
    run = existing_run_dir(run_dir)
    path = resolve_checkpoint(run, checkpoint)  # resolved and its metadata read once, then loaded from them
    meta = read_metadata(path)
    task = meta.get("task", "lm")
    if not text:
        spec = ""
    elif task != "lm":  # a probe run's model reads synthetic token rows: no text, no tokenizer to decode with
        what = "a synthetic probe run (MQAR-style rows, no text)" if task == "probe" else f"a {task!r} run"
        raise UserError(
            f"{str(run_dir)!r} is {what}, not a language-model run: sample needs a run of --task lm; "
            "evaluate a probe run with `oelm report` instead"
        )
    else:
        spec = run_tokenizer_spec(run_dir, meta)
    if text and not spec:
        raise UserError(f"{str(run_dir)!r} records no tokenizer; sample needs an LM run trained on prepared text data")
    model = load_checkpoint(run, path, meta, device)
    if not isinstance(model, (GPT, Llama)):
        raise UserError(
            f"{str(run_dir)!r} is not a language-model run ({type(model).__name__}); sample needs an LM run"
        )
    return model, spec


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

    if tokens < 1:
        raise UserError(f"--tokens must be at least 1, got {tokens}")
    if not math.isfinite(temperature) or temperature < 0:  # NaN passes `< 0` and samples from NaN weights
        raise UserError(f"--temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise UserError(f"--top-k must be at least 1 (or left out), got {top_k}")
    resolve_device(device)  # an unknown or missing device fails before any loading
    model, spec = load_run_model(run_dir, checkpoint, device)
    check_finite(model)  # a diverged checkpoint samples from NaN probabilities: refuse, naming the tensor
    tok = load_tokenizer(spec)
    ids = tok.encode(prompt) or [tok.eot_id]  # an empty prompt starts from end-of-text
    idx = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    gen = torch.Generator(device=idx.device).manual_seed(seed)
    # The context the run trained at: position rows past it (up to the block size) were never trained.
    context = int(read_yaml(Path(run_dir) / "config.yaml", "run config").get("seq_len") or model.config.block_size)
    if len(ids) + tokens > context:
        log.warning(
            "the prompt (%d tokens) and %d new tokens exceed the %d tokens the run trained at: past that, each "
            "new token sees the last %d tokens only (a sliding window)",
            len(ids),
            tokens,
            context,
            context,
        )
    window = min(context, model.config.block_size)
    out = model.generate(idx, tokens, temperature=temperature, top_k=top_k, generator=gen, context=window)
    return tok.decode(out[0].tolist())
