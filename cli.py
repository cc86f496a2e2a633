"""dspark-tune command line: parse, call one function, print (Rich, or --json for scripts).

Each layer registers its own commands; heavy libraries (torch, optuna) are imported inside the
commands that need them so that `--help` and light commands start fast.
"""

from __future__ import annotations

import sys

import typer

app = typer.Typer(
    name="dspark",
    help="Profile a model, GPU and workload; match deployment rules; tune and export DSpark speculative decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    from kb.commands import register as register_kb

    register_kb(app)
    for module in ("kb.commands_profile", "tuner.commands", "tuner.commands_tune", "dspark_core.commands",
                   "dspark_core.commands_dspark"):
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


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a user error is one line on stderr and exit code 2, never a traceback."""
    import click

    _register()
    user_errors = _user_errors()
    try:
        result = app(args=argv, standalone_mode=False, prog_name="dspark")
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return 2
    except click.exceptions.Abort:
        print("aborted", file=sys.stderr)
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
