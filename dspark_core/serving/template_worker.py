"""The child process that renders a checkpoint's chat template (run as a script by `chat.TemplateRenderer`).

A chat template is Jinja code from the model folder: a hostile or broken one can loop for hours, recurse, or
build a string of gigabytes. Rendered here, in its own process under an address-space limit, it can cost that
process at most; the server kills it past a deadline and starts another. Only the standard library and jinja2
are imported, so the process starts in a fraction of a second.

Protocol, one JSON object per line: the first line on stdin is `{"template", "specials", "max_chars",
"memory_bytes"}`; then each line `{"messages": [...]}` is answered on stdout by `{"text": ...}`, or by
`{"error": ..., "kind": "request" | "template"}` (request: the template refused these messages, e.g. with
raise_exception; template: the template itself failed)."""

from __future__ import annotations

import json
import sys
from typing import Any


class _Refused(Exception):
    """raise_exception() called by the template: the messages are not what it accepts."""


def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise _Refused(str(message)[:300])

    env.globals["raise_exception"] = raise_exception
    return env


def _render(template: Any, messages: list[dict[str, str]], specials: dict[str, str], max_chars: int) -> str:
    """The template's output, refused as soon as it passes max_chars (rendered piece by piece)."""
    parts, size = [], 0
    for piece in template.generate(messages=messages, add_generation_prompt=True, **specials):
        size += len(piece)
        if size > max_chars:
            raise OverflowError(f"it rendered more than {max_chars} characters")
        parts.append(piece)
    return "".join(parts)


def main() -> None:
    import resource

    from jinja2.exceptions import TemplateError

    setup = json.loads(sys.stdin.readline())
    limit = int(setup["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    env = _environment()
    try:
        template = env.from_string(setup["template"])
        broken = None
    except Exception as e:  # noqa: BLE001 - every request then gets the syntax error
        template, broken = None, f"{type(e).__name__}: {e}"
    for line in sys.stdin:
        try:
            if broken is not None:
                raise SyntaxError(broken)
            out: dict[str, str] = {"text": _render(template, json.loads(line)["messages"], setup["specials"],
                                                   int(setup["max_chars"]))}
        except _Refused as e:
            out = {"error": f"chat template: {e}", "kind": "request"}
        except TemplateError as e:
            out = {"error": " ".join(f"{type(e).__name__}: {e}".split())[:300], "kind": "request"}
        except MemoryError:
            out = {"error": "it needed more memory than the renderer's limit", "kind": "template"}
        except RecursionError:
            out = {"error": "it recursed too deeply", "kind": "template"}
        except Exception as e:  # noqa: BLE001 - include without a loader, a bad filter, a loop bomb's overflow
            out = {"error": " ".join(f"{type(e).__name__}: {e}".split())[:300], "kind": "template"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
