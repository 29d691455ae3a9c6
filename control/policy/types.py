"""The seam between executors and the controller: StepView -> Decision, then StepOutcome.

Every array is struct-of-arrays over the n decode requests of one engine step, in the same order in
the view, the decision and the outcome. Policies keep per-request state in arrays indexed by
``slots`` (a small, stable, reused integer per in-flight request), so the per-step path is a handful
of vectorised numpy operations and no per-request Python objects.

An executor that owns its loop calls, once per iteration::

    decision = policy.decide(view)
    ... draft (stop request i at decision.k[i] tokens or when its running confidence product
        falls below decision.conf_cut[i]) ...
    verify_k = policy.prune(view, decision, confidence)   # only if the policy has ``prune``
    ... verify, accept, roll back ...
    policy.observe(outcome)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from control.goodput.granularity import PER_REQUEST, VerifyGranularity

I64 = np.int64


def _arr(x, dtype=I64) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=dtype)


@dataclass(slots=True)
class StepView:
    """What the controller sees before a decode step.

    Attributes (arrays have length n = batch size unless noted):
        slots: stable slot index per request in [0, max_slots); reused after the request leaves.
        request_ids: unique id per request over the executor's lifetime (a new id in an old slot
            tells the policy to reset that slot's state).
        ctx_lens: tokens in the target KV cache for the request (prompt + generated).
        remaining: tokens the request may still generate; drafting more than remaining - 1 wastes work.
        k_cap: per-request cap on k (Triton's ``num_draft_tokens``); ``max_k`` when uncapped.
        drafter: the drafter each request used last (index into ``drafters``), -1 if none yet.
        draft_lag: shape (n, len(drafters)): tokens each drafter's state is behind the target for the
            request (0 = in sync; drafting first re-prefills the lag, the catch-up). Drafters without
            state (n-gram) are always 0. A request whose draft was never prefilled has lag = ctx_len.
        category: category index per request (-1 = unknown), or None when requests carry none.
        free_kv_slots: free token slots in the target's KV cache (each draft token needs one).
        token_budget: maximum tokens the verify pass may batch (n + sum k must not exceed it).
        max_k: the executor's maximum draft length K.
        drafters: names of the executor's drafters; index = drafter id.
        now: executor clock in seconds.
        step: iteration counter.
        prefill_tokens: tokens prefilled in the same iteration (mixed batches), 0 otherwise.
        waiting: requests queued and not yet admitted.
        verify: what the executor's target verifies per request for the k chosen
            (``control.goodput.granularity``): per request unless the executor pads or verifies per batch.
        ngram_avail: (n,) tokens the executor's n-gram drafter (its first drafter of that kind) would
            propose for each request at k = ``max_k`` (0: its lookup finds no match), so a draft of k
            there is min(k, ngram_avail) tokens; None where the executor has no n-gram drafter or
            cannot see its lookup. Built by the step kernel (``control/executors/step/ngram.py``).
    """

    slots: np.ndarray
    request_ids: np.ndarray
    ctx_lens: np.ndarray
    remaining: np.ndarray
    k_cap: np.ndarray
    drafter: np.ndarray
    draft_lag: np.ndarray
    free_kv_slots: int
    token_budget: int
    max_k: int
    drafters: tuple[str, ...]
    now: float = 0.0
    step: int = 0
    category: np.ndarray | None = None
    prefill_tokens: int = 0
    waiting: int = 0
    verify: VerifyGranularity = PER_REQUEST
    ngram_avail: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.slots.shape[0])

    @classmethod
    def build(
        cls,
        *,
        slots,
        request_ids,
        ctx_lens,
        remaining,
        drafters: tuple[str, ...],
        max_k: int,
        free_kv_slots: int,
        token_budget: int,
        k_cap=None,
        drafter=None,
        draft_lag=None,
        category=None,
        now: float = 0.0,
        step: int = 0,
        prefill_tokens: int = 0,
        waiting: int = 0,
        verify: VerifyGranularity = PER_REQUEST,
        ngram_avail=None,
    ) -> StepView:
        """Convenience constructor with defaults (uncapped k, no drafter used yet, drafts in sync)."""
        slots = _arr(slots)
        n = slots.shape[0]
        m = max(len(drafters), 1)
        return cls(
            slots=slots,
            request_ids=_arr(request_ids),
            ctx_lens=_arr(ctx_lens),
            remaining=_arr(remaining),
            k_cap=_arr(np.full(n, max_k) if k_cap is None else k_cap),
            drafter=_arr(np.full(n, -1) if drafter is None else drafter),
            draft_lag=_arr(np.zeros((n, m)) if draft_lag is None else draft_lag).reshape(n, m),
            free_kv_slots=int(free_kv_slots),
            token_budget=int(token_budget),
            max_k=int(max_k),
            drafters=tuple(drafters),
            now=float(now),
            step=int(step),
            category=None if category is None else _arr(category),
            prefill_tokens=int(prefill_tokens),
            waiting=int(waiting),
            verify=verify,
            ngram_avail=None if ngram_avail is None else _arr(ngram_avail),
        )


@dataclass(slots=True)
class Decision:
    """What the controller tells the executor to do this step.

    Attributes:
        k: draft length per request (0 = plain decoding for that request).
        drafter: drafter index per request (meaningful where k > 0).
        conf_cut: per request, stop drafting once the running product of draft confidences falls
            below this value (SpecServe's adaptive drafter); None = no cut.
        prefill_draft: whether requests prefilled in this iteration also prefill their draft state.
            False skips the draft prefill (TurboSpec) and leaves those requests with a lag.
        prefill_drafter: the (executor-indexed) drafter whose state that prefill builds; -1 = the
            executor's default. A policy that mostly runs another drafter names it here, or every new
            request pays a catch-up of its whole prompt on that drafter at its first draft.
        predicted_step_ms / predicted_tokens: the model's prediction for this choice (for telemetry:
            predicted vs measured).
    """

    k: np.ndarray
    drafter: np.ndarray
    conf_cut: np.ndarray | None = None
    prefill_draft: bool = True
    prefill_drafter: int = -1
    predicted_step_ms: float = float("nan")
    predicted_tokens: float = float("nan")

    @classmethod
    def plain(cls, n: int) -> Decision:
        return cls(k=np.zeros(n, dtype=I64), drafter=np.zeros(n, dtype=I64))


@dataclass(slots=True)
class StepOutcome:
    """What happened in a decode step, reported back to the controller.

    Per request (arrays of length n, same order as the view):
        drafted: draft tokens produced (<= decided k; fewer after a confidence cut or near max_tokens).
        verified: draft tokens sent to the target (<= drafted; fewer after verifier pruning).
        accepted: draft tokens the target accepted (<= verified). Generated = accepted + 1 (bonus),
            unless the request stopped (EOS, max_tokens) inside the accepted span.
        confidence: shape (n, max_k) draft confidences (probability the drafter gave its token), NaN
            where nothing was drafted; None if the drafter has none (n-gram).
    Step totals: measured ``draft_ms``, ``verify_ms``, ``total_ms``, and the cost model's features
    for an online refit: ``draft_passes`` forward passes of the draft side with ``draft_ctx_tokens``
    context tokens and ``draft_batched_tokens`` computed tokens summed over passes.
    ``finished`` lists request ids that left the batch after this step. With chunked prefill the
    verify pass also computed ``prefill_tokens`` prompt tokens over ``prefill_ctx_tokens`` cached
    ones; they are part of ``verify_ms`` (and of the target's cost-model features for a refit).
    ``prev_loop_ms``: the previous decode step's time outside its forward passes (its policy calls,
    the executor's bookkeeping, and whatever the loop did before starting this step, such as
    delivering outputs), measured only when that step left requests decoding (else NaN);
    ``prev_loop_requests`` is that step's batch size. ``ngram_avail``: the step's view's (n,) n-gram
    lookup proposals (``StepView.ngram_avail``), or None. ``ngram_match``: (n,) how many leading tokens
    of that lookup's proposal the step committed, compared against the committed tokens only (so at
    most min(ngram_avail, accepted + 1)): what the lookup would have got accepted, scored for free
    whatever the request drafted with; -1 where not scored (no proposal, or the request stopped this
    step); None where the executor does not score lookups.
    """

    slots: np.ndarray
    request_ids: np.ndarray
    drafter: np.ndarray
    ctx_lens: np.ndarray
    drafted: np.ndarray
    verified: np.ndarray
    accepted: np.ndarray
    confidence: np.ndarray | None = None
    category: np.ndarray | None = None
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    total_ms: float = 0.0
    draft_passes: int = 0
    draft_ctx_tokens: int = 0
    draft_batched_tokens: int = 0
    finished: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=I64))
    now: float = 0.0
    step: int = 0
    prefill_tokens: int = 0
    prefill_ctx_tokens: int = 0
    prev_loop_ms: float = math.nan
    prev_loop_requests: int = 0
    ngram_avail: np.ndarray | None = None
    ngram_match: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.slots.shape[0])

    def generated(self) -> np.ndarray:
        return self.accepted + 1

    def position_counts(self, max_k: int) -> tuple[np.ndarray, np.ndarray]:
        """Per draft position (1..max_k): how often it was evaluated and how often accepted.

        With chain verification a position is evaluated when every earlier draft token was accepted;
        tokens after the first rejection are never tried. Both arrays have shape (max_k,).
        """
        return position_counts(self.verified, self.accepted, max_k)


def position_counts(verified: np.ndarray, accepted: np.ndarray, max_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Trials and successes per draft position from chain outcomes (see StepOutcome.position_counts)."""
    pos = np.arange(max_k)
    tried_len = np.minimum(accepted + 1, verified)
    trials = (pos[None, :] < tried_len[:, None]).sum(axis=0)
    succ = (pos[None, :] < accepted[:, None]).sum(axis=0)
    return trials.astype(I64), succ.astype(I64)


def stopped_short(asked: np.ndarray, drafted: np.ndarray, verified: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """Requests whose drafter drafted fewer than the k asked and had everything it drafted verified
    and accepted. For a drafter that stops only when it has nothing to propose (no confidence cut:
    an n-gram lookup without a longer match) that is a rejection at the next position: the token
    was asked for and none came."""
    return (drafted < asked) & (verified == drafted) & (accepted == verified)


@runtime_checkable
class Policy(Protocol):
    """A decision policy: ``decide`` before each decode step, ``observe`` after it."""

    name: str

    def decide(self, view: StepView) -> Decision: ...

    def observe(self, outcome: StepOutcome) -> None: ...


@runtime_checkable
class FreshWanted(Protocol):
    """Optional: a policy that says when one-step-stale decisions would cost it (an engine that
    prepares step t+1's decision during step t then decides that step on its loop, fresh)."""

    def wants_fresh(self) -> bool:
        """Whether the next decision should see every outcome so far."""
        ...


def wants_fresh(policy: object) -> bool:
    """Whether ``policy`` asks for decisions that see every outcome so far (``FreshWanted``); a policy
    without the method, or whose method fails, is served one step stale (always correct)."""
    ask = getattr(policy, "wants_fresh", None)
    if ask is None:
        return False
    try:
        return bool(ask())
    except Exception:  # noqa: BLE001 - the question is advisory
        return False


@runtime_checkable
class Verifier(Protocol):
    """Optional: a policy that prunes drafted tokens before verification (SpecServe 5.2)."""

    def prune(self, view: StepView, decision: Decision, drafted: np.ndarray, confidence: np.ndarray) -> np.ndarray:
        """Return how many of each request's ``drafted`` tokens to verify (a prefix, <= drafted)."""
        ...
