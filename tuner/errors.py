"""Errors the tuner reports to a user (no GPU, unknown study, SLO no config meets, unwritable --out)."""


class TunerError(Exception):
    """A one-line, user-facing problem: what, where, how to fix."""
