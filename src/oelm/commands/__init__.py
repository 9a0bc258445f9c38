"""Subcommands of the `oelm` CLI; each module is a few lines over a library function."""
