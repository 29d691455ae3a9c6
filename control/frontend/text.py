"""Text helpers around the model: counting prompt tokens, and holding back a stop sequence.

The ``llm`` model ends a generation after a stop word and includes it in its output; OpenAI's API
leaves the stop sequence out. ``StopTrimmer`` holds back as many trailing characters as could start a
stop sequence, so a streamed answer never shows one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


class TokenCounter:
    """Counts prompt tokens as the model does: the tokenizer's ids plus BOS when the model has one."""

    def __init__(self, directory: Path | None) -> None:
        self.tokenizer = None
        self.bos = 0
        if directory is None:
            return
        tok = Path(directory) / "tokenizer.json"
        if tok.is_file():
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(tok))
        cfg = Path(directory) / "config.json"
        if cfg.is_file():
            self.bos = int(json.loads(cfg.read_text()).get("bos_token_id") is not None)

    def count(self, prompt: str | Sequence[int]) -> int:
        if not isinstance(prompt, str):
            return len(prompt)
        if self.tokenizer is None:
            return 0
        return self.bos + len(self.tokenizer.encode(prompt, add_special_tokens=False).ids)


class StopTrimmer:
    """Feeds text through, never releasing a stop sequence; ``finish()`` returns what is left."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        self.pending += text
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0:
                out, self.pending, self.stopped = self.pending[:i], "", True
                return out
        cut = len(self.pending) - self.hold
        if cut <= 0:
            return ""
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def finish(self) -> str:
        out, self.pending = self.pending, ""
        return out
