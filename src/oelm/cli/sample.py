"""`oelm sample RUN_DIR --prompt "..." --tokens N`: generate text from a trained LM run."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `sample` subcommand."""
    p = subparsers.add_parser("sample", help="generate text from a trained LM run directory")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--prompt", default="", help="text to continue (default: start of a document)")
    p.add_argument("--tokens", type=int, default=100, help="number of tokens to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default="best", help="best, last, or a step number")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the prompt followed by the sampled continuation."""
    from oelm.training.sample import sample

    print(
        sample(
            args.run_dir,
            args.prompt,
            args.tokens,
            args.temperature,
            args.top_k,
            args.seed,
            args.checkpoint,
            args.device,
        )
    )
    return 0
