"""`oelm prepare lm`: text sources -> flat token memmaps (train/val/test.bin) + meta.json."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sysconfig
import time
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import numpy as np
from tqdm import tqdm

from oelm.data.cls_sources import iter_jsonl, not_utf8
from oelm.data.tales import tales
from oelm.data.tokenizers import EOT_TEXT, Tokenizer, load_tokenizer
from oelm.utils.errors import UserError
from oelm.utils.hub import require_hub
from oelm.utils.io import atomic_write_json, read_json, read_json_object
from oelm.utils.lock import LOCK_NAME, clear_stale_temps, dir_lock

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
BUILTIN_SOURCES = ("builtin:python-docs", "builtin:python-stdlib", "builtin:tales")
# builtin:tales: this many generated stories (about 3.4M characters), seed 0.
TALES = 5000
# The stdlib corpus: the first modules (by name) of the running Python's standard library, whole
# files up to this many characters, so it is the same on every machine with the same Python.
STDLIB_CHARS = 3_000_000
ACCEPTED_SOURCES = (
    "accepted sources: a text file (documents separated by '<|endoftext|>' lines, else by blank "
    "lines; WikiText raw files by ' = Title = ' headings); a folder of such files (files named "
    "train/valid/validation/test, wiki.train.raw, train_head.txt... are official splits, otherwise "
    "one document per file); a .jsonl file with a text field; a .csv / .tsv file with a header row "
    "(one document per row, its --text-field column); 'builtin:python-docs', "
    "'builtin:python-stdlib' (Python's own documentation or standard-library source) or "
    "'builtin:tales' (generated children's stories); a Hugging "
    "Face dataset 'owner/name' or 'owner/name:config' (e.g. Salesforce/wikitext:wikitext-103-raw-v1)"
)
_TEXT_SUFFIXES = {"", ".txt", ".raw", ".text", ".tokens", ".jsonl", ".csv", ".tsv"}
# `train.txt`, `valid_head.txt`, `wiki.test.raw`, `wiki.train.head.txt`, `validation.jsonl`...
# A split may come in numbered shards, read in name order: `train_00.txt`, `train-00001-of-00004.jsonl`.
_SPLIT_FILE = re.compile(
    r"^(?:wiki\.)?(train|valid|validation|val|dev|test)(?:[._-]head)?"
    r"(?:[._-](\d+)(?:-of-\d+)?)?(?:\.(?:txt|raw|text|tokens|jsonl))?$"
)
_SPLIT_ALIASES = {"train": "train", "valid": "val", "validation": "val", "val": "val", "dev": "val", "test": "test"}
# A WikiText level-1 heading line, ` = Title = ` (level 2 is ` = = Title = = `).
_WIKI_TITLE = re.compile(r"^ = [^=](?:.*[^=])? = $")
_OUTPUT_FILES = ("train.bin", "val.bin", "test.bin", "meta.json")
_DOC_BATCH = 512


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65535), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.uint32)


def read_meta(data_dir: str | os.PathLike) -> dict:
    """Read and check DIR/meta.json written by `oelm prepare lm` (a bad file is a UserError)."""

    path = Path(data_dir) / "meta.json"
    fix = f"re-run `oelm prepare lm SOURCE --tokenizer TOK --out {data_dir} --overwrite`"
    if not path.is_file():
        raise UserError(
            f"no LM data at {str(data_dir)!r} (meta.json missing); run "
            f"`oelm prepare lm SOURCE --tokenizer TOK --out {data_dir}` first"
        )
    meta = read_json_object(path, fix)
    ok = (
        isinstance(meta.get("splits"), dict)
        and all(isinstance(v, int) and v >= 0 for v in meta["splits"].values())
        and isinstance(meta.get("vocab_size"), int)
        and meta["vocab_size"] > 0
        and meta.get("dtype") in ("uint16", "uint32")
    )
    if not ok:
        raise UserError(f"{str(path)!r} is corrupt (needs splits, vocab_size, dtype uint16/uint32); {fix}")
    return meta


def load_lm_split(data_dir: str | os.PathLike, split: str) -> np.memmap:
    """Open one split of a prepared LM directory as a read-only token memmap (size checked)."""
    meta = read_meta(data_dir)
    if split not in meta["splits"]:
        raise UserError(f"{str(data_dir)!r} has no {split!r} split; it has {sorted(meta['splits'])}")
    path = Path(data_dir) / f"{split}.bin"
    fix = f"re-run `oelm prepare lm ... --out {data_dir} --overwrite`"
    if not path.is_file():
        raise UserError(f"{str(path)!r} is missing; {fix}")
    dtype = np.dtype(meta["dtype"])
    expected = meta["splits"][split] * dtype.itemsize
    if path.stat().st_size != expected or expected == 0:
        raise UserError(
            f"{str(path)!r} holds {path.stat().st_size} bytes but meta.json promises {expected} "
            f"(truncated, empty or from another preparation); {fix}"
        )
    return np.memmap(path, dtype=dtype, mode="r")


def prepare_lm(
    source: str | os.PathLike,
    tokenizer: str | Tokenizer,
    out_dir: str | os.PathLike,
    *,
    config: str | None = None,
    val_fraction: float = 0.05,
    test_fraction: float = 0.0,
    seed: int = 0,
    max_docs: int | None = None,
    workers: int | None = None,
    text_field: str = "text",
    overwrite: bool = False,
    verbose: bool = True,
) -> dict:
    """Tokenize SOURCE into OUT/{train,val[,test]}.bin (EOT after every document) + meta.json.

    A local source without an official test split gets a seeded test hold-out when
    test_fraction > 0, so a run can select on validation and report on unseen text.
    """
    _check_options(val_fraction, max_docs, workers, test_fraction, seed)
    workers = workers or os.cpu_count() or 1
    source = str(source)
    out = Path(out_dir)
    kind, name, config = _resolve_source(source, config)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file; give a folder path")
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
    # One preparation per folder at a time; a killed one leaves only what the next one clears.
    with dir_lock(out, "data preparation", keep_file=False):
        _check_out_dir(out, overwrite, verbose)
        files = None
        if kind == "hub":
            splits, origin, holdout = _hub_splits(name, config, text_field, max_docs, val_fraction, seed)
            source = f"{name}:{config}" if config else name
        else:
            docs = _local_docs(kind, Path(name), text_field, max_docs)
            splits, origin, holdout = _holdout_local(docs, val_fraction, seed)
            files = source_files(kind, Path(name))
        test_info = None
        if test_fraction > 0 and "test" not in splits:  # e.g. TinyStories (train + validation only)
            splits, test_info = _holdout_test(splits, test_fraction, seed)
            origin["test"] = "holdout"
        return _write_all(out, splits, tok, source, origin, holdout, workers, verbose, text_field, test_info, files)


# ---------------------------------------------------------------------------- checks


def _check_options(val_fraction: Any, max_docs: Any, workers: Any, test_fraction: Any = 0.0, seed: Any = 0) -> None:
    """Reject impossible numeric options before any work: from the command line (argparse gives
    numbers, NaN and inf among them) or a study's `prepare` recipe (YAML gives any value)."""

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def count(value: Any) -> bool:
        return value is None or (number(value) and isinstance(value, int) and value >= 1)

    if not number(val_fraction) or not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val-fraction must be between 0 and 1 (exclusive), got {val_fraction!r}")
    if not number(test_fraction) or not 0.0 <= test_fraction < 1.0 or val_fraction + test_fraction >= 1.0:
        raise UserError(f"--test-fraction must be in [0, 1) with val + test < 1, got {test_fraction!r}")
    if not count(max_docs):
        raise UserError(f"--max-docs must be a positive number of documents, got {max_docs!r}")
    if not count(workers):
        raise UserError(f"--workers must be a whole number >= 1, got {workers!r}")
    if not number(seed) or not isinstance(seed, int) or seed < 0:  # numpy refuses it only once documents are read
        raise UserError(f"--seed must be a whole number >= 0 (it seeds the hold-out), got {seed!r}")


def _check_out_dir(out: Path, overwrite: bool, verbose: bool = False) -> None:
    """Refuse to mix new data into an existing, non-empty output folder unless asked to.

    Called with the folder's lock held, so temp files found here are a killed preparation's
    debris (removed), and split files without meta.json are a preparation killed while
    publishing (redone without --overwrite).
    """
    if not out.is_dir():
        return
    for debris in out.glob(".*.tmp*"):
        debris.unlink(missing_ok=True)
    entries = [p.name for p in out.iterdir() if p.name != LOCK_NAME]
    if overwrite or not entries:
        return
    if "meta.json" not in entries and set(entries) <= set(_OUTPUT_FILES):
        if verbose:
            log.info(f"{str(out)!r} holds an unfinished preparation (no meta.json); preparing it again")
        return
    what = ""
    if (out / "meta.json").is_file():
        meta = read_json(out / "meta.json") or {}
        meta = meta if isinstance(meta, dict) else {}
        what = f" (LM data from {meta.get('source')!r} with tokenizer {meta.get('tokenizer')!r})"
    raise UserError(
        f"--out {str(out)!r} already exists and is not empty{what}; pass --overwrite or pick another folder"
    )


def _resolve_source(source: str, config: str | None) -> tuple[str, str, str | None]:
    """Classify SOURCE as ('builtin'|'file'|'dir'|'hub', name, config) or fail clearly."""
    if source.startswith("builtin:"):
        if source not in BUILTIN_SOURCES:
            raise UserError(f"unknown built-in corpus {source!r}; built-ins: {', '.join(BUILTIN_SOURCES)}")
        return "builtin", source, None
    path = Path(source).expanduser()
    if path.is_dir():
        return "dir", str(path), None
    if path.is_file():
        if path.stat().st_size == 0:
            raise UserError(f"source file {source!r} is empty")
        return "file", str(path), None
    name, _, inline_config = source.partition(":")
    if _looks_like_hub_name(name):
        if inline_config and config and inline_config != config:
            raise UserError(f"two dataset configs given: {inline_config!r} in SOURCE and --config {config!r}")
        return "hub", name, config or inline_config or None
    raise UserError(f"source {source!r} not found: no such file or folder; {ACCEPTED_SOURCES}")


def _looks_like_hub_name(name: str) -> bool:
    """`owner/name` with no path-like prefix and no text-file extension."""
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        return False
    return re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None and Path(name).suffix not in _TEXT_SUFFIXES - {""}


# ---------------------------------------------------------------------------- local sources


def _local_docs(kind: str, path: Path, text_field: str, max_docs: int | None) -> dict[str, list[str]]:
    """Documents per official split ('train' only when the source has no splits)."""
    if kind == "builtin":
        docs = {"train": _builtin_docs(str(path))}
    elif kind == "file":
        docs = {"train": _file_docs(path, text_field, whole_if_plain=False)}
    else:
        docs = _folder_docs(path, text_field)
    if max_docs is not None:
        docs = {split: d[:max_docs] for split, d in docs.items()}
    for split, d in docs.items():
        if not d:
            raise UserError(f"source {str(path)!r} has no documents in its {split!r} split (empty?)")
    return docs


def _builtin_docs(name: str) -> list[str]:
    """Documents of a corpus that ships with Python itself or with oelm (offline everywhere)."""
    if name.endswith("tales"):
        return tales(TALES, seed=0)
    if name.endswith("python-stdlib"):
        docs, total = [], 0
        for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
            text = path.read_text(encoding="utf-8-sig", errors="replace").strip()
            if total + len(text) > STDLIB_CHARS:
                break
            if text:
                docs.append(text)
                total += len(text)
        return list(dict.fromkeys(docs))

    # Some topics share one text: drop exact repeats so no document sits in two splits.
    texts = (topics[k].strip() for k in sorted(topics))
    return list(dict.fromkeys(t for t in texts if t))


def split_files(folder: Path, note: bool = True) -> dict[str, list[Path]]:
    """The files of each official split of a folder, shards in name order; {} when it has none.

    A split is one file (`train.txt`) or numbered shards (`train_00.txt`, `train_01.txt`, ...),
    never both, and a folder with split files must have a train split.
    """
    files = sorted(
        p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in _TEXT_SUFFIXES
    )
    if not files:
        raise UserError(f"folder {str(folder)!r} holds no text files (.txt, .raw, .jsonl, ...)")
    whole: dict[str, Path] = {}
    shards: dict[str, list[Path]] = {}
    for p in files:
        match = _SPLIT_FILE.match(p.name.lower())
        if not match:
            continue
        split = _SPLIT_ALIASES[match.group(1)]
        if match.group(2) is None:
            if split in whole:
                raise UserError(
                    f"folder {str(folder)!r} has two {split!r} files: {whole[split].name}, {p.name}; "
                    "keep one, or number them as shards (train_00.txt, train_01.txt, ...)"
                )
            whole[split] = p
        else:
            shards.setdefault(split, []).append(p)
    for split in whole.keys() & shards.keys():
        raise UserError(
            f"folder {str(folder)!r} has both a whole {split!r} file ({whole[split].name}) and shards "
            f"({', '.join(p.name for p in shards[split])}); move one of them out"
        )
    shards = {split: _checked_shards(folder, split, paths) for split, paths in shards.items()}
    by_split = {**{s: [p] for s, p in whole.items()}, **shards}
    if not by_split:
        return {}
    chosen = {p for ps in by_split.values() for p in ps}
    ignored = [p.name for p in files if p not in chosen]
    if ignored and note:
        log.info(f"note: {folder} has official split files; ignoring {', '.join(ignored)}")
    if "train" not in by_split:
        raise UserError(f"folder {str(folder)!r} has split files {sorted(by_split)} but no train file")
    _refuse_copies(folder, sorted(chosen))
    return {s: by_split[s] for s in SPLITS if s in by_split}


def _refuse_copies(folder: Path, paths: list[Path]) -> None:
    """Two split files (or shards) with the same bytes: a test split that is a copy of the
    validation split, or a shard copied under the next number, would pass for held-out text or
    for more data. Only files of equal size are hashed."""
    by_size: dict[int, list[Path]] = {}
    for p in paths:
        by_size.setdefault(p.stat().st_size, []).append(p)
    for same_size in (ps for ps in by_size.values() if len(ps) > 1):
        seen: dict[str, Path] = {}
        for p in same_size:
            with p.open("rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            if digest in seen:
                raise UserError(
                    f"folder {str(folder)!r}: {p.name} is a byte-for-byte copy of {seen[digest].name}; a held-out "
                    "split copied from another, or a shard counted twice, is no new text: restore the right file"
                )
            seen[digest] = p


# A held-out document this long that also appears, verbatim, in the train split is leaked text, not
# a shared heading ("CHAPTER I.", "THE END"): its share of the held-out split is checked.
LEAK_MIN_CHARS = 200


def _check_held_out_leaks(folder: Path, docs: dict[str, list[str]]) -> None:
    """Refuse a held-out split (val or test) whose text is mostly verbatim in the train split, or in
    the other held-out split; note a smaller share (at least 1%). Shares count characters of
    documents of at least LEAK_MIN_CHARS."""
    # each document of each split hashed once: (its length, its digest, or None when too short to count)
    hashed = {
        split: [
            (len(d), hashlib.blake2b(d.encode(), digest_size=16).digest() if len(d) >= LEAK_MIN_CHARS else None)
            for d in docs.get(split, ())
        ]
        for split in ("train", "val", "test")
    }
    seen = {split: {h for _, h in hashed[split] if h is not None} for split in ("train", "val")}
    for split, others in (("val", ("train",)), ("test", ("train", "val"))):
        total = sum(n for n, _ in hashed[split])
        for other in others:
            if not total or not seen[other]:
                continue
            shared = sum(n for n, h in hashed[split] if h is not None and h in seen[other])
            if shared >= total / 2:
                raise UserError(
                    f"folder {str(folder)!r}: {100 * shared / total:.0f}% of the {split!r} split's text is verbatim in the "
                    f"{other!r} split: it would not be held out; give held-out files that share no document with {other}"
                )
            if shared >= total / 100:
                log.warning(
                    f"warning: {folder}: {100 * shared / total:.1f}% of the {split!r} split's text is verbatim in the "
                    f"{other!r} split (documents of {LEAK_MIN_CHARS}+ characters); held-out numbers read it as unseen"
                )


def _checked_shards(folder: Path, split: str, paths: list[Path]) -> list[Path]:
    """A split's shards in number order (train_2 before train_10), refused when one is missing (a
    gap in the numbers, or fewer than a `-of-N` name says) or empty: a download that did not finish
    would otherwise be prepared, silently, as a smaller corpus."""
    numbered = sorted((int(_SPLIT_FILE.match(p.name.lower()).group(2)), p) for p in paths)
    numbers = [n for n, _ in numbered]
    where = f"folder {str(folder)!r}, split {split!r}"
    if len(set(numbers)) != len(numbers):
        raise UserError(f"{where}: two shards share a number ({', '.join(p.name for p in paths)}); keep one of each")
    missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
    totals = {int(m.group(1)) for p in paths if (m := re.search(r"-of-(\d+)", p.name.lower()))}
    if len(totals) == 1 and (total := totals.pop()) > len(numbers):
        missing = missing or [f"{total - len(numbers)} of {total}"]
    if missing:
        raise UserError(
            f"{where}: shard(s) {', '.join(map(str, missing))} missing (have {', '.join(p.name for _, p in numbered)}); "
            "a corpus with a shard missing would be prepared short: restore it, or renumber the shards"
        )
    empty = [p.name for _, p in numbered if p.stat().st_size == 0]
    if empty:
        raise UserError(f"{where}: shard {empty[0]} is empty (a download that did not finish?); restore or remove it")
    return [p for _, p in numbered]


def _folder_docs(folder: Path, text_field: str) -> dict[str, list[str]]:
    """Official split files (shards concatenated) if the folder has them, else every text file as train."""
    by_split = split_files(folder)
    if not by_split:
        files = sorted(
            p
            for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in _TEXT_SUFFIXES
        )
        return {"train": [d for p in files for d in _file_docs(p, text_field, whole_if_plain=True)]}
    docs = {
        split: [d for p in paths for d in _file_docs(p, text_field, whole_if_plain=False)]
        for split, paths in by_split.items()
    }
    _check_held_out_leaks(folder, docs)
    return docs


def source_files(kind: str, path: Path) -> dict[str, list[dict]] | None:
    """Which local files each split was read from, with their sizes in bytes (for meta.json)."""
    if kind == "file":
        return {"train": [{"file": path.name, "bytes": path.stat().st_size}]}
    if kind != "dir":
        return None
    by_split = split_files(path, note=False)
    if not by_split:
        return None  # every file of the folder is a train document, holds-outs drawn from them
    return {s: [{"file": p.name, "bytes": p.stat().st_size} for p in ps] for s, ps in by_split.items()}


def _file_docs(path: Path, text_field: str, whole_if_plain: bool) -> list[str]:
    """Documents of one file: JSON lines, or text split by EOT markers / WikiText titles / blank lines."""
    if path.suffix.lower() == ".jsonl":
        return _jsonl_docs(path, text_field)
    if path.suffix.lower() in (".csv", ".tsv"):
        return _table_docs(path, text_field)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM is no text (it would change the first document)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    return split_documents(text, whole_if_plain=whole_if_plain)


def split_documents(text: str, whole_if_plain: bool = False) -> list[str]:
    """Split raw text into documents: EOT markers, else WikiText titles, else blank lines."""
    if EOT_TEXT in text:
        pieces = text.split(EOT_TEXT)
    elif _is_wikitext(text):
        return _wikitext_articles(text)
    elif whole_if_plain:
        pieces = [text]
    else:
        pieces = re.split(r"\n[ \t]*\n", text)
    return [p.strip() for p in pieces if p.strip()]


def _is_wikitext(text: str) -> bool:
    """True when the first non-blank line is a WikiText level-1 title."""
    for line in islice(text[:20_000].split("\n"), 50):  # only the head matters
        if line.strip():
            return _WIKI_TITLE.match(line) is not None
    return False


def _wikitext_articles(text: str) -> list[str]:
    """One document per ` = Title = ` article, keeping WikiText's own spacing."""
    articles: list[list[str]] = []
    for line in text.split("\n"):
        if _WIKI_TITLE.match(line) or not articles:
            articles.append([])
        articles[-1].append(line)
    docs = []
    for lines in articles:
        # Blank lines at the ends are separators, not content; the leading space of a title is kept.
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if lines:
            docs.append("\n".join(lines))
    return docs


def _jsonl_docs(path: Path, text_field: str) -> list[str]:
    """The text field of every JSON line."""

    docs = []
    for n, record in enumerate(iter_jsonl(path), start=1):
        if text_field not in record:
            raise UserError(
                f"{str(path)!r} record {n} has no {text_field!r} field (has {sorted(record)}); pass --text-field"
            )
        value = record[text_field]
        if not isinstance(value, str):
            raise UserError(
                f"{str(path)!r} record {n}: its {text_field!r} field is a {type(value).__name__}, not text; "
                "pass --text-field naming a field that holds a string (or flatten the file first)"
            )
        if value.strip():
            docs.append(value)
    return docs


def _table_docs(path: Path, text_field: str) -> list[str]:
    """One document per row of a CSV / TSV file with a header row: its `text_field` column."""
    import csv

    # A whole book in a cell is a document too: the module's 128 KiB cap would refuse it.
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
            columns = reader.fieldnames or []
            if text_field not in columns:
                raise UserError(
                    f"{str(path)!r} has no {text_field!r} column (its header: {columns}); pass --text-field COLUMN"
                )
            return [row[text_field] for row in reader if (row.get(text_field) or "").strip()]
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except csv.Error as e:
        raise UserError(
            f"{str(path)!r} is not a readable {path.suffix[1:].upper()} file ({e}); fix or convert it"
        ) from None


def holdout_indices(n_docs: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded document-level split: (train indices, val indices), each in document order."""
    n_val = max(1, round(n_docs * fraction))
    if n_docs - n_val < 1:
        raise UserError(f"only {n_docs} document(s): too few to hold out a validation split; add documents")
    perm = np.random.default_rng(seed).permutation(n_docs)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def _holdout_local(docs: dict[str, list[str]], fraction: float, seed: int) -> tuple[dict, dict, dict | None]:
    """Add a held-out val split when the source has no official one."""
    origin = {split: "official" for split in SPLITS[1:] if split in docs}
    if "val" in docs:
        return docs, origin, None
    train_idx, val_idx = holdout_indices(len(docs["train"]), fraction, seed)
    train = docs["train"]
    out = dict(docs, train=[train[i] for i in train_idx], val=[train[i] for i in val_idx])
    origin["val"] = "holdout"
    return out, origin, _holdout_info(fraction, seed, len(val_idx), len(train))


def _holdout_test(splits: dict, fraction: float, seed: int) -> tuple[dict, dict]:
    """Carve a seeded test split from train (a different seed stream than the val hold-out)."""
    train = splits["train"]
    # The fraction is of the documents train had before any hold-out, as for val.
    n_before = len(train) + (len(splits["val"]) if "val" in splits else 0)
    rest_idx, test_idx = holdout_indices(len(train), fraction * n_before / len(train), seed + 1)
    if isinstance(train, list):
        out = dict(splits, train=[train[i] for i in rest_idx], test=[train[i] for i in test_idx])
    else:  # a Hugging Face Dataset
        out = dict(splits, train=train.select(rest_idx), test=train.select(test_idx))
    return out, _holdout_info(fraction, seed + 1, len(test_idx), len(train))


def _holdout_info(fraction: float, seed: int, n_val: int, n_total: int) -> dict:
    """What meta.json records about a hold-out split."""
    return {"fraction": fraction, "seed": seed, "n_docs": int(n_val), "from_docs": int(n_total), "from_split": "train"}


# ---------------------------------------------------------------------------- hub sources


def _hub_splits(
    name: str, config: str | None, text_field: str, max_docs: int | None, fraction: float, seed: int
) -> tuple[dict, dict, dict | None]:
    """Load a Hugging Face dataset; map its splits to train/val/test; hold out val if needed."""

    require_hub(name, "dataset", "use a local text file, folder or .jsonl instead (oelm prepare lm PATH ...)")
    import datasets  # heavy optional dependency: imported on use

    try:
        dsd = datasets.load_dataset(name, config) if config else datasets.load_dataset(name)
    except Exception as err:  # offline, unknown name, missing config: many error types
        first = str(err).splitlines()[0] if str(err) else ""
        raise UserError(
            f"could not load Hugging Face dataset {name!r}{f' (config {config!r})' if config else ''}: "
            f"{type(err).__name__}: {first}. Offline? Use a local file or folder instead; {ACCEPTED_SOURCES}"
        ) from None
    splits = _map_hub_splits(dsd, name, text_field)
    if max_docs is not None:
        splits = {s: ds.select(range(min(max_docs, len(ds)))) for s, ds in splits.items()}
    if "wikitext" in name.lower():
        # WikiText rows are lines; regroup them into articles like the raw files.
        return _holdout_local(
            {s: _wikitext_articles("".join(ds[text_field])) for s, ds in splits.items()}, fraction, seed
        )
    origin = {split: "official" for split in SPLITS[1:] if split in splits}
    if "val" in splits:
        return splits, origin, None
    train_idx, val_idx = holdout_indices(len(splits["train"]), fraction, seed)
    full = splits["train"]
    splits.update(train=full.select(train_idx), val=full.select(val_idx))
    origin["val"] = "holdout"
    return splits, origin, _holdout_info(fraction, seed, len(val_idx), len(full))


def _map_hub_splits(dsd: Any, name: str, text_field: str) -> dict:
    """train / validation|valid|val|dev / test -> train / val / test, checking the text column."""
    splits = {}
    for hub_split in dsd:
        split = _SPLIT_ALIASES.get(str(hub_split).lower())
        if split and split not in splits:
            splits[split] = dsd[hub_split]
    if "train" not in splits:
        raise UserError(f"dataset {name!r} has no train split (splits: {list(dsd)})")
    for ds in splits.values():
        if text_field not in ds.column_names:
            raise UserError(
                f"dataset {name!r} has no {text_field!r} column (columns: {ds.column_names}); pass --text-field"
            )
    return splits


def _hub_batches(ds: Any, tok: Tokenizer, text_field: str, workers: int) -> Iterator[list[list[int]]]:
    """Tokenize with datasets.map over worker processes, then stream the ids in batches."""
    num_proc = workers if workers > 1 and len(ds) >= 10_000 else None
    mapped = ds.map(
        _encode_rows,
        batched=True,
        batch_size=1000,
        num_proc=num_proc,
        remove_columns=ds.column_names,
        fn_kwargs={"tok": tok, "field": text_field},
        desc="tokenizing",
    )
    for batch in mapped.iter(batch_size=10_000):
        yield batch["ids"]


def _encode_rows(batch: dict, tok: Tokenizer, field: str) -> dict:
    """datasets.map function: one list of ids per row."""
    return {"ids": tok.encode_batch(batch[field], num_threads=1)}


# ---------------------------------------------------------------------------- writing


def _local_batches(docs: Sequence[str], tok: Tokenizer, workers: int, desc: str) -> Iterator[list[list[int]]]:
    """Tokenize documents in batches; the backends parallelise each batch over the cores."""
    with tqdm(total=len(docs), desc=desc, unit="doc", disable=None, leave=False) as bar:
        for start in range(0, len(docs), _DOC_BATCH):
            chunk = docs[start : start + _DOC_BATCH]
            yield tok.encode_batch(chunk, num_threads=workers)
            bar.update(len(chunk))


def _write_split(path: Path, batches: Iterable[list[list[int]]], eot_id: int, dtype: np.dtype) -> tuple[int, str]:
    """Append every document's ids and an EOT to `path`; return the token count and their sha256."""
    n_tokens = 0
    digest = hashlib.sha256()
    with path.open("wb") as f:
        for batch in batches:
            flat: list[int] = []
            for ids in batch:
                flat.extend(ids)
                flat.append(eot_id)
            # np.array raises OverflowError if an id does not fit the dtype, so nothing wraps silently.
            arr = np.array(flat, dtype=dtype)
            digest.update(arr.tobytes())
            arr.tofile(f)
            n_tokens += arr.size
    return n_tokens, digest.hexdigest()


def data_fingerprint(meta: dict) -> str | None:
    """One short digest of a prepared folder: every split's tokens, the tokenizer and the hold-outs.

    Written into meta.json at preparation (hashing while writing costs nothing extra); a folder
    prepared before fingerprints existed gives None.
    """
    digests = meta.get("split_sha256")
    if not isinstance(digests, dict):
        return None
    keys = ("tokenizer", "vocab_size", "eot_id", "dtype", "splits", "split_origin", "holdout", "test_holdout")
    payload = {"split_sha256": digests, **{k: meta.get(k) for k in keys}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _write_all(
    out: Path,
    splits: dict,
    tok: Tokenizer,
    source: str,
    origin: dict,
    holdout: dict | None,
    workers: int,
    verbose: bool,
    text_field: str,
    test_holdout: dict | None = None,
    files: dict[str, list[dict]] | None = None,
) -> dict:
    """Write every split and meta.json into a temp folder beside OUT, then swap it in whole: a
    failure (a full disk, Ctrl-C) before the swap leaves OUT as it was and no temp folder."""
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tok.vocab_size)
    real = out.resolve()  # a link to a folder keeps pointing at the new data
    stage = real.parent / f".{real.name}.tmp-{os.getpid()}"
    clear_stale_temps(real)
    temps = {s: stage / f"{s}.bin" for s in SPLITS if s in splits}
    counts: dict[str, int] = {}
    digests: dict[str, str] = {}
    text_bytes: dict[str, int] = {}
    start = time.perf_counter()
    try:
        stage.mkdir()
        for split, tmp in temps.items():
            data = splits[split]
            batches = (
                _local_batches(data, tok, workers, f"tokenizing {split}")
                if isinstance(data, list)
                else _hub_batches(data, tok, text_field, workers)
            )
            counts[split], digests[split] = _write_split(tmp, batches, tok.eot_id, dtype)
            if isinstance(data, list):  # UTF-8 bytes of the split's text: bits per byte compare tokenizers
                text_bytes[split] = sum(len(doc.encode("utf-8")) for doc in data)
        elapsed = time.perf_counter() - start
        meta = {
            "source": source,
            "tokenizer": tok.spec,
            "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id,
            "dtype": dtype.name,
            "splits": counts,
            "split_origin": origin,
            "holdout": holdout,
        }
        if test_holdout is not None:
            meta["test_holdout"] = test_holdout
        meta["split_sha256"] = digests
        if text_bytes:
            meta["split_bytes"] = text_bytes
        if files:  # the local files each split was read from (a sharded split lists every shard)
            meta["source_files"] = files
        meta["fingerprint"] = data_fingerprint(meta)
        atomic_write_json(stage / "meta.json", meta)
        _swap_in(stage, real)
    except OSError as err:  # a full disk or a file-size limit: one line, the previous data untouched
        shutil.rmtree(stage, ignore_errors=True)  # first, so the free space it reports is what is free
        raise _write_failed(out, real.parent, err) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if verbose:
        total = sum(counts.values())
        sizes = ", ".join(f"{s} {n:,}" for s, n in counts.items())
        log.info(
            f"prepared {total:,} tokens ({sizes}) in {elapsed:.1f}s, {total / max(elapsed, 1e-9):,.0f} tokens/s -> {out}"
        )
    return meta


def _swap_in(stage: Path, real: Path) -> None:
    """Put the complete `stage` folder at `real` by renames only (no space needed): entries of
    `real` that preparation did not write (kept under --overwrite) move along, the old folder goes."""
    ours = {*_OUTPUT_FILES, LOCK_NAME}
    for entry in real.iterdir():
        if entry.name not in ours and not (entry.name.startswith(".") and ".tmp" in entry.name):
            os.replace(entry, stage / entry.name)
    old = real.parent / f".{real.name}.old-{os.getpid()}"
    os.replace(real, old)
    try:
        os.replace(stage, real)
    except OSError:
        os.replace(old, real)  # the previous data stays where it was
        raise
    shutil.rmtree(old, ignore_errors=True)  # with it the lock file this process still holds


def _write_failed(out: Path, folder: Path, err: OSError) -> UserError:
    """One line for a failed write of prepared data: why, the free space, and that nothing changed."""
    short = err.errno is None and "requested and" in str(err)  # numpy's tofile on a full disk
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or short:
        try:
            free = f"{shutil.disk_usage(folder).free:,} bytes free there"
        except OSError:
            free = "free space unknown"
        reason = f"no space left on the disk, or a file-size limit reached; {free}"
    else:
        reason = err.strerror or str(err)
    return UserError(
        f"could not write the prepared data for {str(out)!r} ({reason}); the previous contents of "
        f"{str(out)!r} are untouched and no temp files are left: free space or choose another --out"
    )
