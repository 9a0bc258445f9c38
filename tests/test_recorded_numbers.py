"""A stored run's numbers that no real run records non-finite (its learning rate, seed, counts, step
times, the settings it ran with, its timing and freeze audit) are refused where the record is read,
naming the file and the field; a diverged run's NaN loss stays an outcome, listed as collapsed."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oelm.cli import main
from oelm.records import run as records
from oelm.records.compact import RUN_RECORD_FILE, read_record, write_record
from oelm.records.load import load_run, load_runs
from oelm.records.numbers import AMOUNT_KEYS, COUNT_KEYS, POSITIVE_KEYS, WHOLE_KEYS
from oelm.utils.errors import UserError
from test_report import make_run

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
# A bad value for each rule: what no real run writes there.
BAD = {
    **{key: NON_FINITE | st.sampled_from([1.5, "7", True]) for key in WHOLE_KEYS},
    **{key: NON_FINITE | st.sampled_from([-1, 2.5, "40", False]) for key in COUNT_KEYS},
    **{key: NON_FINITE | st.sampled_from([-0.1, "0.1"]) for key in AMOUNT_KEYS},
    **{key: NON_FINITE | st.sampled_from([0, -1e-3, "1e-3"]) for key in POSITIVE_KEYS},
}


@st.composite
def bad_field(draw: st.DrawFn) -> tuple[str, object]:
    key = draw(st.sampled_from(sorted(BAD)))
    return key, draw(BAD[key])


@SETTINGS
@given(bad=bad_field())
def test_a_results_number_no_run_records_is_refused_naming_the_file_and_field(bad: tuple[str, object]) -> None:
    """Before: a NaN learning rate was read as the reports' "no learning rate", a NaN seed as no
    seed, an inf seed or parameter count ended the report in OverflowError, a count of 2.5 was
    truncated to 2 and an inf step time was averaged."""
    key, value = bad
    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp), "baseline", 1e-3, 0, test_perplexity=4.0, best_val_loss=1.5)
        results = json.loads((run / "results.json").read_text())
        results[key] = value
        (run / "results.json").write_text(json.dumps(results))  # allow_nan: the tokens NaN, Infinity
        with pytest.raises(UserError) as err:
            load_runs([tmp])
        message = str(err.value)
        assert "results.json" in message and f"records {key} = " in message and "\n" not in message


def test_a_diverged_run_with_nan_losses_is_still_listed_as_collapsed(tmp_path: Path) -> None:
    """NaN metrics are an outcome of a real run: not refused, classified as before."""
    run = make_run(
        tmp_path, "baseline", 1e-3, 0, test_perplexity=float("nan"), best_val_loss=float("nan"), curve=[2.0, math.nan]
    )
    loaded = load_run(run)
    assert loaded.status == records.COLLAPSED and "diverged on validation" in loaded.reason


@pytest.mark.parametrize(
    ("file", "edit", "field"),
    [
        ("config.yaml", lambda d: d.update(dropout=float("nan")), "dropout"),
        ("config.yaml", lambda d: d.update(model_overrides={"n_embd": float("inf")}), "model_overrides.n_embd"),
        ("timing_stats.json", lambda d: d["step_time"].update(mean=float("inf")), "step_time.mean"),
        ("freeze_audit.json", lambda d: d["start"]["totals"].update(frozen=float("nan")), "start.totals.frozen"),
        ("freeze_audit.json", lambda d: d["start"]["totals"].update(trainable=1e3 + 0.5), "trainable"),
        ("metrics.jsonl", lambda d: d.update(step=float("nan")), "step"),
    ],
)
def test_a_non_finite_setting_timing_audit_or_eval_step_is_refused_naming_it(
    tmp_path: Path, file: str, edit, field: str
) -> None:
    run = make_run(tmp_path, "baseline", 1e-3, 0, test_perplexity=4.0, best_val_loss=1.5)
    (run / "timing_stats.json").write_text(json.dumps({"step_time": {"count": 3, "mean": 0.1}}))
    (run / "freeze_audit.json").write_text(json.dumps({"start": {"totals": {"trainable": 1000, "frozen": 0}}}))
    path = run / file
    if file == "config.yaml":
        data = yaml.safe_load(path.read_text())
        edit(data)
        path.write_text(yaml.safe_dump(data))
    elif file == "metrics.jsonl":
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        edit(lines[-1])
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    else:
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=rf"{file}.* records {field} = "):
        run_record = load_run(run)
        assert run_record.eval_curve("loss")  # the metrics stream is read on first use


def test_a_compact_record_holding_a_non_finite_config_value_is_refused_by_oelm_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "dirs", "baseline", 1e-3, 0, test_perplexity=4.0, best_val_loss=1.5)
    folder = tmp_path / "stored" / "runs" / "baseline" / "lr0.001" / "seed0"
    write_record(load_run(run), folder)
    assert read_record(folder).lr == 1e-3
    raw = json.loads((folder / RUN_RECORD_FILE).read_text())
    raw["config"]["lr"] = float("nan")
    (folder / RUN_RECORD_FILE).write_text(json.dumps(raw, indent=1))
    assert main(["report", str(tmp_path / "stored"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "record.json" in err and "(config of run" in err and "records lr = nan" in err


@pytest.mark.parametrize("value", ["abc", [1.0, 2.0], True, {"mean": 1.0}])
def test_a_metric_that_is_not_a_number_is_refused_not_dropped_from_the_mean(tmp_path, value) -> None:
    """A string (or list, boolean, mapping) where results.json holds a metric was read as 'not
    recorded': that seed dropped out of its arm's mean without a word. It is refused, by name."""
    import json

    from oelm.records.run import read_results

    run = tmp_path / "run"
    run.mkdir()
    good = {"status": "complete", "primary_metric": "test_perplexity", "test_perplexity": 4.0, "test_loss": 1.4}
    (run / "results.json").write_text(json.dumps(good))
    assert read_results(run)["test_perplexity"] == 4.0
    (run / "results.json").write_text(json.dumps({**good, "test_perplexity": value}))
    with pytest.raises(UserError, match=r"records test_perplexity = .*it must be a number, or null"):
        read_results(run)
    (run / "results.json").write_text(json.dumps({**good, "test_perplexity": None, "custom_metric": 1.0}))
    assert read_results(run)["test_perplexity"] is None  # null: not measured, as oelm writes it
