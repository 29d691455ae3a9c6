"""The BLS orchestrator (``SpecOrchestrator``) behind the ``Executor`` protocol.

The orchestrator hands each request's tokens to a sink as a step produces them; this adapter gives
every request a sink that turns them into ``RequestOutput``s, which ``step`` returns. A request an
engine fails ends alone with ``FinishReason.error``. The orchestrator decodes greedily and knows no
stop or bad words: a request asking for sampling or for words is refused with what to send instead.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np

from control.errors import ConfigError, SpecctlError
from control.executors.base import (
    ExecutorCapabilities,
    FinishReason,
    IterationStats,
    KScope,
    RequestOutput,
    SamplingParams,
)
from control.executors.streams import OutputStreams
from control.executors.trtllm.orchestrator import SpecOrchestrator
from control.policy.types import Policy


class BlsExecutor:
    """A ``SpecOrchestrator`` as an ``Executor``; ``step`` runs on one loop thread."""

    def __init__(self, orchestrator: SpecOrchestrator) -> None:
        self.orch = orchestrator
        o = orchestrator
        self._caps = ExecutorCapabilities("bls", KScope.per_request if o.max_k > 0 else KScope.none,
                                          o.verify_granularity, (o.drafter_name or o.drafter,), o.max_k)
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._done: list[RequestOutput] = []  # outputs the sinks produced during the step
        self._generated: dict[int, int] = {}  # request id -> tokens so far
        self._max_tokens: dict[int, int] = {}
        self._cancelled: set[int] = set()
        self._streams = OutputStreams()
        self.last_stats = IterationStats()

    @property
    def capabilities(self) -> ExecutorCapabilities:
        return self._caps

    @property
    def free_kv_slots(self) -> int:
        """Not reported: the TensorRT-LLM engines behind the BLS manage their own KV cache (0)."""
        return 0

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
                    category: int | None = None, stream: bool = False) -> int:
        params = (params or SamplingParams()).validate()
        if not params.greedy:
            raise ConfigError(f"temperature = {params.temperature}: the BLS orchestrator decodes greedily; send 0")
        if params.stop_words or params.bad_words:
            raise ConfigError("stop_words / bad_words: the BLS orchestrator does not apply them; send none")
        rid = next(self._ids)
        with self._lock:
            self._generated[rid] = 0
            self._max_tokens[rid] = params.max_tokens
            if stream:
                self._streams.open(rid)
        try:
            end_id = None if params.ignore_eos else params.end_id  # the orchestrator stops only at an end_id given
            self.orch.add(rid, prompt_ids, params.max_tokens, self._sink(rid), end_id=end_id,
                          num_draft_tokens=params.num_draft_tokens, on_error=self._on_error(rid))
        except SpecctlError as e:
            with self._lock:
                self._generated.pop(rid, None)
                self._max_tokens.pop(rid, None)
            raise ConfigError(str(e)) from None
        return rid

    def cancel(self, request_id: int) -> bool:
        if not self.orch.cancel(request_id):
            return False
        with self._lock:
            self._cancelled.add(request_id)
        return True

    def has_work(self) -> bool:
        return self.orch.active > 0

    def set_policy(self, policy: Policy) -> None:
        self.orch.policy = policy

    def stream(self, request_id: int, timeout: float | None = None) -> Iterator[RequestOutput]:
        return self._streams.read(request_id, timeout)

    def step(self) -> list[RequestOutput]:
        t0 = time.perf_counter()
        served = self.orch.step()
        with self._lock:
            outputs, self._done = self._done, []
        self.last_stats = IterationStats(
            decode_batch=served, running=self.orch.active, generated=sum(len(o.new_token_ids) for o in outputs),
            drafted=sum(o.drafted for o in outputs), accepted=sum(o.accepted for o in outputs),
            finished=sum(o.finished for o in outputs), total_ms=(time.perf_counter() - t0) * 1e3)
        for out in outputs:
            self._streams.emit(out)
        return outputs

    # -- sinks (called inside the orchestrator's step) -------------------------------------------------
    def _sink(self, rid: int):
        last = [0, 0]  # drafted, accepted already reported

        def tokens(new: np.ndarray, finished: bool) -> None:
            d, a = self.orch.stats(rid) or (last[0], last[1])
            with self._lock:
                n = self._generated[rid] = self._generated[rid] + int(new.size)
                reason = None
                if finished:
                    full = n >= self._max_tokens.pop(rid)
                    reason = FinishReason.length if full else FinishReason.stop  # else: end_id
                    if rid in self._cancelled:
                        reason = FinishReason.cancelled
                    self._cancelled.discard(rid)
                    self._generated.pop(rid, None)
                self._done.append(RequestOutput(rid, tuple(int(t) for t in new), finished, reason, d - last[0],
                                                a - last[1], n, d, a))
            last[:] = [d, a]

        return tokens

    def _on_error(self, rid: int):
        def error(message: str) -> None:
            with self._lock:
                n = self._generated.pop(rid, 0)
                self._max_tokens.pop(rid, None)
                self._cancelled.discard(rid)
                self._done.append(RequestOutput(rid, (), True, FinishReason.error, num_generated=n, error=message))

        return error
