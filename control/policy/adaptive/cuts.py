"""Stage: cuts. Per request, the running draft confidence below which drafting stops.

One more draft token of survival p pays iff its value beats the goodput it costs:

    w_r * p >= g * dT_r(k_r + 1)   so   cut_r (in survival) = clip(g * next_cost_r / w_r, 0, 1),

with g the optimiser's goodput and next_cost_r the marginal step time of request r's next token.
The executor compares the drafter's raw running confidence, so the cut is mapped back through the
drafter's measured survival per confidence (``ConfidenceMap.raw_cut``). That map is pooled over the
drafter's requests, and a request that accepts more than the pool survives at a given confidence more
often than the map says (draft-tiny on the full CPU pair's record, tokens at running confidence under
0.01: 0.73 for the requests above the median rate, 0.25 below). Its cut is read off the map at its
lift, as the survival stage shifts its per-position curve (odds of its first position's rate over the
pooled one's); a request below the pool keeps the pool's cut (the optimiser already shortened its k
at the same lift; docs/decisions.md, 2026-11-27, stop 40):

    odds(cut in the map) = odds(cut_r) / max(lift_r, 1),   lift_r = odds(surv[r, 0]) / odds(pooled_rate[0]).
"""

from __future__ import annotations

import numpy as np

from control.goodput.estimators import RATE_EPS, ConfidenceMap, PositionRates
from control.policy.adaptive.step_plan import StepPlan
from control.policy.adaptive.survival import drafters_in


def confidence_cuts(plan: StepPlan, confidences: np.ndarray, maps: list[ConfidenceMap],
                    pos: list[PositionRates]) -> np.ndarray | None:
    """(n,) raw confidence cuts (None: no drafter in the step reports confidences, or the optimiser
    gave no marginal costs). ``confidences`` (m,) bool: which drafters report them; ``pos``: each
    drafter's pooled per-position rates (the lift's denominator)."""
    choice, d_ctx, w, g_value, uniform = plan.choice, plan.d_ctx, plan.weights, plan.g_value, plan.uniform
    if choice.next_cost is None:
        return None
    if not (confidences[d_ctx[0]] if uniform else confidences[d_ctx].any()):
        return None
    first = plan.surv[:, 0]  # (n,) each request's first-position rate
    if uniform and d_ctx.shape[0] == 1 and d_ctx[0] >= 0:  # batch 1 on plain floats (w is None there)
        i = int(d_ctx[0])
        one = min(max(g_value * float(choice.next_cost[0]), 0.0), 1.0)
        return np.array([maps[i].raw_cut_one(_pooled_cut_one(one, float(first[0]), float(pos[i].odds[0])))])
    cuts = g_value * choice.next_cost if w is None else g_value * choice.next_cost / w  # (n,) in survival
    cuts = np.minimum(np.maximum(cuts, 0.0), 1.0)  # np.clip, cheaper
    if uniform and d_ctx[0] >= 0:
        i = int(d_ctx[0])
        return maps[i].raw_cut(_pooled_cuts(cuts, first, pos[i].odds[0]))
    conf_cut = np.zeros(d_ctx.shape[0])  # (n,)
    for i in drafters_in(d_ctx):
        if i >= 0 and confidences[i]:
            sel = d_ctx == i  # (n,) bool
            conf_cut[sel] = maps[i].raw_cut(_pooled_cuts(cuts[sel], first[sel], pos[i].odds[0]))
    return conf_cut


def _pooled_cuts(cuts: np.ndarray, first: np.ndarray, pooled_odds: float) -> np.ndarray:
    """(n,) the cuts in the pooled map's survival: odds(cut) / max(lift, 1) (module doc)."""
    r = np.minimum(np.maximum(first, RATE_EPS), 1.0 - RATE_EPS)  # (n,)
    lift = np.maximum(r / (1.0 - r) / pooled_odds, 1.0)  # (n,)
    return cuts / (cuts + (1.0 - cuts) * lift)


def _pooled_cut_one(cut: float, first: float, pooled_odds: float) -> float:
    """``_pooled_cuts`` for one request on plain floats."""
    r = min(max(first, RATE_EPS), 1.0 - RATE_EPS)
    lift = max(r / (1.0 - r) / pooled_odds, 1.0)
    return cut / (cut + (1.0 - cut) * lift)
