"""What an engine must provide: the executor protocol and the types that cross it.

An executor owns a batch of in-flight generation requests and advances them one engine iteration
at a time. Its owner (``specctl generate``, the profiler, the Triton model's loop thread) does::

    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=64), stream=True)
    while engine.has_work():
        for out in engine.step():          # one iteration: admit, prefill, draft, verify, accept
            ...                             # RequestOutput per request that produced or finished
    engine.cancel(rid)                      # frees the request's KV at once

``add_request`` and ``cancel`` are thread-safe, so a server can accept requests on its own threads
while one loop thread calls ``step()``; ``stream(rid)`` yields a request's outputs as the loop
produces them. Bad input (an empty or over-long prompt, a sampling parameter out of range) raises
``ConfigError`` from ``add_request`` for that request alone; nothing else in the batch is affected.

Speculation is controlled by a policy (``control.policy.types.Policy``): once per iteration the
executor shows it a ``StepView`` and follows its ``Decision``; ``set_policy`` swaps it at run time.

Every executor declares what it can do in one record, ``capabilities`` (``ExecutorCapabilities``):
how far the policy's k reaches it (``KScope``: per request, one k per step, fixed when it was built,
or no speculation), its verification granularity (``control.goodput.granularity``: whether its
target verifies each request's own k + 1 tokens, the step's largest k + 1 for everyone, or a static
max K + 1 whatever k), the drafters it has, its largest k, whether it honours a request's
``num_draft_tokens``, and whether its clock is virtual (the simulator's). Its views carry the
granularity (``StepView.verify``), and the policy prices verification and chooses k from it. A host
(the Triton ``llm`` model, ``specctl generate``) reads the record instead of asking which class it
holds.

A request the engine fails on its own (the rest of the batch going on) finishes with
``FinishReason.error`` and the reason in ``RequestOutput.error``; a failure of the whole iteration
raises out of ``step``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable

import numpy as np

from control.errors import ConfigError
from control.goodput.granularity import VerifyGranularity
from control.policy.types import Policy

MAX_SEED = 2**63 - 1


class FinishReason(str, Enum):
    stop = "stop"  # end-of-sequence token or a stop word
    length = "length"  # max_tokens reached
    cancelled = "cancelled"  # cancel() was called
    error = "error"  # the engine failed this request alone (RequestOutput.error says why)


class KScope(str, Enum):
    """How far the policy's k reaches an executor."""

    per_request = "per_request"  # each request drafts its own k every iteration
    per_batch = "per_batch"  # one k per iteration for the whole batch
    static = "static"  # fixed when the executor was built (a compiled schedule): plans change nothing
    none = "none"  # the executor does not speculate


@dataclass(frozen=True, slots=True)
class ExecutorCapabilities:
    """What an executor can do, in one record its host and the controller read.

    ``verify`` is what its target verifies per request for the k chosen (padding to a static max K
    included); ``k_scope`` how the policy's k reaches it; ``drafters`` the names of its drafters, in
    the order a ``Decision.drafter`` index counts them; ``max_k`` the longest draft it runs;
    ``request_caps`` whether it honours ``SamplingParams.num_draft_tokens``; ``virtual_clock``
    whether its times are simulated (``IterationStats`` then holds modelled milliseconds, and its
    ``now`` is not the wall clock).
    """

    name: str
    k_scope: KScope
    verify: VerifyGranularity
    drafters: tuple[str, ...] = ()
    max_k: int = 0
    request_caps: bool = True
    virtual_clock: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_k, bool) or not isinstance(self.max_k, int) or self.max_k < 0:
            raise ConfigError(f"executor {self.name}: max_k = {self.max_k!r}: must be an integer >= 0")
        if self.k_scope != KScope.none and self.max_k == 0:
            raise ConfigError(f"executor {self.name}: k_scope {self.k_scope.value} needs max_k >= 1; "
                              "declare k_scope none for an executor that does not speculate")
        if self.k_scope == KScope.none and self.max_k:
            raise ConfigError(f"executor {self.name}: k_scope none drafts nothing, so max_k must be 0, got {self.max_k}")

    @property
    def speculates(self) -> bool:
        return self.k_scope != KScope.none

    @property
    def follows_plans(self) -> bool:
        """Whether a plan the control plane pushes changes what this executor drafts."""
        return self.k_scope in (KScope.per_request, KScope.per_batch)

    def to_dict(self) -> dict:
        return {"name": self.name, "k_scope": self.k_scope.value, "verify": str(self.verify),
                "drafters": list(self.drafters), "max_k": self.max_k, "request_caps": self.request_caps,
                "virtual_clock": self.virtual_clock}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request generation parameters (the names Triton's TensorRT-LLM models use).

    ``temperature`` 0 is greedy decoding; above 0 tokens are sampled (after ``top_k`` and
    ``top_p`` filtering) and speculative drafts are verified by rejection sampling, which leaves the
    output distribution exactly the target's. ``stop_words`` / ``bad_words`` are token-id sequences
    (callers with text encode them with the engine's tokenizer): generation stops after a stop word
    (its tokens are part of the output) and never produces a bad word's last token after the rest
    of it. ``num_draft_tokens`` caps this request's draft length (0 = never speculate).
    ``stop_texts`` / ``bad_texts`` are the same words as the client wrote them, for engines that take
    strings (TensorRT-LLM's LLM API tokenizes ``stop`` / ``bad`` itself); engines on token ids ignore them.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    random_seed: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()
    num_draft_tokens: int | None = None
    ignore_eos: bool = False
    end_id: int | None = None  # this request's end-of-sequence token (default: the model's)
    stop_texts: tuple[str, ...] = ()
    bad_texts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_words", _word_lists(self.stop_words, "stop_words"))
        object.__setattr__(self, "bad_words", _word_lists(self.bad_words, "bad_words"))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, vocab_size: int | None = None) -> SamplingParams:
        """Raise ConfigError naming the first bad value and what is accepted; return self."""
        _int_in("max_tokens", self.max_tokens, 1, None)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise ConfigError(f"temperature = {t!r}: must be a finite number >= 0 (0 = greedy)")
        _int_in("top_k", self.top_k, 0, None)
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not (0.0 < p <= 1.0):
            raise ConfigError(f"top_p = {p!r}: must be in (0, 1] (1 = no nucleus filtering)")
        if self.random_seed is not None:
            _int_in("random_seed", self.random_seed, 0, MAX_SEED)
        if self.num_draft_tokens is not None:
            _int_in("num_draft_tokens", self.num_draft_tokens, 0, None)
        if self.end_id is not None:
            _int_in("end_id", self.end_id, 0, None if vocab_size is None else vocab_size - 1)
        if vocab_size is not None:
            for name, words in (("stop_words", self.stop_words), ("bad_words", self.bad_words)):
                for w in words:
                    bad = [x for x in w if not 0 <= x < vocab_size]
                    if bad:
                        raise ConfigError(f"{name}: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
        return self


def check_prompt(prompt_ids: Sequence[int], params: SamplingParams, vocab: int | None,
                 max_len: int | None) -> np.ndarray:
    """The prompt as (P,) int64, or the ConfigError every executor gives for a request it refuses: its
    parameters, a prompt that is not a flat sequence of token ids, an empty one, a token outside the
    vocabulary, prompt + max_tokens over ``max_len``."""
    params.validate(vocab)
    try:
        prompt = np.asarray(list(prompt_ids))  # (P,)
    except TypeError:
        raise ConfigError(f"prompt must be a sequence of token ids, got {type(prompt_ids).__name__}") from None
    if prompt.size == 0:
        raise ConfigError("prompt is empty; give at least one token id")
    if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
        raise ConfigError(f"prompt must be a flat sequence of integer token ids (got dtype {prompt.dtype}, shape {prompt.shape})")
    if vocab is not None:
        bad = prompt[(prompt < 0) | (prompt >= vocab)]
        if bad.size:
            raise ConfigError(f"prompt token id {int(bad[0])} is outside the vocabulary [0, {vocab})")
    n = int(prompt.size)
    if max_len is not None and n + params.max_tokens > max_len:
        raise ConfigError(f"prompt of {n} tokens + max_tokens {params.max_tokens} exceeds the engine's max sequence "
                          f"length {max_len}; {_length_fix(n, params.max_tokens, max_len)}")
    return prompt.astype(np.int64)


def _length_fix(n: int, max_tokens: int, max_len: int) -> str:
    """What to change so that a prompt of ``n`` tokens and ``max_tokens`` fit in ``max_len``."""
    if n < max_len:
        return f"shorten the prompt or lower max_tokens (at most {max_len - n} here)"
    if max_tokens < max_len:
        return f"shorten the prompt to at most {max_len - max_tokens} tokens"
    return f"shorten the prompt and lower max_tokens below {max_len}"


def _int_in(name: str, v, lo: int, hi: int | None) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{name} = {v!r}: must be an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""))
    if v < lo or (hi is not None and v > hi):
        raise ConfigError(f"{name} = {v}: must be >= {lo}" + (f" and <= {hi}" if hi is not None else ""))


def _word_lists(words, name: str) -> tuple[tuple[int, ...], ...]:
    if not words:
        return ()
    if isinstance(words, str | bytes):
        raise ConfigError(f"{name} = {words!r}: give token-id sequences (encode text with the engine's tokenizer)")
    out = []
    for w in words:
        if isinstance(w, int) and not isinstance(w, bool):
            w = (w,)
        try:
            seq = tuple(int(x) for x in w)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: entry {w!r} is not a sequence of token ids") from None
        if not seq:
            raise ConfigError(f"{name}: an entry is empty; each word needs at least one token id")
        out.append(seq)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """What one request produced in one iteration (or its final state).

    ``new_token_ids`` are the tokens appended this iteration (the end-of-sequence token is never
    included). ``drafted`` / ``accepted`` are this iteration's draft tokens verified and accepted;
    ``num_generated``, ``total_drafted`` and ``total_accepted`` are running totals. ``error`` says
    why the engine failed this request (``finish_reason`` error).
    """

    request_id: int
    new_token_ids: tuple[int, ...]
    finished: bool = False
    finish_reason: FinishReason | None = None
    drafted: int = 0
    accepted: int = 0
    num_generated: int = 0
    total_drafted: int = 0
    total_accepted: int = 0
    error: str | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.total_accepted / self.total_drafted if self.total_drafted else 0.0


@dataclass(slots=True)
class IterationStats:
    """One engine iteration, for telemetry and benchmarks (times in milliseconds)."""

    step: int = 0
    running: int = 0  # requests holding a KV slot after the iteration
    waiting: int = 0
    decode_batch: int = 0
    prefill_requests: int = 0
    prefill_tokens: int = 0
    drafted: int = 0
    verified: int = 0
    accepted: int = 0
    generated: int = 0
    finished: int = 0
    free_kv_slots: int = 0
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    policy_ms: float = 0.0  # decide + prune + observe
    total_ms: float = 0.0
    k: list[int] = field(default_factory=list)
    drafter: list[int] = field(default_factory=list)  # drafter index per request, beside k (meaningful where k > 0)
    policy_error: str | None = None  # the policy raised; this step decoded without speculation


# IterationStats fields that add up over steps (StepTotals.sums holds their totals)
SUMMED_STATS = ("total_ms", "policy_ms", "prefill_ms", "draft_ms", "verify_ms")
DECODE_STATS = ("verified", "accepted")  # summed over decode iterations only


@dataclass(slots=True)
class StepTotals:
    """An executor's IterationStats added up since start (a benchmark diffs them around a run)."""

    steps: int = 0
    decode_steps: int = 0  # iterations with a decode batch
    spec_steps: int = 0  # decode iterations in which some request drafted
    sums: IterationStats = field(default_factory=IterationStats)  # SUMMED_STATS and DECODE_STATS summed

    def add(self, st: IterationStats) -> None:
        self.steps += 1
        names = SUMMED_STATS + DECODE_STATS if st.decode_batch else SUMMED_STATS
        for name in names:
            setattr(self.sums, name, getattr(self.sums, name) + getattr(st, name))
        if st.decode_batch:
            self.decode_steps += 1
            self.spec_steps += int(len(st.k) > 0 and max(st.k) > 0)


@runtime_checkable
class Executor(Protocol):
    """A data plane the controller can drive (DESIGN.md section 3)."""

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
                    category: int | None = None, stream: bool = False) -> int:
        """Queue a request; returns its id. Raises ConfigError for bad input (nothing is queued)."""
        ...

    def cancel(self, request_id: int) -> bool:
        """Stop a request and free its KV; False if it is unknown or already finished."""
        ...

    def step(self) -> list[RequestOutput]:
        """Run one iteration; returns an output per request that produced tokens or finished."""
        ...

    def stream(self, request_id: int, timeout: float | None = None) -> Iterator[RequestOutput]:
        """Yield the outputs of a request added with ``stream=True`` until it finishes."""
        ...

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        ...

    def set_policy(self, policy: Policy) -> None:
        """Use ``policy`` from the next iteration on."""
        ...

    @property
    def capabilities(self) -> ExecutorCapabilities:
        """What this executor can do: k scope, verification granularity, drafters, clock."""
        ...

    @property
    def free_kv_slots(self) -> int: ...

    @property
    def last_stats(self) -> IterationStats: ...
