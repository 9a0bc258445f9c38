"""`oelm train [CONFIG.yaml] [key=value ...] [--flags]`: one training run (also under torchrun).

`python -m oelm.cli.train` rewrites train_flags.json, the flag table, after a TrainConfig field changes.
"""

from __future__ import annotations

import argparse
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

from oelm.cli import Parser

# Flags that are not a config field's own name (kept for the study's habits).
ALIASES: dict[str, tuple[str, str]] = {
    "--dataset": ("data", "classification dataset name (same as --data)"),
    "--qk-init": ("method_options.qk_init", "Q/K initializer of the method (method_options.qk_init)"),
}
# Fields set only in YAML or as key=value (structured values).
_NO_FLAG = {"model_overrides", "method_options", "betas", "text_fields", "dataset"}
# config_flags() as stored beside this module: the parser is built from it, so `oelm --help` imports
# neither pydantic nor torch (TrainConfig needs both). tests/test_cli.py checks it against the fields.
FLAG_TABLE = Path(__file__).with_name("train_flags.json")
_TYPES: dict[str, Any] = {t.__name__: t for t in (int, float, str, bool)}


def _scalar(annotation: Any) -> tuple[Any, list[str] | None] | None:
    """(argparse type, choices) of a field's annotation, or None when it takes no flag."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str, [str(a) for a in typing.get_args(annotation)]
    if origin in (typing.Union, types.UnionType):  # X | None: the flag takes an X
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _scalar(args[0]) if len(args) == 1 else None
    if annotation in (int, float, str, bool):
        return annotation, None
    if origin is list:  # comma-separated on the command line
        return str, None
    return None


def config_flags() -> list[tuple[str, str, Any, list[str] | None, str, Any]]:
    """(flag, dotted field, type, choices, help, default) for every flag-able TrainConfig field.

    Generated from the pydantic models, so a new field gets its flag and help text for free.
    """
    from oelm.training.config import ClassificationOptions, TrainConfig

    flags = []
    top = set(TrainConfig.model_fields)
    sections = [("", TrainConfig), ("classification.", ClassificationOptions)]
    for prefix, model in sections:
        for name, info in model.model_fields.items():
            if name in _NO_FLAG or (prefix and name in top):
                continue
            kind = _scalar(info.annotation)
            if kind is None:
                continue
            flag = "--" + name.replace("_", "-")
            if kind[0] is bool and info.default is True:
                flag = "--no-" + name.replace("_", "-")
            text = info.description or ""
            if flag.startswith("--no-"):
                text = f"turn off: {text}"
            default = "(required)" if info.is_required() else info.get_default(call_default_factory=True)
            flags.append((flag, prefix + name, kind[0], kind[1], text, default))
    return flags


def stored_flags() -> list[tuple[str, str, Any, list[str] | None, str, Any]]:
    """config_flags() as stored in FLAG_TABLE (what the parser is built from; no pydantic, no torch)."""
    rows = json.loads(FLAG_TABLE.read_text(encoding="utf-8"))
    return [(r["flag"], r["field"], _TYPES[r["type"]], r["choices"], r["help"], r["default"]) for r in rows]


def write_flag_table(path: Path = FLAG_TABLE) -> None:
    """Store config_flags() in FLAG_TABLE (run `python -m oelm.cli.train` after changing a TrainConfig field)."""
    from oelm.utils.io import atomic_write_text

    keys = ("flag", "field", "type", "choices", "help", "default")
    rows = [dict(zip(keys, (f, d, t.__name__, c, h, v))) for f, d, t, c, h, v in config_flags()]
    lines = ",\n".join(json.dumps(row, ensure_ascii=False) for row in rows)  # one flag a line: diffs stay readable
    atomic_write_text(path, f"[\n{lines}\n]\n")


class _IntermixedParser(Parser):
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
    p.add_argument(
        "items", nargs="*", metavar="CONFIG.yaml | key=value", help="an optional YAML config, then key=value overrides"
    )
    for flag, field, kind, choices, text, default in stored_flags():
        if kind is bool:
            p.add_argument(flag, dest=field, action="store_true", default=None, help=text)
            continue
        shown = "" if default is None or default == [] or "default" in text else f" (default {default})"
        shown = " (required here or in CONFIG.yaml)" if default == "(required)" else shown
        p.add_argument(
            flag,
            dest=field,
            type=kind,
            default=None,
            choices=choices,
            metavar=None if choices else field.split(".")[-1].upper(),
            help=text + shown,
        )
    for flag, (field, text) in ALIASES.items():
        p.add_argument(flag, dest=field, type=str, default=None, metavar=field.split(".")[-1].upper(), help=text)
    p.add_argument(
        "--scale",
        default=None,
        help="for a study config (configs/study/*.yaml): apply its named scale, e.g. smoke",
    )
    p.add_argument("--json", action="store_true", help="print results.json to stdout")
    p.__class__ = _IntermixedParser
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    """Resolve the config from CONFIG.yaml, --scale, the flags and key=value items (validated once)."""
    from oelm.experiments.resolve import resolve_config
    from oelm.utils.errors import UserError

    files = [item for item in args.items if "=" not in item]
    overrides = [item for item in args.items if "=" in item]
    if len(files) > 1:
        raise UserError(f"more than one config file given ({files[1]!r}); merge them or use key=value")
    table = stored_flags()
    negated = {field for flag, field, *_ in table if flag.startswith("--no-")}
    fields = [f for _, f, *_ in table] + [f for f, _ in ALIASES.values()]
    flags = {}
    for field in fields:
        value = getattr(args, field, None)
        if value is not None:
            flags[field] = (not value) if field in negated else value
    return resolve_config(files[0] if files else None, getattr(args, "scale", None), flags, overrides)


def run(args: argparse.Namespace) -> int:
    """Validate the config, prepare a study config's data if missing, train, print where the results are."""
    from oelm.experiments.prepare import ensure_run_data
    from oelm.training.loop import train

    resolved = config_from_args(args)
    cfg = resolved.config
    passes = ensure_run_data(cfg, resolved.meta)
    results = train(cfg)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return 0
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        if passes is not None:
            print(f"budget: {passes:.3g} passes over the train split of {cfg.data}")
        print(final_line(cfg.run_dir(), results))
    return 0


def final_line(run_dir: Path, results: dict[str, Any]) -> str:
    """The run's final number, rounded, with the split it is on and the freeze check."""
    metric = results.get("primary_metric")
    value = results.get(metric)
    shown = f"{value:.4g}" if isinstance(value, float | int) else "null (not finite)"
    split = results.get("final_split")
    if split == "val":
        where = "on the validation split, which also chose the checkpoint: not a held-out number (no test split)"
    else:
        source = results.get("test_source")
        where = f"on the {split or 'test'} split" + (f" ({source})" if source else "")
    step = results.get("best_step")
    at = f", best validation checkpoint (step {step})" if step is not None else ""
    return f"{run_dir}: {metric} = {shown} {where}{at}; freeze_check ok = {results['freeze_check']['ok']}"


if __name__ == "__main__":
    write_flag_table()
    print(f"wrote {FLAG_TABLE}")
