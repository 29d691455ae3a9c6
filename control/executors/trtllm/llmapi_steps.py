"""TensorRT-LLM's LLM API behind the ``Executor`` protocol: ``step`` hands over what its streams produced.

TensorRT-LLM runs its own iteration loop; requests go in through ``generate_async`` and come back
as async streams of updates (``LlmApiExecutor.start``, ``LlmApiStream.deltas``). ``LlmApiSteps``
runs one asyncio event loop on a thread of its own:

- ``add_request`` checks the request with the reference engine's messages (``check_prompt``), then
  starts it on the loop; every update lands in a queue;
- ``step`` waits up to ``poll_s`` for the first update, then returns everything since the last call,
  one ``RequestOutput`` per request (consecutive updates merged); so a host's loop wakes at least
  every ``poll_s`` while requests run, which is when it looks for cancelled clients;
- ``cancel`` aborts the request in TensorRT-LLM at once (``RequestOutput.abort``);
- a request TensorRT-LLM refuses, or fails mid-stream, ends alone with ``FinishReason.error``.

How the policy's k reaches TensorRT-LLM is the deployment's (``KScope``): with the drafter hook
(``KPlanner``, ``control/executors/trtllm/drafter_hook.py``) the policy chooses k per request every
iteration and its totals count each request's drafts; with the static ``draft_len_schedule`` k was
fixed when the LLM was built, and a policy that takes per-request totals (``TotalsObserver``, the
agent) gets each request's drafted and accepted counts when it ends, spread over draft positions by
``chain_positions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from control.executors.base import (
    ExecutorCapabilities,
    FinishReason,
    IterationStats,
    KScope,
    RequestOutput,
    SamplingParams,
    check_prompt,
)
from control.executors.streams import OutputStreams
from control.executors.trtllm.llmapi import chain_positions
from control.goodput.granularity import VerifyGranularity
from control.policy.types import Policy

POLL_S = 0.05  # the longest step waits for an update (the cancel-check period)
READY_TIMEOUT_S = 10.0
SHUTDOWN_TIMEOUT_S = 10.0


@runtime_checkable
class TotalsObserver(Protocol):
    """A policy that learns from a request's speculation totals (the agent's ``observe_positions``)."""

    def observe_positions(self, drafter: str, requests: int, drafted: int, accepted: int,
                          trials: list[int], accepted_at: list[int]) -> None: ...


def llmapi_sampling(p: SamplingParams) -> dict[str, Any]:
    """A request's parameters -> ``sampling_kwargs`` arguments (TensorRT-LLM's SamplingParams)."""
    return {"max_tokens": p.max_tokens, "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
            "seed": p.random_seed, "end_id": p.end_id, "stop": list(p.stop_texts), "bad": list(p.bad_texts),
            "ignore_eos": p.ignore_eos}


@dataclass(eq=False)
class _Flight:
    """One request in TensorRT-LLM."""

    rid: int
    prompt: list[int]
    params: SamplingParams
    handle: Any = None  # LlmApiStream once started
    task: asyncio.Task | None = None
    cancelled: bool = False
    abort_counted: bool = False
    generated: int = 0
    reported: tuple[int, int] = (0, 0)  # drafted, accepted already returned


@dataclass(frozen=True, slots=True)
class _Update:
    """One stream update, with the request's speculation totals read when it arrived (the hook forgets
    a request as soon as its stream ends)."""

    rid: int
    new: tuple[int, ...]
    done: bool
    error: str | None = None
    drafted: int = 0
    accepted: int = 0


class LlmApiSteps:
    """An ``LlmApiExecutor`` as an ``Executor`` (see the module docstring). ``add_request``, ``cancel``,
    ``has_work`` and ``set_policy`` may be called from any thread, ``step`` from one loop thread."""

    def __init__(self, api, policy: Policy | None, *, k_scope: KScope, verify: VerifyGranularity, max_k: int,
                 drafter_name: str = "", planner=None, poll_s: float = POLL_S) -> None:
        self.api = api
        self.planner = planner
        self.policy = policy
        self.drafter_name = drafter_name
        self._caps = ExecutorCapabilities("trtllm", k_scope, verify, (drafter_name,) if k_scope != KScope.none else (),
                                          max_k if k_scope != KScope.none else 0,
                                          request_caps=planner is not None)
        self.poll_s = poll_s
        self.aborted = 0  # requests aborted in TensorRT-LLM (cancelled, or the host went away)
        self.uncapped = 0  # requests with num_draft_tokens the static schedule cannot apply
        self.metrics_to_agent = 0
        self.last_stats = IterationStats()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._flights: dict[int, _Flight] = {}
        self._updates: queue.SimpleQueue[_Update] = queue.SimpleQueue()
        self._streams = OutputStreams()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, args=(ready,), name="llmapi-steps", daemon=True)
        self._thread.start()
        ready.wait(READY_TIMEOUT_S)

    # -- the protocol ---------------------------------------------------------------------------------
    @property
    def capabilities(self) -> ExecutorCapabilities:
        return self._caps

    @property
    def free_kv_slots(self) -> int:
        """Not reported: TensorRT-LLM manages its own KV cache (0)."""
        return 0

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
                    category: int | None = None, stream: bool = False) -> int:
        params = params or SamplingParams()
        check_prompt(prompt_ids, params, self.api.vocab_size, self.api.max_seq_len)
        with self._lock:
            fl = _Flight(next(self._ids), list(prompt_ids), params)
            self._flights[fl.rid] = fl
            if stream:
                self._streams.open(fl.rid)
        asyncio.run_coroutine_threadsafe(self._serve(fl), self._loop)
        return fl.rid

    def cancel(self, request_id: int) -> bool:
        with self._lock:
            fl = self._flights.pop(request_id, None)
        if fl is None:
            return False
        fl.cancelled = True
        if fl.handle is not None:  # counted now, so the host's stats show it at once
            fl.abort_counted = True
            self.aborted += 1
        self._loop.call_soon_threadsafe(self._abort, fl)
        return True

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._flights)

    def set_policy(self, policy: Policy) -> None:
        self.policy = policy
        if self.planner is not None:
            self.planner.policy = policy

    def stream(self, request_id: int, timeout: float | None = None) -> Iterator[RequestOutput]:
        return self._streams.read(request_id, timeout)

    def step(self) -> list[RequestOutput]:
        """Every update since the last call (waiting up to ``poll_s`` for the first)."""
        updates = []
        with contextlib.suppress(queue.Empty):
            updates.append(self._updates.get(timeout=self.poll_s))
            while True:
                updates.append(self._updates.get_nowait())
        outputs = self._outputs(updates)
        k = self.planner.last_k.tolist() if self.planner is not None else []
        self.last_stats = IterationStats(generated=sum(len(o.new_token_ids) for o in outputs),
                                         finished=sum(o.finished for o in outputs), k=k)
        for out in outputs:
            self._streams.emit(out)
        return outputs

    def shutdown(self) -> None:
        """Abort what is in flight, stop the loop, shut TensorRT-LLM down."""
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._abort_all(), self._loop).result(SHUTDOWN_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(SHUTDOWN_TIMEOUT_S)
        self.api.shutdown()

    # -- updates -> outputs (the host's loop thread) -----------------------------------------------------
    def _outputs(self, updates: list[_Update]) -> list[RequestOutput]:
        """One output per request and run of updates; an error ends its own output."""
        merged: list[_Update] = []
        for u in updates:
            last = merged[-1] if merged else None
            if last is not None and last.rid == u.rid and not last.done and last.error is None and u.error is None:
                merged[-1] = _Update(u.rid, last.new + u.new, u.done, None, u.drafted, u.accepted)
            else:
                merged.append(u)
        outputs = []
        for u in merged:
            with self._lock:
                fl = self._flights.get(u.rid)
                if fl is not None and (u.done or u.error is not None):
                    self._flights.pop(u.rid, None)
            if fl is None:  # cancelled meanwhile
                continue
            outputs.append(self._output(fl, u))
        return outputs

    def _output(self, fl: _Flight, u: _Update) -> RequestOutput:
        fl.generated += len(u.new)
        tot_d, tot_a = u.drafted, u.accepted
        d, a = tot_d - fl.reported[0], tot_a - fl.reported[1]
        fl.reported = (tot_d, tot_a)
        if u.error is not None:
            return RequestOutput(fl.rid, u.new, True, FinishReason.error, d, a, fl.generated, tot_d, tot_a, u.error)
        reason = None
        if u.done:
            reason = FinishReason.stop if fl.handle.finish_reason == "stop" else FinishReason.length
            self._observe_totals(fl, tot_d, tot_a)
        return RequestOutput(fl.rid, u.new, u.done, reason, d, a, fl.generated, tot_d, tot_a)

    def _totals(self, fl: _Flight) -> tuple[int, int]:
        """(drafted, accepted) so far: the hook's counts, else TensorRT-LLM's per-request metrics."""
        if fl.handle is None:
            return 0, 0
        if self.planner is not None:
            d, a = self.planner.totals.get(fl.handle.request_id, (0, 0))
            return int(d), int(a)
        m = fl.handle.metrics
        return (m.drafted, m.accepted) if m is not None else (0, 0)

    def _observe_totals(self, fl: _Flight, drafted: int, accepted: int) -> None:
        """Static schedule: the policy learns the request's totals at its end (the hook showed it every
        iteration already)."""
        if self._caps.k_scope != KScope.static or drafted <= 0 or not isinstance(self.policy, TotalsObserver):
            return
        steps = max(fl.generated - 1 - accepted, 1)  # the first token comes from the prefill
        trials, acc = chain_positions(drafted, accepted, steps, self._caps.max_k)
        self.policy.observe_positions(self.drafter_name, trials[0] if trials else 0, drafted, accepted, trials, acc)
        self.metrics_to_agent += 1

    # -- the event loop (its own thread) -----------------------------------------------------------------
    def _run_loop(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(ready.set)
        self._loop.run_forever()

    async def _serve(self, fl: _Flight) -> None:
        fl.task = asyncio.current_task()
        if fl.cancelled:
            return
        try:
            fl.handle = self.api.start(fl.prompt, **llmapi_sampling(fl.params))
        except Exception as e:  # TensorRT-LLM refused this request: it alone fails
            self._updates.put(_Update(fl.rid, (), True, f"TensorRT-LLM refused the request: {e}"))
            return
        try:
            self._cap(fl)
            if fl.cancelled:
                self._abort(fl)
                return
            async for new, done in fl.handle.deltas():
                self._updates.put(_Update(fl.rid, tuple(new), done, None, *self._totals(fl)))
                if done:
                    return
            raise RuntimeError("TensorRT-LLM ended the stream without a final response")
        except asyncio.CancelledError:  # cancel() or shutdown
            pass
        except Exception as e:  # the engine failed this request mid-stream: it alone fails
            self._abort(fl)
            self._updates.put(_Update(fl.rid, (), True, f"the engine failed while running this request "
                                                        f"({type(e).__name__}: {e}); retry it", *self._totals(fl)))
        finally:
            if self.planner is not None and fl.handle is not None:
                self.planner.forget(fl.handle.request_id)
            fl.task = None

    def _cap(self, fl: _Flight) -> None:
        cap = fl.params.num_draft_tokens
        if cap is None:
            return
        if self.planner is not None:
            self.planner.set_cap(fl.handle.request_id, cap)
        elif self._caps.k_scope == KScope.static:
            self.uncapped += 1

    def _abort(self, fl: _Flight) -> None:
        if fl.handle is not None:
            if not fl.abort_counted:
                fl.abort_counted = True
                self.aborted += 1
            with contextlib.suppress(Exception):  # already finished inside TensorRT-LLM
                fl.handle.abort()
        if fl.task is not None and fl.task is not asyncio.current_task():
            fl.task.cancel()

    async def _abort_all(self) -> None:
        with self._lock:
            flights, self._flights = list(self._flights.values()), {}
        for fl in flights:
            fl.cancelled = True
            self._abort(fl)
