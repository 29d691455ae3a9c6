"""The simulator behind the ``Executor`` protocol: ``SimEngine``'s iterations on a virtual clock, one
``step`` at a time, so a host written for the protocol (the Triton ``llm`` model, a test) drives it
like any other data plane.

A request added here gets a real id (its row in the run, 0, 1, ...) and arrives at the virtual
clock's current time. Its prompt counts for its length only; its output is ``max_tokens`` synthetic
token ids (a hash of the request id and the position, inside the vocabulary): the simulator models
step times and acceptance, not text, so stop words and the end-of-sequence token never end a
request early. Its acceptance is row ``id`` of the ``AcceptanceProcess``, so the run holds at most
``capacity`` requests. Per-request totals (drafted, accepted) come from the outcomes the policy
observes.

Cancelling a request lets it run one more token (a waiting one: its prefill, which yields its first
token), then frees its slot and KV at that iteration; its final output carries ``cancelled`` and no
tokens past the cancellation. ``IterationStats`` times are modelled milliseconds; ``now`` is the
virtual clock in seconds. Under the ``none`` policy a plain stretch runs in closed form, so one
``step`` may advance several iterations (every request gains one token per iteration).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np

from control.errors import ConfigError
from control.executors.base import (
    ExecutorCapabilities,
    FinishReason,
    IterationStats,
    KScope,
    RequestOutput,
    SamplingParams,
    check_prompt,
)
from control.executors.sim.acceptance import AcceptanceProcess
from control.executors.sim.engine import SimConfig, SimEngine
from control.executors.streams import OutputStreams
from control.goodput.stepcost import StepCostModel
from control.policy.simple import NonePolicy
from control.policy.types import Policy, StepOutcome

I64 = np.int64
DEFAULT_VOCAB = 32000
TOKEN_REQUEST_STRIDE = 1_000_003  # synthetic token id = (id * this + position * next + 1) % vocab
TOKEN_POSITION_STRIDE = 7_919


def synthetic_tokens(request_id: int, start: int, stop: int, vocab: int) -> tuple[int, ...]:
    """The simulator's output token ids of ``request_id`` at positions start..stop-1."""
    pos = np.arange(start, stop, dtype=I64)  # (stop - start,)
    return tuple(int(t) for t in (request_id * TOKEN_REQUEST_STRIDE + pos * TOKEN_POSITION_STRIDE + 1) % vocab)


class _Tap:
    """The policy as the engine sees it: forwards every call, and adds each outcome's verified and
    accepted drafts to the requests' totals (``prune`` only where the policy has it)."""

    def __init__(self, policy: Policy, drafted: np.ndarray, accepted: np.ndarray) -> None:
        self.inner = policy
        self.name = getattr(policy, "name", type(policy).__name__)
        self.drafted, self.accepted = drafted, accepted  # (capacity,) totals, shared with the executor
        self.last_k: list[int] = []
        self.last_drafter: list[int] = []
        if callable(getattr(policy, "prune", None)):
            self.prune = policy.prune

    def decide(self, view):
        return self.inner.decide(view)

    def observe(self, outcome: StepOutcome) -> None:
        rid = outcome.request_ids  # (n,) distinct within a step
        self.drafted[rid] += outcome.verified
        self.accepted[rid] += outcome.accepted
        self.last_k = np.asarray(outcome.drafted, dtype=I64).tolist()
        self.last_drafter = np.asarray(outcome.drafter, dtype=I64).tolist()
        self.inner.observe(outcome)


class SimExecutor:
    """``SimEngine`` as an ``Executor`` (see the module docstring); ``add_request`` and ``cancel`` are
    thread-safe, ``step`` runs on one loop thread."""

    def __init__(self, cost: StepCostModel, drafters: tuple[str, ...], acceptance: AcceptanceProcess,
                 config: SimConfig, *, capacity: int, policy: Policy,
                 vocab_size: int = DEFAULT_VOCAB, max_len: int | None = None) -> None:
        rows = getattr(acceptance, "rates", np.zeros((0, 0))).shape[0]
        if capacity < 1 or rows < capacity:
            raise ConfigError(f"sim executor capacity = {capacity}: must be 1..{rows} (the acceptance process "
                              f"has {rows} request rows); build the process with one row per request to serve")
        # (capacity,) arrival (inf: not added yet), prompt and output lengths; the engine keeps these arrays
        self.engine = SimEngine(cost, tuple(drafters), np.full(capacity, np.inf), np.zeros(capacity, dtype=I64),
                                np.zeros(capacity, dtype=I64), acceptance, config)
        self.cfg = config
        self.capacity = capacity
        self.vocab = int(vocab_size)
        self.max_len = max_len
        self._drafted = np.zeros(capacity, dtype=I64)  # (capacity,) verified drafts per request
        self._accepted = np.zeros(capacity, dtype=I64)
        self._emitted = np.zeros(capacity, dtype=I64)  # (capacity,) tokens already returned per request
        self._reported = np.zeros((capacity, 2), dtype=I64)  # (capacity, 2) drafted, accepted already returned
        self._policy: Policy = policy
        self._run = None
        self._n = 0
        self._live: set[int] = set()
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self._streams = OutputStreams()
        self.last_stats = IterationStats()

    # -- the protocol ---------------------------------------------------------------------------------
    @property
    def capabilities(self) -> ExecutorCapabilities:
        speculates = bool(self.engine.drafters) and self.cfg.max_k > 0
        return ExecutorCapabilities("sim", KScope.per_request if speculates else KScope.none, self.cfg.verify,
                                    self.engine.drafters, self.cfg.max_k if speculates else 0,
                                    request_caps=False, virtual_clock=True)

    @property
    def now(self) -> float:
        """The virtual clock, in seconds."""
        return self._run.clock.now if self._run is not None else 0.0

    @property
    def free_kv_slots(self) -> int:
        return self._run.kv.free if self._run is not None else self.cfg.kv_tokens

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
                    category: int | None = None, stream: bool = False) -> int:
        params = params or SamplingParams()
        check_prompt(prompt_ids, params, self.vocab, min(self.cfg.kv_tokens, self.max_len or self.cfg.kv_tokens))
        n_prompt = len(prompt_ids)
        with self._lock:
            rid = self._n
            if rid >= self.capacity:
                raise ConfigError(f"the simulated run holds {self.capacity} requests and all are used; create the "
                                  "SimExecutor with a larger capacity")
            eng = self.engine
            eng.arr[rid], eng.P[rid], eng.O[rid] = self.now, n_prompt, params.max_tokens
            self._n += 1
            self._live.add(rid)
            if stream:
                self._streams.open(rid)
        return rid

    def cancel(self, request_id: int) -> bool:
        with self._lock:
            if request_id not in self._live or request_id in self._cancelled:
                return False
            self._cancelled.add(request_id)
            self._shorten(request_id)
        return True

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._live)

    def set_policy(self, policy: Policy) -> None:
        with self._lock:
            self._policy = policy
            if self._run is not None:
                self._install(policy)

    def stream(self, request_id: int, timeout: float | None = None) -> Iterator[RequestOutput]:
        return self._streams.read(request_id, timeout)

    def step(self) -> list[RequestOutput]:
        """Advance the virtual clock by one iteration (see the module docstring)."""
        with self._lock:
            if self._run is None:
                self._run = self.engine.begin(self._policy)
                self._install(self._policy)
            r = self._run
            before = self._totals()
            if self._live:
                self.engine.iterate(r)
            outputs = self._collect()
            self.last_stats = self._stats(before, outputs)
        for out in outputs:
            self._streams.emit(out)
        return outputs

    # -- pieces -----------------------------------------------------------------------------------------
    def _install(self, policy: Policy) -> None:
        r, cfg = self._run, self.cfg
        plain = isinstance(policy, NonePolicy)
        r.policy = policy if plain else _Tap(policy, self._drafted, self._accepted)
        r.has_prune = callable(getattr(r.policy, "prune", None))
        r.fast_plain = plain and not cfg.noise and not cfg.verify.always

    def _shorten(self, rid: int) -> None:
        """Let a cancelled request end after one more token (its KV reservation shrinks to match)."""
        eng, r = self.engine, self._run
        slot = np.flatnonzero((r.slots.rid == rid) & r.slots.active) if r is not None else np.zeros(0, dtype=I64)
        new_o = int(r.slots.gen[slot[0]]) + 1 if slot.size and r.slots.decoding[slot[0]] else 1
        new_o = min(new_o, int(eng.O[rid]))
        if slot.size:  # admitted: it reserved prompt + the old output
            r.kv.reserved -= int(eng.O[rid]) - new_o
        eng.O[rid] = new_o

    def _generated(self, live: np.ndarray) -> np.ndarray:
        """(L,) tokens each live request has generated so far (its output length once it finished)."""
        r, sl = self._run, self._run.slots
        gen = self._emitted.copy()  # (capacity,)
        act = np.flatnonzero(sl.active)
        gen[sl.rid[act]] = sl.gen[act]
        done = ~np.isnan(r.finish[live])
        out = gen[live]
        out[done] = self.engine.O[live[done]]
        return out

    def _collect(self) -> list[RequestOutput]:
        if not self._live:
            return []
        live = np.array(sorted(self._live), dtype=I64)  # (L,)
        gen = self._generated(live)  # (L,)
        done = ~np.isnan(self._run.finish[live])  # (L,)
        outputs = []
        for rid, g, fin in zip(live.tolist(), gen.tolist(), done.tolist(), strict=True):
            cancelled = rid in self._cancelled
            start = int(self._emitted[rid])
            if cancelled:
                g = start  # nothing past the cancellation
            if g <= start and not fin:
                continue
            toks = synthetic_tokens(rid, start, g, self.vocab)
            tot_d, tot_a = int(self._drafted[rid]), int(self._accepted[rid])
            d, a = tot_d - int(self._reported[rid, 0]), tot_a - int(self._reported[rid, 1])
            self._emitted[rid] = g
            self._reported[rid] = (tot_d, tot_a)
            reason = (FinishReason.cancelled if cancelled else FinishReason.length) if fin else None
            outputs.append(RequestOutput(rid, toks, fin, reason, d, a, g, tot_d, tot_a))
            if fin:
                self._live.discard(rid)
                self._cancelled.discard(rid)
        return outputs

    def _totals(self) -> tuple[float, ...]:
        """The run's running totals that ``last_stats`` differences around one ``step``."""
        res = self._run.res
        return res.steps, res.decode_steps, res.request_steps, res.drafted, res.verified, res.accepted, res.busy_s

    def _stats(self, before: tuple[float, ...], outputs: list[RequestOutput]) -> IterationStats:
        r = self._run
        _, dsteps, rsteps, drafted, verified, accepted, busy_s = (a - b for a, b in zip(self._totals(), before, strict=True))
        tap = r.policy if isinstance(r.policy, _Tap) else None
        return IterationStats(
            step=r.clock.step, running=int(r.slots.active.sum()), waiting=int(r.waiting),
            decode_batch=rsteps // dsteps if dsteps else 0, drafted=drafted, verified=verified, accepted=accepted,
            generated=sum(len(o.new_token_ids) for o in outputs), finished=sum(o.finished for o in outputs),
            free_kv_slots=r.kv.free, total_ms=busy_s * 1e3, k=list(tap.last_k) if tap is not None and dsteps else [],
            drafter=list(tap.last_drafter) if tap is not None and dsteps else [],
        )
