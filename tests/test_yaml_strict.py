"""Config files: duplicate keys and alias bombs are refused with the line, before anything runs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from oelm.cli import main
from oelm.utils.errors import UserError
from oelm.utils.io import MAX_YAML_ALIASES, load_yaml_text, read_yaml

KEYS = st.from_regex(r"k_[a-z0-9_]{0,8}", fullmatch=True)  # never a YAML 1.1 boolean or null
VALUES = st.one_of(st.integers(-1000, 1000), st.booleans(), st.from_regex(r"[a-z]{1,6}", fullmatch=True))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(KEYS, VALUES, min_size=1, max_size=12), st.data())
def test_a_duplicate_key_anywhere_is_refused_naming_it_and_both_lines(mapping: dict, data: st.DataObject) -> None:
    lines = [f"{k}: {yaml.safe_dump(v).splitlines()[0]}" for k, v in mapping.items()]
    assert load_yaml_text("\n".join(lines)) == mapping  # the file without the duplicate reads as written
    first = data.draw(st.integers(0, len(lines) - 1))
    key = list(mapping)[first]
    at = data.draw(st.integers(first + 1, len(lines)))
    dup = [*lines[:at], f"{key}: 0", *lines[at:]]
    with pytest.raises(yaml.YAMLError) as err:
        load_yaml_text("\n".join(dup))
    text = " ".join(str(err.value).split())
    assert f"duplicate key {key!r} (first on line {first + 1})" in text and f"line {at + 1}" in text


def test_nested_duplicates_are_refused_and_same_keys_in_sibling_mappings_are_fine() -> None:
    assert load_yaml_text("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'x'"):
        load_yaml_text("a:\n  x: 1\n  y: 2\n  x: 3\n")


def _bomb(levels: int, width: int) -> str:
    rows = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    rows += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("levels,width", [(9, 9), (30, 2), (4, 40)])
def test_alias_bombs_are_refused_fast(levels: int, width: int, tmp_path: Path) -> None:
    text = _bomb(levels, width)
    assert len(text) < 2000
    start = time.perf_counter()
    with pytest.raises(yaml.YAMLError, match="aliases|expands to more than"):
        load_yaml_text(text)
    assert time.perf_counter() - start < 2.0  # refused while composing, never expanded
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match="not valid YAML .*line"):
        read_yaml(path)


def test_a_few_anchors_for_shared_settings_still_work() -> None:
    text = "base: &b {lr: 0.001, steps: 10}\nrun_a: *b\nrun_b: *b\n"
    assert load_yaml_text(text)["run_b"] == {"lr": 0.001, "steps": 10}
    many = "x: &x 1\n" + "".join(f"k{i}: *x\n" for i in range(MAX_YAML_ALIASES + 1))
    with pytest.raises(yaml.YAMLError, match=f"more than {MAX_YAML_ALIASES} aliases"):
        load_yaml_text(many)


def test_oelm_train_refuses_a_duplicate_key_config_with_exit_2(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data: builtin:tales\nsteps: 5\nout: {tmp_path / 'run'}\nsteps: 7\n")
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "duplicate key 'steps' (first on line 2)" in err and "line 4" in err
    assert not (tmp_path / "run").exists()


def test_duplicates_on_one_line_are_refused_too() -> None:
    for text in ("a: {x: 1, x: 2}", "{lr: 1, lr: 2}", "method_options: {rank: 4, rank: 8}"):
        with pytest.raises(yaml.YAMLError, match="duplicate key"):
            load_yaml_text(text)


@pytest.mark.parametrize("override", ["method_options={rank: 4, rank: 8}", "lr=[1"])
def test_key_value_overrides_use_the_strict_loader_and_fail_in_one_line(override: str, tmp_path: Path, capsys) -> None:
    assert main(["train", "data=x", f"out={tmp_path / 'run'}", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not valid YAML" in err and "Traceback" not in err


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 4), st.sampled_from(["[{}]", "{{k: {}}}", "[1, {{k: [{}]}}]"]))
def test_a_recursive_alias_at_any_depth_is_refused_and_a_shared_one_is_not(depth: int, shape: str) -> None:
    inner = "*x"
    for _ in range(depth):
        inner = shape.format(inner)
    with pytest.raises(yaml.YAMLError, match="recursive alias"):
        load_yaml_text(f"top: &x [{inner}]\n")
    shared = f"top: &x [1]\nother: {shape.format('*x')}\n"  # the same alias beside its anchor is fine
    assert load_yaml_text(shared)["top"] == [1]


def test_oelm_train_refuses_a_recursive_alias_config_in_one_line(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data: builtin:tales\nout: {tmp_path / 'run'}\nmethod_options: &o {{rank: *o}}\n")
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "recursive alias" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_config_saved_as_windows_1252_is_one_line_naming_the_file_and_the_fix(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(f"data: builtin:tales\nout: {tmp_path / 'run'}\nnotes: caf\xe9\n".encode("cp1252"))
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run.yaml" in err and "not UTF-8" in err and "line 3" in err
    assert "re-save it as UTF-8" in err and not (tmp_path / "run").exists()
