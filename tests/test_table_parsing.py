"""Local classification tables read exactly the rows and labels in the file, or name the line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oelm.data.cls_sources import Columns, label_vocabulary, read_table
from oelm.utils.errors import UserError

# Texts with the characters that break naive readers: quotes first, commas, apostrophes, unicode.
TSV_TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30).filter(
    lambda s: s.strip() and "\t" not in s
)
CSV_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"), min_size=1, max_size=30
).filter(lambda s: s.strip())
ROWS = st.lists(
    st.tuples(st.one_of(TSV_TEXT, st.just('"quoted start'), st.just('" lone quote')), st.sampled_from("01")),
    min_size=1,
    max_size=40,
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(rows=ROWS, bom=st.booleans())
def test_tsv_rows_are_the_lines_of_the_file(rows: list[tuple[str, str]], bom: bool, tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    body = "text\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in rows)
    path.write_text(("\ufeff" if bom else "") + body, encoding="utf-8")
    got = read_table(path, Columns())
    assert [(t, lab) for t, _, lab in got] == rows


@SETTINGS
@given(rows=st.lists(st.tuples(CSV_TEXT, st.sampled_from(["0", "1", "2"])), min_size=1, max_size=30))
def test_csv_written_by_a_csv_writer_reads_back_exactly(rows: list[tuple[str, str]], tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)
    assert [(t, lab) for t, _, lab in read_table(path, Columns())] == rows


def test_a_stray_quote_in_csv_names_the_line_instead_of_merging_rows(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_text('text,label\nfine,0\n"broken, 1\nnext,0\nlast,1\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"train.csv line \d+ .*field"):
        read_table(path, Columns())


@pytest.mark.parametrize("label", ["", "  ", None])
def test_an_empty_or_null_label_is_an_error_not_a_class(label, tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    rows = [{"text": "a", "label": 0}, {"text": "b", "label": label}, {"text": "c", "label": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(UserError, match="line 2 has an empty or null label"):
        read_table(path, Columns())
    tsv = tmp_path / "train.tsv"
    tsv.write_text(f"text\tlabel\na\t0\nb\t{label or ''}\n")
    with pytest.raises(UserError, match="line 3 has an empty or null label"):
        read_table(tsv, Columns())


def test_null_text_is_an_error_and_a_null_pair_is_empty_never_the_text_none(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"a": "x", "b": None, "label": 1}) + "\n")
    assert read_table(path, Columns("a", "b")) == [("x", "", "1")]
    path.write_text(json.dumps({"a": None, "b": "y", "label": 1}) + "\n")
    with pytest.raises(UserError, match="empty or null a field"):
        read_table(path, Columns("a", "b"))


def test_integral_labels_in_any_spelling_are_one_class(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    rows = [
        {"text": "a", "label": "1"},
        {"text": "b", "label": 1.0},
        {"text": "c", "label": "1.0"},
        {"text": "d", "label": 0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    labels = [lab for _, _, lab in read_table(path, Columns())]
    names, mapping = label_vocabulary(labels)
    assert names == ["0", "1"] and [mapping[x] for x in labels] == [1, 1, 1, 0]


def test_a_tsv_row_with_an_extra_field_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\na\t0\nb\t1\textra\n")
    with pytest.raises(UserError, match=r"line 3 has 3 field\(s\) but the header has 2"):
        read_table(path, Columns())


def test_the_summary_line_states_the_rows_and_classes_read(tmp_path: Path) -> None:
    from oelm.data.cls import load_classification
    from oelm.training.classification import data_summary_line

    (tmp_path / "train.tsv").write_text("text\tlabel\n" + "".join(f'"t{i}\t{i % 3}\n' for i in range(400)))
    (tmp_path / "test.tsv").write_text("text\tlabel\n" + "".join(f"u{i}\t{i % 3}\n" for i in range(30)))
    data = load_classification("local", data_dir=tmp_path, seed=0)
    line = data_summary_line(data)
    n_train, n_val = len(data.train), len(data.validation)
    assert n_train + n_val == 400 and len(data.heldout) == 30  # every line of the files, quotes and all
    assert f"train {n_train:,}" in line and "heldout 30" in line and "3 classes: 0, 1, 2" in line


def test_distinct_labels_stay_distinct(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    labels = ["01", "1", "1_0", "12345678901234567890", "12345678901234567891", "1.0", 1.0]
    path.write_text("".join(json.dumps({"text": f"t{i}", "label": lab}) + "\n" for i, lab in enumerate(labels)))
    read = [lab for _, _, lab in read_table(path, Columns())]
    assert read == ["01", "1", "1_0", "12345678901234567890", "12345678901234567891", "1", "1"]
    names, mapping = label_vocabulary(read)
    assert len(names) == 5 and len({mapping[x] for x in read}) == 5  # five classes, none merged
