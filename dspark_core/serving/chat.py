"""Chat messages to a prompt: the tokenizer's own chat template (tokenizer_config.json), as transformers
renders it, or a plain role-prefixed transcript when the checkpoint has none."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from dspark_core.errors import DSparkError


@cache
def _template(folder: str) -> tuple[str | None, dict[str, str]]:
    """(chat template source, special tokens the template reads) of a checkpoint folder."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return None, {}
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise DSparkError(f"{path}: not JSON ({e}); restore the checkpoint's tokenizer_config.json") from None
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):  # named templates: the default one
        tpl = next((t.get("template") for t in tpl if t.get("name") == "default"), None)
    specials = {k: v if isinstance(v, str) else (v or {}).get("content", "")
                for k, v in cfg.items() if k in ("bos_token", "eos_token")}
    return tpl if isinstance(tpl, str) else None, specials


def render(folder: str, messages: list[dict[str, str]]) -> str:
    """The prompt text for `messages` ([{role, content}]) with the generation prompt appended."""
    tpl, specials = _template(folder)
    if tpl is None:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise DSparkError(f"chat template: {message}")

    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(tpl).render(messages=messages, add_generation_prompt=True, **specials)
    except TemplateError as e:
        raise DSparkError(f"chat template of {folder}: {e}") from None
