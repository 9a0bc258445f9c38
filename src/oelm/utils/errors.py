"""Errors meant for the user: one clear message naming the problem and the fix."""


class UserError(ValueError):
    """A bad input (config, data, model name...) detected before any work starts."""
