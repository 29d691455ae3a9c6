"""The step procedure every data plane runs, over the plane's own parts (see the package docstring).

``run_step`` is steps 2-5: clamp the decision, draft, let the policy prune, verify and accept. What
differs between planes is behind ``StepParts``: the reference executor drafts with models and
verifies in a target pass; the simulator draws (or replays) each draft's acceptance when it drafts,
so its verifier only takes the accepted run the prune left; the BLS orchestrator calls engines.
``step_outcome`` is step 7. Shapes: n requests in the step, K' the step's longest draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from control.executors.step.clamp import Clamped, clamp_decision
from control.policy.types import Decision, StepOutcome, StepView

I64 = np.int64


@dataclass(slots=True)
class Drafts:
    """Step 3: what the drafters proposed."""

    count: np.ndarray  # (n,) int64 tokens drafted per request
    tokens: np.ndarray | None = None  # (n, K') int64 draft tokens, -1 past count (None: a plane without tokens)
    confidence: np.ndarray | None = None  # (n, max(max_k, 1)) drafter's probability per token, NaN past count
    lead: np.ndarray | None = None  # (n,) accepted run of a full verification, known when drafting (simulator)
    ms: float = 0.0
    passes: int = 0
    ctx_tokens: int = 0
    batched_tokens: int = 0


@dataclass(slots=True)
class Verdict:
    """Steps 4-5: what the target kept."""

    accepted: np.ndarray  # (n,) int64 drafts accepted per request
    bonus: np.ndarray | None = None  # (n,) int64 the target's token after them (None: a plane without tokens)
    ms: float = 0.0


class StepParts(Protocol):
    """A data plane's drafters, verifier and acceptor."""

    n_drafters: int
    default_drafter: int

    def refused(self, view: StepView, error: Exception) -> None:
        """The clamp refused the policy's decision (``error``); return to run the step without
        speculation, raise to stop."""

    def draft(self, view: StepView, plan: Clamped) -> Drafts:
        """Step 3: draft ``plan.k`` tokens per request with ``plan.drafter``."""

    def prune(self, view: StepView, decision: Decision, drafts: Drafts) -> np.ndarray | None:
        """The policy's prune: how many of each request's drafts to verify (None: all)."""

    def verify(self, view: StepView, drafts: Drafts, verified: np.ndarray) -> Verdict:
        """Steps 4-5: verify each request's first ``verified`` drafts and accept."""


@dataclass(slots=True)
class StepResult:
    """Steps 2-5 of one decode step."""

    plan: Clamped
    drafts: Drafts
    verified: np.ndarray  # (n,) int64 drafts sent to the target
    verdict: Verdict


def run_step(view: StepView, decision: Decision, parts: StepParts, who: str = "policy") -> StepResult:
    """Steps 2-5 for ``view``'s requests under ``decision``."""
    try:
        plan = clamp_decision(view, decision, parts.n_drafters, parts.default_drafter, who)  # 2
    except (ValueError, TypeError) as e:
        parts.refused(view, e)
        plan = clamp_decision(view, Decision.plain(view.n), parts.n_drafters, parts.default_drafter, who)
    drafts = parts.draft(view, plan)  # 3
    verified = _pruned(view, decision, drafts, parts)
    verdict = parts.verify(view, drafts, verified)  # 4, 5
    return StepResult(plan, drafts, verified, verdict)


def _pruned(view: StepView, decision: Decision, drafts: Drafts, parts: StepParts) -> np.ndarray:
    """(n,) drafts to verify: the prune's answer within 0..drafted, or every draft."""
    count = drafts.count
    if not count.any():
        return count
    v = parts.prune(view, decision, drafts)
    if v is None:
        return count
    v = np.asarray(v, dtype=I64).reshape(-1)
    return np.clip(v, 0, count) if v.shape[0] == count.shape[0] else count


def step_outcome(view: StepView, res: StepResult, idle_drafter: np.ndarray, finished: np.ndarray, *,
                 verify_ms: float, total_ms: float, now: float, step: int, **extra) -> StepOutcome:
    """Step 7: the outcome the policy observes. ``idle_drafter`` (n,): the drafter reported for the
    requests that did not draft (planes differ: the last one used, or the one decided)."""
    plan, dr = res.plan, res.drafts
    return StepOutcome(
        slots=view.slots, request_ids=view.request_ids, drafter=np.where(plan.k > 0, plan.drafter, idle_drafter),
        ctx_lens=view.ctx_lens, drafted=dr.count, verified=res.verified, accepted=res.verdict.accepted,
        confidence=dr.confidence, category=view.category, draft_ms=dr.ms, verify_ms=verify_ms, total_ms=total_ms,
        draft_passes=dr.passes, draft_ctx_tokens=dr.ctx_tokens, draft_batched_tokens=dr.batched_tokens,
        finished=finished, now=now, step=step, ngram_avail=view.ngram_avail, **extra,
    )
