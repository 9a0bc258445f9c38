"""Worker process of `oelm sweep --parallel`: train the runs the sweep hands it, one at a time.

`python -m oelm.experiments.worker --serve LOGS` reads one path per line on stdin (a JSON
TrainConfig dict the sweep wrote under LOGS), trains that run, and answers one JSON line on
stdout: {"out": run directory, "error": null} when it trained, else the error. Everything else
the run prints goes to stderr (the sweep's LOGS/worker<slot>.log). End of input ends the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import traceback
from collections.abc import Iterable
from typing import Any, TextIO

import torch

from oelm.training.loop import train
from oelm.utils.env import env_count
from oelm.utils.errors import Interrupted, UserError


def serve(lines: Iterable[str], answer: TextIO) -> int:
    """Train the run of each config path read from `lines`; write one answer line each to `answer`."""
    for line in lines:
        path = line.strip()
        if not path:
            continue
        error = None
        config: dict[str, Any] = {}
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
            print(f"== {config.get('out')}", flush=True)
            train(config)
        except Interrupted as err:  # stopped by the sweep (or a signal): checkpoint written, stop here
            print(f"oelm: {err}", flush=True)
            answer.write(json.dumps({"out": config.get("out"), "error": str(err)}) + "\n")
            answer.flush()
            return err.exit_code
        except UserError as err:
            print(f"oelm: {err}", flush=True)
            error = str(err)
        except Exception:  # noqa: BLE001 (reported to the sweep; the worker takes the next run)
            traceback.print_exc()
            error = traceback.format_exc(limit=3)
        answer.write(json.dumps({"out": config.get("out"), "error": error}) + "\n")
        answer.flush()
    return 0


def stop_with_parent() -> None:
    """Linux: get SIGTERM when the sweep's process dies (even by kill -9), so an orphaned worker
    checkpoints its run and stops instead of training on (elsewhere: it stops at its next run)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG


def main(argv: list[str]) -> int:
    """`--serve LOGS`: answer on the real stdout, send everything else written there to stderr."""
    if len(argv) != 2 or argv[0] != "--serve":
        print("usage: python -m oelm.experiments.worker --serve LOGS (started by oelm sweep --parallel)")
        return 2
    stop_with_parent()
    threads = env_count("OELM_THREADS", 0)
    if threads > 0:  # N workers share the machine's cores instead of each grabbing all of them
        torch.set_num_threads(threads)
    sys.stdout.flush()
    answer = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # prints of the runs land in the log, never in the answer channel
    try:
        return serve(sys.stdin, answer)
    except KeyboardInterrupt:  # Ctrl-C in the terminal reached the idle worker too: nothing to save
        return 130
    finally:
        answer.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
