"""Probe task (issue 11 section 4): MQAR / induction data, answer-only metrics, training end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from oelm.data.synthetic import IGNORE, ProbeData, ProbeOptions, generate, n_keys, split_generator
from oelm.training.probe import answer_stats
from oelm.utils.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_mqar_answers_are_retrievable_from_the_context() -> None:
    opts = ProbeOptions(kind="mqar", vocab=32, seq_len=40, n_pairs=6, n_queries=4)
    x, y = generate(opts, 200, _gen())
    keys = n_keys(32)
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        ctx_k, ctx_v = row_x[0:12:2], row_x[1:12:2]
        assert len(set(ctx_k)) == 6 and all(1 <= k <= keys for k in ctx_k)
        assert all(keys < v <= 2 * keys for v in ctx_v)
        lookup = dict(zip(ctx_k, ctx_v))
        answers = [t for t, a in enumerate(row_y) if a != IGNORE]
        assert len(answers) == 4 and min(answers) >= 12
        for t in answers:
            # The query is a context key; its target is that key's value, which also follows it.
            assert row_y[t] == lookup[row_x[t]] == row_x[t + 1]
        queried = [t for t in range(12, 40) if row_x[t] != 0 and row_y[t] != IGNORE]
        assert queried == answers  # outside the context only queries and their answers are non-filler
        assert sum(tok != 0 for tok in row_x[12:]) == 8


def test_induction_second_copy_equals_first_and_only_it_is_scored() -> None:
    opts = ProbeOptions(kind="induction", vocab=24, seq_len=32, min_period=3, max_period=12)
    x, y = generate(opts, 200, _gen(1))
    periods = set()
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        period = next(t for t in range(1, 32) if row_x[t] == row_x[0])
        periods.add(period)
        assert 3 <= period <= 12 and len(set(row_x[:period])) == period  # distinct: one earlier match
        assert all(row_x[t] == row_x[t - period] for t in range(period, 32))
        assert all(a == IGNORE for a in row_y[:period])
        for t in range(period, 32):
            # Answer = the token after the earlier occurrence of the current token.
            assert row_y[t] == row_x[t - period + 1]
    assert len(periods) > 5  # the period varies, so no fixed positional offset solves it


def test_generation_is_deterministic_and_splits_are_disjoint() -> None:
    # A sample space of a few hundred rows forces collisions that the splits must exclude.
    opts = ProbeOptions(kind="induction", vocab=8, seq_len=8, min_period=2, max_period=3, eval_size=64)
    a, b, other = ProbeData(opts, train_seed=0), ProbeData(opts, train_seed=0), ProbeData(opts, train_seed=1)
    for split in ("val", "test"):
        assert torch.equal(a.eval[split][0], other.eval[split][0])  # eval sets do not depend on the run seed
    xa, ya = a.train_batch(256)
    xb, yb = b.train_batch(256)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(xa, other.train_batch(256)[0])

    def rows(x: torch.Tensor) -> set[tuple[int, ...]]:
        return {tuple(r) for r in x.tolist()}

    val, test = rows(a.eval["val"][0]), rows(a.eval["test"][0])
    assert not val & test
    assert not rows(xa) & (val | test)
    g1, g2 = split_generator(0, "train"), split_generator(0, "val")
    assert not torch.equal(torch.rand(8, generator=g1), torch.rand(8, generator=g2))


def test_accuracy_counts_answer_positions_only() -> None:
    targets = torch.tensor([[IGNORE, 3, IGNORE, 1], [IGNORE, IGNORE, 2, IGNORE]])
    right_at_answers = torch.nn.functional.one_hot(targets.clamp(min=0), 5).float()
    right_at_answers[0, 0, 4] = right_at_answers[0, 2, 4] = 9.0  # wrong off-answer positions: ignored
    assert answer_stats(right_at_answers, targets) == (3, 3, 2, 2)
    wrong = torch.nn.functional.one_hot((targets.clamp(min=0) + 1) % 5, 5).float()
    wrong[0, 1] = right_at_answers[0, 1]
    assert answer_stats(wrong, targets) == (1, 3, 0, 2)


def test_bad_probe_options_fail_before_work() -> None:
    from oelm.training.config import make_config

    base = {"task": "probe", "data": "synthetic", "model": "gpt-tiny"}
    with pytest.raises(UserError, match="n_pairs"):
        make_config({**base, "probe": {"kind": "mqar", "vocab": 16, "n_pairs": 9}})
    with pytest.raises(UserError, match="seq_len"):
        make_config({**base, "probe": {"kind": "mqar", "vocab": 64, "seq_len": 16, "n_pairs": 8}})
    with pytest.raises(UserError, match="max_period"):
        make_config({**base, "probe": {"kind": "induction", "vocab": 8, "seq_len": 64}})
    with pytest.raises(UserError, match="probe.kid.*did you mean 'kind'"):
        make_config({**base, "probe": {"kid": "mqar"}})
    from oelm.training.loop import train

    with pytest.raises(UserError, match="needs `probe"):
        train({**base, "device": "cpu", "steps": 2, "warmup": 0, "out": "unused"})


def _probe_config(out: Path, **over) -> dict:
    cfg = {
        "task": "probe",
        "data": "synthetic",
        "model": "gpt-tiny",
        "out": str(out),
        "model_overrides": {"d_model": 32, "n_head": 2},
        "probe": {"kind": "induction", "vocab": 16, "seq_len": 16, "eval_size": 128},
        "steps": 6,
        "batch_size": 16,
        "lr": 3e-3,
        "warmup": 0,
        "schedule": "constant",
        "eval_every": 3,
        "eval_batches": 2,
        "checkpoint_every": 0,
        "progress": False,
        "tensorboard": False,
        "device": "cpu",
        "method": "oelm-freeze",
    }
    cfg.update(over)
    return cfg


def test_probe_run_writes_higher_is_better_accuracy_that_report_tabulates(tmp_path: Path) -> None:
    from oelm.records.load import load_runs
    from oelm.reports.aggregate import compare
    from oelm.training.loop import train

    res = train(_probe_config(tmp_path / "run"))
    assert res["primary_metric"] == "test_answer_accuracy" and res["selection_metric"] == "val_answer_accuracy"
    assert 0.0 <= res["test_answer_accuracy"] <= 1.0 and res["chance_accuracy"] == 1 / 16
    assert [s for s, _ in res["accuracy_curve"]] == [3, 6]
    assert res["freeze_check"]["ok"] and res["dataset"] == "induction-v16-t16-L2-8"
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(e.get("kind") == "eval" and "accuracy" in e for e in evals)
    group = compare(load_runs([tmp_path])).groups[0]
    assert group.primary_metric == "test_answer_accuracy" and group.higher_is_better
    from oelm.reports.probes import probe_report

    text = probe_report([tmp_path])
    assert "### induction-v16-t16-L2-8" in text and "| oelm-freeze | 0.003 |" in text
    assert "How to read these numbers: docs/reading.md#probes." in text  # the guide is docs/reading.md


def test_sample_on_a_probe_run_is_refused_naming_the_task(tmp_path: Path) -> None:
    from oelm.training.loop import train
    from oelm.training.sample import sample

    train(_probe_config(tmp_path / "run", steps=2, eval_every=2, eval_batches=1))
    with pytest.raises(UserError, match=r"is a synthetic probe run .* sample needs a run of --task lm"):
        sample(tmp_path / "run", "hello", tokens=2)


def test_query_rank_accuracy_separates_recall_from_elimination() -> None:
    from oelm.training.probe import query_rank_accuracy

    opts = ProbeOptions(kind="mqar", vocab=16, seq_len=16, n_pairs=3)
    x, y = generate(opts, 32, _gen(0))
    # A model that answers only the last query right (what elimination allows) and the others wrong.
    asked = y != IGNORE
    last = asked & (asked.long().cumsum(1) == 3)
    wrong = torch.where(asked & ~last, (y + 1) % 16, y)
    logits = torch.nn.functional.one_hot(wrong.clamp(min=0), 16).float()
    assert query_rank_accuracy(logits.argmax(-1), y) == [0.0, 0.0, 1.0]
    assert query_rank_accuracy(y.clamp(min=0), y) == [1.0, 1.0, 1.0]


def test_probe_summary_tabulates_and_plots_mqar_accuracy_by_difficulty(tmp_path: Path) -> None:
    from oelm.reports.probes import probe_report
    from oelm.training.loop import train

    for method in ("baseline", "oelm-freeze"):
        for pairs, length in ((2, 16), (3, 16), (2, 24)):
            probe = {"kind": "mqar", "vocab": 16, "seq_len": length, "n_pairs": pairs, "eval_size": 64}
            train(_probe_config(tmp_path / f"{method}-p{pairs}-t{length}", method=method, probe=probe, steps=3))
    plot = tmp_path / "scaling.png"
    text = probe_report([tmp_path], plot=plot)
    table = text[text.index("### mqar: test answer accuracy by difficulty") :].splitlines()
    # Columns sorted by length, then pairs; one row per method, every cell filled (n = 1 seed).
    head = table.index("| method | 2 pairs, length 16 | 3 pairs, length 16 | 2 pairs, length 24 |")
    rows = table[head + 2 : head + 4]
    # Each MQAR table has the first/last-query column, filled from what each run recorded.
    row = next(ln for ln in text.splitlines() if ln.startswith("| baseline | 0.003 |"))
    first, last = row.rstrip(" |").rsplit("| ", 1)[1].split(" / ")
    assert 0.0 <= float(first) <= 1.0 and 0.0 <= float(last) <= 1.0
    assert {row.split(" | ")[0] for row in rows} == {"| baseline", "| oelm-freeze"}
    # Each cell: mean (n seeds) and how many seeds reached the target (3 steps: none did).
    assert all(row.count("(1); 0/1 solved") == 3 for row in rows)
    assert plot.stat().st_size > 0 and "![accuracy by difficulty](scaling.png)" in text
    # One difficulty only: no scaling table and no plot.
    assert "by difficulty" not in probe_report([tmp_path / "baseline-p2-t16"], plot=tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


@pytest.mark.slow
def test_two_layer_baseline_learns_induction_above_chance(tmp_path: Path) -> None:
    from oelm.training.loop import train

    cfg = _probe_config(
        tmp_path / "run",
        method="baseline",
        steps=250,
        batch_size=32,
        lr=3e-3,
        warmup=20,
        schedule="cosine",
        eval_every=50,
        eval_batches=4,
        model_overrides={"d_model": 64, "n_head": 2},
    )
    res = train(cfg)
    # Chance is 1/16; guessing among the tokens already seen (no copying) gets about 0.25 here.
    assert res["test_answer_accuracy"] > 0.6 > 8 * res["chance_accuracy"], res["accuracy_curve"]
    assert res["steps_to_target"] is None or res["steps_to_target"] % 50 == 0


@pytest.mark.parametrize("spec", sorted((REPO / "configs" / "probes").glob("*.yaml")), ids=lambda p: p.stem)
def test_probe_sweep_specs_validate_and_list_the_three_arms(spec: Path) -> None:
    from oelm.experiments.sweep import load_spec

    resolved = load_spec(spec, out=Path("unused"))
    assert resolved.base["task"] == "probe"
    assert {"baseline", "oelm-freeze", "oelm-random"} <= set(resolved.methods)


def test_head_scores_find_an_induction_pattern_and_capture_real_attention() -> None:
    from oelm.models.gpt import GPT, GPTConfig
    from oelm.training.probe import captured_attention, head_scores

    opts = ProbeOptions(kind="induction", vocab=16, seq_len=12, min_period=3, max_period=5)
    x, y = generate(opts, 8, _gen(2))
    t = x.shape[1]
    ideal = torch.zeros(8, 1, t, t)
    for b in range(8):
        period = int((y[b] == IGNORE).sum())
        ideal[b, 0, 0, 0] = 1.0
        for i in range(1, t):
            ideal[b, 0, i, i - period + 1 if i >= period else i - 1] = 1.0
    scores = head_scores([ideal], x, y)
    assert scores["induction"][0][0] == pytest.approx(1.0)
    uniform = torch.ones(t, t).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True)).expand(8, 1, t, t)
    assert head_scores([uniform], x, y)["induction"][0][0] < 0.5
    model = GPT(GPTConfig(vocab_size=16, block_size=12, n_layer=2, n_head=2, d_model=16)).eval()
    with torch.no_grad(), captured_attention() as maps:
        logits, _ = model(x)
    assert len(maps) == 2 and maps[0].shape == (8, 2, t, t)
    assert torch.allclose(maps[0].sum(-1), torch.ones(8, 2, t)) and maps[0].triu(1).abs().max() == 0
    assert torch.allclose(model(x)[0], logits)  # the functional is restored


def test_oelm_report_switches_the_probe_section_on_from_the_data(tmp_path: Path) -> None:
    """One report (issue 50): the probe summary is a section of `oelm report`, switched on by probe
    tables; a column no run recorded (a rebuilt record keeps only the held-out value) is left out,
    and a seed without steps_to_target is never shown as one that did not reach the target."""
    import shutil

    from oelm.cli import main
    from oelm.training.loop import train

    run = tmp_path / "runs" / "oelm-freeze" / "lr0.003" / "seed0"
    res = train(_probe_config(run))
    # The run records its best weights' head scores (layers x heads), so the report needs no weights.
    assert [len(layer) for layer in res["head_scores"]["induction"]] == [2] * len(res["head_scores"]["previous_token"])
    assert all(0.0 <= v <= 1.0 for layer in res["head_scores"]["induction"] for v in layer)
    shutil.rmtree(run / "checkpoints")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    section = text[text.index("## Probes: answer accuracy and steps to target") :]
    assert "| oelm-freeze | 0.003 |" in section and "chance 0.062" in section
    assert "seeds reaching 90% val" in section  # recorded by the run: shown
    best = max(max(layer) for layer in res["head_scores"]["induction"])
    assert "induction score (best head)" in section and f"{best:.2f} ({best:.2f})" in section
    results = tmp_path / "runs" / "oelm-freeze" / "lr0.003" / "seed0" / "results.json"
    data = json.loads(results.read_text())
    for key in ("steps_to_target", "test_sequence_accuracy", "chance_accuracy", "head_scores"):
        data.pop(key, None)
    results.write_text(json.dumps(data))
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rebuilt")]) == 0
    section = (tmp_path / "rebuilt" / "report.md").read_text().split("## Probes: answer accuracy")[1]
    assert "never" not in section and "seeds reaching" not in section and "chance" not in section.split("\n")[4]
    assert "induction score" not in section
