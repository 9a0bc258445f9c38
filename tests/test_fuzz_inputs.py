"""Generated bad inputs end in a result or one UserError, never another exception (issue 28).

Hypothesis draws configs, tables and YAML files; CI runs a few dozen examples each, and
`OELM_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz_inputs.py` (or scripts/fault_suite.py
--fuzz) runs the long, randomized part.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oelm.data.cls_sources import Columns, read_table
from oelm.training.config import TrainConfig, apply_overrides, make_config
from oelm.utils.errors import UserError
from oelm.utils.io import read_json_object, read_yaml

EXAMPLES = int(os.environ.get("OELM_FUZZ_EXAMPLES", "40"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
FIELDS = st.sampled_from(sorted(TrainConfig.model_fields) + ["bogus", "model_overrides.n_layer", "method_options.rank"])


@SETTINGS
@given(st.dictionaries(FIELDS, VALUES, max_size=6))
def test_any_config_is_a_train_config_or_one_user_error(changes: dict) -> None:
    config = {"data": "data/x", "steps": 10, "warmup": 0, **changes}
    try:
        cfg = make_config(config)
    except UserError as err:
        assert str(err) and "\n" not in str(err).strip()  # one line
        return
    assert isinstance(cfg, TrainConfig)
    for name in ("lr", "weight_decay", "eps", "clip", "min_lr_ratio", "layer_lr_decay"):
        value = getattr(cfg, name)
        assert value == value and abs(value) != float("inf")  # finite, never NaN
    assert all(0 <= b < 1 for b in cfg.betas)


LINE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@SETTINGS
@given(
    header=st.sampled_from(["text\tlabel", "text,label", "label\ttext", "x\ty"]),
    lines=st.lists(LINE, max_size=12),
    suffix=st.sampled_from([".tsv", ".csv", ".jsonl"]),
    bom=st.booleans(),
)
def test_any_table_gives_its_rows_or_one_user_error(header: str, lines: list[str], suffix: str, bom: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"train{suffix}"
        body = "\n".join([header, *lines]) + "\n"
        path.write_text(("\ufeff" if bom else "") + body, encoding="utf-8")
        try:
            rows = read_table(path, Columns())
        except UserError as err:
            assert str(err).strip()
            return
        assert all(text.strip() and label.strip() for text, _, label in rows)
        if suffix == ".tsv" and header == "text\tlabel":  # one row per non-blank line, no merging
            data_lines = [x for x in re.split(r"\r\n|\r|\n", body)[1:] if x]  # csv's line ends only
            assert len(rows) == len(data_lines)


# YAML scalars behind explicit tags: PyYAML's safe constructors raised ValueError (`!!int abc`),
# KeyError (`!!bool maybe`) or TypeError (`!!set [1]`) past every `except yaml.YAMLError`.
YAML_TAG = st.sampled_from(
    ["", "!!int ", "!!float ", "!!bool ", "!!null ", "!!str ", "!!timestamp ", "!!binary ", "!!set ", "!!map "]
    + ["!!seq ", "!!omap ", "!!pairs ", "!!python/tuple ", "!local "]
)
YAML_SCALAR = st.one_of(
    st.text(alphabet="0123456789abxyz.-+:_ eE", max_size=10),
    st.sampled_from(["[1]", "{a: 1}", "maybe", "0x", "0b", "2020-99-99", "1e999", ".nan", "~", "'q'", "[" * 60]),
)
YAML_VALUE = st.builds(lambda tag, scalar: tag + scalar, YAML_TAG, YAML_SCALAR)
YAML_DOC = st.lists(st.tuples(st.sampled_from(["lr", "seed", "steps", "a"]), YAML_VALUE), max_size=4).map(
    lambda rows: "".join(f"{key}_{i}: {value}\n" for i, (key, value) in enumerate(rows))
)


@SETTINGS
@given(st.one_of(st.text(max_size=300), YAML_DOC))
def test_any_yaml_file_is_a_mapping_or_one_user_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            data = read_yaml(path)
        except UserError as err:
            assert str(err).strip() and "\n" not in str(err).strip()
            return
        assert isinstance(data, dict)


@SETTINGS
@given(st.binary(max_size=200))
def test_any_json_file_is_an_object_or_one_user_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "meta.json"
        path.write_bytes(raw)
        try:
            data = read_json_object(path, "re-run `oelm prepare lm`")
        except UserError as err:
            assert str(path) in str(err) and "\n" not in str(err).strip()
            return
        assert isinstance(data, dict)


OVERRIDE_KEY = st.sampled_from(
    ["lr", "seed", "steps", "betas", "dropout", "model_overrides.n_layer", "method_options.rank", "method"]
    + ["", "lr.", ".lr", "a..b", "bogus", "data.x"]
)


@SETTINGS
@given(st.one_of(st.builds(lambda key, value: f"{key}={value}", OVERRIDE_KEY, YAML_VALUE), st.text(max_size=30)))
def test_any_key_value_override_is_a_train_config_or_one_user_error(override: str) -> None:
    """`oelm train ... key=value`: any text, tagged YAML values among them, gives a config with
    finite numbers or one UserError line (never the YAML constructor's ValueError or KeyError)."""
    try:
        cfg = make_config(apply_overrides({"data": "data/x", "steps": 10, "warmup": 0}, [override]))
    except UserError as err:
        assert str(err).strip() and "\n" not in str(err).strip()
        return
    assert isinstance(cfg, TrainConfig) and cfg.lr == cfg.lr and abs(cfg.lr) != float("inf")
