"""Errors the engine reports to a user (bad config, missing checkpoint, bad prompt file)."""


class DSparkError(Exception):
    """A one-line, user-facing problem: what, where, how to fix."""
