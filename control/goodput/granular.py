"""The goodput-optimal draft lengths when the target does not verify each request's own k + 1.

Under ``padded`` verification (``control.goodput.granularity``) the step verifies K + 1 tokens per
request as soon as it drafts at all, whatever the k: verification is a fixed cost of the step being
on, and a draft token's marginal cost is its drafting alone. So the decision is:

1. on or off for the whole step (off: plain decoding, where the engine can switch speculation off;
   with ``always`` padding there is no off, every step pays K + 1);
2. when on, per-request k against the drafting cost only: ``admit_parametric`` on a cost model
   whose verify pass is flat at the padded depth. For n-gram lookup, whose drafting costs the same
   whatever k, every request drafts its cap (K unless ``num_draft_tokens`` or max_tokens say less).

Under ``per_batch`` the verify depth D is the step's largest k: each candidate D = 1..K is solved
the same way with k capped at D. Every candidate is priced again with the true cost model
(``StepCostModel.step_ms``, granularity included) and the best goodput wins.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from control.goodput.cost import LinearCost
from control.goodput.granularity import PER_REQUEST, VerifyKind
from control.goodput.optimizer import Choice, Constraints, admit_parametric, slo_ok
from control.goodput.stepcost import StepCostModel


def _flat_at(cost: StepCostModel, n: int, depth: int) -> StepCostModel:
    """``cost`` with a verify pass that costs the same for every k: that of ``depth`` + 1 tokens for
    each of the n requests (a per-request verifier then sees only the drafting costs)."""
    t = cost.target
    flat = LinearCost(t.a, 0.0, t.c + t.b * n * (depth + 1), t.r2, t.mape, t.resid_std_ms, t.d)
    return StepCostModel(flat, cost.drafters, cost.overhead_ms, PER_REQUEST)


def granular_choice(cost: StepCostModel, ctx, surv, cap, cons: Constraints, drafter=None, lag=None) -> Choice:
    """The best per-request k (on or off for the step first) under ``cost.verify``; see the module."""
    ctx = np.asarray(ctx, dtype=np.float64)
    cap = np.asarray(cap, dtype=np.int64)
    n, K = surv.shape
    if cost.verify.per_request:
        return admit_parametric(cost, ctx, surv, cap, cons, drafter, lag)
    plain = cost.plain_ms(ctx)  # padded always: the padded pass; otherwise plain decoding
    zero = np.zeros(n, dtype=np.int64)
    best = Choice(zero, float(n), plain, plain)
    if n == 0 or K == 0 or int(cap.max(initial=0)) <= 0:
        return best
    depths = [cost.verify.pad_to] if cost.verify.kind == VerifyKind.padded else range(1, K + 1)
    std = cost.step_std_ms()
    for depth in depths:
        d_cap = np.minimum(cap, depth)
        ch = admit_parametric(_flat_at(cost, n, depth), ctx, surv, d_cap, replace(cons, slo_tpot_ms=None),
                              drafter, lag)
        k = ch.k
        if not k.any():
            continue
        t = cost.step_ms(ctx, k, drafter, lag)
        total = int(k.sum())
        if total > cons.free_kv_slots or n + total > cons.token_budget or not slo_ok(t, cons, std):
            continue
        tokens = float(n + np.where(np.arange(K)[None, :] < k[:, None], surv, 0.0).sum())
        if tokens / t > best.tokens / best.step_ms:
            best = Choice(k, tokens, t, plain)
    return best
