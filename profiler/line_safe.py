"""Values that end up on one line of a generated file (a launch script's argument, comment or echo line, a YAML
comment): refused when they hold a character that ends or hides a line.

Shell quoting keeps a value one word, but a comment or an echo line ends at a newline, and the text after it runs as
a command. So the model's folder name and path, the drafter's path and the hardware name are refused where they
enter (`profile`, `tune`) when they hold a control character (C0, DEL, C1: newline, CR, NUL, ESC, tab, ...), a
Unicode line or paragraph separator (U+2028 / U+2029, line breaks to some editors and tools) or a bidirectional
override (which makes a script read differently from what runs). The bundle writer checks every value again
(tuner/script_values.py), so a value that arrives another way is refused there.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

from profiler.schema import Profile

_NAMES = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL character", "\x1b": "an escape character (ESC)",
          "\t": "a tab", "\x0b": "a vertical tab", "\x0c": "a form feed", "\x7f": "a DEL character",
          "\x85": "a next-line character (U+0085)", "\u2028": "a line separator (U+2028)",
          "\u2029": "a paragraph separator (U+2029)"}
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def unsafe_char(text: str) -> str | None:
    """What the first line-breaking or line-hiding character of `text` is, in words (None: `text` has none)."""
    for c in text:
        if c in _NAMES:
            return _NAMES[c]
        if c in _BIDI:
            return f"a bidirectional-text control (U+{ord(c):04X})"
        if unicodedata.category(c) in ("Cc", "Zl", "Zp"):
            return f"a control character (U+{ord(c):04X})"
    return None


def _resolved(path: str | None) -> str | None:
    """The path a script will name for `path`: resolved through links when it exists (tuner/engine_config.model_ref)."""
    if not path:
        return None
    try:
        p = Path(path)
        return os.path.realpath(p) if p.exists() else None
    except (OSError, ValueError):
        return None


def profile_problem(profile: Profile) -> str | None:
    """One line naming the first profile value a launch script would carry that holds an unsafe character: which
    option it came from, what it is, what to do. None: every such value is safe."""
    m, d, hw = profile.model, profile.drafter, profile.hw
    checks = [("--model", "the model folder's path", m.source, "rename the folder (or link it under a plain name)"),
              ("--model", "the model folder's resolved path", _resolved(m.source), "rename the folder it links to"),
              ("--model", "the model's name (its folder's name)", m.name, "rename the folder"),
              ("--drafter", "the drafter folder's path", d.id, "rename the folder (or link it under a plain name)"),
              ("--drafter", "the drafter folder's resolved path", _resolved(d.id), "rename the folder it links to"),
              ("--gpu", "the GPU's name", hw.name, "pass a catalogue GPU (profile --list-gpus)")]
    for option, what, value, fix in checks:
        why = unsafe_char(value) if value else None
        if why:
            return f"{option}: {what} holds {why} ({ascii(value)[1:-1][:80]}); {fix}"
    return None
