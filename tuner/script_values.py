"""Every value rendered into a launch script is checked where it is written: the bundle writer's last line of defence.

The `tune` and `profile` commands refuse unsafe model, drafter and GPU names where they enter
(profiler/line_safe.py); this module makes sure no value reaches a script another way. Templates mark how each
value is used, and the environment's `finalize` refuses any string a script template renders unmarked:

- `q`: one shell word (shlex-quoted), for arguments and assignments;
- `token`: a value of shell-inert characters only (letters, digits, `_.,:+=@%/-`), safe anywhere, also inside
  double quotes and `${VAR:-default}` (echo lines, defaults, `${VAR:?message}`);
- `text`: free text for a comment line.

All three refuse a character that ends or hides a line (profiler.line_safe.unsafe_char): shell quoting keeps a
value one word, but a comment ends at a newline and what follows it runs. `check_values` checks a template's
whole context first, so the refusal names the option the value came from.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from profiler.line_safe import unsafe_char
from tuner.errors import TunerError

SCRIPT_SUFFIX = ".sh.j2"  # templates whose every value must be marked
INERT = re.compile(r"[A-Za-z0-9_.,:+=@%/-]+")  # characters no shell context gives a meaning to

# template value -> (the option it came from, what it is, how to fix it)
SOURCES = {"model_path": ("--model", "the model folder's path", "rename the folder (or link it under a plain name)"),
           "model_name": ("--model", "the model's name (its folder's name)", "rename the folder"),
           "draft_path": ("--drafter / --draft", "the drafter folder's path", "rename the folder"),
           "hw_name": ("--gpu", "the GPU's name", "pass a catalogue GPU (profile --list-gpus)"),
           "study": ("--study", "the study name", "pick another --study name")}
DATA_KEYS = {"speculative_config_json", "config_yaml"}  # JSON / YAML payloads of data files, encoded, never scripts


class ShellWord(str):
    """A value quoted as one shell word (`q`)."""


class Token(str):
    """A value made of shell-inert characters only (`token`)."""


class Text(str):
    """A value checked for a comment line (`text`)."""


def _refuse(value: str, where: str) -> None:
    why = unsafe_char(value)
    if why:
        raise TunerError(f"{where} holds {why} ({ascii(value)[1:-1][:80]}); it cannot be written into a launch script")


def quote(value: Any) -> ShellWord:
    """Jinja filter `q`: `value` as one shell word, whatever it holds but a line-breaking character."""
    s = str(value)
    _refuse(s, "a launch script argument")
    return ShellWord(shlex.quote(s))


def token(value: Any) -> Token:
    """Jinja filter `token`: `value` unchanged when it is made of shell-inert characters only."""
    s = str(value)
    _refuse(s, "a launch script value")
    if not INERT.fullmatch(s):
        raise TunerError(f"launch script value {ascii(s)} holds a character a shell interprets; this is a bug in "
                         "dspark-tune's export, please report it")
    return Token(s)


def text(value: Any) -> Text:
    """Jinja filter `text`: `value` for a comment line (one line, no line-breaking character)."""
    s = str(value)
    _refuse(s, "a launch script comment")
    return Text(s)


def finalize(context: Any, value: Any) -> Any:
    """Jinja `finalize` (applied to every `{{ }}`): in a script template only numbers and marked strings pass."""
    name = getattr(context, "name", None) or ""
    if not name.endswith(SCRIPT_SUFFIX) or isinstance(value, (ShellWord, Token, Text)):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    raise TypeError(f"{name}: {value!r} reaches the script unmarked; render it with | q (a shell word), | token "
                    "(inert characters) or | text (a comment)")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple, set)):
        return [s for v in value for s in _strings(v)]
    return []


def check_values(script: str, values: dict[str, Any]) -> None:
    """Refuse, naming the option it came from, any value of a template context that holds a line-breaking
    character: one TunerError line before `script` is written."""
    for key, value in values.items():
        for s in _strings(value) if key not in DATA_KEYS else []:
            why = unsafe_char(s)
            if why:
                option, what, fix = SOURCES.get(key, ("the export", f"the exported value {key}", "report it"))
                raise TunerError(f"{option}: {what} holds {why} ({ascii(s)[1:-1][:80]}); {fix} ({script} would carry "
                                 "it)")
