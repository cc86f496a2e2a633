"""dspark-tune command line: parse, call one function, print (Rich, or --json for scripts).

Each layer registers its own commands; heavy libraries (torch, optuna) are imported inside the
commands that need them so that `--help` and light commands start fast.
"""

from __future__ import annotations

import sys
from functools import cache

import typer

app = typer.Typer(
    name="dspark",
    help="Profile a model, GPU and workload; match deployment rules; tune and export DSpark speculative decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("dspark-tune")
        except PackageNotFoundError:  # run from a checkout that was never installed
            v = "unknown (not installed: pip install -e .)"
        print(f"dspark-tune {v}")
        raise typer.Exit()


@app.callback()
def _root(show: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                    help="Print the version and exit.")) -> None:
    """Profile a model, GPU and workload; match deployment rules; tune and export DSpark speculative decoding."""


@cache
def _register() -> None:
    """Add every layer's commands to `app`, once per process: `main` is called many times in one process by
    tests and scripts, and registering again would add every command again (each call slower than the last)."""
    from kb.commands import register as register_kb

    register_kb(app)
    for module in ("kb.commands_profile", "tuner.commands", "tuner.commands_tune", "tuner.commands_studies",
                   "tuner.commands_estimate",
                   "dspark_core.cli.commands", "dspark_core.cli.commands_dspark", "dspark_core.cli.commands_models",
                   "dspark_core.cli.commands_ar", "dspark_core.cli.commands_suffix",
                   "dspark_core.cli.commands_suffix_corpus", "dspark_core.cli.commands_policy",
                   "dspark_core.cli.commands_serve", "dspark_core.cli.commands_vocab",
                   "live.commands"):
        try:
            mod = __import__(module, fromlist=["register"])
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        mod.register(app)


def _user_errors() -> tuple[type[BaseException], ...]:
    from dspark_core.errors import DSparkError
    from kb.errors import KBError
    from profiler.errors import ProfileError

    errors: list[type[BaseException]] = [KBError, ProfileError, DSparkError]
    try:
        from tuner.errors import TunerError

        errors.append(TunerError)
    except ModuleNotFoundError:
        pass
    return tuple(errors)


def _click_exceptions() -> tuple[tuple[type[BaseException], ...], ...]:
    """(exit, usage error, abort) classes of every click the installed typer may raise: typer >= 0.24 bundles
    its own copy (`typer._click`, with Exit / Abort in `typer.exceptions`), older ones use the click package."""
    groups: tuple[list[type[BaseException]], ...] = ([], [], [])
    for name in ("typer.exceptions", "typer._click.exceptions", "click.exceptions"):
        try:
            mod = __import__(name, fromlist=["_"])
        except ImportError:
            continue
        for group, cls in zip(groups, ("Exit", "ClickException", "Abort"), strict=True):
            found = getattr(mod, cls, None)
            if isinstance(found, type) and found not in group:
                group.append(found)
    return tuple(tuple(g) for g in groups)


def _usage_line(e: BaseException) -> str:
    """One line for a usage error: the command it concerns, what is wrong, where help is."""
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None and getattr(ctx, "command_path", None) else "dspark"
    fmt = getattr(e, "format_message", None)
    msg = " ".join((fmt() if fmt else str(e)).split())
    param = getattr(e, "param", None)
    opts = getattr(param, "opts", None) if param is not None else None
    if opts and type(e).__name__ == "BadParameter" and opts[0] not in msg:
        msg = f"{opts[0]}: {msg}"
    return f"error: {where}: {msg} (see '{where} --help')"


@cache
def _command():  # -> click.Command
    """The click command tree of `app`, built once (typer rebuilds it from every signature on each call)."""
    _register()
    return typer.main.get_command(app)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a user error is one line on stderr and exit code 2, never a traceback. The command runs on a
    Python data-stack chunk of its own, so the timing and decode loops below it never map or unmap one
    (dspark_core/pystack.py: how deep the stack happened to be decided a 1.3x in compiled decode)."""
    from dspark_core.pystack import on_deep_stack

    return on_deep_stack(_main, argv)


def _main(argv: list[str] | None) -> int:
    user_errors = _user_errors()
    exits, usage, aborts = _click_exceptions()
    try:
        result = _command()(args=argv, standalone_mode=False, prog_name="dspark")
    except exits as e:
        return int(getattr(e, "exit_code", 0) or 0)
    except usage as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # a group called bare: its help (already printed by rich)
            text = e.format_message()
            if text.strip():
                print(text, file=sys.stderr)
            return 2
        print(_usage_line(e), file=sys.stderr)
        return 2
    except aborts:
        print("interrupted", file=sys.stderr)
        return 130
    except user_errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
