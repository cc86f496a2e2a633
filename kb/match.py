"""Profile -> Plan: which rules fire, and what they fix, search, prefer and advise.

Resolution, per parameter:
- constraints (range, choices, forbid) of all fired rules intersect; an empty intersection is an
  error naming both rules;
- `set` values resolve by priority, then specificity (number of leaf conditions); a tie with
  different values is an error; a set outside a constraint of equal or higher precedence is an
  error, below it the set wins;
- a space narrowed to one value becomes fixed; the highest-precedence `prefer` inside the space
  wins. Every resolution is recorded in `resolutions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from kb.errors import PlanConflict
from kb.fields import flatten
from kb.params import param_spec
from kb.rules import Action, evaluate
from kb.sync import StoredRule
from profiler.schema import Profile


class FixedEntry(BaseModel):
    value: Any
    rules: list[str]
    why: str


class SpaceEntry(BaseModel):
    kind: str  # "range" | "choices"
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    log: bool = False
    choices: list[Any] | None = None
    exclude: list[Any] = []  # values forbidden inside a numeric range
    type: str = "float"  # int | float | bool | cat
    rules: list[str]
    why: str


class PreferEntry(BaseModel):
    value: Any
    rules: list[str]


class AdviceEntry(BaseModel):
    text: str
    param: str | None = None
    rules: list[str]


class FiredRule(BaseModel):
    id: str
    version: int
    title: str
    priority: int
    category: str


class Plan(BaseModel):
    fixed: dict[str, FixedEntry] = {}
    space: dict[str, SpaceEntry] = {}
    prefer: dict[str, PreferEntry] = {}
    advice: list[AdviceEntry] = []
    resolutions: list[str] = []
    fired: list[FiredRule] = []

    def rule_refs(self) -> list[dict[str, Any]]:
        return [{"id": f.id, "version": f.version} for f in self.fired]


@dataclass(frozen=True)
class _Contrib:
    rule_id: str
    priority: int
    specificity: int
    action: Action

    @property
    def rank(self) -> tuple[int, int]:
        return self.priority, self.specificity

    def label(self) -> str:
        return f"{self.rule_id} (priority {self.priority}, specificity {self.specificity})"


def _ordered(contribs: list[_Contrib]) -> list[_Contrib]:
    return sorted(contribs, key=lambda c: (-c.priority, -c.specificity, c.rule_id))


class _Space:
    """The feasible set of one parameter while constraints are intersected."""

    def __init__(self, param: str) -> None:
        spec = param_spec(param)
        assert spec is not None  # rules were validated against the registry
        self.type = spec.type
        self.choices: list[Any] | None = None
        self.low = self.high = None
        self.step: float | int | None = None
        self.log = False
        self.exclude: list[Any] = []
        if spec.type == "bool":
            self.choices = [False, True]
        elif spec.type == "cat":
            self.choices = list(spec.domain) if spec.domain else None
        elif spec.domain:
            self.low, self.high = spec.domain
        self.narrowed_by: list[_Contrib] = []  # contributions that narrowed the space

    def admits(self, v: Any) -> bool:
        if self.choices is not None and v not in self.choices:
            return False
        if self.low is not None and not (self.low <= v <= self.high):
            return False
        return v not in self.exclude

    def apply(self, c: _Contrib) -> bool:
        """Intersect with one constraint; False when the result is empty."""
        a = c.action
        if a.range_ is not None:
            lo, hi = a.range_
            if self.choices is not None:
                self.choices = [v for v in self.choices if isinstance(v, (int, float)) and lo <= v <= hi]
            else:
                self.low = lo if self.low is None else max(self.low, lo)
                self.high = hi if self.high is None else min(self.high, hi)
                self.step = a.step or self.step
                self.log = self.log or a.log
        elif a.choices is not None:
            if self.choices is None and self.low is not None:
                self.choices = [v for v in a.choices if self.low <= v <= self.high]
                self.low = self.high = None
            else:
                self.choices = [v for v in (self.choices if self.choices is not None else a.choices)
                                if v in a.choices]
        elif a.forbid is not None:
            if self.choices is not None:
                self.choices = [v for v in self.choices if v not in a.forbid]
            else:
                self.exclude += [v for v in a.forbid if v not in self.exclude]
        self.narrowed_by.append(c)
        return not self.empty()

    def empty(self) -> bool:
        if self.choices is not None:
            return not [v for v in self.choices if v not in self.exclude]
        if self.low is not None and self.low > self.high:
            return True
        if self.low is not None and self.low == self.high and self.low in self.exclude:
            return True
        return False

    def single(self) -> Any | None:
        if self.choices is not None and len(self.choices) == 1:
            return self.choices[0]
        if self.choices is None and self.low is not None and self.low == self.high:
            return self.low
        return None

    def describe(self) -> str:
        if self.choices is not None:
            return f"choices {self.choices}"
        ex = f" except {self.exclude}" if self.exclude else ""
        return f"range [{self.low}, {self.high}]{ex}"


def match_profile(rules: list[StoredRule], profile: Profile, feasible: bool = True) -> Plan:
    """Fire the rules on the profile and resolve their actions into a plan; `feasible`: then narrow the parallel
    layout and weight dtype to what runs (kb/feasible.py; off only to see what the rules alone say)."""
    flat = flatten(profile)
    plan = Plan()
    by_param: dict[str, list[_Contrib]] = {}
    for sr in rules:
        rule = sr.rule
        if not evaluate(rule.when, flat):
            continue
        plan.fired.append(FiredRule(id=rule.id, version=sr.version, title=rule.title, priority=rule.priority,
                                    category=rule.category))
        for action in rule.then:
            concrete = action.resolved(flat)
            if concrete is None:
                plan.resolutions.append(f"{action.param}: {rule.id}'s range around {action.around} skipped: the "
                                        "profile has no such value")
                continue
            if concrete is not action:
                plan.resolutions.append(f"{action.param}: {rule.id} ranges {concrete.range_} around {action.around} "
                                        f"= {flat[action.around]!r}")
            action = concrete
            if action.kind == "advise":
                plan.advice.append(AdviceEntry(text=action.advise, param=action.param, rules=[rule.id]))
            else:
                by_param.setdefault(action.param, []).append(
                    _Contrib(rule.id, rule.priority, rule.specificity(), action))
    for c in checkpoint_constraints(profile):
        by_param.setdefault(c.action.param, []).append(c)
        plan.resolutions.append(f"{c.action.param}: {_show(c.action)} from the drafter checkpoint "
                                f"{profile.drafter.id} (profile drafter.*; a checkpoint outranks every rule)")
    for c in method_constraints(profile):
        by_param.setdefault(c.action.param, []).append(c)
        plan.resolutions.append(f"{c.action.param}: {_show(c.action)}: the methods this deployment has drafters for "
                                "(profile drafter.available; they outrank every rule)")
    for param in sorted(by_param):
        _resolve(param, by_param[param], plan)
    if feasible:
        from kb.feasible import apply_feasibility  # after the rules: what runs at all narrows what they planned

        apply_feasibility(plan, profile)
    return _fix_unsearched(plan)


CHECKPOINT_PRIORITY = 10_000  # above any rule's priority: no rule can change the checkpoint that is deployed


def checkpoint_constraints(profile: Profile) -> list[_Contrib]:
    """What the deployed drafter checkpoint fixes (profile `drafter.*`): its head (or the heads on offer), its
    depth, and at most the block it was trained for (it drafts no further)."""
    d = profile.drafter
    if not d.id:
        return []
    label = f"drafter:{d.id}"
    acts: list[dict[str, Any]] = []
    if d.heads:
        acts.append({"param": "spec.head", "set": d.heads[0]} if len(d.heads) == 1 else
                    {"param": "spec.head", "choices": list(d.heads)})
    if d.layers:
        acts.append({"param": "spec.draft_layers", "set": d.layers})
    if d.block_size:
        acts.append({"param": "spec.block_size", "range": [1, d.block_size]})
    return [_Contrib(label, CHECKPOINT_PRIORITY, 1, Action.model_validate(a)) for a in acts]


def method_constraints(profile: Profile) -> list[_Contrib]:
    """`spec.method` restricted to what the deployment can run (kb/method_choice.py)."""
    from kb.method_choice import DEPLOYMENT_PRIORITY, method_actions

    return [_Contrib("drafter:available", DEPLOYMENT_PRIORITY, 1, Action.model_validate(a))
            for a in method_actions(profile)]


def _resolve(param: str, contribs: list[_Contrib], plan: Plan) -> None:
    ordered = _ordered(contribs)
    constraints = [c for c in ordered if c.action.kind in ("range", "choices", "forbid")]
    sets = [c for c in ordered if c.action.kind == "set"]
    prefers = [c for c in ordered if c.action.prefer is not None]

    space = _Space(param)
    for c in constraints:
        before = list(space.narrowed_by)
        if not space.apply(c):
            other = _culprit(param, before, c)
            raise PlanConflict(f"{param}: {c.label()} and {other.label()} leave no feasible value "
                               f"({_show(c.action)} vs {_show(other.action)}); change a condition or a range")

    if sets:
        top = sets[0]
        value = top.action.set_
        for other in sets[1:]:
            if other.action.set_ != value:
                if other.rank == top.rank:
                    raise PlanConflict(f"{param}: {top.label()} sets {value!r} but {other.label()} sets "
                                       f"{other.action.set_!r}; give one a higher priority")
                plan.resolutions.append(f"{param}: {top.rule_id} sets {value!r} over {other.rule_id}'s "
                                        f"{other.action.set_!r} (higher priority/specificity)")
        for c in constraints:
            single = _Space(param)
            single.apply(c)
            if not single.admits(value):
                if c.rank >= top.rank:
                    raise PlanConflict(f"{param}: {top.label()} sets {value!r} outside {c.label()}'s "
                                       f"{_show(c.action)}; give the setter a higher priority or fix the range")
                plan.resolutions.append(f"{param}: {top.rule_id} sets {value!r}, overriding {c.rule_id}'s "
                                        f"{_show(c.action)} (higher priority/specificity)")
        setters = [c.rule_id for c in sets if c.action.set_ == value]
        plan.fixed[param] = FixedEntry(value=value, rules=setters, why=f"set by {top.rule_id}")
        if prefers:
            plan.resolutions.append(f"{param}: fixed to {value!r}, so preferences of "
                                    f"{', '.join(p.rule_id for p in prefers)} do not apply")
        return

    rule_ids = [c.rule_id for c in constraints]
    if constraints:
        one = space.single()
        if one is not None:
            plan.fixed[param] = FixedEntry(value=one, rules=rule_ids,
                                           why=f"{space.describe()} leaves a single value")
            plan.resolutions.append(f"{param}: the constraints of {', '.join(rule_ids)} leave only {one!r}")
            return
        plan.space[param] = SpaceEntry(
            kind="choices" if space.choices is not None else "range", low=space.low, high=space.high,
            step=space.step, log=space.log, choices=space.choices, exclude=space.exclude, type=space.type,
            rules=rule_ids, why=space.describe() + " from " + ", ".join(rule_ids))
    for p in prefers:
        if space.admits(p.action.prefer):
            plan.prefer[param] = PreferEntry(value=p.action.prefer, rules=[p.rule_id])
            losers = [q.rule_id for q in prefers if q is not p and q.action.prefer != p.action.prefer]
            if losers:
                plan.resolutions.append(f"{param}: prefer {p.action.prefer!r} from {p.rule_id} over "
                                        f"{', '.join(losers)} (higher priority/specificity)")
            break
        plan.resolutions.append(f"{param}: {p.rule_id}'s preference {p.action.prefer!r} lies outside "
                                f"{space.describe()}; ignored")


def _fix_unsearched(plan: Plan) -> Plan:
    """A parameter only an exporter reads is never searched (no evaluator would see its value): what is left of its
    space after the rules and feasibility is fixed at the preference it admits, else at the first value it allows."""
    for param in sorted(plan.space):
        spec = param_spec(param)
        if spec is None or spec.searchable:
            continue
        e = plan.space.pop(param)
        pref = plan.prefer.pop(param, None)
        if pref is not None:
            value, why = pref.value, f"preferred by {', '.join(pref.rules)}"
        elif e.choices is not None:
            value, why = next(v for v in e.choices if v not in e.exclude), f"first of {e.choices}"
        else:
            value, why = e.low, f"low end of [{e.low}, {e.high}]"
        rules = list(dict.fromkeys([*(pref.rules if pref else []), *e.rules]))
        plan.fixed[param] = FixedEntry(value=value, rules=rules, why=f"{why}; exported only, so not searched")
        plan.resolutions.append(f"{param}: fixed to {value!r} ({why}): only an exporter reads it, so no search could "
                                "tell its values apart")
    return plan


def _culprit(param: str, applied: list[_Contrib], failing: _Contrib) -> _Contrib:
    """The earlier constraint that, with `failing` alone, already empties the space."""
    for c in applied:
        pair = _Space(param)
        pair.apply(c)
        if not pair.apply(failing):
            return c
    return applied[-1] if applied else failing


def _show(a: Action) -> str:
    if a.range_ is not None:
        return f"range {a.range_}"
    if a.choices is not None:
        return f"choices {a.choices}"
    if a.forbid is not None:
        return f"forbid {a.forbid}"
    return f"set {a.set_!r}"
