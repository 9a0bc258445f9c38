"""The one owner of what is on disk about a run and a sweep (oelm.records)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import load_script
from oelm.experiments.runner import run_sweep
from oelm.experiments.sweep import SweepSpec, spec_from_dict
from oelm.records.compact import (
    RECORDS_FILE,
    RUN_RECORD_FILE,
    read_record,
    read_records,
    record_text,
    write_raw_records,
    write_record,
)
from oelm.records.layout import RunKey, parse_run_path, setting_name
from oelm.records.load import load_run, load_runs, stored_record
from oelm.records.sweep import read_sweep_record
from oelm.reports.aggregate import compare
from oelm.utils.errors import UserError
from test_sweep import TINY
from test_validate_once import count_reads

ROOT = Path(__file__).resolve().parent.parent


@given(
    method=st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True),
    lr=st.floats(1e-6, 1.0, allow_nan=False),
    seed=st.integers(-5, 10_000),
    warmup=st.integers(0, 99),
)
def test_the_layout_parses_what_it_builds(method: str, lr: float, seed: int, warmup: int) -> None:
    """A run directory built from (method, setting, seed) parses back to the same key and LR."""
    setting = setting_name(lr, {"warmup": warmup})
    key = RunKey(method, setting, seed, lr)
    parsed = parse_run_path(key.path("some/sweep"))
    assert parsed is not None
    assert (parsed.method, parsed.setting, parsed.seed) == (method, setting, seed)
    assert parsed.lr == float(f"{lr:g}")


def test_paths_outside_the_layout_are_not_parsed() -> None:
    assert parse_run_path("a/lr0.1/seed1") is None  # no runs/ folder above the method
    assert parse_run_path("x/runs/m/warm/seed1") is None  # the setting names no LR
    assert parse_run_path("x/runs/m/lr0.1/s1") is None


def test_a_stray_sweep_yaml_is_one_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "sweep.yaml").write_text("base: {steps: 3}\nseeds: [0]\n")  # no methods
    with pytest.raises(UserError, match=r"sweep.yaml is not a sweep record \(KeyError"):
        read_sweep_record(tmp_path)
    (tmp_path / "sweep.yaml").write_text("methods: {a: {lr: [1]}}\nmethods: {}\nseeds: [0]\n")
    with pytest.raises(UserError, match="not valid YAML"):  # the strict loader: duplicate keys
        read_sweep_record(tmp_path)
    assert read_sweep_record(tmp_path / "nothing-here") is None


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory) -> Path:
    """A finished two-arm sweep of 4 tiny runs."""
    tmp = tmp_path_factory.mktemp("sweep")
    spec = spec_from_dict(
        {
            "name": "tiny",
            "out": str(tmp / "sweep"),
            "prepare": {"source": "builtin:python-docs", "tokenizer": "byte", "max_docs": 20},
            "config": {**TINY, "data": str(tmp / "data")},
            "methods": {"baseline": {"lr": [3e-3]}, "oelm-lowrank": {"lr": [3e-3], "method_options": {"rank": 2}}},
            "seeds": [0, 1],
            "max_extend": 0,
        }
    )
    run_sweep(spec, progress=False)
    return spec.out


def test_the_sweep_record_round_trips_into_a_spec(tiny_sweep: Path) -> None:
    """SweepSpec.from_record rebuilds the same runs (directories and configs) from sweep.yaml."""
    record = read_sweep_record(tiny_sweep)
    assert record is not None and record.methods["oelm-lowrank"]["method_options"] == {"rank": 2}
    spec = SweepSpec.from_record(record)
    assert [r.run_dir for r in spec.runs()] == [record.run_dir(p) for p in record.planned()]
    assert all(r.finished() for r in spec.runs())
    assert read_sweep_record(tiny_sweep / "runs") == record  # its runs/ folder names the same sweep


def test_report_and_a_resumed_sweep_read_each_input_once(tiny_sweep: Path, tmp_path: Path, monkeypatch) -> None:
    """`oelm report` reads the sweep record once and each run's results.json once; a resumed `oelm
    sweep` hands the record it wrote to its report in memory (read once, at the start)."""
    from oelm.records.run import forget_read_results
    from oelm.reports.report import write_report

    forget_read_results()  # a fresh process: nothing read yet
    counts = count_reads(monkeypatch, {"sweep.yaml", "results.json"})
    write_report([tiny_sweep], tmp_path / "report")
    assert counts == {"sweep.yaml": 1, "results.json": 4}
    record = read_sweep_record(tiny_sweep)
    forget_read_results()
    counts.clear()
    outcome = run_sweep(SweepSpec.from_record(record), progress=False)
    assert len(outcome.skipped) == 4 and outcome.report is not None
    assert counts["sweep.yaml"] == 1 and counts["results.json"] == 4


def test_a_changed_method_option_is_refused_not_pooled(tiny_sweep: Path) -> None:
    """Runs of one arm under two method options would be averaged as one arm: refused up front."""
    raw = {
        "name": "tiny",
        "out": str(tiny_sweep),
        "config": {**TINY, "data": str(tiny_sweep.parent / "data")},
        "methods": {"baseline": {"lr": [3e-3]}, "oelm-lowrank": {"lr": [3e-3], "method_options": {"rank": 4}}},
        "seeds": [0, 1],
        "max_extend": 0,
    }
    with pytest.raises(UserError, match=r"differs in: methods\.oelm-lowrank\.method_options"):
        run_sweep(spec_from_dict(raw), progress=False)


def test_committed_records_report_exactly_like_their_run_directories(tiny_sweep: Path, tmp_path: Path) -> None:
    """Records written from run directories load to the same runs, and the one comparison path
    gives the same numbers from either; no machine path survives in a record."""
    runs = load_runs([tiny_sweep])
    for run in runs:
        write_record(run, tmp_path / run.path.relative_to(tiny_sweep), relative_to=tiny_sweep)
    stored = load_runs([tmp_path])
    assert len(stored) == len(runs) == 4
    for a, b in zip(runs, stored):
        assert b.results == a.results and b.status == a.status and b.setting == a.setting
        assert b.eval_curve("loss") == a.eval_curve("loss") and b.test_items() == a.test_items()
        assert b.audit == a.audit and b.audit is not None and (b.audit.frozen > 0) == (b.method != "baseline")
        text = (b.path / RUN_RECORD_FILE).read_text()
        assert str(tiny_sweep) not in text and str(tiny_sweep.resolve()) not in text
    direct, from_records = compare(runs), compare(stored)
    for g1, g2 in zip(direct.groups, from_records.groups):
        for a1, a2 in zip(g1.arms, g2.arms):
            assert (a1.method, a1.by_seed, a1.primary) == (a2.method, a2.by_seed, a2.primary)
            assert g1.versus_of(a1.method) == g2.versus_of(a2.method)


def test_a_stored_board_is_one_file_that_loads_and_hashes_like_its_records(tiny_sweep: Path, tmp_path: Path) -> None:
    """scripts/store_records.py writes BOARD/runs.jsonl.gz: byte-identical when stored twice, each
    run loading as from its directory (also by its place, and by a folder inside the board), each
    record reading back as the record.json text write_record gives, and a clash refused."""
    store = load_script("store_records")
    board = tmp_path / "board"
    assert store.store(tiny_sweep, board) == 4
    first = (board / RECORDS_FILE).read_bytes()
    assert store.store(tiny_sweep, board) == 4 and (board / RECORDS_FILE).read_bytes() == first
    assert not list(board.rglob(RUN_RECORD_FILE)) and not (board / "runs").exists()
    runs, stored = load_runs([tiny_sweep]), load_runs([board])
    assert [r.path.relative_to(board) for r in stored] == [r.path.relative_to(tiny_sweep) for r in runs]
    for a, b in zip(runs, stored):
        assert (b.results, b.test_items(), b.eval_curve("loss"), b.audit) == (
            a.results,
            a.test_items(),
            a.eval_curve("loss"),
            a.audit,
        )
        assert load_run(b.path).results == a.results
        write_record(a, tmp_path / "single" / b.path.relative_to(board), relative_to=tiny_sweep)
        single = (tmp_path / "single" / b.path.relative_to(board) / RUN_RECORD_FILE).read_text()
        assert record_text(stored_record(b.path)) == single
    method = stored[0].method
    assert {r.method for r in load_runs([board / "runs" / method])} == {method}
    edited = read_records(board)
    next(iter(edited.values()))["results"]["test_loss"] = 9.0
    write_raw_records(edited, tmp_path / "other")
    (tmp_path / "other" / "sweep.yaml").write_text((board / "sweep.yaml").read_text())
    with pytest.raises(UserError, match="already stored with other results"):
        store.store(tiny_sweep, tmp_path / "other")


def test_storing_into_another_sweeps_records_is_refused_before_anything_is_written(
    tiny_sweep: Path, tmp_path: Path, capsys
) -> None:
    """A board's folder that holds another sweep's records had its sweep.yaml overwritten by the
    new sweep's before the clash was found, and the refusal ended in a traceback: the stored board
    was left describing a sweep it does not hold. Now it is checked first, in one line, exit 2."""
    store = load_script("store_records")
    board = tmp_path / "board"
    store.store(tiny_sweep, board)
    before = {p.name: p.read_bytes() for p in board.iterdir()}
    other = tmp_path / "other-sweep"
    shutil.copytree(tiny_sweep, other)
    spec = other / "sweep.yaml"
    spec.write_text(spec.read_text().replace("name: tiny", "name: another", 1))
    assert store.main([str(other), str(board)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds another sweep's records" in err[0]
    assert {p.name: p.read_bytes() for p in board.iterdir()} == before


def test_a_sweep_moves_to_a_fresh_machine_through_its_stored_records(tiny_sweep: Path, tmp_path: Path) -> None:
    """A sweep stopped half-way is stored; on a fresh machine `--restore` writes its finished runs
    back as record.json alone, the resumed sweep trains only the others (a restored run counts as
    finished, and its planned config is checked against its record), and storing it again gives
    the restored runs the same records, to the byte."""
    store = load_script("store_records")
    half = tmp_path / "machine-a"
    shutil.copytree(tiny_sweep, half)
    gone = sorted((half / "runs").glob("*/*/seed1"))
    for run in gone:  # the runs still to train when the session ended
        shutil.rmtree(run)
    saved = tmp_path / "under-way"
    assert store.store(half, saved) == 2
    fresh = tmp_path / "machine-b" / "sweep"
    assert store.main(["--restore", str(saved), str(fresh)]) == 0
    assert sorted(p.name for p in (fresh / "runs").rglob("*") if p.is_file()) == [RUN_RECORD_FILE] * 2
    spec = SweepSpec.from_record(read_sweep_record(tiny_sweep))
    spec.out = fresh
    spec.base = {**spec.base, "data": str(tiny_sweep.parent / "data")}
    outcome = run_sweep(spec, progress=False)
    assert len(outcome.skipped) == 2 and len(outcome.trained) == 2 and not outcome.failed
    assert sorted(r.run_dir.relative_to(fresh) for r in outcome.trained) == sorted(r.relative_to(half) for r in gone)
    again = tmp_path / "again"
    assert store.store(fresh, again) == 4
    before, after = read_records(saved), read_records(again)
    assert all(after[at] == before[at] for at in before) and len(after) == 4
    assert store.restore(saved, fresh) == 0  # every place there already: nothing written
    (fresh / next(iter(before)) / RUN_RECORD_FILE).write_text("{}\n")
    with pytest.raises(UserError, match="hold another record"):
        store.restore(saved, fresh)


def test_a_ladder_rung_under_way_resumes_from_its_saved_progress(
    tiny_sweep: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """scripts/scale_ladder.py --save-progress stores each rung under way (records and its spec); a
    later session with no run folders restores them before it resumes the rung with that spec, and
    a rung both stored whole and under way is one clear error."""
    ladder = load_script("scale_ladder")
    monkeypatch.setattr(ladder, "PROGRESS", tmp_path / "under-way")
    monkeypatch.setattr(ladder, "STORED", tmp_path / "stored")
    out = tmp_path / "runs"
    shutil.copytree(tiny_sweep, out / "gpt-r1")
    (out / "gpt-r1" / ladder.RUNG_SPEC).write_text(f"name: the rung as first written\nbase: {ROOT}/configs/b.yaml\n")
    assert ladder.save_progress(out) == [f"gpt-r1: 4 finished runs -> {(tmp_path / 'under-way' / 'gpt-r1').as_posix()}"]
    shutil.rmtree(out)  # a fresh machine
    calls = []
    monkeypatch.setattr(ladder, "oelm", lambda argv: calls.append(argv) or 0)
    monkeypatch.setattr(ladder, "chosen_lrs", lambda path: {})
    monkeypatch.setattr(ladder, "total_params", lambda *a, **k: 1000)
    monkeypatch.setattr(
        ladder, "load_yaml_text", lambda text: {"overrides": {"model": "m", "model_overrides": {}, "steps": 20}}
    )
    spec = {"out": str(out), "rungs": [{"name": "r1"}], "arms": []}
    assert ladder.run_family(spec, "gpt", None, parallel=1, plan=False) == 1
    assert "gpt-r1: 4 finished runs restored" in capsys.readouterr().out
    assert len(list((out / "gpt-r1" / "runs").rglob(RUN_RECORD_FILE))) == 4
    assert (out / "gpt-r1" / ladder.RUNG_SPEC).read_text() == "name: the rung as first written\nbase: configs/b.yaml\n"
    assert calls[0][:2] == ["sweep", (out / "gpt-r1" / ladder.RUNG_SPEC).as_posix()]
    shutil.rmtree(out)
    (tmp_path / "stored" / "gpt-r1").mkdir(parents=True)
    (tmp_path / "stored" / "gpt-r1" / "sweep.yaml").write_text("name: x\n")
    with pytest.raises(UserError, match="remove .*under-way/gpt-r1"):
        ladder.run_family(spec, "gpt", None, parallel=1, plan=False)


def test_a_restored_run_trained_otherwise_is_refused_not_skipped(tiny_sweep: Path, tmp_path: Path) -> None:
    """A record restored into a sweep that now plans other settings for that run is named, not
    counted as the plan's finished run."""
    store = load_script("store_records")
    store.store(tiny_sweep, tmp_path / "saved")
    fresh = tmp_path / "sweep"
    store.restore(tmp_path / "saved", fresh)
    spec = SweepSpec.from_record(read_sweep_record(tiny_sweep))
    spec.out = fresh
    spec.base = {**spec.base, "data": str(tiny_sweep.parent / "data"), "steps": spec.base["steps"] + 1}
    with pytest.raises(UserError, match="steps"):
        run_sweep(spec, progress=False)


@pytest.mark.parametrize("damage", ['{"format": "oelm run rec', '{"format": "oelm run record", "version": 1}'])
def test_a_damaged_restored_record_is_refused_before_any_run_trains(
    tiny_sweep: Path, tmp_path: Path, damage: str
) -> None:
    """A restored run whose record.json was cut short or lost its results is one error naming the
    file and the fix; read as absent, the run would pass for unfinished and train again beside it."""
    store = load_script("store_records")
    store.store(tiny_sweep, tmp_path / "saved")
    fresh = tmp_path / "sweep"
    store.restore(tmp_path / "saved", fresh)
    damaged = sorted(fresh.rglob(RUN_RECORD_FILE))[1]
    damaged.write_text(damage)
    spec = SweepSpec.from_record(read_sweep_record(tiny_sweep))
    spec.out = fresh
    spec.base = {**spec.base, "data": str(tiny_sweep.parent / "data")}
    with pytest.raises(
        UserError, match=rf"{damaged.name}.*(corrupt|not an oelm run record).*(restore it|remove the run directory)"
    ):
        run_sweep(spec, progress=False)
    assert not list(fresh.rglob("results.json")) and damaged.read_text() == damage


def test_storing_or_restoring_onto_a_file_is_one_error_before_any_write(
    tiny_sweep: Path, tmp_path: Path, capsys
) -> None:
    """A destination that is a file (or has a file where a run folder goes) ends in one line naming
    it, not a traceback; the file is left as it was."""
    store = load_script("store_records")
    store.store(tiny_sweep, tmp_path / "saved")
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    for argv in (["--restore", str(tmp_path / "saved"), str(afile)], [str(tiny_sweep), str(afile)]):
        assert store.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "afile is a file: give a folder" in err
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "runs").write_text("keep\n")
    assert store.main(["--restore", str(tmp_path / "saved"), str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "could not write" in err and "Not a directory" in err
    assert afile.read_text() == (tmp_path / "sweep" / "runs").read_text() == "keep\n"


def test_paths_under_the_sweep_are_written_relative_in_plain_and_json_form(tmp_path: Path) -> None:
    """One rule for a record, a sweep's own files and a plan read against a record: a path under the
    sweep folder, given or resolved, plain or JSON-escaped, loses the folder; others keep it."""
    from oelm.records.compact import relative_under

    sweep = tmp_path / "swé ep"
    sweep.mkdir()
    (tmp_path / "link").symlink_to(sweep)
    inside = f"{sweep.as_posix()}/data/x.bin"
    text = json.dumps({"a": inside, "b": f"{tmp_path / 'link'}/runs/r", "c": f"{tmp_path}/other/y"})
    assert json.loads(relative_under(text, tmp_path / "link")) == {
        "a": "data/x.bin",
        "b": "runs/r",
        "c": f"{tmp_path}/other/y",
    }
    assert relative_under(f"data: {inside}\n", sweep) == "data: data/x.bin\n"


@pytest.mark.parametrize(
    "damage",
    [
        b"not gzip",
        gzip.compress(b'{"format": "x"}\n'),
        gzip.compress(b'{"format": "oelm run records", "version": 1, "runs": 2}\n{}\n'),
    ],
)
def test_a_damaged_records_file_is_one_clear_error(tmp_path: Path, damage: bytes) -> None:
    (tmp_path / RECORDS_FILE).write_bytes(damage)
    with pytest.raises(UserError, match="restore it from git|upgrade oelm"):
        load_runs([tmp_path])


@pytest.mark.parametrize("text", ["[1, 2]", "null", "3.5", '{"status": "comp', "\udcff"])
def test_a_results_file_that_is_no_json_object_is_refused_by_name(tmp_path: Path, text: str) -> None:
    """A damaged or hand-edited results.json was read as absent: its run listed as unfinished, and a
    sweep would train it again. Now one line names the file and the fix."""
    from oelm.records.run import read_results

    (tmp_path / "results.json").write_text(text, errors="surrogateescape")
    with pytest.raises(UserError, match=r"results\.json.*(not an object|corrupt).*remove the run directory"):
        read_results(tmp_path)
    assert read_results(tmp_path / "absent") is None


def test_a_record_from_a_newer_oelm_is_refused(tmp_path: Path) -> None:
    (tmp_path / RUN_RECORD_FILE).write_text(json.dumps({"format": "oelm run record", "version": 99}))
    with pytest.raises(UserError, match="newer than this oelm reads"):
        read_record(tmp_path)
    (tmp_path / RUN_RECORD_FILE).write_text(json.dumps({"format": "something else", "version": 1}))
    with pytest.raises(UserError, match="not an oelm run record"):
        read_record(tmp_path)


def test_a_copied_run_directory_is_refused_not_counted_twice(tiny_sweep: Path, tmp_path: Path) -> None:
    """A copy of a run left beside the originals (same method, setting and seed) would be a fourth
    seed of a three-seed arm: the comparison refuses it, naming both paths."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_sweep / "runs", copy / "runs")
    with pytest.raises(UserError, match=r"baseline lr0\.003 seed 0: .* each seed counts once"):
        compare(load_runs([tiny_sweep, copy]))
