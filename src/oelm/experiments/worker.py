"""Worker process of `oelm sweep --parallel`: train the runs in the given JSON config files."""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch

from oelm.training.loop import train
from oelm.utils.errors import Interrupted


def main(argv: list[str]) -> int:
    """Train each run (a JSON TrainConfig dict per file) in order; a failure does not stop the rest."""

    threads = int(os.environ.get("OELM_THREADS", "0"))
    if threads > 0:  # N workers share the machine's cores instead of each grabbing all of them
        torch.set_num_threads(threads)

    failed = 0
    for path in argv:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        print(f"== {config.get('out')}", flush=True)
        try:
            train(config)
        except Interrupted as err:  # stopped by the sweep (or a signal): checkpoint written, stop here
            print(f"oelm: {err}", flush=True)
            return err.exit_code
        except Exception:  # noqa: BLE001 (reported in the log; the parent marks the run failed)
            traceback.print_exc()
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
