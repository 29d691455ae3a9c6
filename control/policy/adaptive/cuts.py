"""Stage: cuts. Per request, the running draft confidence below which drafting stops.

One more draft token of survival p pays iff its value beats the goodput it costs:

    w_r * p >= g * dT_r(k_r + 1)   so   cut_r (in survival) = clip(g * next_cost_r / w_r, 0, 1),

with g the optimiser's goodput and next_cost_r the marginal step time of request r's next token.
The executor compares the drafter's raw running confidence, so the cut is mapped back through the
drafter's measured survival per confidence (``ConfidenceMap.raw_cut``).
"""

from __future__ import annotations

import numpy as np

from control.goodput.estimators import ConfidenceMap
from control.policy.adaptive.step_plan import StepPlan
from control.policy.adaptive.survival import drafters_in


def confidence_cuts(plan: StepPlan, confidences: np.ndarray, maps: list[ConfidenceMap]) -> np.ndarray | None:
    """(n,) raw confidence cuts (None: no drafter in the step reports confidences, or the optimiser
    gave no marginal costs). ``confidences`` (m,) bool: which drafters report them."""
    choice, d_ctx, w, g_value, uniform = plan.choice, plan.d_ctx, plan.weights, plan.g_value, plan.uniform
    if choice.next_cost is None:
        return None
    if not (confidences[d_ctx[0]] if uniform else confidences[d_ctx].any()):
        return None
    if uniform and d_ctx.shape[0] == 1 and d_ctx[0] >= 0:  # batch 1 on plain floats (w is None there)
        one = min(max(g_value * float(choice.next_cost[0]), 0.0), 1.0)
        return np.array([maps[int(d_ctx[0])].raw_cut_one(one)])
    cuts = g_value * choice.next_cost if w is None else g_value * choice.next_cost / w  # (n,) in survival
    if uniform and d_ctx[0] >= 0:
        return maps[int(d_ctx[0])].raw_cut(np.minimum(np.maximum(cuts, 0.0), 1.0))  # np.clip, cheaper
    conf_cut = np.zeros(d_ctx.shape[0])  # (n,)
    for i in drafters_in(d_ctx):
        if i >= 0 and confidences[i]:
            sel = d_ctx == i  # (n,) bool
            conf_cut[sel] = maps[i].raw_cut(np.clip(cuts[sel], 0.0, 1.0))
    return conf_cut
