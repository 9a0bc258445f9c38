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
