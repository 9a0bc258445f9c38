"""One comparison, one protocol: runs that differ in anything but method, options, LR, setting and
seed are refused, and each (method, setting, seed) counts once (records.comparable, issue 40 class 2).

Synthetic run directories written to the run-directory schema (test_report.make_run)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oelm.cli import main
from oelm.experiments.resolve import resolve_config as resolve
from oelm.experiments.runner import run_sweep
from oelm.experiments.sweep import spec_from_dict
from oelm.records.comparable import RUNTIME, RUNTIME_FIELDS
from oelm.records.load import load_runs
from oelm.reports.aggregate import compare
from oelm.training.config import dump_config
from oelm.utils.errors import UserError
from test_report import make_run
from test_sweep import TINY

ARMS = ("baseline", "oelm-freeze")


def _edit(run: Path, config: dict | None = None, **results) -> Path:
    """Change a run's config.yaml and results.json in place."""
    if config:
        path = run / "config.yaml"
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **config}))
    if results:
        path = run / "results.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **results}))
    return run


# What a real config.yaml holds beside make_run's keys (a full TrainConfig dump has every field).
FULL = {"batch_size": 2, "seq_len": 32, "warmup": 1, "eval_batches": 2, "model_overrides": {"n_layer": 1}}


def _table(root: Path, seeds: int = 3, arms: tuple[str, ...] = ARMS, lr: float = 1e-3) -> list[Path]:
    runs = []
    for seed in range(seeds):
        for i, method in enumerate(arms):
            run = make_run(root, method, lr, seed, test_perplexity=10 + seed / 10 + i / 5, best_val_loss=1.5 + i / 10)
            runs.append(_edit(run, {**FULL, "method_options": {}}))
    return runs


def test_runtime_fields_of_training_are_not_part_of_the_protocol() -> None:
    from oelm.training import config, rundir

    assert config.RUNTIME_FIELDS is RUNTIME_FIELDS is rundir.RUNTIME_FIELDS  # one list, owned by records
    assert RUNTIME_FIELDS < RUNTIME


def test_an_arm_whose_options_changed_between_seeds_is_refused_not_pooled(tmp_path: Path) -> None:
    """The sweep spec edited between two invocations (a method option changed): the seeds of one
    setting were trained under two options; pooled they would be one arm."""
    for seed in range(4):
        make_run(tmp_path, "baseline", 1e-3, seed, test_perplexity=10, best_val_loss=1.5)
        run = make_run(tmp_path, "oelm-lowrank", 1e-3, seed, test_perplexity=10.1, best_val_loss=1.5)
        _edit(run, {"method_options": {"rank": 2 if seed < 2 else 8}})
    with pytest.raises(UserError, match=r"seeds of oelm-lowrank lr0\.001 .* method_options\.rank \(2: 2 run"):
        compare(load_runs([tmp_path]))


def test_defaults_that_changed_between_runs_are_seen_in_results(tmp_path: Path) -> None:
    """The config says {} both times; results.json records the options as validated (defaults in)."""
    for seed in range(2):
        make_run(
            tmp_path,
            "oelm-lowrank",
            1e-3,
            seed,
            test_perplexity=10,
            best_val_loss=1.5,
            method_options={"rank": 4 + 4 * seed},
        )
    with pytest.raises(UserError, match=r"method_options\.rank"):
        compare(load_runs([tmp_path]))


def test_options_may_differ_between_arms(tmp_path: Path) -> None:
    for seed in range(2):
        make_run(tmp_path, "baseline", 1e-3, seed, test_perplexity=10, best_val_loss=1.5)
        _edit(
            make_run(tmp_path, "oelm-lowrank", 1e-3, seed, test_perplexity=10, best_val_loss=1.5),
            {"method_options": {"rank": 2}},
        )
    (group,) = compare(load_runs([tmp_path])).groups
    assert {a.method: a.primary.n for a in group.arms} == {"baseline": 2, "oelm-lowrank": 2}


@pytest.mark.parametrize("name", ["seed0 (copy)", "seed0.bak", "old-seed0"])
def test_a_copy_under_any_folder_name_is_refused(tmp_path: Path, name: str) -> None:
    """A copy beside the original whose folder name is outside the layout (so its setting comes from
    its LR alone) is still the same run: it would be a phantom setting or a fourth seed."""
    _table(tmp_path)
    for method in ARMS:  # a grid field in the setting name: the copy's own setting would be lr0.001
        (tmp_path / "runs" / method / "lr0.001").rename(tmp_path / "runs" / method / "lr0.001_warmup2")
    original = tmp_path / "runs" / "oelm-freeze" / "lr0.001_warmup2" / "seed0"
    shutil.copytree(original, original.parent / name)
    with pytest.raises(UserError, match=r"oelm-freeze lr0\.001_warmup2 seed 0: .* each seed counts once"):
        compare(load_runs([tmp_path]))


def test_a_run_copied_into_another_slot_is_refused(tmp_path: Path) -> None:
    _table(tmp_path)
    src = tmp_path / "runs" / "oelm-freeze" / "lr0.001" / "seed0"
    shutil.copytree(src, tmp_path / "runs" / "oelm-freeze" / "lr0.003" / "seed0")
    with pytest.raises(UserError, match=r"lr0\.003/seed0 sits in another run's place \(its folder says lr 0\.003"):
        compare(load_runs([tmp_path]))
    shutil.rmtree(tmp_path / "runs" / "oelm-freeze" / "lr0.003")
    shutil.copytree(src, tmp_path / "runs" / "oelm-freeze" / "lr0.001" / "seed7")
    with pytest.raises(UserError, match=r"its folder says seed 7, its record 0"):
        compare(load_runs([tmp_path]))


def test_a_leaderboard_over_unequal_budgets_says_so_and_gives_no_verdict(tmp_path: Path, capsys) -> None:
    """Two sweeps with unequal step budgets: no 'Target met', one line naming the field, exit 2."""
    for seed in range(3):
        make_run(tmp_path / "a", "baseline", 1e-3, seed, test_perplexity=10 + seed / 10, best_val_loss=1.5)
        run = make_run(tmp_path / "b", "oelm-freeze", 1e-3, seed, test_perplexity=10 + seed / 10, best_val_loss=1.5)
        _edit(run, {"steps": 80}, steps=80, tokens_seen=80 * 512)
    out = tmp_path / "lb"
    assert main(["report", "--view", "board", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 2
    err = capsys.readouterr()
    assert "Target met" not in err.out and not out.exists()
    assert "differ in steps (40: 3 run(s)" in err.err and "80: 3 run(s)" in err.err
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "r")]) == 2


def test_model_sizes_under_one_name_are_refused(tmp_path: Path) -> None:
    for run in _table(tmp_path):
        _edit(run, {"model_overrides": {"d_model": 16 if "baseline" in run.parts else 64}})
    with pytest.raises(UserError, match=r"differ in model_overrides\.d_model"):
        compare(load_runs([tmp_path]))


def test_swept_fields_named_by_the_setting_may_differ(tmp_path: Path) -> None:
    for warmup in (1, 2):
        for run in _table(tmp_path / f"w{warmup}"):
            _edit(run, {"warmup": warmup})
            target = tmp_path / "runs" / run.parts[-3] / f"lr0.001_warmup{warmup}" / run.name
            target.parent.mkdir(parents=True, exist_ok=True)
            run.rename(target)
    (group,) = compare(load_runs([tmp_path / "runs"])).groups
    assert all(len(a.cells) == 2 and a.primary.n == 3 for a in group.arms)


def test_the_data_folder_may_move_when_the_fingerprint_says_it_is_the_same(tmp_path: Path) -> None:
    for run in _table(tmp_path):
        _edit(run, {"data": f"/elsewhere/{run.parts[-3]}/tinystories"}, data_fingerprint="aaaa")
    assert compare(load_runs([tmp_path])).groups
    _edit(run, data_fingerprint=None)
    with pytest.raises(UserError, match=r"differ in data"):
        compare(load_runs([tmp_path]))


# ---------------------------------------------------------------------------------------------
# Property: whatever the table, a change of anything but seed, LR, options of a whole arm or a
# runtime field is refused, and an unchanged or runtime-only change keeps every seed once.

PROTOCOL = {"steps": 80, "batch_size": 4, "seq_len": 64, "warmup": 7, "model": "gpt-small", "eval_batches": 3}
PROTOCOL_NESTED = {"model_overrides": {"n_layer": 3, "d_model": 64}, "method_options": {"f": 0.5}}
RUNTIME_CHANGES = {"out": "elsewhere", "device": "cuda", "progress": False, "log_every": 99, "tensorboard": False}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seeds=st.integers(2, 3),
    lrs=st.lists(st.sampled_from([3e-4, 1e-3, 3e-3]), min_size=1, max_size=2, unique=True),
    change=st.sampled_from(["none", "runtime", "protocol", "nested", "whole-arm-options", "copy"]),
    key=st.integers(0, 100),
    picks=st.sets(st.integers(0, 20), min_size=1, max_size=4),
)
def test_a_table_is_one_protocol_or_refused(seeds, lrs, change, key, picks) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        runs = [r for lr in lrs for r in _table(root, seeds=seeds, lr=lr)]
        chosen = [runs[i % len(runs)] for i in sorted(picks)]
        refused = change in ("protocol", "nested", "copy")
        if change == "runtime":
            name = sorted(RUNTIME_CHANGES)[key % len(RUNTIME_CHANGES)]
            for run in chosen:
                _edit(run, {name: RUNTIME_CHANGES[name]})
        elif change == "protocol":
            name = sorted(PROTOCOL)[key % len(PROTOCOL)]
            _edit(chosen[0], {name: PROTOCOL[name]})
        elif change == "nested":
            name = sorted(PROTOCOL_NESTED)[key % len(PROTOCOL_NESTED)]
            _edit(chosen[0], {name: PROTOCOL_NESTED[name]})
        elif change == "whole-arm-options":
            for run in runs:
                if run.parts[-3] == "oelm-freeze":
                    _edit(run, {"method_options": {"f": 0.5}})
        elif change == "copy":
            shutil.copytree(chosen[0], chosen[0].with_name(f"{chosen[0].name}-copy{key}"))
        if refused:
            with pytest.raises(UserError):
                compare(load_runs([root]))
            return
        (group,) = compare(load_runs([root])).groups
        for arm in group.arms:
            assert all(c.finished == seeds for c in arm.cells)
            assert sorted(arm.by_seed) == list(range(seeds))


# ---------------------------------------------------------------------------------------------
# The sweep: run folders that already hold runs of other settings are refused before any run.


def test_a_sweep_whose_folders_hold_runs_of_other_settings_is_refused_before_any_run(tmp_path: Path) -> None:
    """The spec edited between two invocations (sweep.yaml gone, so the record cannot say): the
    finished run of the old option would be skipped and reported as the new option's."""
    spec = spec_from_dict(
        {
            "out": str(tmp_path / "sweep"),
            "prepare": {"source": "builtin:python-docs", "tokenizer": "byte", "max_docs": 20},
            "config": {**TINY, "data": str(tmp_path / "data")},
            "methods": {"baseline": {"lr": [1e-3]}, "oelm-lowrank": {"lr": [1e-3], "method_options": {"rank": 2}}},
            "seeds": [0],
        }
    )
    lowrank = next(r for r in spec.runs() if r.method == "oelm-lowrank")
    lowrank.run_dir.mkdir(parents=True)
    (lowrank.run_dir / "config.yaml").write_text(
        dump_config(resolve({**lowrank.config, "method_options": {"rank": 4}, "progress": False}).config)
    )
    with pytest.raises(UserError, match=r"1 run folder\(s\) .*\(differs in: method_options\.rank\)"):
        run_sweep(spec, progress=False, threads=1)
    assert not (tmp_path / "data").exists() and not (tmp_path / "sweep" / "sweep.yaml").exists()
    # The same settings (a runtime field aside) are this spec's run: nothing to refuse.
    (lowrank.run_dir / "config.yaml").write_text(dump_config(resolve({**lowrank.config, "progress": False}).config))
    assert lowrank.stored_differences() == []
    # A config.yaml that no longer parses: its run's settings are unknown, refused naming the file.
    (lowrank.run_dir / "config.yaml").write_text("lr: [unclosed\n")
    with pytest.raises(UserError, match=r"config\.yaml' cannot be read .*restore the file"):
        run_sweep(spec, progress=False, threads=1)
    assert not (tmp_path / "data").exists() and not (tmp_path / "sweep" / "sweep.yaml").exists()


def test_one_stored_against_planned_check_for_train_sweep_and_confirm(tmp_path: Path) -> None:
    """`oelm train`'s run directory, a sweep's stale folders and a confirmation's runs ask one
    function (records.comparable.config_differences) with one rule: bookkeeping (keep_last,
    checkpoint_every) and a field written before it existed are no difference; a setting is."""
    from oelm.experiments.sweep import RunSpec
    from oelm.records.comparable import config_differences
    from oelm.training.rundir import differences

    raw = {**TINY, "data": str(tmp_path / "data"), "out": str(tmp_path / "run"), "method": "baseline", "lr": 1e-3}
    cfg = resolve(raw).config
    stored = {k: v for k, v in cfg.identity().items() if k != "layer_lr_decay"}  # an older oelm's config
    stored.update(keep_last=5, checkpoint_every=7, steps=cfg.steps + 1)
    planned = RunSpec("baseline", 1e-3, 0, {}, tmp_path / "run", raw)
    assert config_differences(cfg.identity(), stored) == ["steps"]
    assert differences(cfg, stored) == planned.differences_from(stored) == ["steps"]
    assert (
        differences(cfg, {**stored, "steps": cfg.steps})
        == planned.differences_from({**stored, "steps": cfg.steps})
        == []
    )
