"""Stage: probes. While the drafter bandit explores, a request on an unmeasured drafter drafts one token.

A drafter with fewer than ``PROBE_TRIALS`` first-position trials is unmeasured. Where the optimiser
gave such a request k = 0 (its prior says drafting does not pay), the probe sets k = 1 for it, in
request order, as far as the KV slots and the token budget leave room,

    room = min(free_kv_slots, token_budget - n) - sum_r k_r,

and only if the probed step still meets the SLO. Otherwise a pessimistic prior is never tested: the
drafter's requests never speculate and the bandit never sees a reward.
"""

from __future__ import annotations

import numpy as np

from control.goodput.estimators import PositionRates
from control.goodput.optimizer import Choice, slo_ok
from control.goodput.stepcost import StepCostModel
from control.policy.adaptive.step_plan import StepPlan

PROBE_TRIALS = 32  # first-position trials below which a drafter counts as unmeasured (probed while exploring)


def probe_unmeasured(plan: StepPlan, pos: list[PositionRates], cost: StepCostModel) -> Choice:
    """``plan.choice`` with k = 1 for the requests the probe admits (the same object if none)."""
    choice, cap, view = plan.choice, plan.cap, plan.view
    if not (choice.k == 0).any():
        return choice
    unmeasured = np.array([p.trials[0] < PROBE_TRIALS for p in pos])  # (m,) bool
    probe = (choice.k == 0) & (cap > 0) & (plan.lag == 0) & unmeasured[plan.d_ctx]  # (n,) bool
    room = min(int(view.free_kv_slots), int(view.token_budget) - view.n) - int(choice.k.sum())
    if room <= 0 or not probe.any():
        return choice
    probe &= np.cumsum(probe) <= room
    k = np.where(probe, 1, choice.k)  # (n,)
    step = cost.step_ms(view.ctx_lens, k, plan.d_ctx, plan.lag)
    cons = plan.cons
    if cons.slo_tpot_ms is not None and not slo_ok(step, cons, cost.step_std_ms()):
        return choice
    pos_idx = np.arange(plan.surv.shape[1])[None, :]  # (1, K)
    tokens = float(k.shape[0] + plan.surv[pos_idx < k[:, None]].sum())  # bonus tokens plus survivals
    return Choice(k, tokens, step, choice.plain_ms)
