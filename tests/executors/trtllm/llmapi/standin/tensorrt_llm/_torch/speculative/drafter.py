"""Stand-in for ``tensorrt_llm/_torch/speculative/drafter.py``: the ``Drafter`` base class a
user-provided drafter subclasses, with the pinned release's constructor and CUDA-graph padding.

As upstream: ``max_total_draft_tokens`` is kept as ``_static_max_total_draft_tokens``, and
``pad_draft_tokens_for_cuda_graph`` (which the executor calls right after ``prepare_draft_tokens``)
extends every generation request's ``py_draft_tokens`` with zeros up to it, so a subclass that
leaves it None fails there (TypeError), as it does on a GPU. ``_needs_padding_kv_extension``: a
drafter whose sampler rewinds by the padded length sets it; the stand-in then asks the resource
manager (when one is given) to extend KV capacity, and records that it did.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


def get_draft_token_length(request) -> int:
    """``tensorrt_llm/_torch/pyexecutor/llm_request.py``: a request's draft length (0 without drafts)."""
    drafts = getattr(request, "py_draft_tokens", None)
    return 0 if drafts is None else len(drafts)


class Drafter(ABC):
    _needs_padding_kv_extension: bool = False

    def __init__(self, max_draft_len: int = None, max_total_draft_tokens: int = None, max_concurrency=None,
                 draft_len_schedule=None) -> None:
        self.max_draft_len = max_draft_len
        self.max_total_draft_tokens = max_total_draft_tokens
        self._static_max_total_draft_tokens = max_total_draft_tokens
        self.max_concurrency = max_concurrency
        self.draft_len_schedule = draft_len_schedule

    @abstractmethod
    def prepare_draft_tokens(self, scheduled_requests, resource_manager=None) -> None:
        raise NotImplementedError

    def should_use_spec_decode(self, requests, max_batch_size: int, max_num_tokens: int,
                               max_total_draft_tokens: int) -> bool:
        """Speculation on for this batch: always without ``max_concurrency``, else while the batch (capped by
        the batch and token budgets) stays within it."""
        if self.max_concurrency is None:
            return True
        if not requests or max_batch_size <= 0 or max_num_tokens <= 0:
            return False
        fit = max_num_tokens // (1 + max_total_draft_tokens)
        return fit > 0 and min(len(requests), max_batch_size, fit) <= self.max_concurrency

    def pad_draft_tokens_for_cuda_graph(self, scheduled_requests, resource_manager=None) -> None:
        target = self._static_max_total_draft_tokens
        for req in scheduled_requests.generation_requests:
            req.py_draft_tokens.extend([0] * (target - get_draft_token_length(req)))
        if self._needs_padding_kv_extension and resource_manager is not None:
            for req in scheduled_requests.generation_requests:
                resource_manager.extend_capacity_for_tokens(req)
