"""`oelm export RUN_DIR --to hf OUT_DIR`: a trained GPT or Llama as a standard Hugging Face folder."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `export` subcommand."""
    p = subparsers.add_parser(
        "export", help="write a trained GPT / Llama run as a Hugging Face GPT2LMHeadModel / LlamaForCausalLM folder"
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument(
        "--to", choices=["hf"], required=True, help="target format (hf: GPT2LMHeadModel or LlamaForCausalLM)"
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="new (or empty) folder to write")
    p.add_argument("--checkpoint", default="best", help="best, latest, or a step number")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUT_DIR when it holds a previous oelm export (and nothing else)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Export and print what was written, the logit check and the tokenizer note."""
    import os

    import torch

    from oelm.hf.export import export_hf

    # transformers' save_pretrained imports DeepSpeed when it is installed, and DeepSpeed then warns
    # that it "set the accelerator to CPU": noise on a machine without a GPU, where CPU is right.
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    report = export_hf(args.run_dir, args.out_dir, which=args.checkpoint, overwrite=args.overwrite)
    print(f"wrote {report['architecture']} to {report['out_dir']}")
    print(f"max |logit difference| vs oelm.load_model on random input: {report['max_abs_logit_diff']:.2e}")
    print(report["tokenizer"])
    return 0
