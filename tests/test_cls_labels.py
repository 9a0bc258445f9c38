"""Classification labels: missing values, labels unseen in training and non-UTF-8 files are refused
where they enter, naming the file and the row (issue 40, classes 4 and 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oelm.data.cls import load_classification
from oelm.data.cls_sources import MISSING_LABELS
from oelm.utils.errors import UserError

TRAIN = "text,label\n" + "good,1\nbad,0\n" * 4
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _spelling(word: str, data: st.DataObject) -> str:
    """The word as a spreadsheet or pandas might write it: any case, maybe padded."""
    cased = "".join(c.upper() if data.draw(st.booleans()) else c for c in word)
    return data.draw(st.sampled_from(["", " "])) + cased


@FAST
@given(
    word=st.sampled_from(sorted(MISSING_LABELS)),
    at=st.integers(0, 7),
    suffix=st.sampled_from([".csv", ".tsv"]),
    data=st.data(),
)
def test_a_missing_value_label_is_refused_naming_its_line(word, at, suffix, data, tmp_path_factory) -> None:
    folder = tmp_path_factory.mktemp("cls")
    sep = "," if suffix == ".csv" else "\t"
    rows = [f"t{i}{sep}{i % 2}" for i in range(8)]
    rows[at] = f"t{at}{sep}{_spelling(word, data)}"
    (folder / f"train{suffix}").write_text("\n".join([f"text{sep}label", *rows]) + "\n")
    with pytest.raises(UserError, match=rf"train\{suffix} line {at + 2}: label .* marks a missing value"):
        load_classification("local", data_dir=folder)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "null"])
def test_a_json_nan_or_null_label_is_refused(value, tmp_path: Path) -> None:
    lines = [json.dumps({"text": f"t{i}", "label": i % 2}) for i in range(6)]
    lines[3] = f'{{"text": "t3", "label": {value}}}'
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"train\.jsonl line 4(: .*missing value| has an empty or null label)"):
        load_classification("local", data_dir=tmp_path)


def test_a_pandas_float_label_column_with_nan_is_not_a_third_class(tmp_path: Path) -> None:
    """What df.to_csv writes when one label is missing: 1.0, 0.0, nan."""
    (tmp_path / "train.csv").write_text("text,label\n" + "good,1.0\nbad,0.0\n" * 3 + "odd,nan\n")
    with pytest.raises(UserError, match=r"line 8: label 'nan'"):
        load_classification("local", data_dir=tmp_path)
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"good{i},1.0\nbad{i},0.0\n" for i in range(10)))
    assert load_classification("local", data_dir=tmp_path).num_labels == 2


@FAST
@given(
    train_labels=st.sets(st.sampled_from(["ant", "bee", "cat", "dog", "eel"]), min_size=2, max_size=4),
    other=st.sampled_from(["ant", "bee", "cat", "dog", "eel", "fox"]),
    split=st.sampled_from(["test", "validation"]),
)
def test_a_label_never_seen_in_training_is_refused_not_added(train_labels, other, split, tmp_path_factory) -> None:
    folder = tmp_path_factory.mktemp("cls")
    labels = sorted(train_labels)
    (folder / "train.csv").write_text("text,label\n" + "".join(f"t{i},{lab}\n" for i, lab in enumerate(labels * 10)))
    (folder / f"{split}.csv").write_text(f"text,label\nx,{labels[0]}\ny,{other}\n")
    if other in train_labels:
        assert load_classification("local", data_dir=folder, val_fraction=0.2).label_names == labels
        return
    with pytest.raises(UserError, match=rf"{split}\.csv: label\(s\) '{other}' never occur in the training file"):
        load_classification("local", data_dir=folder, val_fraction=0.2)


def test_an_integer_test_label_beyond_training_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text(TRAIN)
    (tmp_path / "test.csv").write_text("text,label\nx,1\ny,2\n")
    with pytest.raises(UserError, match=r"label\(s\) '2' never occur .*first at data row 2"):
        load_classification("local", data_dir=tmp_path)


@pytest.mark.parametrize("name", ["train.csv", "train.tsv", "train.jsonl"])
def test_a_file_saved_as_windows_1252_is_one_error_naming_it(name: str, tmp_path: Path) -> None:
    text = {
        "train.csv": "text,label\ngood,1\ncaf\u00e9 na\u00efve,0\n",
        "train.tsv": "text\tlabel\ngood\t1\ncaf\u00e9 na\u00efve\t0\n",
        "train.jsonl": '{"text": "good", "label": 1}\n{"text": "caf\u00e9", "label": 0}\n',
    }[name]
    (tmp_path / name).write_bytes(text.encode("cp1252"))
    with pytest.raises(UserError, match=rf"{name}' is not UTF-8 .*line [23].*re-save it as UTF-8"):
        load_classification("local", data_dir=tmp_path)


def test_a_registered_layout_saved_as_windows_1252_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "train.tsv").write_bytes("sentence\tlabel\ncaf\u00e9\t1\n".encode("cp1252"))
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n")
    with pytest.raises(UserError, match=r"train\.tsv' is not UTF-8"):
        load_classification("sst2", data_dir=tmp_path)


def test_a_hub_label_that_is_missing_names_the_row() -> None:
    datasets = pytest.importorskip("datasets")

    def loader(path, config):
        rows = {"sentence": ["good", "bad", "fine", "awful"], "label": [1.0, 0.0, float("nan"), 0.0]}
        return {s: datasets.Dataset.from_dict(rows) for s in ("train", "validation")}

    with pytest.raises(UserError, match=r"\[train\] row 2: label nan is not a class id"):
        load_classification("sst2", hub_loader=loader)


@pytest.mark.parametrize("batch,accum,ok", [(16, 1, False), (4, 4, False), (4, 3, True), (12, 1, True)])
def test_a_step_larger_than_the_training_split_is_refused_before_the_run(batch, accum, ok, tmp_path: Path) -> None:
    from oelm.training.loop import train

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(12)))
    (data / "validation.csv").write_text("text,label\nx,0\ny,1\n")
    (data / "test.csv").write_text("text,label\nx,0\ny,1\n")
    cfg = {
        "task": "classification",
        "data": "local",
        "model": "gpt-tiny",
        "method": "baseline",
        "model_overrides": {"n_layer": 1, "d_model": 16, "n_head": 2, "block_size": 16},
        "classification": {"data_dir": str(data), "tokenizer": "byte", "max_length": 16},
        "steps": 1,
        "batch_size": batch,
        "grad_accum": accum,
        "warmup": 0,
        "out": str(tmp_path / "run"),
        "progress": False,
        "tensorboard": False,
        "device": "cpu",
    }
    if ok:
        assert train(cfg)["steps"] == 1
        return
    with pytest.raises(UserError, match=rf"= {batch * accum} rows per optimizer step, but the training split has 12"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_a_class_that_max_train_or_the_carve_leaves_untrained_is_refused(tmp_path: Path) -> None:
    rows = "".join(f"common {i},a\n" for i in range(30)) + "rare,b\n"
    (tmp_path / "train.csv").write_text("text,label\n" + rows)
    (tmp_path / "test.csv").write_text("text,label\nx,a\ny,b\n")
    assert load_classification("local", data_dir=tmp_path, val_fraction=0.05).num_labels == 2
    with pytest.raises(UserError, match=r"heldout rows hold class\(es\) 'b' that no training row has .*max_train"):
        load_classification("local", data_dir=tmp_path, val_fraction=0.05, max_train=5, seed=1)
