"""`oelm train [CONFIG.yaml] [key=value ...] [--flags]`: one training run (also under torchrun)."""

from __future__ import annotations

import argparse
import json
from typing import Any

# flag -> (TrainConfig field, type); store_true flags have type None.
FLAGS: dict[str, tuple[str, Any]] = {
    "--task": ("task", str),
    "--data": ("data", str),
    "--model": ("model", str),
    "--method": ("method", str),
    "--steps": ("steps", int),
    "--batch-size": ("batch_size", int),
    "--grad-accum": ("grad_accum", int),
    "--seq-len": ("seq_len", int),
    "--lr": ("lr", float),
    "--warmup": ("warmup", int),
    "--schedule": ("schedule", str),
    "--min-lr-ratio": ("min_lr_ratio", float),
    "--weight-decay": ("weight_decay", float),
    "--clip": ("clip", float),
    "--eval-every": ("eval_every", int),
    "--eval-batches": ("eval_batches", int),
    "--checkpoint-every": ("checkpoint_every", int),
    "--keep-last": ("keep_last", int),
    "--log-every": ("log_every", int),
    "--seed": ("seed", int),
    "--out": ("out", str),
    "--device": ("device", str),
    "--dtype": ("dtype", str),
    "--resume": ("resume", None),
    "--overwrite": ("overwrite", None),
    "--compile": ("compile", None),
    "--no-progress": ("progress", None),
    # classification (dotted fields reach nested sections)
    "--dataset": ("data", str),
    "--data-dir": ("classification.data_dir", str),
    "--eval-dataset": ("classification.eval_dataset", str),
    "--eval-data-dir": ("classification.eval_data_dir", str),
    "--max-length": ("classification.max_length", int),
    "--tokenizer": ("classification.tokenizer", str),
    "--epochs": ("classification.epochs", float),
    "--max-train": ("classification.max_train", int),
    "--max-eval": ("classification.max_eval", int),
    "--qk-init": ("method_options.qk_init", str),
}


class _IntermixedParser(argparse.ArgumentParser):
    """Lets `key=value` items and flags interleave (`c.yaml --lr 1e-3 seed=2`).

    Plain argparse stops filling a nargs='*' positional at the first flag; the intermixed parser
    does not, but refuses parsers with subcommands, so only this subcommand's parser uses it.
    """

    _inner = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        if self._inner:  # parse_known_intermixed_args calls back into parse_known_args
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `train` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train one model (LM or classification) into a run directory",
        description="Train one run. Settings come from an optional YAML file, then the flags, "
        "then key=value overrides (dots reach nested fields, e.g. model_overrides.n_layer=2). "
        "Multi-process: torchrun --nproc_per_node N -m oelm train ...",
    )
    p.add_argument("items", nargs="*", metavar="CONFIG.yaml | key=value")
    for flag, (field, kind) in FLAGS.items():
        if kind is None:
            p.add_argument(flag, dest=field, action="store_true", default=None)
        else:
            p.add_argument(flag, dest=field, type=kind, default=None, metavar=field.split(".")[-1].upper())
    p.add_argument(
        "--scale",
        default=None,
        help="for a study config (configs/study/*.yaml): apply its named scale, e.g. smoke",
    )
    p.add_argument("--json", action="store_true", help="print results.json to stdout")
    p.__class__ = _IntermixedParser
    p.set_defaults(func=run)


def _read_config_file(path: str, scale: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainConfig keys, study meta keys) of a YAML; study configs get their scale applied."""
    from oelm.errors import UserError
    from oelm.experiments.study import META_KEYS, SCALES_KEY, load_study_config, split_study_config
    from oelm.training.config import load_yaml

    raw = load_yaml(path)
    if not any(k in raw for k in (*META_KEYS, SCALES_KEY)):
        if scale is not None:
            raise UserError(f"--scale {scale} given, but {path} has no 'scales' section")
        return raw, {}
    return split_study_config(load_study_config(path, scale))


def config_from_args(args: argparse.Namespace) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """The raw config dict (YAML + flags), the key=value overrides and study meta keys."""
    from oelm.errors import UserError

    raw: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    overrides: list[str] = []
    files = 0
    for item in args.items:
        if "=" in item:
            overrides.append(item)
        elif files:
            raise UserError(f"more than one config file given ({item!r}); merge them or use key=value")
        else:
            files += 1
            raw, meta = _read_config_file(item, getattr(args, "scale", None))
    if getattr(args, "scale", None) is not None and not files:
        raise UserError("--scale needs a study config file, e.g. oelm train configs/study/gpt-01.yaml --scale smoke")
    for field, _ in FLAGS.values():
        value = getattr(args, field, None)
        if value is not None:
            *parents, leaf = field.split(".")
            node = raw
            for part in parents:
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            node[leaf] = (not value) if field == "progress" else value
    return raw, overrides, meta


def _ensure_data(raw: dict[str, Any], overrides: list[str], meta: dict[str, Any]) -> None:
    """Build a study config's LM data directory from its `prepare` recipe when it is missing."""
    import os
    import time
    from pathlib import Path

    from oelm.experiments.prepare import ensure_lm_data
    from oelm.training.config import apply_overrides

    cfg = apply_overrides(dict(raw), overrides)
    if "prepare" not in meta or cfg.get("task", "lm") != "lm" or not cfg.get("data"):
        return
    meta_file = Path(cfg["data"]) / "meta.json"
    if int(os.environ.get("RANK", "0")) == 0:
        ensure_lm_data(meta["prepare"], cfg["data"], verbose=True)
        return
    while not meta_file.is_file():  # other ranks wait for rank 0 under torchrun
        time.sleep(1.0)


def run(args: argparse.Namespace) -> int:
    """Validate the config, train, and print where the results are."""
    from oelm.training.config import make_config
    from oelm.training.loop import train

    raw, overrides, meta = config_from_args(args)
    _ensure_data(raw, overrides, meta)
    cfg = make_config(raw, overrides)
    results = train(cfg)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        metric = results.get("primary_metric")
        print(
            f"{cfg.run_dir()}: {metric} = {results.get(metric)}, "
            f"freeze_check ok = {results['freeze_check']['ok']}"
        )
    return 0
