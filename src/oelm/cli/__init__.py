"""The `oelm` command: a thin layer over library functions, one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys

from oelm import __version__
from oelm.utils.errors import Interrupted, UserError

# Each name is a module `oelm.cli.<name>` exposing `register(subparsers)`, which adds
# its parser and sets `func` (a callable taking the parsed args and returning an exit code).
COMMANDS: list[str] = [
    "methods",
    "params",
    "report",
    "prepare",
    "train",
    "sample",
    "sweep",
    "compare",
    "export",
    "leaderboard",
]


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (problem + where to look), exit code 2, no usage dump."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every registered subcommand."""
    parser = Parser(
        prog="oelm",
        description="Orthogonal ELM Transformers: frozen head-wise orthogonal Q/K, compared fairly.",
    )
    parser.add_argument("--version", action="version", version=f"oelm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"oelm.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `oelm` console script."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help (0) or a bad flag (2, one line already printed)
        return int(stop.code or 0)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe surfaces here, not in the interpreter's exit
        return code
    except Interrupted as err:  # SIGINT/SIGTERM handled by the work itself: how to go on
        print(f"oelm: {err}", file=sys.stderr)
        return err.exit_code
    except UserError as err:  # one clear message, no traceback
        print(f"oelm: error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 2)
    except KeyboardInterrupt:  # Ctrl-C outside a training loop (or a second one inside it)
        print("oelm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
