"""Config validation: each mistake gets one clear UserError before any training starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oelm.cli import main
from oelm.training.config import TrainConfig, apply_overrides, make_config
from oelm.training.loop import train
from oelm.utils.errors import UserError
from train_utils import synthetic_lm_dir, tiny_config


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return synthetic_lm_dir(tmp_path / "data")


def error_of(cfg: dict) -> str:
    with pytest.raises(UserError) as info:
        train(cfg)
    return str(info.value)


def test_unknown_method_lists_methods(data: Path, tmp_path: Path) -> None:
    msg = error_of(tiny_config(data, tmp_path / "r", method="oelm-frezee"))
    assert "unknown method 'oelm-frezee'" in msg and "did you mean 'oelm-freeze'" in msg
    assert "baseline" in msg and "oelm-random" in msg


def test_unknown_keys_suggest_the_closest(data: Path, tmp_path: Path) -> None:
    assert "unknown config key 'learning_rate'" in error_of({**tiny_config(data, tmp_path), "learning_rate": 1})
    assert "did you mean 'steps'" in error_of({**tiny_config(data, tmp_path), "stesp": 3})
    cfg = {**tiny_config(data, tmp_path), "classification": {"num_lables": 2}}
    assert "'classification.num_lables'" in error_of(cfg) and "num_labels" in error_of(cfg)


def test_seq_len_beyond_context(data: Path, tmp_path: Path) -> None:
    msg = error_of(tiny_config(data, tmp_path / "r", seq_len=64))
    assert "seq_len 64 exceeds the context" in msg and "block_size 32" in msg


def test_data_dir_without_meta(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "meta.json" in error_of(tiny_config(tmp_path / "empty", tmp_path / "r"))
    assert "does not exist" in error_of(tiny_config(tmp_path / "missing", tmp_path / "r"))


def test_vocab_larger_than_model(data: Path, tmp_path: Path) -> None:
    cfg = tiny_config(data, tmp_path / "r")
    cfg["model_overrides"] = {**cfg["model_overrides"], "vocab_size": 32}
    assert "vocabulary (64 tokens" in error_of(cfg) and "vocab_size (32)" in error_of(cfg)


def test_bad_values_are_named(data: Path, tmp_path: Path) -> None:
    assert "steps" in error_of(tiny_config(data, tmp_path, steps=0))
    assert "schedule" in error_of(tiny_config(data, tmp_path, schedule="cosin"))
    assert "unknown model preset" in error_of(tiny_config(data, tmp_path, model="gpt-huge"))
    assert "float16 needs a CUDA" in error_of(tiny_config(data, tmp_path / "r", dtype="float16"))


def test_out_dir_with_another_finished_run(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("seed: 5\n")
    (out / "results.json").write_text(json.dumps({"status": "complete"}))
    msg = error_of(tiny_config(data, out))
    assert "already holds a different finished run" in msg and "--overwrite" in msg
    assert "cannot resume" in error_of(tiny_config(data, out, resume=True))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    assert "holds no run" in error_of(tiny_config(data, tmp_path / "junk"))


def test_overrides_reach_nested_fields_and_parse_yaml_values() -> None:
    raw = apply_overrides({"data": "d"}, ["lr=1e-3", "model_overrides.n_layer=2", "compile=true"])
    cfg = make_config(raw)
    assert cfg.lr == 1e-3 and cfg.model_overrides == {"n_layer": 2} and cfg.compile is True
    with pytest.raises(UserError, match="not key=value"):
        apply_overrides({}, ["lr"])


def test_cli_yaml_flags_and_overrides(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import yaml

    cfg = tiny_config(data, tmp_path / "run", steps=4, eval_every=0, checkpoint_every=0)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**cfg, "lr": 1.0}))
    rc = main(["train", str(tmp_path / "c.yaml"), "--lr", "0.002", "seed=3", "--json"])
    results = json.loads(capsys.readouterr().out)
    assert rc == 0 and results["lr"] == 0.002 and results["seed"] == 3 and results["steps"] == 4
    assert main(["train", str(tmp_path / "c.yaml"), "--method", "nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err


def test_compile_mode_needs_compile(data: Path, tmp_path: Path) -> None:
    msg = error_of({**tiny_config(data, tmp_path), "compile_mode": "reduce-overhead"})
    assert "compile_mode='reduce-overhead' needs compile=true" in msg
    assert "compile_mode" in error_of({**tiny_config(data, tmp_path), "compile": True, "compile_mode": "fast"})


FLOAT_FIELDS = [name for name, f in TrainConfig.model_fields.items() if f.annotation in (float, float | None)]


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_every_float_field_refuses_non_finite_values_naming_the_field(field: str, value: float, tmp_path: Path) -> None:
    assert len(FLOAT_FIELDS) >= 6  # lr, min_lr_ratio, weight_decay, eps, clip, layer_lr_decay at least
    with pytest.raises(UserError, match=rf"{field}: Input should be a finite number"):
        make_config({**tiny_config(tmp_path / "d", tmp_path / "r"), field: value})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b1=st.floats(allow_nan=True, allow_infinity=True), b2=st.floats(allow_nan=True, allow_infinity=True))
def test_adam_betas_are_accepted_exactly_when_both_are_in_0_1(b1: float, b2: float, tmp_path: Path) -> None:
    cfg = {**tiny_config(tmp_path / "no-data-needed", tmp_path / "r"), "betas": [b1, b2]}
    ok = all(0 <= b < 1 for b in (b1, b2))
    if ok:
        assert make_config(cfg).betas == (b1, b2)
    else:
        with pytest.raises(UserError, match="betas"):
            make_config(cfg)


@pytest.mark.parametrize(
    "override,message",
    [
        ({"dropout": 1.0}, "dropout must be in [0, 1)"),
        ({"dropout": -0.1}, "dropout"),
        ({"n_layer": 2.5}, "n_layer must be a positive integer"),
        ({"init_std": float("inf")}, "init_std"),
    ],
)
def test_bad_model_override_values_are_one_clear_error(override: dict, message: str, tmp_path: Path, capsys) -> None:
    from oelm.cli import main

    data = synthetic_lm_dir(tmp_path / "d")
    key, value = next(iter(override.items()))
    assert (
        main(
            ["train", f"data={data}", f"out={tmp_path / 'r'}", "steps=2", "warmup=0", f"model_overrides.{key}={value}"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_flags_and_key_value_overrides_go_through_one_setter() -> None:
    """One setter (issue 50, item 4): a command-line flag (a dotted field) and a `key=value`
    override set the same field the same way, making a missing or null section, and both refuse a
    path through a value that is not a section with one line naming what was given."""
    from oelm.experiments.resolve import resolve_raw
    from oelm.training.config import apply_dotted, apply_overrides
    from oelm.utils.errors import UserError

    raw = {"model": "gpt-tiny", "classification": None}
    by_flag = apply_dotted(raw, {"classification.num_labels": 3, "lr": None})
    by_override = apply_overrides(raw, ["classification.num_labels=3"])
    assert by_flag == by_override == {"model": "gpt-tiny", "classification": {"num_labels": 3}}
    assert raw["classification"] is None  # copies: the caller's dict is left as it was
    flagged, _ = resolve_raw({"model": "gpt-tiny"}, flags={"model_overrides.n_layer": 2})
    assert flagged["model_overrides"] == {"n_layer": 2}
    for bad in (
        lambda: apply_dotted({"model": "gpt-tiny"}, {"model.n_layer": 2}),
        lambda: apply_overrides({"model": "gpt-tiny"}, ["model.n_layer=2"]),
    ):
        with pytest.raises(UserError, match=r"'model' is not a section \(it holds 'gpt-tiny'\)"):
            bad()


def test_a_mapping_of_fields_goes_through_the_one_dotted_setter():
    """Scales, a sweep's overrides and grid values merge through set_dotted (issue 50 item 4: one
    setter): nested sections merge field by field, an empty section is made only where none is, and
    a section over a plain value is refused naming where it came from (before, it was replaced)."""
    from oelm.training.config import apply_mapping

    base = {"lr": 1e-3, "model_overrides": {"n_layer": 2, "d_model": 64}, "data": "d"}
    out = apply_mapping(base, {"lr": 3e-3, "model_overrides": {"n_layer": 4}, "probe": {}}, "scale 'smoke'")
    assert out == {"lr": 3e-3, "model_overrides": {"n_layer": 4, "d_model": 64}, "data": "d", "probe": {}}
    assert base["model_overrides"] == {"n_layer": 2, "d_model": 64}  # a copy: the input is untouched
    assert apply_mapping(base, {"model_overrides": {}}, "overrides")["model_overrides"] == base["model_overrides"]
    # One syntax: a dotted key is the path the command line's model_overrides.n_layer=4 names.
    assert apply_mapping(base, {"model_overrides.n_layer": 4}, "overrides") == apply_mapping(
        base, {"model_overrides": {"n_layer": 4}}, "overrides"
    )
    with pytest.raises(UserError, match=r"^scale 'smoke': data\.path='x': 'data' is not a section"):
        apply_mapping(base, {"data": {"path": "x"}}, "scale 'smoke'")
