"""Options and output helpers shared by the CLI commands of kb/ and tuner/."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

DbOpt = Annotated[str | None, typer.Option("--db", envvar="DSPARK_DB", show_envvar=True,
                                           help="SQLAlchemy URL of the knowledge base (default: SQLite in the "
                                                "user data directory).")]
RulesOpt = Annotated[str | None, typer.Option("--rules", envvar="DSPARK_RULES", show_envvar=True,
                                              help="Folder of rule YAML files (default: the shipped rules/).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]

console = Console()
err_console = Console(stderr=True)


def print_json(obj: Any) -> None:
    """JSON on stdout, nothing else, so scripts can pipe it."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
