"""Errors the knowledge base reports to a user: one line, what, where and how to fix."""

from __future__ import annotations


class KBError(Exception):
    """A problem with the user's input or environment (rules, database), not a bug."""


class RuleError(KBError):
    """A rule file or rule that cannot be loaded; the message names the file, line and rule id."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 rule_id: str | None = None) -> None:
        where = ""
        if file:
            where = f"{file}:{line}" if line else file
        if rule_id:
            where = f"{where} (rule {rule_id})" if where else f"rule {rule_id}"
        super().__init__(f"{where}: {message}" if where else message)
        self.file, self.line, self.rule_id, self.reason = file, line, rule_id, message


class PlanConflict(KBError):
    """Two fired rules whose constraints on one parameter cannot both hold."""
