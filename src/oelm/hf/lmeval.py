"""lm-evaluation-harness as an outside evaluator of an `oelm export`: a local held-out task.

`write_task` writes a rolling log-likelihood task over a text file (the held-out split of a
prepared data folder, from `heldout_text`), which `lm_eval --include_path` runs offline on the
exported GPT2LMHeadModel. lm-eval reports bits per byte; `token_perplexity` turns that into the
token perplexity `oelm` reports, so the two can be compared at the same context.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from oelm.data.lm import load_lm_split, read_meta
from oelm.data.tokenizers import load_tokenizer
from oelm.utils.errors import UserError

TASK_NAME = "oelm_heldout"


def heldout_text(data_dir: str | Path, split: str = "test") -> str:
    """The text of a prepared split, decoded with the data's own tokenizer (documents joined by
    its end-of-text token, as the split's tokens are)."""
    meta = read_meta(data_dir)
    if split not in meta["splits"]:
        raise UserError(f"{str(data_dir)!r} has no {split!r} split (it has {', '.join(meta['splits'])})")
    tokenizer = load_tokenizer(meta["tokenizer"])
    return tokenizer.decode([int(t) for t in load_lm_split(data_dir, split)])


def write_task(folder: str | Path, text_file: str | Path, name: str = TASK_NAME) -> Path:
    """Write NAME.yaml: lm-eval's rolling log-likelihood over `text_file` as one document."""
    text_file = Path(text_file).resolve()
    if not text_file.is_file():
        raise UserError(f"held-out text {str(text_file)!r} not found; write it first (oelm.hf.lmeval.heldout_text)")
    task = {
        "task": name,
        "dataset_path": "text",  # the Hugging Face `text` builder: local files, no download
        "dataset_kwargs": {"data_files": {"test": str(text_file)}, "sample_by": "document"},
        "test_split": "test",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "{{text}}",
        "should_decontaminate": False,
        "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False), encoding="utf-8")
    return path


def token_perplexity(bits_per_byte: float, text: str, n_tokens: int) -> float:
    """Token perplexity from lm-eval's bits per byte: exp(total NLL / tokens scored)."""
    if n_tokens < 1:
        raise UserError("no tokens to average over")
    return math.exp(bits_per_byte * math.log(2) * len(text.encode("utf-8")) / n_tokens)
