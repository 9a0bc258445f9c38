"""The registered classification datasets: labels, hub location, official local files, split roles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oelm.data.cls_sources import (
    NLI_LABELS,
    Example,
    read_ag_news_csv,
    read_imdb_jsonl,
    read_mnli_tsv,
    read_sst2_tsv,
    read_xnli_tsv,
)


@dataclass(frozen=True)
class RolePlan:
    """Which official split plays which role; None for validation means carved from train."""

    train: str | None = "train"
    validation: str | None = None
    heldout: str | None = "validation"
    extra: tuple[str, ...] = ()  # also evaluated at the end, reported under their own names
    three_way: str | None = None  # the only labelled split, divided into train/validation/heldout


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset: label names, hub location, official local files and role plans."""

    name: str
    label_names: tuple[str, ...]
    hub: tuple[str, str | None]
    hub_plan: RolePlan
    local_files: dict[str, tuple[str, Callable[[Path], list[Example]]]]  # split -> (file, reader)
    local_plan: RolePlan
    split_names: dict[str, str]  # split -> what it is, for split_roles
    eval_split: str  # the split reported when this dataset is only the evaluation dataset
    optional_files: frozenset[str] = frozenset()


_SST2 = DatasetSpec(
    name="sst2",
    label_names=("negative", "positive"),
    hub=("nyu-mll/glue", "sst2"),
    hub_plan=RolePlan(heldout="validation"),
    local_files={"train": ("train.tsv", read_sst2_tsv), "validation": ("dev.tsv", read_sst2_tsv)},
    local_plan=RolePlan(heldout="validation"),
    split_names={"train": "GLUE SST-2 train", "validation": "GLUE SST-2 dev (test labels are hidden)"},
    eval_split="validation",
)
_MNLI = DatasetSpec(
    name="mnli",
    label_names=NLI_LABELS,
    hub=("nyu-mll/glue", "mnli"),
    hub_plan=RolePlan(heldout="validation_matched", extra=("validation_mismatched",)),
    local_files={
        "train": ("train.tsv", read_mnli_tsv),
        "validation_matched": ("dev_matched.tsv", read_mnli_tsv),
        "validation_mismatched": ("dev_mismatched.tsv", read_mnli_tsv),
    },
    local_plan=RolePlan(heldout="validation_matched", extra=("validation_mismatched",)),
    split_names={
        "train": "GLUE MNLI train",
        "validation_matched": "GLUE MNLI dev_matched (test labels are hidden)",
        "validation_mismatched": "GLUE MNLI dev_mismatched",
    },
    eval_split="validation_matched",
    optional_files=frozenset({"dev_mismatched.tsv"}),
)
_XNLI_EN = DatasetSpec(
    name="xnli-en",
    label_names=NLI_LABELS,
    hub=("facebook/xnli", "en"),
    hub_plan=RolePlan(validation="validation", heldout="test"),
    local_files={"validation": ("dev.tsv", read_xnli_tsv)},
    local_plan=RolePlan(train=None, heldout=None, three_way="validation"),
    split_names={
        "train": "XNLI en train (= MNLI train)",
        "validation": "XNLI-en validation (dev)",
        "test": "XNLI-en test",
    },
    eval_split="validation",  # the study evaluated MNLI-trained models on XNLI-en validation
)
_IMDB = DatasetSpec(
    name="imdb",
    label_names=("neg", "pos"),
    hub=("stanfordnlp/imdb", None),
    hub_plan=RolePlan(heldout="test"),
    local_files={"train": ("train.jsonl", read_imdb_jsonl), "test": ("test.jsonl", read_imdb_jsonl)},
    local_plan=RolePlan(heldout="test"),
    split_names={"train": "IMDB train", "test": "IMDB test"},
    eval_split="test",
)
_AG_NEWS = DatasetSpec(
    name="ag_news",
    label_names=("World", "Sports", "Business", "Sci/Tech"),
    hub=("fancyzhx/ag_news", None),
    hub_plan=RolePlan(heldout="test"),
    local_files={"train": ("train.csv", read_ag_news_csv), "test": ("test.csv", read_ag_news_csv)},
    local_plan=RolePlan(heldout="test"),
    split_names={"train": "AG News train", "test": "AG News test"},
    eval_split="test",
)

DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (_SST2, _MNLI, _XNLI_EN, _IMDB, _AG_NEWS)}
_ALIASES = {"sst-2": "sst2", "xnli": "xnli-en", "xnli_en": "xnli-en", "agnews": "ag_news", "ag-news": "ag_news"}
