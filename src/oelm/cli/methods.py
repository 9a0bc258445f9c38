"""`oelm methods`: list the registered methods, one line each."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("methods", help="list the registered methods")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from oelm.core.methods import list_methods

    methods = list_methods()
    if args.json:
        print(json.dumps([m.to_dict() for m in methods], indent=2))
        return 0
    width = max(len(m.name) for m in methods)
    for m in methods:
        own = ", ".join(f"{o.name}={o.default}" for o in m.options)
        print(f"{m.name:<{width}}  {m.summary}" + (f"  [{own}]" if own else ""))
    print(
        "\nEvery method takes method_options.layers (all | lower-half | upper-half | every-other | [i, ...]) "
        "and method_options.qk_init (pretrained models: reinit | orthogonalize | keep)."
    )
    return 0
