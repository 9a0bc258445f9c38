"""`oelm prepare lm`: sources -> token memmaps + meta.json, splits, hold-out, errors, CLI."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import numpy as np
import pytest

from oelm.cli import main
from oelm.data.lm import holdout_indices, load_lm_split, prepare_lm, read_meta, split_files, token_dtype
from oelm.data.tokenizers import Tokenizer, load_tokenizer
from oelm.utils.errors import UserError

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
GPT2_SPEC = f"gpt2:{DATA / 'tokenizers' / 'gpt2'}"


def need(path: Path) -> Path:
    """Skip the test when a shared data file is absent."""
    if not path.exists():
        pytest.skip(f"shared data not found: {path} (the shared/data folder sits beside the repo)")
    return path


def docs_of(tokens: np.ndarray, eot_id: int) -> list[np.ndarray]:
    """Split a flat token array at EOT ids (which must end it)."""
    assert tokens.size and tokens[-1] == eot_id
    cuts = np.flatnonzero(tokens == eot_id)
    return [piece[:-1] for piece in np.split(tokens, cuts[:-1] + 1)]


def test_text_file_documents_are_eot_separated(tmp_path: Path) -> None:
    docs = [f"story {i}: ünïcode {'x' * i}\nsecond line" for i in range(40)]
    src = tmp_path / "stories.txt"
    src.write_text("".join(f"{d}\n<|endoftext|>\n" for d in docs), encoding="utf-8")
    meta = prepare_lm(src, "byte", tmp_path / "out", val_fraction=0.1, seed=3, verbose=False)
    assert meta["dtype"] == "uint16" and meta["eot_id"] == 256 and meta["vocab_size"] == 257
    assert meta["split_origin"] == {"val": "holdout"}
    assert meta["holdout"]["n_docs"] == 4 and meta["holdout"]["seed"] == 3
    tok = load_tokenizer(meta["tokenizer"])
    split_docs = {
        s: [tok.decode(d.tolist()) for d in docs_of(load_lm_split(tmp_path / "out", s), 256)] for s in ("train", "val")
    }
    _, val_idx = holdout_indices(40, 0.1, 3)
    assert split_docs["val"] == [docs[i] for i in val_idx]
    assert sorted(split_docs["train"] + split_docs["val"]) == sorted(docs)
    for split, n in meta["splits"].items():
        assert (tmp_path / "out" / f"{split}.bin").stat().st_size == 2 * n
    assert not list((tmp_path / "out").glob(".*tmp*"))  # no temp files left behind


def test_dtype_choice() -> None:
    assert token_dtype(257) == np.uint16 and token_dtype(50257) == np.uint16
    assert token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32 and token_dtype(128256) == np.uint32


class _WideTokenizer(Tokenizer):
    """A stand-in with a vocabulary too large for uint16."""

    def __init__(self) -> None:
        super().__init__("wide", "wide", base_vocab_size=70_000, eot_id=69_999)

    def _encode_batch(self, texts: list[str], num_threads: int) -> list[list[int]]:
        return [[66_000 + len(w) for w in t.split()] for t in texts]


def test_large_vocab_writes_uint32(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("one two\n\nthree four five\n\nsix")
    meta = prepare_lm(src, _WideTokenizer(), tmp_path / "out", val_fraction=0.3, verbose=False)
    tokens = np.concatenate([load_lm_split(tmp_path / "out", s) for s in ("train", "val")])
    assert meta["dtype"] == "uint32" and tokens.dtype == np.uint32 and tokens.max() == 69_999


def test_builtin_python_docs_offline(tmp_path: Path) -> None:
    meta = prepare_lm("builtin:python-docs", "byte", tmp_path / "py", max_docs=30, verbose=False)
    assert meta["source"] == "builtin:python-docs" and meta["holdout"]["from_docs"] == 30
    train = load_lm_split(tmp_path / "py", "train")
    assert int((train == 256).sum()) == 30 - meta["holdout"]["n_docs"] and train.size == meta["splits"]["train"]


def test_builtin_tales_are_deterministic_distinct_and_refer_back_to_their_entities(tmp_path: Path) -> None:
    from oelm.data.tales import tales

    first = tales(50, seed=0)
    assert first == tales(50, seed=0) and first != tales(50, seed=1) and len(set(first)) == 50
    for story in first:  # the first child's name opens the story and comes back later
        name = story.split(". ")[1].split()[0]  # "<name> had a <colour> <object>."
        assert story.count(name) >= 4, story
    meta = prepare_lm("builtin:tales", "byte", tmp_path / "t", max_docs=40, test_fraction=0.1, verbose=False)
    assert meta["source"] == "builtin:tales" and meta["holdout"]["from_docs"] == 40


def test_test_fraction_holds_out_disjoint_test_documents(tmp_path: Path) -> None:
    meta = prepare_lm("builtin:python-docs", "byte", tmp_path / "py", max_docs=100, test_fraction=0.1, verbose=False)
    assert meta["split_origin"] == {"val": "holdout", "test": "holdout"}
    n = meta["holdout"]["from_docs"]  # every document of the source (79 topics)
    n_val, n_test = meta["holdout"]["n_docs"], meta["test_holdout"]["n_docs"]
    assert (n_val, n_test) == (round(0.05 * n), round(0.1 * n))  # fractions of the whole source
    splits = {s: docs_of(np.asarray(load_lm_split(tmp_path / "py", s)), 256) for s in ("train", "val", "test")}
    assert [len(d) for d in splits.values()] == [n - n_val - n_test, n_val, n_test]
    texts = {s: {tuple(d) for d in docs} for s, docs in splits.items()}
    assert not (texts["test"] & texts["train"]) and not (texts["test"] & texts["val"])
    with pytest.raises(UserError, match="test-fraction"):
        prepare_lm("builtin:python-docs", "byte", tmp_path / "bad", val_fraction=0.5, test_fraction=0.5)


def test_tinystories_head_with_gpt2(tmp_path: Path) -> None:
    src = need(DATA / "lm" / "tinystories" / "train_head.txt")
    need(DATA / "tokenizers" / "gpt2" / "vocab.json")
    meta = prepare_lm(src, GPT2_SPEC, tmp_path / "ts", max_docs=100, seed=1, verbose=False)
    assert meta["tokenizer"] == GPT2_SPEC and meta["eot_id"] == 50256 and meta["dtype"] == "uint16"
    assert meta["holdout"] == {"fraction": 0.05, "seed": 1, "n_docs": 5, "from_docs": 100, "from_split": "train"}
    val = load_lm_split(tmp_path / "ts", "val")
    assert len(docs_of(np.asarray(val), 50256)) == 5
    first = load_tokenizer(GPT2_SPEC).decode(docs_of(np.asarray(load_lm_split(tmp_path / "ts", "train")), 50256)[0])
    assert first.startswith("One day, a little girl named Lily found a needle in her room.")


def test_wikitext_folder_official_splits(tmp_path: Path) -> None:
    folder = need(DATA / "lm" / "wikitext-2-raw")
    meta = prepare_lm(folder, "byte", tmp_path / "wt", max_docs=3, verbose=False)
    assert meta["split_origin"] == {"val": "official", "test": "official"} and meta["holdout"] is None
    assert set(meta["splits"]) == {"train", "val", "test"}
    tok = load_tokenizer("byte")
    firsts = {
        s: tok.decode(docs_of(np.asarray(load_lm_split(tmp_path / "wt", s)), 256)[0].tolist())
        for s in ("train", "val", "test")
    }
    assert firsts["train"].startswith(" = Valkyria Chronicles III = \n")
    assert firsts["val"].startswith(" = Homarus gammarus = \n")
    assert firsts["test"].startswith(" = Robert Boulter = \n") and "\n = Robert Boulter" not in firsts["test"][1:]


def test_tinystories_folder_recognises_head_files(tmp_path: Path) -> None:
    folder = need(DATA / "lm" / "tinystories")
    meta = prepare_lm(folder, "byte", tmp_path / "ts", max_docs=20, verbose=False)
    assert meta["split_origin"] == {"val": "official"} and meta["holdout"] is None


def test_jsonl_source_and_text_field(tmp_path: Path) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text(
        "\n".join(json.dumps({"id": i, "body": f"document {i} <|endoftext|> stays text"}) for i in range(20)) + "\n"
    )
    with pytest.raises(UserError, match="no 'text' field.*--text-field"):
        prepare_lm(src, "byte", tmp_path / "bad", verbose=False)
    meta = prepare_lm(src, "byte", tmp_path / "out", text_field="body", verbose=False)
    tokens = np.concatenate([load_lm_split(tmp_path / "out", s) for s in ("train", "val")])
    assert int((tokens == 256).sum()) == 20 and meta["holdout"]["n_docs"] == 1


def test_hub_source_through_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    dsd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": [f"train doc {i}" for i in range(50)]}),
            "validation": datasets.Dataset.from_dict({"text": ["val doc"]}),
        }
    )
    calls = []
    monkeypatch.setattr("oelm.data.lm.require_hub", lambda *a, **k: None)  # a fake hub, reachable
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a) or dsd)
    meta = prepare_lm("someone/corpus:cfg", "byte", tmp_path / "hub", workers=1, verbose=False)
    assert calls == [("someone/corpus", "cfg")] and meta["source"] == "someone/corpus:cfg"
    assert meta["split_origin"] == {"val": "official"} and meta["splits"]["val"] == len("val doc") + 1
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.DatasetDict(train=dsd["train"]))
    meta = prepare_lm("someone/corpus", "byte", tmp_path / "hub2", val_fraction=0.1, verbose=False)
    assert meta["split_origin"] == {"val": "holdout"} and meta["holdout"]["n_docs"] == 5
    assert int((load_lm_split(tmp_path / "hub2", "train") == 256).sum()) == 45
    # A hub dataset with train + validation only (TinyStories) gets a seeded test hold-out from
    # train, as a local source does: `oelm compare --preset full` reports on it.
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: dsd)
    meta = prepare_lm("someone/corpus", "byte", tmp_path / "hub3", test_fraction=0.2, max_docs=40, verbose=False)
    assert meta["split_origin"] == {"val": "official", "test": "holdout"}
    assert meta["test_holdout"]["n_docs"] == 8 and meta["test_holdout"]["from_docs"] == 40
    train_eots = int((load_lm_split(tmp_path / "hub3", "train") == 256).sum())
    assert train_eots == 32 and int((load_lm_split(tmp_path / "hub3", "test") == 256).sum()) == 8


def test_bad_inputs_are_clear_user_errors(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    (tmp_path / "ok.txt").write_text("a\n\nb\n\nc")
    cases = [
        (tmp_path / "missing.txt", "byte", "not found"),
        (tmp_path / "empty.txt", "byte", "is empty"),
        (tmp_path / "blank.txt", "byte", "no documents"),
        (tmp_path / "ok.txt", "no-such:tok", "accepted tokenizer specs"),
        ("builtin:nothing", "byte", "unknown built-in"),
    ]
    for source, tok, message in cases:
        with pytest.raises(UserError, match=message):
            prepare_lm(source, tok, tmp_path / "out", verbose=False)
    with pytest.raises(UserError, match="val-fraction"):
        prepare_lm(tmp_path / "ok.txt", "byte", tmp_path / "out", val_fraction=1.5)
    assert not (tmp_path / "out").exists()  # nothing written by a refused run


def test_out_dir_refused_unless_overwrite(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(f"doc {i}" for i in range(10)))
    out = tmp_path / "out"
    prepare_lm(src, "byte", out, verbose=False)
    before = (out / "train.bin").read_bytes()
    with pytest.raises(UserError, match="--overwrite"):
        prepare_lm(src, "byte", out, seed=5, verbose=False)
    assert (out / "train.bin").read_bytes() == before
    assert prepare_lm(src, "byte", out, seed=5, overwrite=True, verbose=False)["holdout"]["seed"] == 5


def test_failed_tokenization_leaves_no_output(tmp_path: Path) -> None:
    class Broken(Tokenizer):
        def __init__(self) -> None:
            super().__init__("broken", "broken", 257, 256)

        def _encode_batch(self, texts: list[str], num_threads: int) -> list[list[int]]:
            raise RuntimeError("boom")

    src = tmp_path / "a.txt"
    src.write_text("x\n\ny\n\nz")
    with pytest.raises(RuntimeError):
        prepare_lm(src, Broken(), tmp_path / "out", verbose=False)
    assert not (tmp_path / "out").exists()  # the folder it created is removed again, lock and all


def test_read_meta_and_load_split_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="oelm prepare lm"):
        read_meta(tmp_path)
    with pytest.raises(UserError, match="oelm prepare lm"):
        load_lm_split(tmp_path, "train")


def test_cli_prepare_lm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "py"
    argv = [
        "prepare",
        "lm",
        "builtin:python-docs",
        "--tokenizer",
        "byte",
        "--out",
        str(out),
        "--max-docs",
        "12",
        "--val-fraction",
        "0.25",
        "--seed",
        "7",
        "--workers",
        "2",
    ]
    assert main(argv) == 0
    assert "tokens/s" in capsys.readouterr().err  # a progress note: stderr, silenced by -q
    assert read_meta(out)["holdout"] == {
        "fraction": 0.25,
        "seed": 7,
        "n_docs": 3,
        "from_docs": 12,
        "from_split": "train",
    }
    assert main(argv) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["prepare", "lm", str(tmp_path / "nothing.txt"), "--tokenizer", "byte", "--out", str(out)]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_utf8_bom_changes_nothing_in_the_prepared_splits(tmp_path: Path) -> None:
    """A BOM before WikiText's first title used to hide the title and change the document split."""
    text = "".join(f" = Article {i} = \n\n Body of article {i} , with words .\n\n" for i in range(40))
    plain, bom = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_text(text, encoding="utf-8")
    bom.write_text("\ufeff" + text, encoding="utf-8")
    a = prepare_lm(plain, "byte", tmp_path / "a", val_fraction=0.1, seed=1, verbose=False)
    b = prepare_lm(bom, "byte", tmp_path / "b", val_fraction=0.1, seed=1, verbose=False)
    assert a["splits"] == b["splits"]
    for split in a["splits"]:
        assert (tmp_path / "a" / f"{split}.bin").read_bytes() == (tmp_path / "b" / f"{split}.bin").read_bytes()


def test_a_killed_preparation_is_redone_by_the_same_command(tmp_path: Path) -> None:
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(f"document number {i} with some words" for i in range(60)))
    out = tmp_path / "out"
    want = prepare_lm(src, "byte", out, val_fraction=0.1, verbose=False)
    reference = {p.name: p.read_bytes() for p in out.iterdir()}
    # Killed while tokenizing (temp files and a stale lock of a dead process) ...
    (out / "meta.json").unlink()
    (out / ".train.bin.tmp-999999").write_bytes(b"partial")
    (out / ".lock").write_text(f"{socket.gethostname()} 999999999\n")  # this host, a dead pid
    (out / "val.bin").unlink()  # ... or while publishing: splits without meta.json
    assert prepare_lm(src, "byte", out, val_fraction=0.1, verbose=False) == want
    assert {p.name: p.read_bytes() for p in out.iterdir()} == reference


def test_a_second_preparation_into_the_same_folder_is_refused_while_one_runs(tmp_path: Path) -> None:
    from oelm.utils.lock import dir_lock

    src = tmp_path / "a.txt"
    src.write_text("one\n\ntwo\n\nthree")
    with dir_lock(tmp_path / "out", "data preparation"), pytest.raises(UserError, match="another data preparation"):
        prepare_lm(src, "byte", tmp_path / "out", val_fraction=0.3, verbose=False)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_a_sharded_train_split_is_read_in_order_and_its_files_recorded(tmp_path: Path) -> None:
    """train_00.txt + train_01.txt are one train split; meta.json says which files and bytes."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train_01.txt").write_text("third book\n<|endoftext|>\n")
    (src / "train_00.txt").write_text("first book\n<|endoftext|>\nsecond book\n<|endoftext|>\n")
    (src / "valid.txt").write_text("held-out book\n<|endoftext|>\n")
    (src / "test.txt").write_text("test book\n<|endoftext|>\n")
    meta = prepare_lm(src, "byte", tmp_path / "out", verbose=False)
    tok = load_tokenizer("byte")
    train = [tok.decode(d.tolist()).strip() for d in docs_of(np.asarray(load_lm_split(tmp_path / "out", "train")), 256)]
    assert train == ["first book", "second book", "third book"]
    assert meta["split_origin"] == {"val": "official", "test": "official"} and meta["holdout"] is None
    assert meta["source_files"] == {
        "train": [
            {"file": "train_00.txt", "bytes": (src / "train_00.txt").stat().st_size},
            {"file": "train_01.txt", "bytes": (src / "train_01.txt").stat().st_size},
        ],
        "val": [{"file": "valid.txt", "bytes": (src / "valid.txt").stat().st_size}],
        "test": [{"file": "test.txt", "bytes": (src / "test.txt").stat().st_size}],
    }
    assert read_meta(tmp_path / "out")["source_files"] == meta["source_files"]


def test_hub_style_shard_names_and_a_mixed_split_refused(tmp_path: Path) -> None:
    """`train-00000-of-00002.jsonl` names shards too; a whole file beside shards is ambiguous."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        (src / f"train-0000{i}-of-00002.jsonl").write_text(json.dumps({"text": f"doc {i}"}) + "\n")
    assert [p.name for p in split_files(src)["train"]] == ["train-00000-of-00002.jsonl", "train-00001-of-00002.jsonl"]
    (src / "train.jsonl").write_text(json.dumps({"text": "doc"}) + "\n")
    with pytest.raises(UserError, match=r"both a whole 'train' file \(train.jsonl\) and shards"):
        prepare_lm(src, "byte", tmp_path / "out", verbose=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(
    ("names", "empty", "refusal"),
    [
        (["train_00.txt", "train_02.txt"], None, r"shard\(s\) 1 missing"),
        (["train-00000-of-00003.jsonl", "train-00001-of-00003.jsonl"], None, r"shard\(s\) 1 of 3 missing"),
        (["train_00.txt", "train_01.txt"], "train_01.txt", r"shard train_01.txt is empty"),
        (["train_00.txt", "train_0.txt"], None, r"two shards share a number"),
    ],
)
def test_a_split_with_a_shard_missing_or_empty_is_refused(tmp_path: Path, names, empty, refusal) -> None:
    """A sharded corpus whose download stopped short (a gap in the numbers, fewer shards than
    `-of-N` says, an empty shard) was prepared as a smaller corpus without a word."""
    src = tmp_path / "src"
    src.mkdir()
    for name in names:
        text = (
            "" if name == empty else (json.dumps({"text": f"doc {name}"}) if name.endswith(".jsonl") else f"doc {name}")
        )
        (src / name).write_text(text + ("\n" if text else ""))
    with pytest.raises(UserError, match=refusal):
        prepare_lm(src, "byte", tmp_path / "out", verbose=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _book(i: int) -> str:
    return f"Book {i}. " + " ".join(f"word{i}x{j}" for j in range(60)) + "\n<|endoftext|>\n"


@pytest.mark.parametrize(
    ("files", "refusal"),
    [
        (
            {"train_00.txt": [0, 1], "train_01.txt": [0, 1], "test.txt": [9]},
            "train_01.txt is a byte-for-byte copy of train_00",
        ),
        ({"train.txt": [0, 1], "valid.txt": [8], "test.txt": [8]}, "valid.txt is a byte-for-byte copy of test.txt"),
        ({"train.txt": [0, 1, 2], "test.txt": [1, 2]}, r"100% of the 'test' split's text is verbatim in the 'train'"),
        (
            {"train.txt": [0, 1], "valid.txt": [5, 6], "test.txt": [6, 5, 7]},
            r"\d+% of the 'test' split's text is verbatim in the 'val'",
        ),
    ],
)
def test_held_out_text_copied_from_another_split_is_refused(tmp_path: Path, files, refusal) -> None:
    """A test file that is the validation file again, a shard saved twice, held-out books that sit in
    the train split: each was prepared as if it were new text, and the held-out numbers would
    have read memorized text as unseen. Refused before anything is written."""
    src = tmp_path / "src"
    src.mkdir()
    for name, books in files.items():
        (src / name).write_text("".join(_book(i) for i in books))
    with pytest.raises(UserError, match=refusal):
        prepare_lm(src, "byte", tmp_path / "out", verbose=False)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_small_verbatim_overlap_is_noted_and_a_shared_heading_is_not(tmp_path: Path, caplog) -> None:
    """One held-out book of 20 also in train is prepared, with a warning giving its share; short
    documents every book has ("THE END") are not leaks."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.txt").write_text("".join(_book(i) for i in range(5)) + "THE END\n<|endoftext|>\n")
    (src / "test.txt").write_text("".join(_book(i) for i in range(4, 24)) + "THE END\n<|endoftext|>\n")
    with caplog.at_level("WARNING", logger="oelm.data.lm"):
        prepare_lm(src, "byte", tmp_path / "out", verbose=False)
    (warning,) = [r.getMessage() for r in caplog.records if "verbatim" in r.getMessage()]
    share = float(re.search(r"(\d+\.\d)% of the 'test' split's text is verbatim in the 'train' split", warning)[1])
    assert 4 < share < 6 and "(documents of 200+ characters)" in warning  # one book of 21 held-out documents
    caplog.clear()
    (src / "test.txt").write_text("".join(_book(i) for i in range(5, 25)) + "THE END\n<|endoftext|>\n")
    with caplog.at_level("WARNING", logger="oelm.data.lm"):
        prepare_lm(src, "byte", tmp_path / "out2", verbose=False)
    assert not [r for r in caplog.records if "verbatim" in r.getMessage()]


def test_shards_are_read_in_number_order_not_name_order(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in (0, 1, 2, 10, 3, 4, 5, 6, 7, 8, 9):
        (src / f"train_{i}.txt").write_text(f"doc {i}\n")
    assert [p.name for p in split_files(src)["train"]] == [f"train_{i}.txt" for i in range(11)]


def test_the_gutenberg_folder_is_four_train_shards_and_whole_book_holdouts() -> None:
    """The shared Gutenberg corpus: train in four shards, official valid and test files."""
    folder = need(DATA / "lm" / "gutenberg-books")
    files = split_files(folder)
    assert [p.name for p in files["train"]] == [f"train_0{i}.txt" for i in range(4)]
    assert [p.name for p in files["val"]] == ["valid.txt"] and [p.name for p in files["test"]] == ["test.txt"]


def test_a_csv_is_read_one_document_per_row_from_its_named_column(tmp_path: Path) -> None:
    """Issue 48 item 4: a CSV of many rows is many documents, read from --text-field's column."""
    import csv

    src = tmp_path / "reviews.csv"
    with src.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "review"])
        for i in range(200):
            w.writerow([i % 2, f"review number {i}, with a comma\nand a line break"])
    meta = prepare_lm(src, "byte", tmp_path / "out", text_field="review", verbose=False)
    assert meta["holdout"]["from_docs"] == 200 and meta["holdout"]["n_docs"] == 10
    with pytest.raises(
        UserError, match=r"has no 'text' column \(its header: \['label', 'review'\]\); pass --text-field"
    ):
        prepare_lm(src, "byte", tmp_path / "out2", verbose=False)
    tsv = tmp_path / "rows.tsv"
    tsv.write_text("id\ttext\n" + "".join(f"{i}\trow {i}\n" for i in range(40)))
    assert prepare_lm(tsv, "byte", tmp_path / "out3", verbose=False)["holdout"]["from_docs"] == 40


def test_a_jsonl_text_field_holding_a_list_is_refused_not_read_as_its_repr(tmp_path: Path) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": ["a", "b"]}) + "\n")
    with pytest.raises(UserError, match=r"record 2: its 'text' field is a list, not text"):
        prepare_lm(src, "byte", tmp_path / "out", verbose=False)


@pytest.mark.parametrize(
    "error",
    [OSError(28, "No space left on device"), OSError("408624 requested and 120832 written")],  # numpy's tofile
    ids=["enospc", "short-write"],
)
def test_a_full_disk_during_overwrite_keeps_the_previous_data_and_ends_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError
) -> None:
    import oelm.data.lm as lm

    src = tmp_path / "src.txt"
    src.write_text("\n\n".join(f"document number {i} with some words" for i in range(60)))
    out = tmp_path / "data"
    prepare_lm(src, "byte", out, val_fraction=0.1, verbose=False)
    (out / "notes.md").write_text("mine")  # a file of the user's: --overwrite keeps it
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["meta.json", "notes.md", "train.bin", "val.bin"]  # no lock file stays
    written = lm._write_split

    def full_disk(path, *args, **kwargs):
        if path.name == "val.bin":  # train.bin was written: the disk fills on the second split
            path.write_bytes(b"partial")
            raise error
        return written(path, *args, **kwargs)

    monkeypatch.setattr(lm, "_write_split", full_disk)
    with pytest.raises(UserError, match=r"could not write the prepared data for .*data'.*no space left.*untouched"):
        prepare_lm(src, "byte", out, val_fraction=0.2, seed=3, overwrite=True, verbose=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "src.txt"]  # no temp folder beside it
    monkeypatch.setattr(lm, "_write_split", written)
    assert prepare_lm(src, "byte", out, val_fraction=0.2, seed=3, overwrite=True, verbose=False)["holdout"]["seed"] == 3
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "notes.md", "train.bin", "val.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "src.txt"]
