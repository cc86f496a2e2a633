"""Rich rendering of a plan: fixed, searched, preferred, advised, and why."""

from __future__ import annotations

from rich.table import Table

from kb.cli_common import console
from kb.match import Plan
from profiler.schema import Profile


def print_plan(plan: Plan, plan_id: int, profile_id: int, profile: Profile) -> None:
    who = " on ".join(x for x in (profile.model.name, profile.hw.name) if x) or "profile"
    console.print(f"[bold]Plan #{plan_id}[/] for {who} (profile #{profile_id}): "
                  f"{len(plan.fired)} rules fired")
    if plan.fixed:
        t = Table(title="fixed")
        for col in ("param", "value", "why", "rules"):
            t.add_column(col)
        for k, e in plan.fixed.items():
            t.add_row(k, repr(e.value), e.why, ", ".join(e.rules))
        console.print(t)
    if plan.space:
        t = Table(title="searched")
        for col in ("param", "space", "prefer", "rules"):
            t.add_column(col)
        for k, e in plan.space.items():
            space = f"{e.choices}" if e.kind == "choices" else f"[{e.low}, {e.high}]" + (" log" if e.log else "")
            if e.exclude:
                space += f" except {e.exclude}"
            pref = plan.prefer.get(k)
            t.add_row(k, space, repr(pref.value) if pref else "", ", ".join(e.rules))
        console.print(t)
    loose = {k: v for k, v in plan.prefer.items() if k not in plan.space}
    for k, p in loose.items():
        console.print(f"prefer {k} = {p.value!r}  [dim]({', '.join(p.rules)})[/]")
    for a in plan.advice:
        console.print(f"[yellow]advice[/] {a.text}  [dim]({', '.join(a.rules)})[/]", soft_wrap=True)
    for r in plan.resolutions:
        console.print(f"[cyan]resolved[/] {r}", soft_wrap=True)
