"""Generation never reads position rows past the context the model was trained at."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from oelm.models.gpt import GPT, Backbone, gpt_config
from oelm.training.loop import train
from oelm.training.sample import sample
from oelm.utils.errors import UserError
from train_utils import one_thread, synthetic_lm_dir, tiny_config


def _longest_input(model: GPT) -> list[int]:
    """Start + length of every position span the backbone reads (cached steps included)."""
    seen: list[int] = []
    model.transformer.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append(kwargs.get("start", 0) + args[0].shape[1]), with_kwargs=True
    )
    return seen


@pytest.mark.parametrize("context", [None, 1, 7, 16])
def test_generate_reads_at_most_context_positions_and_keeps_the_prompt(context) -> None:
    model = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16, n_layer=1)).eval()
    seen = _longest_input(model)
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    out = model.generate(prompt, 30, temperature=0, context=context)
    assert out.shape == (2, 35) and torch.equal(out[:, :5], prompt)
    assert max(seen) == (context or 16)  # the window slides once the sequence outgrows it


@pytest.mark.parametrize("context", [0, -1, 17])
def test_a_context_beyond_the_block_size_is_refused(context) -> None:
    model = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16, n_layer=1))
    with pytest.raises(UserError, match=r"context .* must be in 1\.\.16"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 3, context=context)


def test_sample_of_a_run_trained_shorter_than_its_block_stays_in_the_trained_context(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    cfg = tiny_config(
        synthetic_lm_dir(tmp_path / "data", vocab=257, n_train=2000), tmp_path / "run", steps=4, seq_len=8
    )
    with one_thread():
        train(cfg)  # block size 32, trained at 8 tokens: rows 8..31 of wpe never trained
    seen: list[int] = []  # 1 + the last position each forward reads (the KV cache reads from `start` on)
    original = Backbone.forward
    monkeypatch.setattr(
        Backbone,
        "forward",
        lambda self, idx, *a, start=0, **k: (
            seen.append(start + idx.shape[1]) or original(self, idx, *a, start=start, **k)
        ),
    )
    with caplog.at_level(logging.WARNING, logger="oelm"):
        sample(tmp_path / "run", "", tokens=20, temperature=0)
    assert max(seen) == 8
    assert "exceed the 8 tokens the run trained at" in caplog.text and "sliding window" in caplog.text
    caplog.clear()
    seen.clear()
    sample(tmp_path / "run", "", tokens=3, temperature=0)
    assert max(seen) <= 8 and "exceed" not in caplog.text


@pytest.mark.parametrize("temperature", [float("nan"), float("inf")])
def test_a_non_finite_temperature_is_refused_before_loading(tmp_path: Path, temperature: float) -> None:
    with pytest.raises(UserError, match="--temperature must be a finite number"):
        sample(tmp_path / "no-run", "hi", tokens=2, temperature=temperature)  # refused before the run is read
    model = GPT(gpt_config("gpt-tiny", vocab_size=64, block_size=16, n_layer=1)).eval()
    with pytest.raises(UserError, match="temperature must be a finite number"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, temperature=temperature)


def test_sample_from_weights_holding_nan_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from oelm.training.checkpoint import read_metadata

    cfg = tiny_config(synthetic_lm_dir(tmp_path / "data", vocab=257, n_train=2000), tmp_path / "run", steps=4)
    with one_thread():
        train(cfg)
    weights = next((tmp_path / "run" / "checkpoints").glob("step_*/model.safetensors"))
    state = load_file(weights)
    state["lm_head.weight"][0, 0] = float("nan")  # a trainable tensor: the freeze audit passes, the values do not
    save_file(state, weights, metadata=read_metadata(weights))
    step = weights.parent.name.removeprefix("step_").lstrip("0")
    with pytest.raises(UserError, match=r"tensor '(transformer\.wte|lm_head)\.weight' holds 1 non-finite value"):
        sample(tmp_path / "run", "", tokens=2, checkpoint=step)
