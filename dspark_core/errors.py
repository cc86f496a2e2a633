"""Errors the engine reports to a user (bad config, missing checkpoint, bad prompt file)."""


class DSparkError(Exception):
    """A one-line, user-facing problem: what, where, how to fix."""


class EngineBusy(DSparkError):
    """The engine refused a change because requests are in flight (serve answers 409: retry when idle)."""
