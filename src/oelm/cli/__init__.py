"""The `oelm` command: a thin layer over library functions, one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import sys

from oelm import __version__
from oelm.utils.errors import AgreedRefusal, Interrupted, UserError

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
    "confirm",
]


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (problem + where to look), exit code 2, no usage dump."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


class _StderrHandler(logging.StreamHandler):
    """Writes to the current sys.stderr (not the one at set-up), so redirection and capture work."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the property decides
        pass


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        return f"oelm: warning: {text}" if record.levelno >= logging.WARNING else text


def configure_logging(level: int) -> None:
    """Messages of the `oelm` loggers on stderr at `level` (INFO by default, -q WARNING, -v DEBUG).

    Library users who never call this get Python's defaults: warnings shown, notes not.
    """
    logger = logging.getLogger("oelm")
    for handler in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(_Format())
    logger.addHandler(handler)
    logger.setLevel(level)


def _positive_finite(text: str) -> float:
    """A margin: a finite number > 0 (inf would call every gap equivalent, nan none)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def add_margin_flag(parser: argparse.ArgumentParser, text: str | None = None) -> None:
    """--margin, the equivalence margin of reports and boards (one flag name for every command);
    `text`: its help where the unit depends on the page (the fine-tuning view measures in points)."""
    parser.add_argument(
        "--margin",
        type=_positive_finite,
        default=1.0,  # = oelm.reports.stats.MARGIN (not imported here: `oelm --help` stays fast)
        help=text
        or "equivalence margin in %% of the reference's metric: a gap is called 'equivalent within "
        "±MARGIN%%' only when the TOST (Holm-adjusted) shows it lies inside (default 1)",
    )
    refuse_renamed_flag(parser, "--margin-points", "--margin")


class _Renamed(argparse.Action):
    """An old flag spelling: refused with one line naming the flag that replaced it."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} is now {self.new} (same meaning); pass {self.new}")


def refuse_renamed_flag(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Refuse `old` (hidden from --help) with a one-line hint naming `new`: one name per concept,
    and an old spelling never silently accepted (issue 50)."""
    parser.add_argument(old, action=_Renamed, new=new, dest=f"renamed_{old.lstrip('-').replace('-', '_')}")


def add_baseline_flag(parser: argparse.ArgumentParser, default: str | None, text: str) -> None:
    """--baseline, the control arm every other arm is compared with (one name for every command;
    the old --reference is refused with a hint)."""
    parser.add_argument("--baseline", default=default, help=text)
    refuse_renamed_flag(parser, "--reference", "--baseline")


def add_executor_flags(parser: argparse.ArgumentParser) -> None:
    """--executor and --executor-option: where a sweep's runs train (one wording for every command)."""
    parser.add_argument(
        "--executor",
        default="local",
        choices=("local", "submitit", "ray"),  # = oelm.experiments.executors.EXECUTORS
        help="where runs train: local worker processes (default), Slurm through submitit, or Ray; "
        "--parallel is then the number of runs in flight (docs/distributed.md)",
    )
    parser.add_argument(
        "--executor-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="executor option, repeatable: submitit partition, gpus_per_run, cpus_per_run, timeout_min, "
        "mem_gb, account, qos, constraint, cluster (auto/slurm/local); ray address, gpus_per_run, cpus_per_run",
    )


def executor_of(args: argparse.Namespace):  # noqa: ANN201 (the type lives in oelm.experiments, imported on use)
    """The validated executor of parsed flags (imports the experiments layer on use)."""
    from oelm.experiments.executors import ExecutorSpec

    return ExecutorSpec.parse(args.executor, args.executor_option)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every registered subcommand."""
    parser = Parser(
        prog="oelm",
        description="Orthogonal ELM Transformers: frozen head-wise orthogonal Q/K, compared fairly.",
    )
    parser.add_argument("--version", action="version", version=f"oelm {__version__}")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="print only warnings and errors on stderr")
    loud.add_argument("-v", "--verbose", action="store_true", help="also print debug messages")
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
    configure_logging(logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO)
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
        code = getattr(err, "exit_code", 2)
        if isinstance(err, AgreedRefusal) and os.environ.get("TORCHELASTIC_RUN_ID"):
            # Every rank refused together: leave now, each with this code, before torchrun's
            # SIGTERM (sent once the first rank has exited) reaches a rank still shutting down.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    except KeyboardInterrupt:  # Ctrl-C outside a training loop (or a second one inside it)
        print("oelm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
