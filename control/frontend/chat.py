"""Chat messages -> prompt text.

With a ``chat_template`` in the tokenizer's ``tokenizer_config.json`` (Hugging Face convention) the
messages are rendered with it (Jinja, sandboxed, ``add_generation_prompt`` true). Without one, the
plain template is used: each message on its own line as ``<role>: <content>``, then ``assistant:``
for the reply, e.g.::

    system: You are terse.
    user: Write a parser.
    assistant:
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from control.errors import ConfigError

PLAIN_REPLY_PREFIX = "assistant:"


def plain_template(messages: Sequence[tuple[str, str]]) -> str:
    lines = [f"{role}: {text}" for role, text in messages]
    return "\n".join([*lines, PLAIN_REPLY_PREFIX])


class ChatTemplate:
    """Renders (role, text) messages with the tokenizer's template, else the plain one."""

    def __init__(self, jinja_source: str | None = None, special: dict[str, str] | None = None) -> None:
        self.source = jinja_source
        self._special = special or {}
        self._template = None
        if jinja_source:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self._template = env.from_string(jinja_source)

    @classmethod
    def from_tokenizer_dir(cls, directory: Path | None) -> ChatTemplate:
        path = Path(directory) / "tokenizer_config.json" if directory is not None else None
        if path is None or not path.is_file():
            return cls()
        try:
            cfg = json.loads(path.read_text())
        except ValueError as e:
            raise ConfigError(f"{path}: not JSON ({e})") from None
        tpl = cfg.get("chat_template")
        if isinstance(tpl, list):  # named templates: take the default one
            tpl = next((t.get("template") for t in tpl if t.get("name") == "default"), None)
        special = {k: v for k, v in cfg.items() if k.endswith("_token") and isinstance(v, str)}
        return cls(tpl if isinstance(tpl, str) and tpl else None, special)

    @property
    def kind(self) -> str:
        return "tokenizer" if self._template is not None else "plain"

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        if self._template is None:
            return plain_template(messages)
        msgs = [{"role": r, "content": t} for r, t in messages]
        return self._template.render(messages=msgs, add_generation_prompt=True, **self._special)
