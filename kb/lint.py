"""`rules lint`: load errors, rules that can never fire, contradictory rules that can fire together, rules on
parameters nothing reads.

Satisfiability is decided on a disjunctive normal form of each condition, per field: the allowed
values (eq / in, narrowed by the field's Literal domain), excluded values, numeric bounds and
presence. Regular expressions are taken as satisfiable. Forms that grow past a bound are taken
as satisfiable too, so lint never reports a false "never fires".
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kb.errors import PlanConflict
from kb.fields import lookup_field
from kb.loader import LoadedRule, load_all
from kb.match import Plan, _Contrib, _resolve
from kb.params import param_spec
from kb.rules import All, AnyOf, Leaf, Not, Rule

MAX_TERMS = 256
MAX_PAIRS = 20_000  # pairs of rules on one parameter compared (the shipped catalogue has ~460; each costs ~0.2 ms)
MAX_CONTRADICTIONS = 100  # contradiction findings reported before lint stops comparing
Literal_ = tuple[Leaf, bool]  # (leaf, negated)


@dataclass(frozen=True)
class Finding:
    kind: str  # error | never_fires | contradiction | inert | unsearchable
    message: str  # one line, with file:line and rule id
    rules: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "rules": list(self.rules)}


def _dnf(cond: Any, negated: bool = False) -> list[list[Literal_]] | None:
    """Condition as a list of conjunctions of (leaf, negated); None when it grows too large."""
    if cond is None:
        return [[]]
    if isinstance(cond, Leaf):
        return [[(cond, negated)]]
    if isinstance(cond, Not):
        return _dnf(cond.not_, not negated)
    items = cond.all if isinstance(cond, All) else cond.any if isinstance(cond, AnyOf) else None
    if items is None:
        return None
    conjunctive = isinstance(cond, All) != negated  # De Morgan
    parts = [_dnf(c, negated) for c in items]
    if any(p is None for p in parts):
        return None
    if not conjunctive:
        out = [t for p in parts for t in p]
        return out if len(out) <= MAX_TERMS else None
    out: list[list[Literal_]] = [[]]
    for p in parts:
        out = [a + b for a in out for b in p]
        if len(out) > MAX_TERMS:
            return None
    return out


@dataclass
class _FieldState:
    present: bool | None = None
    allowed: set[Any] | None = None
    excluded: set[Any] = field(default_factory=set)
    lo: float = -math.inf
    lo_strict: bool = False
    hi: float = math.inf
    hi_strict: bool = False
    neg_bounds: list[tuple[str, float]] = field(default_factory=list)  # from not(lt/le/gt/ge)

    def bound(self, op: str, v: float) -> None:
        if op in ("gt", "ge") and (v > self.lo or (v == self.lo and op == "gt")):
            self.lo, self.lo_strict = v, op == "gt"
        if op in ("lt", "le") and (v < self.hi or (v == self.hi and op == "lt")):
            self.hi, self.hi_strict = v, op == "lt"

    def in_bounds(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return self.lo == -math.inf and self.hi == math.inf
        return (v > self.lo or (v == self.lo and not self.lo_strict)) and \
               (v < self.hi or (v == self.hi and not self.hi_strict))

    def consistent(self) -> bool:
        if self.present is False:
            return self.allowed is None and self.lo == -math.inf and self.hi == math.inf
        if self.lo > self.hi or (self.lo == self.hi and (self.lo_strict or self.hi_strict)):
            return False
        if self.allowed is not None:
            return any(v not in self.excluded and self.in_bounds(v) for v in self.allowed)
        return True


_NEGATE = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}


def _conjunct_satisfiable(lits: list[Literal_]) -> bool:
    states: dict[str, _FieldState] = {}
    for leaf, neg in lits:
        st = states.setdefault(leaf.field, _FieldState())
        info = lookup_field(leaf.field)
        if info is not None and info.choices and st.allowed is None:
            st.allowed = set(info.choices)
        op, v = leaf.op, leaf.value
        if op == "exists":
            want = v != neg
            if st.present is not None and st.present != want:
                return False
            st.present = want
            continue
        if neg:
            # not(leaf) also holds when the field is absent; it only narrows a present field.
            if op == "eq":
                st.excluded.add(v)
            elif op == "in":
                st.excluded |= set(v)
            elif op in _NEGATE:
                st.neg_bounds.append((_NEGATE[op], v))
            continue
        st.present = True if st.present is None else st.present
        if st.present is False:
            return False
        if op == "eq":
            st.allowed = {v} if st.allowed is None else {x for x in st.allowed if x == v}
        elif op == "in":
            st.allowed = set(v) if st.allowed is None else {x for x in st.allowed if x in v}
        elif op == "ne":
            st.excluded.add(v)
        elif op == "not_in":
            st.excluded |= set(v)
        elif op in ("lt", "le", "gt", "ge"):
            st.bound(op, v)
        elif op == "between":
            st.bound("ge", v[0])
            st.bound("le", v[1])
    for st in states.values():
        if st.present is None:
            continue  # only negated literals: an absent field satisfies them all
        if st.present:
            for op, v in st.neg_bounds:
                st.bound(op, v)
        if not st.consistent():
            return False
    return True


def satisfiable(*conds: Any) -> bool:
    """Whether some profile makes all the conditions true at once."""
    forms = [_dnf(c) for c in conds]
    if any(f is None for f in forms):
        return True
    total = 1
    for f in forms:
        total *= max(1, len(f))
    if total > MAX_TERMS * 4:
        return True
    return any(_conjunct_satisfiable([lit for term in combo for lit in term])
               for combo in itertools.product(*forms))


def _contradiction(a: Rule, b: Rule) -> str | None:
    """Why two rules' actions cannot both hold, or None."""
    params = {x.param for x in a.then if x.param and x.kind != "advise" and x.around is None} & \
             {x.param for x in b.then if x.param and x.kind != "advise" and x.around is None}
    for param in sorted(params):
        contribs = [_Contrib(r.id, r.priority, r.specificity(), x)  # an `around` range is known only per profile
                    for r in (a, b) for x in r.then if x.param == param and x.kind != "advise" and x.around is None]
        try:
            _resolve(param, contribs, Plan())
        except PlanConflict as e:
            return str(e)
    return None


def _param_findings(lr: LoadedRule) -> list[Finding]:
    """A rule on a parameter nothing reads (inert), or a range on one only an exporter reads (it cannot be
    searched, so the value it would export is arbitrary)."""
    out = []
    for a in lr.rule.then:
        spec = param_spec(a.param) if a.param else None
        if spec is None:
            continue
        if not spec.readers:
            out.append(Finding("inert", f"{lr.file}:{lr.line} (rule {lr.id}): {a.param} is read by no engine, "
                               "simulator or exporter (kb/catalog/params.yaml readers); wire it or drop the action",
                               (lr.id,)))
        elif (a.range_ is not None or a.around is not None) and not spec.searchable and a.prefer is None:
            out.append(Finding("unsearchable", f"{lr.file}:{lr.line} (rule {lr.id}): a range on {a.param}, which "
                               f"only {', '.join(spec.readers)} read(s), is never searched; set a value or prefer one",
                               (lr.id,)))
    return out


def lint_rules(directory: Path) -> tuple[list[LoadedRule], list[Finding]]:
    """Every problem of a rules folder; an empty list of findings means clean."""
    rules, errors = load_all(directory)
    findings = [Finding("error", str(e), (e.rule_id,) if e.rule_id else ()) for e in errors]
    for lr in rules:
        findings += _param_findings(lr)
        if not satisfiable(lr.rule.when):
            findings.append(Finding("never_fires", f"{lr.file}:{lr.line} (rule {lr.id}): its condition can "
                                    "never hold for any profile; fix the condition", (lr.id,)))
    by_param: dict[str, list[LoadedRule]] = {}
    for lr in rules:
        for p in {x.param for x in lr.rule.then if x.param and x.kind != "advise"}:
            by_param.setdefault(p, []).append(lr)
    findings += _contradictions(by_param)
    return rules, findings


def _contradictions(by_param: dict[str, list[LoadedRule]]) -> list[Finding]:
    """Pairs of rules on one parameter that can fire together and contradict. The comparison is quadratic, so it
    stops after MAX_PAIRS pairs or MAX_CONTRADICTIONS findings, with one finding that says so (lint of a huge or
    generated folder then ends in seconds, not hours)."""
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for param, group in by_param.items():
        for x, y in itertools.combinations(group, 2):
            key = (min(x.id, y.id), max(x.id, y.id))
            if key in seen:
                continue
            if len(seen) >= MAX_PAIRS or len(out) >= MAX_CONTRADICTIONS:
                limit = (f"{MAX_CONTRADICTIONS} contradictions" if len(out) >= MAX_CONTRADICTIONS
                         else f"{MAX_PAIRS} pairs of rules on one parameter")
                return out + [Finding("error", f"lint stopped comparing rules after {limit} ({len(group)} rules act "
                                      f"on {param}); fix those reported, or lint a smaller folder")]
            seen.add(key)
            why = _contradiction(x.rule, y.rule)
            if why and satisfiable(x.rule.when, y.rule.when):
                out.append(Finding("contradiction", f"{x.file}:{x.line} and {y.file}:{y.line} can fire "
                                   f"together and contradict: {why}", key))
    return out
