"""Step 2, the clamp: a policy's decision made safe, by one rule for every data plane.

Each request's k lies in 0..min(its k_cap, remaining - 1, max_k) (drafting past what the request
may still generate is waste); a drafter index outside the plane's drafters means the plane's default
drafter; then, if n + sum k exceeds the step's token budget or sum k the free KV slots, the longest
drafts are shortened one token at a time (the first of equals first) until both fit. A plane
without drafters never speculates. A decision of the wrong length is an error naming the policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from control.policy.types import Decision, StepView

I64 = np.int64


@dataclass(frozen=True, slots=True)
class Clamped:
    """The decision as the plane runs it."""

    k: np.ndarray  # (n,) int64 draft length per request
    drafter: np.ndarray  # (n,) int64 drafter index per request, within the plane's drafters
    conf_cut: np.ndarray | None  # (n,) float64 confidence cut per request, or None


def check_shapes(view: StepView, decision: Decision, who: str) -> None:
    """Raise ValueError unless the decision holds one k, drafter and cut (if any) per request."""
    n = view.n
    nk, nd = np.shape(np.asarray(decision.k).reshape(-1))[0], np.shape(np.asarray(decision.drafter).reshape(-1))[0]
    if nk != n or nd != n:
        raise ValueError(f"policy '{who}' returned {nk} draft lengths and {nd} drafters for a step of {n} requests")
    if decision.conf_cut is not None:
        nc = np.asarray(decision.conf_cut).reshape(-1).shape[0]
        if nc != n:
            raise ValueError(f"policy '{who}' returned {nc} confidence cuts for {n} requests")


def clamp_decision(view: StepView, decision: Decision, n_drafters: int, default_drafter: int,
                   who: str = "policy") -> Clamped:
    """The module's rule applied to ``decision`` for ``view``'s requests (ValueError: wrong shapes)."""
    check_shapes(view, decision, who)
    n = view.n
    cut = None if decision.conf_cut is None else np.asarray(decision.conf_cut, dtype=np.float64).reshape(-1)
    if n_drafters <= 0:
        zeros = np.zeros(n, dtype=I64)
        return Clamped(zeros, zeros.copy(), cut)
    cap = np.clip(np.minimum(view.k_cap, view.remaining - 1), 0, view.max_k)  # (n,)
    k = np.clip(np.asarray(decision.k, dtype=I64).reshape(-1), 0, cap)  # (n,)
    d = np.asarray(decision.drafter, dtype=I64).reshape(-1)  # (n,)
    d = np.where((d >= 0) & (d < n_drafters), d, default_drafter)
    limit = min(int(view.token_budget) - n, int(view.free_kv_slots))
    return Clamped(fit_budget(k, limit), d, cut)


def fit_budget(k: np.ndarray, limit: int) -> np.ndarray:
    """``k`` (n,) with its longest drafts shortened one token at a time, the first of equals first,
    until sum k <= ``limit`` (or every k is 0); ``k`` itself when it fits."""
    over = int(k.sum()) - max(limit, 0)
    if over <= 0:
        return k
    k = k.copy()
    while over > 0:
        top = int(k.max())
        if top <= 0:
            break
        at_top = np.flatnonzero(k == top)  # (t,) the longest drafts, in request order
        take = min(over, at_top.size)
        k[at_top[:take]] -= 1
        over -= take
    return k
