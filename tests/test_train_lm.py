"""LM training end to end: loss drops on TinyStories, run-directory schema, frozen Q/K, sampling."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from oelm.training.checkpoint import WEIGHTS, list_steps, load_weights
from oelm.training.config import make_config
from oelm.training.distributed import DistInfo
from oelm.training.lm import LMTask
from oelm.training.loop import lr_factor, train
from train_utils import one_thread, synthetic_lm_dir, tiny_config, tinystories_dir

RESULT_KEYS = {
    "schema_version",
    "status",
    "task",
    "method",
    "model",
    "dataset",
    "seed",
    "lr",
    "steps",
    "tokens_seen",
    "best_val_loss",
    "best_step",
    "total_wall_time",
    "mean_step_time",
    "median_step_time",
    "tokens_per_second",
    "peak_memory_bytes",
    "trainable_params",
    "frozen_params",
    "freeze_check",
    "git_commit",
    "device",
    "primary_metric",
    "selection_metric",
    "val_loss",
    "val_perplexity",
    "test_loss",
    "test_perplexity",
    "final_perplexity",
    "final_split",
    "test_source",
    "val_windows",
    "val_windows_all",
    "val_subset",
}


@pytest.fixture(scope="module")
def ts_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One short gpt-tiny run (oelm-freeze, weight decay on) on the TinyStories sample."""
    root = tmp_path_factory.mktemp("ts")
    data = tinystories_dir(root / "data", max_docs=300)
    cfg = tiny_config(
        data,
        root / "run",
        model_overrides={"block_size": 64},
        seq_len=64,
        batch_size=8,
        steps=36,
        eval_every=12,
        eval_batches=4,
        final_eval_batches=8,
        checkpoint_every=12,
        keep_last=2,
        weight_decay=0.1,
        log_every=4,
        tensorboard=True,
    )
    with one_thread():
        return root / "run", train(cfg)


def test_validation_loss_drops_on_tinystories(ts_run: tuple[Path, dict]) -> None:
    run, results = ts_run
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [12, 24, 36]
    assert evals[-1]["loss"] < evals[0]["loss"]
    assert results["best_val_loss"] < 0.75 * math.log(257)  # well below the uniform-guess loss
    assert results["val_perplexity"] == pytest.approx(math.exp(results["val_loss"]))
    # No test split: the final numbers are validation's and say so; no "final" perplexity poses as test.
    assert results["test_loss"] is None and results["final_perplexity"] is None
    assert results["final_split"] == "val" and results["test_source"] is None and "model_type" not in results
    assert results["primary_metric"] == "val_perplexity"
    # eval_batches=4 x batch 8 = 32 evenly spaced windows of a larger split: labelled a subset.
    assert results["val_windows"] == 32 < results["val_windows_all"] and results["val_subset"] is True


def test_run_directory_schema(ts_run: tuple[Path, dict]) -> None:
    run, results = ts_run
    for name in ("config.yaml", "metrics.jsonl", "results.json", "timing_stats.json", "freeze_audit.json"):
        assert (run / name).is_file(), name
    assert any((run / "tb").iterdir())
    assert set(results) >= RESULT_KEYS
    assert json.loads((run / "results.json").read_text()) == results
    assert results["status"] == "complete" and results["tokens_seen"] == 36 * 8 * 64
    train_lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    first = next(x for x in train_lines if x["kind"] == "train")
    assert set(first) == {"kind", "step", "loss", "lr", "tokens", "step_time"}
    timing = json.loads((run / "timing_stats.json").read_text())
    assert {"mean", "std", "median", "min", "max", "p95", "p99"} <= set(timing["step_time"])
    assert timing["step_time"]["count"] == 36 - 5 and timing["flops_per_step"] > 0
    assert timing["achieved_flops_per_second"] > 0 and "LM head and attention" in timing["mfu_counts"]
    assert timing["mfu"] is None and timing["mfu_note"]  # CPU: no peak FLOP/s assumed
    assert timing["eval"]["count"] == 3
    steps = [s for s, _ in list_steps(run / "checkpoints")]
    assert steps == [24, 36]  # keep_last=2
    assert (run / "checkpoints" / "best" / WEIGHTS).is_file()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000036"


def test_frozen_qk_bit_identical_after_training_with_weight_decay(ts_run: tuple[Path, dict]) -> None:
    from oelm import apply_method
    from oelm.models.gpt import GPT, GPTConfig

    run, results = ts_run
    assert results["freeze_check"]["ok"] and results["freeze_check"]["n_frozen_checked"] == 4
    audit = json.loads((run / "freeze_audit.json").read_text())
    assert audit["end"]["ok"] and audit["start"]["totals"]["frozen"] == results["frozen_params"]
    from oelm.training.checkpoint import read_metadata

    last = run / "checkpoints" / "step_0000036" / WEIGHTS
    gcfg = GPTConfig(**json.loads(read_metadata(last)["gpt_config"]))
    torch.manual_seed(0)
    fresh = GPT(gcfg)
    apply_method(fresh, "oelm-freeze", seed=0)
    trained = GPT(gcfg)
    load_weights(trained, last)
    for name, p in fresh.named_parameters():
        q = dict(trained.named_parameters())[name]
        if ".q_proj.weight" in name or ".k_proj.weight" in name:
            assert torch.equal(p, q), name
        elif name.endswith("v_proj.weight"):
            assert not torch.equal(p, q), name


def test_sample_from_run(ts_run: tuple[Path, dict]) -> None:
    from oelm.training.sample import sample

    run, _ = ts_run
    text = sample(run, "Once upon", tokens=20, temperature=0.8, top_k=20, seed=1)
    assert text.startswith("Once upon") and len(text) > len("Once upon")
    assert text == sample(run, "Once upon", tokens=20, temperature=0.8, top_k=20, seed=1)


def test_resume_of_finished_run_returns_stored_results(ts_run: tuple[Path, dict]) -> None:
    import yaml

    run, results = ts_run
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert train({**stored, "resume": True}) == results


def test_every_method_sees_the_same_batches(tmp_path: Path) -> None:
    data = synthetic_lm_dir(tmp_path / "d")

    def batches(method: str, seed: int) -> list[torch.Tensor]:
        task = LMTask(
            make_config(tiny_config(data, tmp_path / "r", method=method, seed=seed)), DistInfo(), torch.device("cpu")
        )
        task.validate()
        return [task.next_batch()["idx"] for _ in range(3)]

    a, b, c = batches("baseline", 0), batches("oelm-freeze", 0), batches("baseline", 1)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_lr_schedule_warmup_then_cosine_to_min() -> None:
    cfg = make_config({"data": "x", "steps": 100, "warmup": 10, "lr": 1.0, "min_lr_ratio": 0.1})
    f = [lr_factor(s, cfg) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:])) and f[99] == pytest.approx(0.1, abs=1e-3)
    lin = make_config({"data": "x", "steps": 100, "warmup": 0, "schedule": "linear", "min_lr_ratio": 0.0})
    assert lr_factor(50, lin) == pytest.approx(0.5)


@pytest.mark.slow  # inductor compiles the training step on CPU: under a minute
def test_compiled_training_runs_and_matches_eager(tmp_path: Path) -> None:
    """`compile: true` trains (fused QKV with frozen blocks, the logits-free loss) to the eager run's losses."""
    data = synthetic_lm_dir(tmp_path / "data")
    cfg = tiny_config(
        data, tmp_path / "eager", steps=8, batch_size=4, eval_every=4, checkpoint_every=0, method="oelm-freeze"
    )
    with one_thread():
        eager = train(cfg)
        compiled = train({**cfg, "out": str(tmp_path / "compiled"), "compile": True})
    assert compiled["freeze_check"]["ok"], compiled["freeze_check"]
    assert compiled["best_val_loss"] == pytest.approx(eager["best_val_loss"], rel=1e-5)
    timing = json.loads((tmp_path / "compiled" / "timing_stats.json").read_text())
    assert timing["compiled"] is True


def test_a_run_moved_to_another_place_still_samples_and_exports(shared_data: Path, tmp_path: Path, capsys) -> None:
    """The tokenizer was given by a local path that no longer exists: the run's own copy is used."""
    import shutil

    from oelm.cli import main
    from oelm.data.lm import prepare_lm

    tok = tmp_path / "tok"
    shutil.copytree(shared_data / "tokenizers" / "gpt2", tok)
    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(f"Once upon a time there was a cat number {i}." for i in range(200)))
    prepare_lm(src, f"gpt2:{tok}", tmp_path / "data", val_fraction=0.1, verbose=False)
    cfg = tiny_config(tmp_path / "data", tmp_path / "run", steps=3, warmup=0)
    cfg["model_overrides"] = {**cfg.get("model_overrides", {}), "vocab_size": 50257}
    with one_thread():
        train(cfg)
    assert (tmp_path / "run" / "tokenizer" / "vocab.json").is_file()
    moved = tmp_path / "elsewhere" / "run"
    shutil.move(tmp_path / "run", moved)
    shutil.rmtree(tok)  # the original path is gone, as on another machine
    capsys.readouterr()
    assert main(["sample", str(moved), "--prompt", "Once upon", "--tokens", "3", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("Once upon")
    assert main(["export", str(moved), "--to", "hf", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").is_file() or (tmp_path / "hf" / "vocab.json").is_file()
    # A class every transformers release knows (5.x writes "TokenizersBackend", which 4.x cannot load).
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    import transformers

    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert again.encode("Once upon") == again.encode("Once upon") and again.eos_token_id is not None


def test_timing_reports_the_gradient_bytes_frozen_qk_do_not_communicate(tmp_path: Path) -> None:
    data = synthetic_lm_dir(tmp_path / "data")
    timing = {}
    for method in ("baseline", "oelm-freeze"):
        with one_thread():
            train(tiny_config(data, tmp_path / method, steps=2, warmup=0, method=method))
        timing[method] = json.loads((tmp_path / method / "timing_stats.json").read_text())
        assert timing[method]["allreduce_bytes_per_step"] is None  # one process: nothing all-reduced
    from oelm.training.task import checked_model_config

    cfg = make_config(tiny_config(data, tmp_path / "x"))
    model_cfg = checked_model_config(cfg.model, {"vocab_size": 64, **cfg.model_overrides})
    d, layers = model_cfg.d_model, model_cfg.n_layer
    saved = timing["baseline"]["gradient_bytes_per_step"] - timing["oelm-freeze"]["gradient_bytes_per_step"]
    assert saved == layers * 2 * d * d * 4  # the Q and K weights' float32 gradients of every layer


def test_bits_per_byte_follow_the_text_bytes_whatever_the_tokenizer(shared_data: Path, tmp_path: Path) -> None:
    """bits/byte = loss x tokens per byte / ln 2 on each split's own counts; with the byte
    tokenizer a split has exactly one token per UTF-8 byte plus one end-of-text per document."""
    from oelm.data.lm import prepare_lm

    docs = [f"Once upon a time, café number {i} opened." for i in range(120)]
    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(docs))
    results = {}
    for name, tok in (("byte", "byte"), ("bpe", f"gpt2:{shared_data / 'tokenizers' / 'gpt2'}")):
        meta = prepare_lm(src, tok, tmp_path / name, val_fraction=0.1, test_fraction=0.1, seed=0, verbose=False)
        cfg = tiny_config(tmp_path / name, tmp_path / f"run-{name}", steps=2, warmup=0)
        cfg["model_overrides"] = {**cfg.get("model_overrides", {}), "vocab_size": meta["vocab_size"]}
        with one_thread():
            results[name] = train(cfg)
        r = results[name]
        per_byte = meta["splits"]["test"] / meta["split_bytes"]["test"]
        assert r["test_bits_per_byte"] == pytest.approx(r["test_loss"] * per_byte / math.log(2))
        if name == "byte":
            n_docs = meta["splits"]["test"] - meta["split_bytes"]["test"]
            assert 0 < n_docs < 20  # one end-of-text per held-out document, nothing else
    assert sum(meta["split_bytes"].values()) == sum(len(d.encode()) for d in docs)


def test_sample_resolves_the_checkpoint_once_and_reads_its_metadata_once(tmp_path, monkeypatch, capsys):
    """`oelm sample` resolves its checkpoint and reads the weights' metadata once each (issue 50);
    before, it resolved and read them itself for the tokenizer, then again through load_model."""
    import collections

    from oelm.cli import main
    from oelm.data.lm import prepare_lm
    from oelm.training import checkpoint
    from test_validate_once import count_calls

    src = tmp_path / "corpus.txt"
    src.write_text("\n\n".join(f"Once upon a time there was a cat number {i}." for i in range(200)))
    prepare_lm(src, "byte", tmp_path / "data", val_fraction=0.1, verbose=False)
    with one_thread():
        train(tiny_config(tmp_path / "data", tmp_path / "run", steps=3, warmup=0))
    counts = count_calls(
        monkeypatch, checkpoint, {"resolve_checkpoint": "resolved", "read_metadata": "metadata"}, collections.Counter()
    )
    capsys.readouterr()
    with one_thread():
        args = ["sample", str(tmp_path / "run"), "--prompt", "Once", "--tokens", "3", "--temperature", "0"]
        assert main([*args, "--checkpoint", "last"]) == 0
    assert counts == {"resolved": 1, "metadata": 1}
    assert capsys.readouterr().out.startswith("Once")
