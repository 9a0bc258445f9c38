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
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oelm.hf.build import param_summary

    s = param_summary(args.model, args.method, args.num_labels)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    labels = f", {s['num_labels']} labels" if s["num_labels"] else ""
    print(f"model      {s['model']} ({s['family']}{labels})")
    print(f"method     {s['method']}")
    print(f"total      {s['total']:>14,}")
    print(f"trainable  {s['trainable']:>14,}  ({100 * (1 - s['frozen_fraction']):.1f}%)")
    print(f"frozen     {s['frozen']:>14,}  ({100 * s['frozen_fraction']:.1f}%)")
    print(f"max |W_h W_h^T - I| over frozen orthogonal heads: {s['max_orthogonality_error']:.2e}")
    return 0
