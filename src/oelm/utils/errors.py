"""Errors meant for the user: one clear message naming the problem and the fix."""


class UserError(ValueError):
    """A bad input (config, data, model name...) detected before any work starts."""


class Interrupted(UserError):
    """SIGINT or SIGTERM stopped the work cleanly; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class Diverged(UserError):
    """The training loss became non-finite: the run stopped and recorded it (exit code 3)."""

    exit_code = 3


class AgreedRefusal(UserError):
    """A refusal every process of a distributed job raised at the same point, with the same line
    and exit code (oelm.training.distributed:share_refusal). Under torchrun each process exits as
    soon as it has printed it: torchrun SIGTERMs the others once the first has exited, and a
    process still tearing down its interpreter then would end with -15 instead of this code."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
