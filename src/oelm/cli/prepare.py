"""`oelm prepare KIND ...`: turn raw datasets into the files training reads (`lm` for now)."""

from __future__ import annotations

import argparse
import importlib

# Each entry "module:function" adds one `oelm prepare <kind>` parser to the nested subparsers
# (function(kinds) -> None, setting `func`). Another kind, e.g. classification data, is one
# more line here, with its code in its own module.
KINDS: list[str] = ["oelm.cli.prepare:register_lm"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add `prepare` with its own nested subcommands (one per kind of data)."""
    parser = sub.add_parser(
        "prepare",
        help="tokenize a dataset into the files training reads",
        description="Prepare data for training. KIND is one of the subcommands below.",
    )
    kinds = parser.add_subparsers(dest="prepare_kind", metavar="KIND")
    parser.set_defaults(func=lambda args: _print_help(parser))
    for entry in KINDS:
        module, _, function = entry.partition(":")
        getattr(importlib.import_module(module), function)(kinds)


def _print_help(parser: argparse.ArgumentParser) -> int:
    """`oelm prepare` without a kind: show the kinds, exit code 2."""
    parser.print_help()
    return 2


def register_lm(kinds: argparse._SubParsersAction) -> None:
    """Add `oelm prepare lm`."""
    p = kinds.add_parser(
        "lm",
        help="tokenize a text corpus into train.bin / val.bin [/ test.bin] + meta.json",
        description=(
            "SOURCE: a text file, a folder of text files (train/valid/test files are official "
            "splits), a .jsonl file, builtin:python-docs, builtin:python-stdlib, builtin:tales, or a Hugging Face dataset "
            "(owner/name or owner/name:config). Without an official validation split, a seeded "
            "document-level hold-out is made from train."
        ),
    )
    p.add_argument("source", metavar="SOURCE")
    p.add_argument(
        "--tokenizer",
        required=True,
        metavar="TOK",
        help="byte | gpt2 | gpt2:DIR | DIR | FILE.tiktoken | HF tokenizer folder or hub name",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--config", default=None, help="Hugging Face dataset config (or SOURCE as NAME:CONFIG)")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.05,
        metavar="F",
        help="documents held out for validation when the source has no official split (default 0.05)",
    )
    p.add_argument(
        "--test-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="also hold out this fraction as a test split when the source has none (default 0)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the hold-out (default 0)")
    p.add_argument("--max-docs", type=int, default=None, metavar="N", help="keep the first N documents of each split")
    p.add_argument(
        "--workers", type=int, default=None, metavar="W", help="tokenizer threads/processes (default: all cores)"
    )
    p.add_argument(
        "--text-field",
        default="text",
        metavar="FIELD",
        help="text field of JSON lines, column of a CSV/TSV file (header row), or hub dataset field",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the LM files in an existing --out folder")
    p.set_defaults(func=run_lm)


def run_lm(args: argparse.Namespace) -> int:
    """Run `oelm prepare lm` through the library function."""
    from oelm.data.lm import prepare_lm

    prepare_lm(
        args.source,
        args.tokenizer,
        args.out,
        config=args.config,
        val_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        seed=args.seed,
        max_docs=args.max_docs,
        workers=args.workers,
        text_field=args.text_field,
        overwrite=args.overwrite,
    )
    return 0
