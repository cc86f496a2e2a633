"""Which speculative methods a deployment can run, as a constraint on `spec.method` (issue 37, part 3).

The profile's `drafter.available` lists the methods the model has published drafters for, plus the host-side
ones (n-gram, suffix) and none (profiler/drafter.py). A study searches `spec.method` only over those, so a bundle
never deploys a method it has no drafter for (DSpark without a DSpark checkpoint above all). The chosen drafter's
own method is runnable too (a committed or folder DSpark drafter is not in the catalogue's list). An explicit
`--drafter METHOD|ID|FOLDER` fixes the method to the one chosen; `--drafter none` (design a DSpark drafter to train)
and profiles without `available` (stored before it existed) keep the old behaviour: no constraint, DSpark.
"""

from __future__ import annotations

from typing import Any

from profiler.schema import Profile

DEPLOYMENT_PRIORITY = 10_000  # what the deployment has drafters for outranks every rule (as a checkpoint does)
SPEC_METHODS = ("dspark", "dflash", "eagle3", "mtp", "draft_model", "ngram", "suffix")  # spec.method's domain


def runnable_methods(profile: Profile) -> list[str] | None:
    """The speculative methods this deployment can run, in the profile's order (its drafter's method first);
    None when the profile does not say (no constraint)."""
    d = profile.drafter
    if d.available is None or d.chosen == "none":
        return None
    explicit = d.chosen not in (None, "auto")
    if explicit and d.method:
        return [d.method]
    got = [m for m in d.available if m in SPEC_METHODS]
    if d.method in SPEC_METHODS and d.method not in got:
        got.insert(0, d.method)
    if "dspark" in got and not d.id:  # a DSpark deployment needs a checkpoint the bundle can name
        got.remove("dspark")
    if d.method in got:
        got.insert(0, got.pop(got.index(d.method)))
    return got


def method_actions(profile: Profile) -> list[dict[str, Any]]:
    """The `spec.method` actions of the deployment's drafters: choices among what it can run, preferring the drafter
    it was profiled with (a single method is a set)."""
    got = runnable_methods(profile)
    if not got:
        return []
    if len(got) == 1:
        return [{"param": "spec.method", "set": got[0]}]
    return [{"param": "spec.method", "choices": got, "prefer": got[0]}]
