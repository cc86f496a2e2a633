"""Errors the profiler reports to a user (unknown model or GPU, unreadable config)."""


class ProfileError(Exception):
    """A one-line, user-facing problem: what, where, how to fix."""
