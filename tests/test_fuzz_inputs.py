"""Generated bad inputs end in a result or one UserError, never another exception (issue 28).

Hypothesis draws configs, tables and YAML files; CI runs a few dozen examples each, and
`OELM_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz_inputs.py` (or scripts/fault_suite.py
--fuzz) runs the long, randomized part.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oelm.data.cls_sources import Columns, read_table
from oelm.data.lm import prepare_lm
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


# A JSON line as a corpus writes it (json.dumps escapes a lone surrogate as \ud800, which reads
# back into Python and fails only when the text is encoded for the tokenizer), or a damaged one.
TEXTS = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2),
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.lists(st.text(max_size=3), max_size=2),
)
JSONL_LINE = st.one_of(
    st.builds(lambda text, field: json.dumps({field: text, "id": 1}), TEXTS, st.sampled_from(["text", "body"])),
    st.sampled_from(['{"text": "a", "n": 1' + "0" * 5000 + "}", '{"text": ' + "[" * 3000, "[1, 2]", "{", "null"]),
    st.text(max_size=20),
)


@SETTINGS
@given(st.lists(JSONL_LINE, min_size=1, max_size=6))
def test_any_jsonl_source_gives_text_documents_or_one_user_error(lines: list[str]) -> None:
    """`oelm prepare lm FILE.jsonl`: every document read is text the tokenizer can encode, or the
    file is refused in one line naming it (not a ValueError on a 5,000-digit number, a
    RecursionError on deep nesting, or a UnicodeEncodeError once tokenizing began)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "docs.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            meta = prepare_lm(path, "byte", Path(tmp) / "out", verbose=False)
        except UserError as err:
            assert str(err).strip() and "\n" not in str(err).strip()
            assert "docs.jsonl" in str(err) or " line " not in str(err)  # a bad line is named with its file
            return
        assert meta and (Path(tmp) / "out" / "meta.json").is_file()


OPTION = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(2**40, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["0.1", "abc", ""]),
)


@settings(max_examples=max(10, EXAMPLES // 2), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    options=st.fixed_dictionaries(
        {},
        optional={
            "val_fraction": OPTION,
            "test_fraction": OPTION,
            "seed": OPTION,
            "max_docs": OPTION,
            "workers": st.one_of(st.sampled_from([1, 2]), OPTION.filter(lambda v: not isinstance(v, int) or v < 1)),
        },
    )
)
def test_any_prepare_option_is_used_or_refused_in_one_line_before_any_work(options: dict) -> None:
    """`oelm prepare lm`'s numeric options (argparse hands NaN, inf and negatives through; a study's
    `prepare` recipe hands any YAML value): the data is prepared, or one UserError is raised and
    nothing is written (not a TypeError on a string fraction or numpy's ValueError on seed -1)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src.txt"
        src.write_text("\n\n".join(f"document {i} has a few words" for i in range(12)))
        out = Path(tmp) / "out"
        try:
            meta = prepare_lm(src, "byte", out, verbose=False, **options)
        except UserError as err:
            assert str(err).strip() and "\n" not in str(err).strip()
            assert not out.exists()
            return
        assert meta and (out / "meta.json").is_file()
