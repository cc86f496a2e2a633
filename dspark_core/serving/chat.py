"""Chat messages to a prompt: the tokenizer's own chat template (tokenizer_config.json), as transformers
renders it, or a plain role-prefixed transcript when the checkpoint has none.

The template is code from the model folder, so it is rendered in a child process (`template_worker.py`) with a
deadline, an output cap and an address-space limit: a template that loops, recurses or builds huge strings costs
one request a one-line error, and the server (its event loop, the engine, /health) never waits on it."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dspark_core.errors import DSparkError

TEMPLATE_TIMEOUT_S = 5.0  # one render's deadline (a real template renders in milliseconds)
TEMPLATE_MEMORY_BYTES = 1 << 30  # the renderer's address space (Python + jinja2 take ~60 MB of it)
MAX_TEMPLATE_BYTES = 1 << 20  # tokenizer_config.json is read only up to this size (real ones: ~10-200 KB)


class TemplateFailed(DSparkError):
    """The chat template itself failed (timed out, too large, crashed): a server-side problem (500)."""


def template_of(folder: str) -> tuple[str | None, dict[str, str]]:
    """(chat template source, special tokens the template reads) of a checkpoint folder."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return None, {}
    if path.stat().st_size > MAX_TEMPLATE_BYTES:
        raise DSparkError(f"{path}: larger than {MAX_TEMPLATE_BYTES >> 20} MiB; restore the checkpoint's "
                          "tokenizer_config.json")
    try:
        cfg = json.loads(path.read_text())
    except (ValueError, RecursionError) as e:
        raise DSparkError(f"{path}: not JSON ({' '.join(str(e).split())[:200]}); restore the checkpoint's "
                          "tokenizer_config.json") from None
    if not isinstance(cfg, dict):
        raise DSparkError(f"{path}: a JSON object is expected; restore the checkpoint's tokenizer_config.json")
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):  # named templates: the default one
        tpl = next((t.get("template") for t in tpl if isinstance(t, dict) and t.get("name") == "default"), None)
    specials = {k: v if isinstance(v, str) else (v.get("content", "") if isinstance(v, dict) else "")
                for k, v in cfg.items() if k in ("bos_token", "eos_token")}
    return tpl if isinstance(tpl, str) else None, {k: str(v) for k, v in specials.items()}


def transcript(messages: list[dict[str, str]]) -> str:
    """The prompt of a checkpoint without a chat template."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


@dataclass
class _Child:
    proc: subprocess.Popen
    started: float


class TemplateRenderer:
    """Renders one checkpoint's chat template in a child process, one render at a time (call from a worker thread,
    e.g. asyncio.to_thread). A child that misses the deadline or dies is killed and replaced on the next render."""

    def __init__(self, folder: str, max_chars: int, timeout_s: float = TEMPLATE_TIMEOUT_S,
                 memory_bytes: int = TEMPLATE_MEMORY_BYTES) -> None:
        self.folder, self.max_chars, self.timeout_s, self.memory_bytes = folder, max_chars, timeout_s, memory_bytes
        self.template, self.specials = template_of(folder)
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self.restarts = 0  # children killed (deadline) or lost (crash)

    def start(self) -> None:
        """Start the child now (the server does at startup, so the first chat request does not wait for it)."""
        if self.template is not None:
            with self._lock:
                self._ensure()

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for `messages` ([{role, content}]) with the generation prompt appended. Raises
        DSparkError when the template refuses the messages, TemplateFailed when the template itself fails."""
        if self.template is None:
            return transcript(messages)
        with self._lock:
            child = self._ensure()
            try:
                child.proc.stdin.write(json.dumps({"messages": messages}) + "\n")
                child.proc.stdin.flush()
            except OSError:
                self._kill()
                raise TemplateFailed(f"chat template of {self.folder}: its renderer died; retry") from None
            line = self._read_line(child)
        if "text" in line:
            return str(line["text"])
        if line.get("kind") == "request":
            raise DSparkError(str(line["error"]))
        raise TemplateFailed(f"chat template of {self.folder} failed: {line['error']}")

    def close(self) -> None:
        with self._lock:
            self._kill()

    # -- the child ---------------------------------------------------------------------------------
    def _ensure(self) -> _Child:
        if self._child is None or self._child.proc.poll() is not None:
            worker = Path(__file__).with_name("template_worker.py")
            proc = subprocess.Popen([sys.executable, "-I", str(worker)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
            setup = {"template": self.template, "specials": self.specials, "max_chars": self.max_chars,
                     "memory_bytes": self.memory_bytes}
            proc.stdin.write(json.dumps(setup) + "\n")
            proc.stdin.flush()
            self._child = _Child(proc, time.monotonic())
        return self._child

    def _read_line(self, child: _Child) -> dict:
        """The child's answer, or TemplateFailed when it misses the deadline or dies (the child is then killed)."""
        fd = child.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout_s
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0.0))[0] if left > 0 else []
            if not ready:
                self._kill()
                raise TemplateFailed(f"chat template of {self.folder} took longer than {self.timeout_s:g} s; "
                                     "fix the template (tokenizer_config.json: chat_template)")
            data = os.read(fd, 1 << 16)
            if not data:
                self._kill()
                raise TemplateFailed(f"chat template of {self.folder}: its renderer died (out of memory?); "
                                     "fix the template (tokenizer_config.json: chat_template)")
            buf += data
        return json.loads(buf)

    def _kill(self) -> None:
        if self._child is not None:
            self._child.proc.kill()
            self._child.proc.wait()
            for f in (self._child.proc.stdin, self._child.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            self._child = None
            self.restarts += 1
