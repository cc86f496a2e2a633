"""CLI of the knowledge base: `rules list|show|lint|stats|search`, `match`, `kb sync|stats|migrate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kb.cli_common import DbOpt, JsonOpt, RulesOpt, console, print_json
from kb.errors import KBError

rules_app = typer.Typer(help="Browse, lint and search the deployment rules.", no_args_is_help=True)
kb_app = typer.Typer(help="Manage the knowledge-base database.", no_args_is_help=True)


def open_synced(db_url: str | None, rules: str | None):  # -> tuple[Database, SyncReport]
    """Open the database and bring it up to date with the rule files (a no-op when unchanged)."""
    from kb.db import open_db
    from kb.loader import load_rules
    from kb.sync import sync_rules

    loaded = load_rules(rules)
    db = open_db(db_url)
    return db, sync_rules(db, loaded)


def _rule_rows(db) -> list[Any]:
    from sqlalchemy import select

    from kb.models import RuleRow

    with db.session() as s:
        return list(s.scalars(select(RuleRow).where(RuleRow.enabled.is_(True)).order_by(RuleRow.rule_id)))


@rules_app.command("list")
def rules_list(category: Annotated[str | None, typer.Option(help="Only this category.")] = None,
               db: DbOpt = None, rules: RulesOpt = None, as_json: JsonOpt = False) -> None:
    """List the enabled rules (synced from the rule files first)."""
    database, _ = open_synced(db, rules)
    rows = [r for r in _rule_rows(database) if category is None or r.category == category]
    if as_json:
        print_json([{"id": r.rule_id, "version": r.version, "category": r.category, "priority": r.priority,
                     "title": r.title, "source": f"{r.source_file}:{r.source_line}"} for r in rows])
        return
    table = Table(title=f"{len(rows)} rules", show_lines=False)
    for col in ("id", "v", "category", "prio", "title"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.rule_id, str(r.version), r.category, str(r.priority), r.title)
    console.print(table)


@rules_app.command("show")
def rules_show(rule_id: Annotated[str, typer.Argument(help="Rule id, e.g. spec.gamma.hopper-dense-small")],
               db: DbOpt = None, rules: RulesOpt = None, as_json: JsonOpt = False) -> None:
    """Print one rule with its references and the stored profiles it fires on."""
    from kb.fields import flatten
    from kb.rules import Rule, evaluate
    from kb.store import get_profile, list_profiles

    database, _ = open_synced(db, rules)
    row = next((r for r in _rule_rows(database) if r.rule_id == rule_id), None)
    if row is None:
        ids = [r.rule_id for r in _rule_rows(database)]
        import difflib

        close = difflib.get_close_matches(rule_id, ids, n=3)
        raise KBError(f"no rule {rule_id!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                  "; list them with 'dspark rules list'"))
    rule = Rule.model_validate(row.body)
    fires = [p for p in list_profiles(database, limit=200)
             if evaluate(rule.when, flatten(get_profile(database, p["profile_id"])))]
    if as_json:
        print_json({**rule.to_json(), "version": row.version, "source": f"{row.source_file}:{row.source_line}",
                    "fires_on_profiles": fires})
        return
    console.print(f"[bold]{rule.id}[/] v{row.version}  [dim]{row.source_file}:{row.source_line}[/]")
    console.print(f"{rule.title}  (category {rule.category}, priority {rule.priority})")
    console.print(f"[bold]when[/] {json.dumps(rule.to_json().get('when'))}")
    for a in rule.then:
        console.print(f"[bold]then[/] {json.dumps(a.model_dump(mode='json', by_alias=True, exclude_defaults=True))}")
    console.print(f"[bold]why[/] {rule.rationale}")
    for ref in rule.references:
        console.print(f"  - {ref}")
    console.print(f"[bold]fires on[/] {len(fires)} stored profile(s)" +
                  "".join(f"\n  - #{p['profile_id']} {p['name']}" for p in fires))


@rules_app.command("lint")
def rules_lint(rules: RulesOpt = None, as_json: JsonOpt = False) -> None:
    """Check the rule files: schema, unknown fields, duplicates, references, contradictions, dead rules.

    Exit 0 only when clean, 2 otherwise.
    """
    from kb.lint import lint_rules
    from kb.loader import rules_dir

    folder = rules_dir(rules)
    loaded, findings = lint_rules(folder)
    if as_json:
        print_json({"rules": len(loaded), "findings": [f.to_json() for f in findings]})
    else:
        for f in findings:
            console.print(f"[red]{f.kind}[/] {f.message}", soft_wrap=True)
        status = "[green]clean[/]" if not findings else f"[red]{len(findings)} problem(s)[/]"
        console.print(f"{len(loaded)} rules in {folder}: {status}")
    if findings:
        raise typer.Exit(2)


@rules_app.command("stats")
def rules_stats(db: DbOpt = None, rules: RulesOpt = None, as_json: JsonOpt = False) -> None:
    """Counts of rules (not actions) by category, action kind, parameter and kind of source, and the share whose
    conditions read roofline facts."""
    from kb.rules import Rule
    from kb.stats import rule_stats

    database, _ = open_synced(db, rules)
    stats = rule_stats([Rule.model_validate(r.body) for r in _rule_rows(database)])
    if as_json:
        print_json(stats)
        return
    reads = stats["conditions_read"]
    console.print(f"[bold]{stats['total']}[/] enabled rules; conditions read roofline facts in {reads['roofline']} "
                  f"({stats['roofline_share']:.0%}), memory-fit facts in {reads['memory_fit']}, GPU identity "
                  f"(name, arch, sm, vendor) in {reads['gpu_identity']}")
    for key in ("by_category", "by_action", "by_param", "by_source"):
        table = Table(title=key.replace("_", " "))
        table.add_column("name")
        table.add_column("rules", justify="right")
        for name, n in stats[key].items():
            table.add_row(name, str(n))
        console.print(table)


@rules_app.command("search")
def rules_search(text: Annotated[list[str], typer.Argument(help="Words to look for (all must appear).")],
                 db: DbOpt = None, rules: RulesOpt = None, as_json: JsonOpt = False) -> None:
    """Find rules whose id, title, rationale, references, tags or parameters mention every word
    (`rules search gamma chat`, or quoted: `rules search "gamma chat"`)."""
    database, _ = open_synced(db, rules)
    words = " ".join(text).lower().split()
    text = " ".join(words)
    hits = [r for r in _rule_rows(database)
            if all(w in json.dumps(r.body).lower() for w in words)]
    if as_json:
        print_json([{"id": r.rule_id, "title": r.title, "category": r.category} for r in hits])
        return
    for r in hits:
        console.print(f"[bold]{r.rule_id}[/] [dim]({r.category})[/] {r.title}")
    console.print(f"{len(hits)} rule(s) match {text!r}")


def _load_profile(database, profile_file: Path | None, profile_id: int | None, model: str | None,
                  gpu: str | None, workload: str | None):  # -> tuple[int, Profile]
    from pydantic import ValidationError

    from kb.store import get_profile, latest_profile, save_profile
    from profiler.schema import Profile

    if profile_file is not None:
        try:
            data = json.loads(profile_file.read_text())
        except OSError as e:
            raise KBError(f"cannot read profile {profile_file}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise KBError(f"{profile_file}:{e.lineno}: invalid JSON ({e.msg})") from None
        try:
            profile = Profile.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            raise KBError(f"{profile_file}: {'.'.join(map(str, err['loc']))}: {err['msg']}; see "
                          "profiler/schema.py for the fields") from None
        return save_profile(database, profile, name=profile_file.stem), profile
    if model or gpu or workload:
        try:
            from profiler.build import build_profile
        except ModuleNotFoundError:
            raise KBError("profiling by --model/--gpu/--workload needs the profiler; pass --profile FILE") from None
        profile = build_profile(model=model, gpu=gpu, workload=workload)
        return save_profile(database, profile), profile
    if profile_id is not None:
        return profile_id, get_profile(database, profile_id)
    latest = latest_profile(database)
    if latest is None:
        raise KBError("no profile given and none stored; pass --profile FILE.json or --model/--gpu, "
                      "or run 'dspark profile' first")
    return latest


def match(profile_file: Annotated[Path | None, typer.Option("--profile", help="Profile JSON file.")] = None,
          profile_id: Annotated[int | None, typer.Option("--profile-id", help="A stored profile's id.")] = None,
          model: Annotated[str | None, typer.Option(help="Model name or path (profiles it first).")] = None,
          gpu: Annotated[str | None, typer.Option(help="GPU name (profiles it first).")] = None,
          workload: Annotated[str | None, typer.Option(help="Workload preset or JSONL file.")] = None,
          db: DbOpt = None, rules: RulesOpt = None, as_json: JsonOpt = False) -> None:
    """Turn a profile into a plan: fixed settings, search space, preferences, advice, and why."""
    from kb.match import match_profile
    from kb.store import save_plan
    from kb.sync import enabled_rules

    database, _ = open_synced(db, rules)
    pid, profile = _load_profile(database, profile_file, profile_id, model, gpu, workload)
    plan = match_profile(enabled_rules(database), profile)
    plan_id = save_plan(database, pid, plan.model_dump(mode="json"), plan.rule_refs())
    if as_json:
        print_json({"plan_id": plan_id, "profile_id": pid, **plan.model_dump(mode="json")})
        return
    from kb.render import print_plan

    print_plan(plan, plan_id, pid, profile)


@kb_app.command("sync")
def kb_sync(db: DbOpt = None, rules: RulesOpt = None, as_json: JsonOpt = False) -> None:
    """Load the rule files into the database in one transaction (idempotent)."""
    database, report = open_synced(db, rules)
    if as_json:
        print_json(report.to_json())
        return
    console.print(f"added {len(report.added)}, changed {len(report.changed)}, disabled "
                  f"{len(report.disabled)}, re-enabled {len(report.reenabled)}, unchanged {report.unchanged}")


@kb_app.command("stats")
def kb_stats(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Rows per table, schema revision and URL of the database."""
    from sqlalchemy import func, inspect, select

    from kb.db import _redact, open_db
    from kb.models import Base
    from kb.store import list_profiles

    database = open_db(db)
    counts: dict[str, int] = {}
    with database.engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
        for table in Base.metadata.sorted_tables:
            if table.name in names:
                counts[table.name] = conn.execute(select(func.count()).select_from(table)).scalar_one()
    out = {"url": _redact(database.url), "revision": database.revision(), "tables": counts,
           "recent_profiles": list_profiles(database, limit=5)}
    if as_json:
        print_json(out)
        return
    console.print(f"database {out['url']}  (schema revision {out['revision']})")
    for name, n in counts.items():
        console.print(f"  {name:<16} {n:>7}")
    for p in out["recent_profiles"]:
        console.print(f"  profile #{p['profile_id']}: {p['name']}  [dim]{p['stored_at']}[/]")


@kb_app.command("migrate")
def kb_migrate(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Upgrade the database schema to this version's head (refuses a newer database)."""
    from kb.db import open_db

    database = open_db(db, migrate=False)
    before, after = database.migrate()
    if as_json:
        print_json({"from": before, "to": after})
    elif before == after:
        console.print(f"schema already at {after}")
    else:
        console.print(f"schema upgraded {before or '(empty)'} -> {after}")


def register(app: typer.Typer) -> None:
    app.add_typer(rules_app, name="rules")
    app.add_typer(kb_app, name="kb")
    app.command("match")(match)
