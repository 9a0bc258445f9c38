"""`oelm params MODEL`: parameter counts of a model under a method (the study's tables)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "params",
        help="count total / trainable / frozen parameters of a model under a method",
        description="MODEL is one of our presets (gpt-*, llama-*), a Hugging Face model name, or a path to a config.json.",
    )
    p.add_argument("model")
    p.add_argument("--method", default="baseline")
    p.add_argument("--num-labels", type=int, default=None, help="build the sequence-classification variant")
    vocab = p.add_mutually_exclusive_group()
    vocab.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        metavar="N",
        help="count with this vocabulary (default: the preset's, GPT-2 BPE's 50,257, or the model's config)",
    )
    vocab.add_argument(
        "--tokenizer",
        default=None,
        metavar="SPEC",
        help="count with this tokenizer's vocabulary, as `oelm train` would (byte, gpt2, a tokenizer folder, ...)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oelm.hf.build import param_summary

    vocab_size, vocab_from = args.vocab_size, "--vocab-size" if args.vocab_size is not None else None
    if args.tokenizer is not None:
        from oelm.data.tokenizers import load_tokenizer

        vocab_size, vocab_from = load_tokenizer(args.tokenizer).vocab_size, f"tokenizer {args.tokenizer}"
    s = param_summary(args.model, args.method, args.num_labels, vocab_size=vocab_size, vocab_from=vocab_from)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    labels = f", {s['num_labels']} labels" if s["num_labels"] else ""
    print(f"model      {s['model']} ({s['family']}{labels})")
    print(f"method     {s['method']}")
    if s["vocab_size"] is not None:
        hint = "" if args.vocab_size or args.tokenizer else "; --vocab-size N or --tokenizer SPEC to change"
        print(f"vocabulary {s['vocab_size']:>14,}  ({s['vocab_source']}{hint})")
    print(f"total      {s['total']:>14,}")
    print(f"trainable  {s['trainable']:>14,}  ({100 * (1 - s['frozen_fraction']):.1f}%)")
    print(f"frozen     {s['frozen']:>14,}  ({100 * s['frozen_fraction']:.1f}%)")
    print(f"max |W_h W_h^T - I| over frozen orthogonal heads: {s['max_orthogonality_error']:.2e}")
    return 0
