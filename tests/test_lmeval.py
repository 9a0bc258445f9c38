"""lm-eval-harness, run offline on an export, agrees with oelm's own held-out perplexity."""

from __future__ import annotations

from pathlib import Path

import pytest

from oelm.data.lm import load_lm_split, prepare_lm
from oelm.hf.export import export_hf
from oelm.hf.lmeval import TASK_NAME, heldout_text, token_perplexity, write_task
from oelm.training.loop import train
from train_utils import one_thread, tiny_config

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install -e '.[eval]')")


@pytest.mark.slow  # a tiny run, its export and one lm-eval pass: ~30 s
@pytest.mark.parametrize("tokenizer", ["gpt2", "byte"])
def test_lm_eval_on_an_export_agrees_with_oelms_held_out_perplexity(
    tokenizer: str, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPT-2-BPE run and a byte-level one (whose export once carried no tokenizer, so lm-eval
    scored every text as empty and reported 0.07 bits per byte for a 3-bits-per-byte model)."""
    import transformers
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(f"Once upon a time a cat, number {i}, liked fish and milk." for i in range(300)))
    data = tmp_path / "data"
    spec = f"gpt2:{shared_data / 'tokenizers' / 'gpt2'}" if tokenizer == "gpt2" else "byte"
    prepare_lm(src, spec, data, val_fraction=0.1, test_fraction=0.1, verbose=False)
    cfg = tiny_config(data, tmp_path / "run", steps=30, warmup=0, seq_len=32, final_eval_batches=None)
    vocab = 50257 if tokenizer == "gpt2" else 257
    cfg["model_overrides"] = {**cfg.get("model_overrides", {}), "vocab_size": vocab, "block_size": 64}
    with one_thread():
        ours = train(cfg)["test_perplexity"]
    export_hf(tmp_path / "run", tmp_path / "hf")  # n_positions = 32, the context it trained at

    text = heldout_text(data)
    (tmp_path / "heldout.txt").write_text(text)
    write_task(tmp_path / "tasks", tmp_path / "heldout.txt")
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tmp_path / 'hf'},max_length=32",
        tasks=[TASK_NAME],
        task_manager=TaskManager(include_path=str(tmp_path / "tasks")),
        device="cpu",
        batch_size=1,
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    tokens = tokenizer(text)["input_ids"]
    assert tokens == [int(t) for t in load_lm_split(data, "test")]  # the same token stream
    theirs = token_perplexity(out["results"][TASK_NAME]["bits_per_byte,none"], text, len(tokens))
    # Same model, same context; only the windows' alignment differs (lm-eval scores every token).
    assert theirs == pytest.approx(ours, rel=0.02)
