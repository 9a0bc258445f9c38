"""A tiny sweep runs, resumes without redoing finished runs, and its report matches the records."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from oelm.experiments.runner import run_sweep
from oelm.experiments.sweep import load_spec, spec_from_dict
from oelm.records.load import load_runs
from oelm.reports.comparison import page_sections
from oelm.utils.errors import UserError

TINY = {
    "task": "lm",
    "model": "gpt-tiny",
    "steps": 6,
    "batch_size": 2,
    "seq_len": 32,
    "warmup": 1,
    "eval_every": 3,
    "eval_batches": 2,
    "final_eval_batches": 2,
    "checkpoint_every": 3,
    "device": "cpu",
    "tensorboard": False,
    "log_every": 1,
    "timing_warmup": 1,
    "model_overrides": {"n_layer": 1, "d_model": 32, "n_head": 2},
}


def _spec(tmp_path: Path, seeds=(0, 1), **extra) -> dict:
    return {
        "name": "tiny",
        "out": str(tmp_path / "sweep"),
        "prepare": {"source": "builtin:python-docs", "tokenizer": "byte", "max_docs": 20},
        "config": {**TINY, "data": str(tmp_path / "data")},
        "methods": {"baseline": {"lr": [1e-3, 3e-3]}, "oelm-freeze": {"lr": [3e-3, 1e-2]}},
        "seeds": list(seeds),
        "max_extend": 0,  # these tests count runs; test_grid_extends_... turns extension on
        **extra,
    }


@pytest.mark.slow
def test_sweep_runs_resumes_and_reports(tmp_path: Path) -> None:
    spec = spec_from_dict(_spec(tmp_path))
    first = run_sweep(spec, progress=False, threads=1)
    assert len(first.trained) == 8 and not first.failed
    runs = sorted((tmp_path / "sweep" / "runs").glob("*/lr*/seed*"))
    assert [p.relative_to(tmp_path / "sweep").as_posix() for p in runs][:2] == [
        "runs/baseline/lr0.001/seed0",
        "runs/baseline/lr0.001/seed1",
    ]
    # Equal budgets, same data order per seed: every arm saw the same tokens.
    results = [json.loads((p / "results.json").read_text()) for p in runs]
    assert {r["tokens_seen"] for r in results} == {6 * 2 * 32}

    # The report's numbers are those of the records: LR chosen on mean best_val_loss.
    report = page_sections(tmp_path / "sweep" / "report" / "report.json")
    records = load_runs([tmp_path / "sweep" / "runs"])
    for arm in report["groups"][0]["arms"]:
        mine = [r for r in records if r.method == arm["method"]]
        by_lr = {lr: np.mean([r.results["best_val_loss"] for r in mine if r.lr == lr]) for lr in {r.lr for r in mine}}
        best = min(by_lr, key=by_lr.get)
        assert arm["lr"] == best
        primary = [r.results[r.results["primary_metric"]] for r in mine if r.lr == best]
        assert arm["primary"]["mean"] == pytest.approx(np.mean(primary))
        assert arm["primary"]["n"] == 2

    # "Kill" mid-way: one run loses its results (keeps its checkpoint), one loses everything.
    killed = runs[0]
    (killed / "results.json").unlink()
    shutil.rmtree(runs[-1])
    kept = runs[3] / "results.json"
    stamp = kept.stat().st_mtime_ns
    again = run_sweep(spec_from_dict(_spec(tmp_path)), progress=False, threads=1)
    assert sorted(r.run_dir for r in again.trained) == sorted([killed, runs[-1]])
    assert len(again.skipped) == 6 and kept.stat().st_mtime_ns == stamp  # not redone

    # Extending with a seed trains only the new runs; sweep.yaml lists every seed.
    more = run_sweep(spec_from_dict(_spec(tmp_path, seeds=(0, 1, 2))), progress=False, report=False, threads=1)
    assert len(more.trained) == 4 and len(more.skipped) == 8
    assert "- 2" in (tmp_path / "sweep" / "sweep.yaml").read_text()


def test_bad_specs_fail_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown method"):
        spec_from_dict({**_spec(tmp_path), "methods": {"nope": {"lr": [1e-3]}}})
    with pytest.raises(UserError, match="only 'lr' and 'method_options'"):
        spec_from_dict({**_spec(tmp_path), "methods": {"baseline": {"lr": [1e-3], "steps": 9}}})
    with pytest.raises(UserError, match="set per run"):
        spec_from_dict({**_spec(tmp_path), "grid": {"lr": [1e-3]}})
    with pytest.raises(UserError, match="unknown config key"):
        spec_from_dict({**_spec(tmp_path), "overrides": {"stepz": 3}})
    with pytest.raises(UserError, match="not found"):
        load_spec(tmp_path / "missing.yaml")
    assert not (tmp_path / "sweep").exists()


def test_grid_fields_get_their_own_setting_and_a_changed_base_is_refused(tmp_path: Path) -> None:
    spec = spec_from_dict({**_spec(tmp_path), "grid": {"warmup": [1, 2]}})
    dirs = {r.run_dir.parent.name for r in spec.runs()}
    assert "lr0.001_warmup2" in dirs and len(spec.runs()) == 16
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.yaml").write_text(
        "base: {steps: 99}\ngrid: {}\nmethods: {baseline: {lr: [0.001]}}\nseeds: [0]\n"
    )
    with pytest.raises(UserError, match="different base config"):
        run_sweep(spec_from_dict(_spec(tmp_path)), progress=False)


def test_study_sweep_spec_resolves(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "configs" / "sweeps" / "gpt-tinystories-smoke.yaml", out=tmp_path / "s")
    assert set(spec.methods) == {"baseline", "oelm-freeze", "oelm-random"}
    assert spec.base["model"] == "gpt-tiny" and "files" in spec.prepare
    assert len(spec.runs()) == 3 * 3 * 3  # methods x LRs (own grid each) x seeds


def test_methods_option_trains_only_the_named_arms_in_the_spec_s_form(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    path = root / "configs" / "sweeps" / "gpt-tinystories-smoke.yaml"
    full = load_spec(path, out=tmp_path / "s")
    spec = load_spec(path, out=tmp_path / "s", methods=["oelm-random", "baseline"])
    # The plan stays the whole spec (sweep.yaml, so reports list the arms not yet trained) ...
    assert spec.methods == full.methods and spec.to_dict() == full.to_dict()
    # ... and only the named arms train, in the order given, seed by seed, each with its own grid.
    chosen = spec.selected_runs()
    assert {r.method for r in chosen} == {"oelm-random", "baseline"}
    assert [(r.seed, r.method, r.lr) for r in chosen] == sorted(
        ((r.seed, r.method, r.lr) for r in full.runs() if r.method in {"oelm-random", "baseline"}),
        key=lambda t: (t[0], t[1] != "oelm-random"),
    )
    assert full.selected_runs() == full.runs()
    with pytest.raises(UserError, match="not an arm of .*its arms are baseline"):
        load_spec(path, out=tmp_path / "s", methods=["oelm-temp"])


def test_dry_run_ends_with_the_counts_and_a_time_estimate(tmp_path: Path) -> None:
    """Each run todo / done, then '8 runs: 5 to do, 3 done' and the rest's time at the done runs' mean."""
    from oelm.experiments.sweep import dry_run
    from test_report import make_run

    spec = spec_from_dict(_spec(tmp_path))  # 2 methods x 2 LRs x 2 seeds
    lines = list(dry_run(spec.runs()))
    assert len(lines) == 9 and all(line.startswith("todo  ") for line in lines[:8])
    assert lines[-1] == "8 runs: 8 to do, 0 done; no finished run yet to estimate their time from"
    for seed, wall in ((0, 60.0), (1, 120.0)):
        run = make_run(spec.out, "baseline", 1e-3, seed, total_wall_time=wall, test_perplexity=5.0)
        assert run in {r.run_dir for r in spec.runs()}
    make_run(spec.out, "oelm-freeze", 3e-3, 0, total_wall_time=90.0, test_perplexity=5.0)
    lines = list(dry_run(spec.runs()))
    assert sum(line.startswith("done  ") for line in lines) == 3
    assert lines[-1] == (  # 5 runs x 90 s mean
        "8 runs: 5 to do, 3 done; about 8 min in one process at the mean wall time of 3 finished run(s) "
        "(90 s), less with --parallel"
    )


def test_dry_run_piped_into_a_reader_that_stops_is_not_an_error(tmp_path: Path) -> None:
    """`oelm sweep SPEC --dry-run | head -1`: the closed pipe ends the listing quietly, exit 0."""
    import subprocess
    import sys

    spec = Path(__file__).resolve().parents[1] / "configs" / "sweeps" / "gap-tinystories.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "oelm", "sweep", str(spec), "--dry-run", "--out", str(tmp_path / "s")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader stops after one line, as `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and first.startswith(b"todo") and "Traceback" not in err, err


def _workers_of(sweep: Path) -> list[int]:
    """Pids of live `oelm.experiments.worker` processes training runs of this sweep."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "oelm.experiments.worker" in cmd and str(sweep) in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow  # a parallel sweep in a subprocess, stopped by SIGTERM: ~20 s
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds worker processes through /proc")
def test_sigterm_to_a_parallel_sweep_stops_every_worker_after_a_checkpoint(tmp_path: Path) -> None:
    spec = _spec(tmp_path, seeds=(0,))
    spec["config"] = {**spec["config"], "steps": 5000, "checkpoint_every": 5000, "eval_every": 5000}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "oelm", "sweep", str(path), "--parallel", "2", "--threads", "1", "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    sweep = tmp_path / "sweep"
    deadline = time.monotonic() + 120
    while len(list(sweep.glob("runs/*/*/seed0/metrics.jsonl"))) < 2:  # both workers are training
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.2)
    workers = _workers_of(sweep)
    assert len(workers) == 2
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=150)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-2000:]
    assert "the sweep stopped" in err.decode() and "Traceback" not in err.decode()
    assert _workers_of(sweep) == []  # no orphan keeps training
    for run in sweep.glob("runs/*/*/seed0"):  # each run in progress wrote a checkpoint to resume from
        assert list(run.glob("checkpoints/step_*/model.safetensors")), run
        assert not (run / "results.json").exists()


@pytest.mark.slow
def test_grid_extends_beyond_the_edge_where_validation_chooses_until_the_cap(tmp_path: Path) -> None:
    """Tiny LRs over 6 steps: the largest is best on validation, so the grid grows upward (same
    geometric step), at most max_extend times; the report says the choice is still at the edge."""
    raw = _spec(tmp_path, seeds=(0,), methods={"baseline": {"lr": [1e-5, 3e-5]}}, max_extend=2)
    first = run_sweep(spec_from_dict(raw), progress=False, threads=1)
    assert not first.failed and sorted(r.lr for r in first.extended) == [9e-5, 2.7e-4]
    lrs = sorted(r.lr for r in load_runs([tmp_path / "sweep" / "runs"]))
    assert lrs == [1e-5, 3e-5, 9e-5, 2.7e-4]  # x3 each time, for the selection seed
    record = yaml.safe_load((tmp_path / "sweep" / "sweep.yaml").read_text())
    assert record["max_extend"] == 2 and record["methods"]["baseline"]["lr"] == lrs
    assert [(e["lr"], e["side"], e["chosen"]) for e in record["extended"]["baseline"]] == [
        (9e-5, "up", 3e-5),
        (2.7e-4, "up", 9e-5),
    ]
    report = page_sections(tmp_path / "sweep" / "report" / "report.json")
    assert report["groups"][0]["arms"][0]["lr"] == 2.7e-4
    assert any("still the largest of its grid" in w and "max_extend 2" in w for w in report["groups"][0]["warnings"])
    # The same command again replays the extensions on finished runs: nothing trains.
    again = run_sweep(spec_from_dict(raw), progress=False, report=False, threads=1)
    assert not again.trained and len(again.extended) == 2
    # 0 disables; a bad value is one error naming the key.
    off = run_sweep(spec_from_dict({**raw, "max_extend": 0}), progress=False, report=False, threads=1)
    assert not off.extended and not off.trained
    with pytest.raises(UserError, match="max_extend must be a whole number >= 0"):
        spec_from_dict({**raw, "max_extend": -1})


def test_edge_step_is_the_grid_s_own_or_doubling_for_one_point() -> None:
    from oelm.experiments.sweep import SweepSpec, edge_step, extend_grids

    assert extend_grids(SweepSpec("s", {}, {"baseline": {"lr": [1e-3]}}, [0], max_extend=0)) == []
    assert edge_step([1e-3], "up") == 2.0 and edge_step([1e-3], "down") == 0.5
    assert edge_step([1e-4, 3e-4, 1e-3], "up") == pytest.approx(1e-3 / 3e-4)
    assert edge_step([1e-4, 3e-4, 1e-3], "down") == pytest.approx(1 / 3)


def test_a_grid_also_extends_past_an_edge_whose_best_mean_the_robust_rule_rejected(tmp_path: Path) -> None:
    """The robust rule rejects the smallest LR (its seeds scatter 18%) and chooses the middle one,
    but the smallest has the best mean: the best LR may lie below it, so the grid grows downward."""
    from oelm.experiments.sweep import SweepSpec, extend_grids
    from test_report import make_run

    values = {0.08: [2.6, 2.7, 3.1], 0.16: [2.94, 2.95, 2.96], 0.32: [3.05, 3.06, 3.07]}
    for lr, losses in values.items():
        for seed, v in enumerate(losses):
            make_run(tmp_path, "baseline", lr, seed, best_val_loss=v, curve=[v + 0.1, v])
    spec = SweepSpec("s", {}, {"baseline": {"lr": [0.08, 0.16, 0.32]}}, [0, 1, 2], out=tmp_path, max_extend=2)
    assert spec.runs()[0].run_dir.is_dir()  # the records sit where the sweep looks for them
    added = extend_grids(spec)
    assert added == ["baseline: best mean (rejected as unstable) lr 0.08 at the smallest of its grid, adding lr 0.04"]
    assert spec.methods["baseline"]["lr"] == [0.04, 0.08, 0.16, 0.32]
    assert spec.extended["baseline"] == [{"lr": 0.04, "side": "down", "chosen": 0.16}]


def test_a_spec_and_its_stored_record_share_one_parser_and_one_set_of_defaults(tmp_path: Path) -> None:
    """max_extend and lr_rule are parsed once (records.sweep.sweep_policy) with one set of defaults:
    a record that leaves max_extend out means what a spec that leaves it out means (it read 0, the
    spec 2), and a bad value is refused in a stored record as in a spec (a record took -1)."""
    from oelm.records.sweep import LR_RULE, LR_RULE_BEFORE_KEY, MAX_EXTEND, read_sweep_record

    raw = {k: v for k, v in _spec(tmp_path).items() if k != "max_extend"}
    spec = spec_from_dict(raw)
    assert (spec.max_extend, spec.lr_rule) == (MAX_EXTEND, LR_RULE)
    folder = tmp_path / "stored"
    folder.mkdir()
    record = {k: v for k, v in json.loads(json.dumps(spec.to_dict(), default=str)).items() if k != "max_extend"}
    (folder / "sweep.yaml").write_text(yaml.safe_dump(record))
    stored = read_sweep_record(folder)
    assert (stored.max_extend, stored.lr_rule) == (spec.max_extend, spec.lr_rule)
    # A record written before the lr_rule key existed was chosen by the best mean: it says so.
    (folder / "sweep.yaml").write_text(yaml.safe_dump({k: v for k, v in record.items() if k != "lr_rule"}))
    assert read_sweep_record(folder).lr_rule == LR_RULE_BEFORE_KEY
    for bad in ({"max_extend": -1}, {"lr_rule": "best"}):
        with pytest.raises(UserError, match=f"{next(iter(bad))} must be"):
            spec_from_dict({**raw, **bad})
        (folder / "sweep.yaml").write_text(yaml.safe_dump({**record, **bad}))
        with pytest.raises(UserError, match=rf"sweep\.yaml: {next(iter(bad))} must be"):
            read_sweep_record(folder)
