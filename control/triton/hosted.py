"""What the ``llm`` Triton model hosts: one executor (any ``Executor``), its agent, its tokenizer.

A builder per ``executor`` parameter (``control/triton/hosts.py``) returns a ``Hosted``; the model
(``control/triton/llm_model.py``) serves it without knowing which data plane it holds: what differs
between data planes is in the executor's ``capabilities`` and in ``describe()`` for the stats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from control.executors.base import Executor


@dataclass
class Hosted:
    """An executor ready to serve, and what the model needs around it.

    ``encode`` tokenises a prompt (special tokens included), ``encode_words`` a stop or bad word,
    ``decode`` detokenises output; ``encode_large`` (optional) tokenises a large prompt without
    holding the GIL. ``vocab_size`` and ``max_prompt_bytes`` bound requests before they reach the
    executor (0 / None: the executor checks alone). ``describe`` adds the data plane's own fields to
    a ``stats`` answer; ``close`` releases the executor at ``finalize``.
    """

    executor: Executor
    agent: Any  # control.agent.Agent, or None when the executor has nothing to control
    encode: Callable[[str], list[int]]
    encode_words: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    describe: Callable[[], dict[str, Any]]
    vocab_size: int = 0
    max_prompt_bytes: int | None = None
    encode_large: Callable[[str], list[int]] | None = None
    close: Callable[[], None] = lambda: None
