"""Subprocess entry of `oelm sweep --parallel`: train one run from a JSON config file."""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    """Train the run described by argv[0] (a JSON TrainConfig dict)."""
    import torch

    threads = int(os.environ.get("OELM_THREADS", "0"))
    if threads > 0:  # N runs share the machine's cores instead of each grabbing all of them
        torch.set_num_threads(threads)
    from oelm.training.loop import train

    with open(argv[0], encoding="utf-8") as f:
        train(json.load(f))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
