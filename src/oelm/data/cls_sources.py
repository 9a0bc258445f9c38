"""Readers for classification sources: official local file layouts, generic tables, the HF hub."""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oelm.utils.errors import UserError
from oelm.utils.io import read_text

NLI_LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")  # HF glue/xnli order

# GLUE/XNLI text fields can exceed csv's default 128 KiB field limit (IMDB-like reviews in tables).
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


@dataclass(frozen=True)
class Example:
    """One labelled example: a text, an optional second text (pair tasks) and a label id."""

    text: str
    text_pair: str | None
    label: int


Splits = dict[str, list[Example]]


# ----------------------------------------------------------------------------- file helpers


def require_files(data_dir: Path, dataset: str, required: Iterable[str]) -> None:
    """Raise one UserError listing the expected and found files when any is missing."""
    required = list(required)
    if not data_dir.is_dir():
        raise UserError(
            f"data_dir {data_dir} for dataset {dataset!r} does not exist or is not a folder; "
            f"pass a folder holding {', '.join(required)}"
        )
    missing = [name for name in required if not (data_dir / name).is_file()]
    if missing:
        found = sorted(p.name for p in data_dir.iterdir())
        raise UserError(
            f"data_dir {data_dir} lacks {', '.join(missing)} for dataset {dataset!r}; "
            f"expected files: {', '.join(required)}; found: {', '.join(found) or 'nothing'}"
        )


def _nonempty(rows: list[Any], path: Path) -> list[Any]:
    if not rows:
        raise UserError(f"{path} has no data rows; check that it is the right file and not empty")
    return rows


def _check_label(label: int, num_labels: int, path: Path, row: int, names: Iterable[str]) -> int:
    if not 0 <= label < num_labels:
        hint = " (-1 means the labels of this split are hidden, e.g. a GLUE test file)" if label == -1 else ""
        raise UserError(
            f"{path} row {row}: label {label} is outside 0..{num_labels - 1} "
            f"({', '.join(names)}){hint}; fix the file or pick the labelled split"
        )
    return label


def _named_label(value: str, names: tuple[str, ...], path: Path, row: int) -> int:
    if value not in names:
        raise UserError(f"{path} row {row}: label {value!r} is not one of {', '.join(names)}; fix the file")
    return names.index(value)


def _int_label(value: Any, path: Path, row: int) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise UserError(f"{path} row {row}: label {value!r} is not an integer; fix the file") from None


def not_utf8(path: Path) -> UserError:
    """The one error for a data file that is not UTF-8 (a CSV saved as Windows-1252 by a spreadsheet)."""
    try:
        read_text(path, "data file")
    except UserError as err:
        return err
    return UserError(f"data file {str(path)!r} is not UTF-8; re-save it as UTF-8")


def _tsv_rows(path: Path) -> Iterator[list[str]]:
    # GLUE/XTREME TSVs are unquoted: a literal quote is part of the text (README hint).
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            yield from csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def _header_rows(path: Path, required: list[str], hint: str) -> tuple[list[str], Iterator[list[str]]]:
    rows = _tsv_rows(path)
    header = next(rows, None)
    if header is None:
        raise UserError(f"{path} is empty; expected a header with columns {', '.join(required)}")
    missing = [c for c in required if c not in header]
    if missing:
        raise UserError(f"{path} lacks column(s) {', '.join(missing)}; found columns: {', '.join(header)}; {hint}")
    return header, rows


# ----------------------------------------------------------------------------- official layouts


def read_sst2_tsv(path: Path) -> list[Example]:
    """GLUE SST-2 TSV with header `sentence<TAB>label`."""
    header, rows = _header_rows(path, ["sentence", "label"], "expected the GLUE SST-2 train/dev layout")
    i_s, i_l = header.index("sentence"), header.index("label")
    out = []
    for n, r in enumerate(rows, start=2):
        if not r:
            continue
        label = _check_label(_int_label(r[i_l], path, n), 2, path, n, ("negative", "positive"))
        out.append(Example(r[i_s], None, label))
    return _nonempty(out, path)


def read_mnli_tsv(path: Path) -> list[Example]:
    """GLUE MNLI TSV (sentence1, sentence2, gold_label); rows without a gold label are skipped."""
    header, rows = _header_rows(
        path, ["sentence1", "sentence2", "gold_label"], "expected the GLUE MNLI train/dev layout"
    )
    i_a, i_b, i_l = header.index("sentence1"), header.index("sentence2"), header.index("gold_label")
    out = []
    for n, r in enumerate(rows, start=2):
        if not r:
            continue
        if len(r) <= max(i_a, i_b, i_l):
            raise UserError(f"{path} row {n} has {len(r)} fields, fewer than the header; fix the file")
        if r[i_l] == "-":  # MultiNLI marks pairs without annotator consensus with "-"
            continue
        out.append(Example(r[i_a], r[i_b], _named_label(r[i_l], NLI_LABELS, path, n)))
    return _nonempty(out, path)


def read_xnli_tsv(path: Path) -> list[Example]:
    """XTREME XNLI TSV without header: `premise<TAB>hypothesis<TAB>label` (label as a word)."""
    out = []
    for n, r in enumerate(_tsv_rows(path), start=1):
        if not r:
            continue
        if len(r) < 3:
            raise UserError(
                f"{path} row {n} has {len(r)} column(s); expected premise, hypothesis, label "
                "(unlabelled test files cannot be used for training or evaluation)"
            )
        out.append(Example(r[0], r[1], _named_label(r[2].strip(), NLI_LABELS, path, n)))
    return _nonempty(out, path)


def read_imdb_jsonl(path: Path) -> list[Example]:
    """JSON lines with keys `text` and `label` (0 negative, 1 positive)."""
    rows = list(iter_jsonl(path))
    _require_keys(rows, path, ["text", "label"], "expected JSON lines with text and label")
    return [
        Example(r["text"], None, _check_label(_int_label(r["label"], path, n), 2, path, n, ("neg", "pos")))
        for n, r in enumerate(rows, start=1)
    ]


def read_ag_news_csv(path: Path) -> list[Example]:
    """AG News CSV without header: class index 1-4, title, description."""
    out = []
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            for n, r in enumerate(csv.reader(f), start=1):
                if not r:
                    continue
                if len(r) < 3:
                    raise UserError(f"{path} row {n} has {len(r)} column(s); expected class, title, description")
                label = _check_label(_int_label(r[0], path, n) - 1, 4, path, n, ("1", "2", "3", "4"))
                out.append(Example(f"{r[1]} {r[2]}", None, label))
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    return _nonempty(out, path)


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (blank lines skipped), one clear error per bad line."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise UserError(f"{path} line {n} is not valid JSON ({err.msg}); fix the file") from None
                except (ValueError, RecursionError) as err:  # an integer of over 4,300 digits, deep nesting
                    why = "nested too deeply" if isinstance(err, RecursionError) else str(err).split(";")[0]
                    raise UserError(f"{path} line {n} cannot be read as JSON ({why}); fix the file") from None
                if not isinstance(obj, dict):
                    raise UserError(f"{path} line {n} is not a JSON object; expected one object per line")
                if "\\u" in line and _has_lone_surrogate(obj):
                    raise UserError(
                        f"{path} line {n} holds an unpaired surrogate escape (such as \\ud800): half of a "
                        "character, which no text can hold; fix the file (it was cut mid-character)"
                    )
                yield obj
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def _has_lone_surrogate(obj: Any) -> bool:
    """Whether a JSON value holds a string with an unpaired surrogate (JSON's `\\ud800` escapes):
    it reads into Python, and then fails when the text is encoded for the tokenizer."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _require_keys(rows: list[dict[str, Any]], path: Path, keys: list[str], hint: str) -> None:
    _nonempty(rows, path)
    for n, r in enumerate(rows, start=1):
        missing = [k for k in keys if k not in r]
        if missing:
            raise UserError(
                f"{path} line {n} lacks column(s) {', '.join(missing)}; found columns: {', '.join(r)}; {hint}"
            )


# ----------------------------------------------------------------------------- generic tables

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json")


@dataclass(frozen=True)
class Columns:
    """Which columns of a generic local table hold the text, the optional pair and the label."""

    text: str = "text"
    text_pair: str | None = None
    label: str = "label"


def read_table(path: Path, cols: Columns) -> list[tuple[str, str | None, str]]:
    """Read (text, text_pair, raw label) rows from a CSV/TSV (with header) or JSON-lines file.

    TSV follows GLUE's convention: no quoting, one row per line (a field may start with a double
    quote). CSV follows RFC 4180 quoting. A row with too many or too few fields, or an empty
    text or label, is an error naming its line: the rows read are the rows in the file.
    """
    if path.suffix in (".jsonl", ".json"):
        records = list(enumerate(iter_jsonl(path), start=1))
    else:
        records = _read_delimited(path)
    _nonempty(records, path)
    wanted = [c for c in (cols.text, cols.text_pair, cols.label) if c is not None]
    missing = [c for c in wanted if c not in records[0][1]]
    if missing:
        raise UserError(
            f"{path} lacks column(s) {', '.join(missing)}; found columns: {', '.join(records[0][1])}; "
            "set text_column / text_pair_column / label_column to the right names"
        )
    return [_table_row(r, cols, path, n) for n, r in records]


def _read_delimited(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) of a CSV or TSV with a header; a BOM before the header is dropped."""
    tsv = path.suffix == ".tsv"
    out: list[tuple[int, dict[str, Any]]] = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t" if tsv else ",", quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
        try:
            header = next(reader)
            line = reader.line_num + 1
            for row in reader:
                if row:  # a blank line is no row
                    if len(row) != len(header):
                        raise UserError(
                            f"{path} line {line} has {len(row)} field(s) but the header has {len(header)} "
                            f"({', '.join(header)}); fix the row"
                            + ("" if tsv else " (a stray double quote opens a quoted field in CSV)")
                        )
                    out.append((line, dict(zip(header, row))))
                line = reader.line_num + 1
        except StopIteration:
            return out
        except csv.Error as err:
            raise UserError(f"{path} line {reader.line_num}: {err}; fix the file") from None
        except UnicodeDecodeError:
            raise not_utf8(path) from None
    return out


# How pandas, R, spreadsheets and JSON write a missing value: never a class of its own.
# Words that may be real class names ("none", "other") are not in it.
MISSING_LABELS = frozenset({"nan", "-nan", "+nan", "na", "n/a", "#n/a", "<na>", "nat", "null", "inf", "-inf", "+inf"})


def _table_row(r: dict[str, Any], cols: Columns, path: Path, n: int) -> tuple[str, str | None, str]:
    empty = [c for c in (cols.text, cols.label) if r.get(c) is None or not str(r[c]).strip()]
    if empty:
        raise UserError(f"{path} line {n} has an empty or null {' and '.join(empty)} field; fix or drop the row")
    label = r[cols.label]
    if (isinstance(label, float) and not math.isfinite(label)) or str(label).strip().lower() in MISSING_LABELS:
        raise UserError(
            f"{path} line {n}: label {str(label).strip()!r} in column {cols.label!r} marks a missing value, not a "
            "class; fill in the label or drop the row"
        )
    pair = r.get(cols.text_pair) if cols.text_pair is not None else None
    if cols.text_pair is not None and pair is None:
        pair = ""  # a JSON null pair is an empty second text, never the text "None"
    return str(r[cols.text]), None if pair is None else str(pair), _label_text(r[cols.label])


def _label_text(value: Any) -> str:
    """A label as text; one integer in any spelling ("1", "1.0", 1.0) is one label, "1".

    Only text that is an integer (optionally with a zero fraction) is normalised: "01" stays apart
    from "1", and "1_0" or a 20-digit id is never read through a float.
    """
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    match = _INTEGER_LABEL.fullmatch(text)
    if match and not (len(match.group("digits")) > 1 and match.group("digits").startswith("0")):
        return str(int(match.group("sign") + match.group("digits")))
    return text


_INTEGER_LABEL = re.compile(r"(?P<sign>[+-]?)(?P<digits>\d+)(?:\.0+)?")


def label_vocabulary(raw_labels: Iterable[str]) -> tuple[list[str], dict[str, int]]:
    """Map raw label strings to ids: integer labels keep their value, other labels sorted order."""
    values = sorted(set(raw_labels))
    try:
        ints = sorted({int(v) for v in values})
    except ValueError:
        return values, {v: i for i, v in enumerate(values)}
    if len(ints) < len(values):  # "01" and "1" are two labels: keep them apart, as text
        return values, {v: i for i, v in enumerate(values)}
    if ints[0] < 0:
        raise UserError(
            f"integer labels must be >= 0 but {ints[0]} was found (-1 usually marks hidden test "
            "labels); drop those rows or use a labelled split"
        )
    names = [str(i) for i in range(ints[-1] + 1)]
    return names, {v: int(v) for v in values}


# ----------------------------------------------------------------------------- hub

# Column names of each hub dataset: (text, text_pair or None, label).
HUB_COLUMNS: dict[str, tuple[str, str | None, str]] = {
    "nyu-mll/glue/sst2": ("sentence", None, "label"),
    "nyu-mll/glue/mnli": ("premise", "hypothesis", "label"),
    "facebook/xnli/en": ("premise", "hypothesis", "label"),
    "stanfordnlp/imdb": ("text", None, "label"),
    "fancyzhx/ag_news": ("text", None, "label"),
}


def _hub_label(value: Any, where: Path, row: int) -> int:
    """A hub row's label id; None, NaN or a non-integer is refused naming the row."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise UserError(f"{where} row {row}: label {value!r} is not a class id (missing or not an integer)")
    return int(value)


def default_hub_loader(path: str, config: str | None) -> Any:
    """Call `datasets.load_dataset` (network or the local HF cache)."""
    import datasets  # heavy import, only when the hub is asked for

    return datasets.load_dataset(path, config)


def load_hub_splits(
    path: str,
    config: str | None,
    splits: Iterable[str],
    num_labels: int,
    loader: Callable[[str, str | None], Any] | None = None,
) -> Splits:
    """Load the named labelled splits of a hub dataset as Examples."""
    key = f"{path}/{config}" if config else path
    text_col, pair_col, label_col = HUB_COLUMNS[key]
    dsd = (loader or default_hub_loader)(path, config)
    out: Splits = {}
    for split in splits:
        ds = dsd[split]
        texts = ds[text_col]
        pairs = ds[pair_col] if pair_col else [None] * len(texts)
        where = Path(f"hub:{key}[{split}]")
        labels = [_hub_label(v, where, n) for n, v in enumerate(ds[label_col])]
        for n, lab in enumerate(labels):
            _check_label(lab, num_labels, where, n, [str(i) for i in range(num_labels)])
        out[split] = [Example(t, p, lab) for t, p, lab in zip(texts, pairs, labels, strict=True)]
    return out
