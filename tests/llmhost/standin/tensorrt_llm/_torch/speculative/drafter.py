"""Stand-in for ``tensorrt_llm/_torch/speculative/drafter.py``: the ``Drafter`` base class a
user-provided drafter subclasses (same constructor: ``max_concurrency``)."""

from abc import ABC, abstractmethod


class Drafter(ABC):
    def __init__(self, max_concurrency=None) -> None:
        self.max_concurrency = max_concurrency

    @abstractmethod
    def prepare_draft_tokens(self, scheduled_requests, resource_manager=None) -> None:
        raise NotImplementedError
