"""CUDA paths (bf16 autocast, fused AdamW, CUDA-event timing); skipped without a GPU."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


def _tiny_lm_data(folder):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 20_000), ("val", 4_000)):
        rng.integers(0, 256, n, dtype=np.uint16).tofile(folder / f"{split}.bin")
    meta = {"source": "random", "tokenizer": "byte", "vocab_size": 257, "eot_id": 256, "dtype": "uint16",
            "splits": {"train": 20_000, "val": 4_000}, "split_origin": {"val": "official"}, "holdout": None}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_amp_training_keeps_frozen_qk_and_times_with_cuda_events(cuda, tmp_path, dtype):
    from oelm.training import train

    data = _tiny_lm_data(tmp_path / "data")
    results = train({"data": str(data), "model": "gpt-tiny", "method": "oelm-freeze", "steps": 12,
                     "warmup": 2, "batch_size": 4, "seq_len": 64, "eval_every": 6, "eval_batches": 2,
                     "device": "cuda", "dtype": dtype, "out": str(tmp_path / "run"), "progress": False})
    timing = json.loads((tmp_path / "run" / "timing_stats.json").read_text())
    assert results["freeze_check"]["ok"], results["freeze_check"]
    assert timing["timer"] == "cuda_events" and timing["memory_kind"] == "cuda_max_memory_allocated"
    assert np.isfinite(results["best_val_loss"])
