"""Classification datasets: a registry (hub or official local layouts), honest splits, encoding.

Every dataset assigns three roles: `train` (optimized on), `validation` (picks the best
checkpoint and the learning rate) and `heldout` (reported once, never used for choices). The
roles are recorded in `ClassificationData.split_roles` so that results.json says which data
each number comes from.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oelm.data.cls_encode import SEP_TOKEN, PadCollator, encode_pairs, gpt_separator_id, truncate_pair
from oelm.data.cls_registry import _ALIASES, DATASETS, DatasetSpec, RolePlan
from oelm.data.cls_sources import (
    TABLE_SUFFIXES,
    Columns,
    Example,
    Splits,
    label_vocabulary,
    load_hub_splits,
    read_table,
    require_files,
)
from oelm.utils.errors import UserError
from oelm.utils.hub import require_hub

__all__ = [
    "DATASETS",
    "SEP_TOKEN",
    "ClassificationData",
    "DatasetSpec",
    "Example",
    "PadCollator",
    "encode_pairs",
    "gpt_separator_id",
    "list_datasets",
    "load_classification",
    "truncate_pair",
]

LOCAL = "local"  # the name of the generic CSV/TSV/JSON-lines source


@dataclass
class ClassificationData:
    """Train / validation / held-out examples plus what results.json must record about them."""

    name: str
    train: list[Example]
    validation: list[Example]
    heldout: list[Example]
    num_labels: int
    label_names: list[str]
    split_roles: dict[str, str]
    source: str
    extra_eval: dict[str, list[Example]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def is_pair(self) -> bool:
        """True when examples carry a second text (NLI)."""
        return self.train[0].text_pair is not None

    def summary(self) -> dict[str, Any]:
        """JSON-ready description: source, sizes, labels, roles and how splits were made."""
        sizes = {"train": len(self.train), "validation": len(self.validation), "heldout": len(self.heldout)}
        sizes.update({k: len(v) for k, v in self.extra_eval.items()})
        return {
            "dataset": self.name,
            "source": self.source,
            "num_labels": self.num_labels,
            "label_names": list(self.label_names),
            "split_roles": dict(self.split_roles),
            "sizes": sizes,
            **self.info,
        }


def list_datasets() -> list[str]:
    """Names accepted by load_classification (registered datasets plus 'local')."""
    return [*DATASETS, LOCAL]


def _spec(name: str) -> DatasetSpec | None:
    key = _ALIASES.get(name.lower(), name.lower())
    if key == LOCAL:
        return None
    if key not in DATASETS:
        raise UserError(
            f"unknown classification dataset {name!r}; registered: {', '.join(list_datasets())} "
            "(use 'local' with data_dir for your own CSV/TSV/JSON-lines files)"
        )
    return DATASETS[key]


# ----------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class _Loaded:
    splits: Splits
    plan: RolePlan
    names: dict[str, str]
    label_names: list[str]
    source: str
    eval_split: str
    notes: dict[str, Any]


def _load_registered(spec: DatasetSpec, data_dir: Path | None, hub_loader: Callable | None) -> _Loaded:
    if data_dir is not None:
        required = [f for f, _ in spec.local_files.values() if f not in spec.optional_files]
        require_files(data_dir, spec.name, required)
        splits = {
            split: reader(data_dir / fname)
            for split, (fname, reader) in spec.local_files.items()
            if (data_dir / fname).is_file()
        }
        plan = _drop_missing_extras(spec.local_plan, splits)
        return _Loaded(splits, plan, spec.split_names, list(spec.label_names), f"local:{data_dir}", spec.eval_split, {})
    wanted = _plan_splits(spec.hub_plan) | {spec.eval_split}
    if hub_loader is None:  # the real hub (tests pass their own loader)
        files = ", ".join(f for f, _ in spec.local_files.values())
        require_hub(spec.hub[0], "dataset", f"pass --data-dir with the official files ({files})")
    try:
        splits = load_hub_splits(*spec.hub, sorted(wanted), len(spec.label_names), loader=hub_loader)
    except UserError:
        raise
    except Exception as err:  # network, cache, auth, or a renamed hub dataset
        files = ", ".join(f for f, _ in spec.local_files.values())
        raise UserError(
            f"dataset {spec.name!r} could not be loaded from the Hugging Face hub "
            f"({spec.hub[0]}{'/' + spec.hub[1] if spec.hub[1] else ''}: {type(err).__name__}: "
            f"{str(err)[:200]}) and no data_dir was given; pass data_dir (--data-dir) with the "
            f"official files: {files}"
        ) from None
    hub_name = f"hub:{spec.hub[0]}" + (f"/{spec.hub[1]}" if spec.hub[1] else "")
    return _Loaded(splits, spec.hub_plan, spec.split_names, list(spec.label_names), hub_name, spec.eval_split, {})


def _plan_splits(plan: RolePlan) -> set[str]:
    names = {plan.train, plan.validation, plan.heldout, plan.three_way, *plan.extra}
    return {n for n in names if n}


def _drop_missing_extras(plan: RolePlan, splits: Splits) -> RolePlan:
    extra = tuple(e for e in plan.extra if e in splits)
    return RolePlan(plan.train, plan.validation, plan.heldout, extra, plan.three_way)


def _find_table(data_dir: Path, stems: Sequence[str]) -> Path | None:
    for stem in stems:
        for suffix in TABLE_SUFFIXES:
            if (data_dir / f"{stem}{suffix}").is_file():
                return data_dir / f"{stem}{suffix}"
    return None


_LOCAL_STEMS = {"train": ("train",), "validation": ("validation", "val", "dev"), "test": ("test", "heldout")}


def _load_local(data_dir: Path | None, cols: Columns, num_labels: int | None) -> _Loaded:
    if data_dir is None:
        raise UserError("dataset 'local' needs data_dir (--data-dir) holding train.csv|tsv|jsonl")
    files = {split: _find_table(data_dir, stems) for split, stems in _LOCAL_STEMS.items()}
    if not data_dir.is_dir():
        raise UserError(f"data_dir {data_dir} does not exist or is not a folder")
    if files["train"] is None:
        raise UserError(
            f"data_dir {data_dir} has no train file; expected one of train.csv, train.tsv, train.jsonl "
            f"(plus optional validation|val|dev and test|heldout files); found: "
            f"{', '.join(sorted(p.name for p in data_dir.iterdir())) or 'nothing'}"
        )
    raw = {split: read_table(path, cols) for split, path in files.items() if path is not None}
    _check_labels_seen_in_training(raw, files)
    names, mapping = label_vocabulary(lab for rows in raw.values() for _, _, lab in rows)
    if num_labels is not None:
        if len(names) > num_labels:
            raise UserError(
                f"labels of {data_dir} ({', '.join(names)}) are outside 0..{num_labels - 1}; "
                f"fix the files or set num_labels to at least {len(names)}"
            )
        names = names + [str(i) for i in range(len(names), num_labels)]
    splits = {s: [Example(t, p, mapping[lab]) for t, p, lab in rows] for s, rows in raw.items()}
    plan = _local_plan("validation" in splits, "test" in splits)
    desc = {s: f"{files[s].name}" for s in splits}  # type: ignore[union-attr]
    notes = {"label_mapping": mapping, "columns": vars(cols)}
    return _Loaded(splits, plan, desc, names, f"local:{data_dir}", plan.heldout or "test", notes)


def _check_labels_seen_in_training(raw: dict[str, list[tuple[str, str | None, str]]], files: dict[str, Any]) -> None:
    """Refuse a validation or test file holding a label no training row has: the model could never
    predict it, and counting it as one more class would change num_labels and every score."""
    seen = {lab for _, _, lab in raw["train"]}
    for split, rows in raw.items():
        unseen = [(n, lab) for n, (_, _, lab) in enumerate(rows) if lab not in seen]
        if split != "train" and unseen:
            labels = sorted({lab for _, lab in unseen})
            raise UserError(
                f"{files[split]}: label(s) {', '.join(map(repr, labels[:5]))} never occur in the training file "
                f"{files['train'].name} (first at data row {unseen[0][0] + 1}; training has {', '.join(sorted(seen)[:10])}); "
                "fix the labels, or move such rows into training"
            )


def _check_evaluated_classes_trained(
    train: list[Example], evaluated: dict[str, list[Example]], names: list[str]
) -> None:
    """Refuse data whose training rows (after splits and caps) lack a class that is evaluated: the
    model could never predict it (e.g. max_train too small, or a carve that took a rare class)."""
    seen = {ex.label for ex in train}
    for split, rows in evaluated.items():
        missing = sorted({ex.label for ex in rows} - seen)
        if missing:
            labels = ", ".join(repr(names[i]) if i < len(names) else str(i) for i in missing[:5])
            raise UserError(
                f"the {split} rows hold class(es) {labels} that no training row has ({len(train)} training rows "
                "after splitting and max_train); raise max_train, or use data where every class is trained"
            )


def _local_plan(has_val: bool, has_test: bool) -> RolePlan:
    if has_val and has_test:
        return RolePlan(validation="validation", heldout="test")
    if has_test or has_val:
        return RolePlan(heldout="test" if has_test else "validation")
    return RolePlan(train=None, heldout=None, three_way="train")


def load_classification(
    name: str,
    data_dir: str | Path | None = None,
    seed: int = 0,
    max_train: int | None = None,
    max_eval: int | None = None,
    val_fraction: float = 0.05,
    three_way_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    eval_dataset: str | None = None,
    eval_data_dir: str | Path | None = None,
    text_column: str = "text",
    text_pair_column: str | None = None,
    label_column: str = "label",
    num_labels: int | None = None,
    hub_loader: Callable[[str, str | None], Any] | None = None,
) -> ClassificationData:
    """Load a classification dataset with train / validation / held-out roles (seeded splits)."""
    _check_fractions(val_fraction, three_way_fractions, max_train, max_eval)
    loaded = _load_any(name, data_dir, Columns(text_column, text_pair_column, label_column), num_labels, hub_loader)
    roles = _assign_roles(loaded, seed, val_fraction, three_way_fractions)
    train, validation, heldout, extra, split_roles, info = roles
    display = _spec(name).name if _spec(name) else LOCAL
    source = loaded.source
    if eval_dataset is not None and _canonical(eval_dataset) != _canonical(name):
        heldout, extra, split_roles, source = _swap_heldout(
            loaded, display, eval_dataset, eval_data_dir, heldout, extra, split_roles, hub_loader
        )
    info.update(loaded.notes)
    info["split_seed"] = seed
    train, validation, heldout, extra = _cap(train, validation, heldout, extra, max_train, max_eval, seed, info)
    _check_evaluated_classes_trained(train, {"validation": validation, "heldout": heldout, **extra}, loaded.label_names)
    return ClassificationData(
        name=display if eval_dataset is None else f"{display}->{_canonical(eval_dataset)}",
        train=train,
        validation=validation,
        heldout=heldout,
        num_labels=len(loaded.label_names),
        label_names=loaded.label_names,
        split_roles=split_roles,
        source=source,
        extra_eval=extra,
        info=info,
    )


def _canonical(name: str) -> str:
    spec = _spec(name)
    return spec.name if spec else LOCAL


def _load_any(
    name: str, data_dir: str | Path | None, cols: Columns, num_labels: int | None, hub_loader: Callable | None
) -> _Loaded:
    spec = _spec(name)
    path = Path(data_dir) if data_dir is not None else None
    return _load_local(path, cols, num_labels) if spec is None else _load_registered(spec, path, hub_loader)


def _check_fractions(
    val_fraction: float, three: tuple[float, float, float], max_train: int | None, max_eval: int | None
) -> None:
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if len(three) != 3 or min(three) <= 0 or abs(sum(three) - 1.0) > 1e-6:
        raise UserError(f"three_way_fractions must be three positive numbers summing to 1, got {three}")
    for key, value in (("max_train", max_train), ("max_eval", max_eval)):
        if value is not None and value < 1:
            raise UserError(f"{key} must be a positive number of rows, got {value}")


def _assign_roles(
    loaded: _Loaded, seed: int, val_fraction: float, three: tuple[float, float, float]
) -> tuple[Any, ...]:
    plan, s, names = loaded.plan, loaded.splits, loaded.names
    info: dict[str, Any] = {}
    if plan.three_way:
        src = names.get(plan.three_way, plan.three_way)
        validation, heldout, train = grouped_partition(s[plan.three_way], [three[1], three[2]], seed)
        pct = [f"{round(100 * f)}%" for f in three]
        roles = {
            "train": f"{pct[0]} of {src}, split by seed {seed} (grouped by first text)",
            "validation": f"{pct[1]} of {src}, split by seed {seed}; picks the best checkpoint",
            "heldout": f"{pct[2]} of {src}, split by seed {seed}; reported",
        }
        info["split_fractions"] = {"train": three[0], "validation": three[1], "heldout": three[2]}
        return train, validation, heldout, {}, roles, info
    train_src = names.get(plan.train, plan.train)
    if plan.validation is None:
        validation, train = grouped_partition(s[plan.train], [val_fraction], seed)
        pct = f"{round(100 * val_fraction, 2):g}%"
        roles = {
            "train": f"{train_src} minus the validation carve",
            "validation": f"{pct} of {train_src} carved by seed {seed} (grouped by first text); "
            "picks the best checkpoint",
        }
        info["split_fractions"] = {"validation_of_train": val_fraction}
    else:
        train, validation = s[plan.train], s[plan.validation]
        roles = {
            "train": train_src,
            "validation": f"{names.get(plan.validation, plan.validation)}; picks the best checkpoint",
        }
    roles["heldout"] = f"{names.get(plan.heldout, plan.heldout)}; reported"
    extra = {e: s[e] for e in plan.extra}
    roles.update({e: f"{names.get(e, e)}; also reported" for e in extra})
    return train, validation, s[plan.heldout], extra, roles, info


def _swap_heldout(
    loaded: _Loaded,
    display: str,
    eval_name: str,
    eval_dir: str | Path | None,
    heldout: list[Example],
    extra: dict[str, list[Example]],
    roles: dict[str, str],
    hub_loader: Callable | None,
) -> tuple[Any, ...]:
    # Cross-dataset evaluation (e.g. train MNLI, report XNLI-en): selection stays on the training
    # dataset's validation split; the eval dataset's split is the held-out one.
    spec = _spec(eval_name)
    if spec is None:
        raise UserError("eval_dataset must be a registered dataset name, not 'local'")
    ev = _load_registered(spec, Path(eval_dir) if eval_dir is not None else None, hub_loader)
    if ev.label_names != loaded.label_names:
        raise UserError(
            f"eval_dataset {spec.name!r} has labels {ev.label_names} but {display!r} has "
            f"{loaded.label_names}; pick datasets with the same label set"
        )
    new_extra = {f"{display}/heldout": heldout, **{f"{display}/{k}": v for k, v in extra.items()}}
    new_roles = {
        "train": roles["train"],
        "validation": roles["validation"],
        "heldout": f"{spec.name}: {ev.names.get(ev.eval_split, ev.eval_split)} (all rows); reported",
    }
    new_roles[f"{display}/heldout"] = roles["heldout"].replace("; reported", "; also reported")
    new_roles.update({f"{display}/{k}": roles[k] for k in extra})
    return ev.splits[ev.eval_split], new_extra, new_roles, f"{loaded.source} + {ev.source}"


def grouped_partition(examples: list[Example], fractions: Sequence[float], seed: int) -> list[list[Example]]:
    """Split by seed into len(fractions)+1 parts (the last takes the rest), keeping equal first texts together."""
    groups: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        # Grouping by the first text keeps an NLI premise (or a duplicated sentence) on one side.
        groups.setdefault(ex.text, []).append(i)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    targets = [round(f * len(examples)) for f in fractions]
    parts: list[list[int]] = [[] for _ in range(len(fractions) + 1)]
    k = 0
    for key in keys:
        while k < len(targets) and len(parts[k]) >= targets[k]:
            k += 1
        parts[k].extend(groups[key])
    if any(not p for p in parts):
        raise UserError(
            f"{len(examples)} examples are too few to split into {len(parts)} non-empty parts; "
            "use more data or larger fractions"
        )
    return [[examples[i] for i in sorted(p)] for p in parts]


def _subsample(rows: list[Example], n: int | None, seed: int) -> list[Example]:
    if n is None or n >= len(rows):
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [rows[i] for i in keep]


def _cap(
    train: list[Example],
    validation: list[Example],
    heldout: list[Example],
    extra: dict[str, list[Example]],
    max_train: int | None,
    max_eval: int | None,
    seed: int,
    info: dict[str, Any],
) -> tuple[Any, ...]:
    if max_train is not None or max_eval is not None:
        info["row_caps"] = {"max_train": max_train, "max_eval": max_eval, "how": f"seeded sample, seed {seed}"}
    return (
        _subsample(train, max_train, seed),
        _subsample(validation, max_eval, seed),
        _subsample(heldout, max_eval, seed),
        {k: _subsample(v, max_eval, seed) for k, v in extra.items()},
    )
