"""Rule schema (pydantic) and the condition evaluator.

A rule is data: ``when`` is a tree of all / any / not over leaf conditions
``{field: <profile path>, <op>: <value>}``, interpreted here by a small evaluator (no ``eval``,
no templates, nothing executable from a rule file). ``then`` is a list of actions on tuner
parameters (DESIGN.md section 3).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from kb.fields import lookup_field
from kb.params import param_spec

Op = Literal["eq", "ne", "lt", "le", "gt", "ge", "in", "not_in", "between", "exists", "matches"]
OPS: tuple[str, ...] = Op.__args__  # type: ignore[attr-defined]
ACTION_KINDS = ("set", "range", "choices", "forbid", "prefer", "advise")
CATEGORIES = ("speculative", "quantization", "fusion", "attention", "batching", "memory", "parallelism",
              "kernels", "stability", "long_context", "moe")
Scalar = str | bool | int | float
MAX_PATTERN = 200


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Leaf(_Strict):
    """One comparison of a profile field against a constant."""

    field: str
    op: Op
    value: Any

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "op" in data:
            return data
        ops = [k for k in data if k != "field"]
        if "field" not in data or len(ops) != 1:
            raise ValueError(f"a condition is {{field: <path>, <op>: <value>}} with exactly one op of "
                             f"{', '.join(OPS)}; got keys {sorted(map(str, data))}")
        if ops[0] not in OPS:
            raise ValueError(f"unknown operator {ops[0]!r}; use one of {', '.join(OPS)}")
        return {"field": data["field"], "op": ops[0], "value": data[ops[0]]}

    @model_validator(mode="after")
    def _check(self) -> Leaf:
        info = lookup_field(self.field)
        if info is None:
            raise ValueError(f"unknown profile field {self.field!r} (see profiler/schema.py for the vocabulary)")
        v, op = self.value, self.op
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        if op in ("lt", "le", "gt", "ge") and not numeric:
            raise ValueError(f"{op} needs a number, got {v!r}")
        if op in ("lt", "le", "gt", "ge", "between") and info.kind not in ("number",):
            raise ValueError(f"{op} compares numbers but {self.field} is a {info.kind}")
        if op in ("eq", "ne") and not isinstance(v, Scalar):
            raise ValueError(f"{op} needs a scalar, got {v!r}")
        if op in ("in", "not_in") and not (isinstance(v, list) and v and all(isinstance(x, Scalar) for x in v)):
            raise ValueError(f"{op} needs a non-empty list of scalars, got {v!r}")
        if op == "between":
            ok = isinstance(v, list) and len(v) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
            if not ok or v[0] > v[1]:
                raise ValueError(f"between needs [low, high] numbers with low <= high, got {v!r}")
        if op == "exists" and not isinstance(v, bool):
            raise ValueError(f"exists needs true or false, got {v!r}")
        if op == "matches":
            if not isinstance(v, str) or len(v) > MAX_PATTERN:
                raise ValueError(f"matches needs a regular expression of at most {MAX_PATTERN} characters")
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"matches: invalid regular expression {v!r}: {e}") from None
        return self


class All(_Strict):
    all: list[Condition] = Field(min_length=1)


class AnyOf(_Strict):
    any: list[Condition] = Field(min_length=1)


class Not(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    not_: Condition = Field(alias="not")


def _cond_tag(v: Any) -> str:
    if isinstance(v, dict):
        for key, tag in (("all", "all"), ("any", "any"), ("not", "not"), ("not_", "not")):
            if key in v:
                return tag
        return "leaf"
    return {All: "all", AnyOf: "any", Not: "not"}.get(type(v), "leaf")


Condition = Annotated[
    Annotated[All, Tag("all")] | Annotated[AnyOf, Tag("any")] | Annotated[Not, Tag("not")]
    | Annotated[Leaf, Tag("leaf")],
    Discriminator(_cond_tag),
]
All.model_rebuild()
AnyOf.model_rebuild()
Not.model_rebuild()


class Action(_Strict):
    """One action on a parameter; ``prefer`` may accompany ``range`` or ``choices``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    param: str | None = None
    set_: Any = Field(None, alias="set")
    range_: list[int | float] | None = Field(None, alias="range")
    step: int | float | None = None  # optional grid step for a range
    log: bool = False  # search a range on a log scale
    choices: list[Scalar] | None = None
    forbid: list[Scalar] | None = None
    prefer: Any = None
    advise: str | None = None
    around: str | None = None  # a range around a numeric profile field's value (instead of constants)
    factor: list[float] | None = None  # with around: [low, high] multiples of the field's value
    offset: list[float] | None = None  # with around: [low, high] added to the field's value

    @property
    def kind(self) -> str:
        """The action's main kind: set, range, choices, forbid, advise, or prefer when alone."""
        if self.around is not None:
            return "range"
        for kind, val in (("set", self.set_), ("range", self.range_), ("choices", self.choices),
                          ("forbid", self.forbid), ("advise", self.advise)):
            if val is not None:
                return kind
        return "prefer"

    def resolved(self, flat: dict[str, Any]) -> Action | None:
        """This action with an `around` range turned into constants for one profile (None: the field is absent)."""
        if self.around is None:
            return self
        v = flat.get(self.around)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return None
        lo, hi = ([v * f for f in self.factor] if self.factor is not None else [v + d for d in self.offset or (0, 0)])
        spec = param_spec(self.param or "")
        if spec is not None and spec.domain:
            lo, hi = max(lo, spec.domain[0]), min(hi, spec.domain[1])
        if spec is not None and spec.type == "int":
            lo, hi = int(round(lo)), int(round(hi))
        return self.model_copy(update={"range_": [lo, max(lo, hi)], "around": None, "factor": None, "offset": None})

    def _check_around(self) -> None:
        info = lookup_field(self.around or "")
        if info is None or info.kind != "number":
            raise ValueError(f"around needs a numeric profile field, got {self.around!r}")
        bands = [b for b in (self.factor, self.offset) if b is not None]
        if len(bands) != 1 or len(bands[0]) != 2 or bands[0][0] > bands[0][1]:
            raise ValueError("around needs exactly one of factor: [low, high] or offset: [low, high] with low <= high")
        if self.factor is not None and self.factor[0] <= 0:
            raise ValueError("factor needs positive multiples")
        if any(v is not None for v in (self.set_, self.range_, self.choices, self.forbid, self.advise)):
            raise ValueError("around is a range of its own; it takes no set, range, choices, forbid or advise")
        spec = param_spec(self.param or "")
        if spec is None or spec.type not in ("int", "float"):
            raise ValueError(f"around needs a numeric parameter, got {self.param!r}")

    @model_validator(mode="after")
    def _check(self) -> Action:
        if self.around is not None:
            self._check_around()
            return self
        if self.factor is not None or self.offset is not None:
            raise ValueError("factor and offset go with around")
        given = [k for k, v in (("set", self.set_), ("range", self.range_), ("choices", self.choices),
                                ("forbid", self.forbid), ("advise", self.advise)) if v is not None]
        if len(given) > 1:
            raise ValueError(f"an action has one kind; got {' and '.join(given)}")
        if not given and self.prefer is None:
            raise ValueError(f"an action needs one of {', '.join(ACTION_KINDS)}")
        if self.prefer is not None and given and given[0] not in ("range", "choices"):
            raise ValueError("prefer may only accompany range or choices")
        if self.kind == "advise":
            if not self.advise.strip():
                raise ValueError("advise needs a non-empty text")
            if self.param is not None and param_spec(self.param) is None:
                raise ValueError(f"unknown parameter {self.param!r} (see kb/catalog/params.yaml)")
            return self
        if self.param is None:
            raise ValueError(f"a {self.kind} action needs a param")
        spec = param_spec(self.param)
        if spec is None:
            raise ValueError(f"unknown parameter {self.param!r} (see kb/catalog/params.yaml)")
        values: list[Any] = []
        if self.set_ is not None:
            values.append(self.set_)
        if self.prefer is not None:
            values.append(self.prefer)
        if self.choices is not None:
            if not self.choices:
                raise ValueError("choices needs at least one value")
            values += self.choices
        if self.forbid is not None:
            if not self.forbid:
                raise ValueError("forbid needs at least one value")
            values += self.forbid
        if self.range_ is not None:
            if spec.type not in ("int", "float"):
                raise ValueError(f"range on {self.param}, which is {spec.type}, not a number")
            if len(self.range_) != 2 or self.range_[0] > self.range_[1]:
                raise ValueError(f"range needs [low, high] with low <= high, got {self.range_}")
            if self.log and self.range_[0] <= 0:
                raise ValueError("a log range needs low > 0")
            values += self.range_
            if self.prefer is not None and not self.range_[0] <= self.prefer <= self.range_[1]:
                raise ValueError(f"prefer {self.prefer!r} lies outside range {self.range_}")
        if self.choices is not None and self.prefer is not None and self.prefer not in self.choices:
            raise ValueError(f"prefer {self.prefer!r} is not among choices {self.choices}")
        bad = [v for v in values if not spec.admits(v)]
        if bad:
            dom = f" (domain {list(spec.domain)})" if spec.domain else ""
            raise ValueError(f"{self.param} is {spec.type}{dom}; {bad[0]!r} does not fit")
        return self


class Rule(_Strict):
    """One declarative, sourced piece of deployment knowledge."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.\-]*$", max_length=120)
    title: str = Field(min_length=3)
    category: Literal[CATEGORIES]  # type: ignore[valid-type]
    when: Condition | None = None  # absent: the rule always fires
    then: list[Action] = Field(min_length=1)
    priority: int = Field(50, ge=0, le=1000)
    rationale: str = Field(min_length=10)
    references: list[str] = Field(min_length=1)
    tags: list[str] = []

    @field_validator("references")
    @classmethod
    def _refs(cls, refs: list[str]) -> list[str]:
        if any(not r.strip() for r in refs):
            raise ValueError("references must not be empty strings")
        return refs

    def content_hash(self) -> str:
        blob = json.dumps(self.model_dump(mode="json", by_alias=True, exclude_defaults=True), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)

    def specificity(self) -> int:
        """Number of leaf conditions: the more a rule says about the profile, the more specific."""
        return len(leaves(self.when)) if self.when is not None else 0


def leaves(cond: Any) -> list[Leaf]:
    if isinstance(cond, Leaf):
        return [cond]
    if isinstance(cond, All):
        return [leaf for c in cond.all for leaf in leaves(c)]
    if isinstance(cond, AnyOf):
        return [leaf for c in cond.any for leaf in leaves(c)]
    if isinstance(cond, Not):
        return leaves(cond.not_)
    return []


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def eval_leaf(leaf: Leaf, flat: dict[str, Any]) -> bool:
    """One comparison; a missing field or a value of the wrong type makes it false (exists aside)."""
    present = leaf.field in flat and flat[leaf.field] is not None
    if leaf.op == "exists":
        return present == leaf.value
    if not present:
        return False
    x, v = flat[leaf.field], leaf.value
    match leaf.op:
        case "eq":
            return type(x) is type(v) and x == v if isinstance(x, bool) or isinstance(v, bool) else x == v
        case "ne":
            return not eval_leaf(Leaf(field=leaf.field, op="eq", value=v), flat)
        case "in":
            return any(eval_leaf(Leaf(field=leaf.field, op="eq", value=e), flat) for e in v)
        case "not_in":
            return not eval_leaf(Leaf(field=leaf.field, op="in", value=v), flat)
        case "lt" | "le" | "gt" | "ge" | "between":
            if not _num(x):
                return False
            if leaf.op == "between":
                return v[0] <= x <= v[1]
            return {"lt": x < v, "le": x <= v, "gt": x > v, "ge": x >= v}[leaf.op]
        case "matches":
            return isinstance(x, str) and re.search(v, x) is not None
    return False


def evaluate(cond: Any, flat: dict[str, Any]) -> bool:
    """Whether a condition tree holds for a flattened profile (see kb.fields.flatten)."""
    if cond is None:
        return True
    if isinstance(cond, Leaf):
        return eval_leaf(cond, flat)
    if isinstance(cond, All):
        return all(evaluate(c, flat) for c in cond.all)
    if isinstance(cond, AnyOf):
        return any(evaluate(c, flat) for c in cond.any)
    if isinstance(cond, Not):
        return not evaluate(cond.not_, flat)
    raise TypeError(f"not a condition: {cond!r}")
