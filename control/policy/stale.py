"""One-step-stale decisions: the decision for step t+1 made before step t's outcome is learned.

An engine that overlaps host work with the GPU (TensorRT-LLM's overlap scheduler) prepares step t+1
while step t still runs, so the controller deciding t+1 has seen outcomes up to step t-1 only. This
wrapper models that with any policy: ``observe(outcome_t)`` is held back and delivered to the inner
policy right after it decides step t+1. Its cost in goodput (against the same policy deciding fresh)
is what ``benchmarks/stale_decisions.py`` measures on the simulator.

Rows of a held-back outcome whose slot a new request takes in the next view are delivered before
that decision: the inner policy resets a slot's per-request state when a new request arrives in it,
and the old request's outcome must not land on the new one. (With an overlap scheduler a freed slot
is reused two steps later at the earliest, so a real engine never needs this.)
"""

from __future__ import annotations

import math
from dataclasses import fields, replace

import numpy as np

from control.policy.types import Decision, StepOutcome, StepView, wants_fresh

_PER_REQUEST = tuple(f.name for f in fields(StepOutcome)
                     if f.name in ("slots", "request_ids", "drafter", "ctx_lens", "drafted", "verified", "accepted",
                                   "confidence", "category", "ngram_avail", "ngram_match"))


def outcome_rows(outcome: StepOutcome, rows: np.ndarray, step_totals: bool) -> StepOutcome:
    """The outcome of the requests in ``rows`` (a boolean mask); without ``step_totals`` it carries
    none of the step's times or pass counts (so it refits nothing)."""
    per = {name: None if getattr(outcome, name) is None else getattr(outcome, name)[rows] for name in _PER_REQUEST}
    if step_totals:
        return replace(outcome, **per)
    return replace(outcome, **per, draft_ms=0.0, verify_ms=0.0, total_ms=0.0, draft_passes=0, draft_ctx_tokens=0,
                   draft_batched_tokens=0, prefill_tokens=0, prefill_ctx_tokens=0, prev_loop_ms=math.nan,
                   prev_loop_requests=0)


class OneStepStale:
    """Wraps a policy so each decision uses estimates one step older than the step before it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = f"{inner.name}+stale"
        self._held: StepOutcome | None = None

    def __getattr__(self, attr: str):
        # everything else (update_context, explain hooks, ...) is the inner policy's
        return getattr(self.inner, attr)

    def decide(self, view: StepView) -> Decision:
        held, self._held = self._held, None
        if held is not None and wants_fresh(self.inner):  # as an overlapping engine would: decide fresh
            self.inner.observe(held)
            held = None
        if held is not None and held.n and view.n:
            held = self._deliver_reused(held, view)
        decision = self.inner.decide(view)
        if held is not None:
            self.inner.observe(held)
        return decision

    def observe(self, outcome: StepOutcome) -> None:
        if self._held is not None:  # two outcomes without a decision between them: the older one is due
            self.inner.observe(self._held)
        self._held = outcome

    def flush(self) -> None:
        """Deliver the held-back outcome (at the end of a run)."""
        if self._held is not None:
            held, self._held = self._held, None
            self.inner.observe(held)

    def _deliver_reused(self, held: StepOutcome, view: StepView) -> StepOutcome | None:
        """Deliver now the held rows whose slot holds another request in ``view``; return the rest."""
        size = int(max(view.slots.max(), held.slots.max())) + 1
        rid_now = np.full(size, -1, dtype=np.int64)
        rid_now[view.slots] = view.request_ids
        now = rid_now[held.slots]
        reused = (now >= 0) & (now != held.request_ids)
        if not reused.any():
            return held
        rest = ~reused
        if not rest.any():
            self.inner.observe(held)
            return None
        self.inner.observe(outcome_rows(held, reused, step_totals=False))
        return outcome_rows(held, rest, step_totals=True)
