"""Stage: optimiser. Per-request k maximising residence-weighted goodput, and each request's pace.

    k* = argmax_k (n + sum_r w_r P_r(k_r)) / T(k)        P_r(k) = sum_{j < k} surv[r, j]

with T the live cost model's step time (real contexts, catch-up of lagging drafts, KV, token budget
and SLO limits; ``admit_parametric``, a Dinkelbach iteration warm-started at the last step's ratio).
w_r values request r's token by the step time it saves: an accepted token shortens its stay by
1 / pace_r steps, and each step it stays costs the batch (a * ctx_r + b + d + (c + overhead) / n), so

    w_r ~ (a * ctx_r + b + d + (c + overhead) / n) / pace_r,   normalised to mean 1 over the batch,

with pace_r the request's tokens per step at the k it was given, smoothed over its steps:

    pace_r <- PACE_SMOOTHING * pace_r + (1 - PACE_SMOOTHING) * (1 + P_r(k_r)),

starting, for a request not decided on before, from the batch's mean pace (the known requests', else
this step's), the prior its weight took (docs/decisions.md, 2026-11-27, stop 38).

A lagging draft's catch-up is charged to this step as lag / (remaining / (1 + P_r(cap_r))): the
re-prefill serves every later step of the request. The charge sits on the request's first draft
token, so it deepens the k of a request that catches up (the step pays it whatever k) and can give
it k = 0. Where requests stay on their drafters (``stays``: one drafter, or the bandit exploiting),
waiting saves nothing: the lag only grows by the tokens the request emits meanwhile, and each later
step charges it again, while the request's weight (its pace at k = 0 is one token a step) rises
until it drafts deep to repay the charge. So a lagging request the charged optimiser gives no tokens
is decided once more with its catch-up as if paid, where its remaining life can repay it (its
share per step left b_d lag_r (1 + P_r(cap_r)) / remaining_r <= P_r(cap_r) / G, G the step's goodput):
it drafts when it would in sync. While the bandit explores, a request may sit on a drafter for one
chunk only, and the charge decides alone, but for new requests on the draft model the drafter choice
priced them in sync with (``StepPlan.sunk``): their catch-up stands for the prefill that would have
put them in sync, so where their remaining life repays it (the same test, at the last step's goodput)
they are decided with no charge, as prefilled requests are, exploring or not, and the step's
predicted time adds the catch-up of those that draft.

n-gram lookups (``StepPlan.lookup_curves``, the view's ``ngram_avail`` a_r): a request on a draft model
that the optimiser gives no tokens (its passes do not pay for it) still drafts by lookup when that
raises the step's goodput: the optimiser runs once more with those requests on the lookup, at its
survival for their a_r, and keeps the better choice. Between full decisions a request on the lookup
drafts the lookup's draft length for what its lookup proposes now (``held_lookup``):

    k_lookup[a] = #{j < a : S_a[j] >= tau},   tau = median over the lookup's requests of g * next_cost_r / w_r

(the optimiser's marginal condition, as the held table over rates uses it).
"""

from __future__ import annotations

import numpy as np

from control.goodput import optimizer
from control.goodput.optimizer import Choice
from control.goodput.stepcost import StepCostModel
from control.policy.adaptive.step_plan import StepPlan

PACE_SMOOTHING = 0.5  # weight of a request's previous pace against this step's (damps k <-> weight feedback)
EQUAL_WEIGHTS_TOL = 1e-12  # relative spread of the weights below which every token counts alike


class Optimiser:
    """Runs the optimiser on a step plan; owns the per-slot pace and the warm start."""

    def __init__(self, slots: int) -> None:
        self.pace = np.full(slots, np.nan)  # (slots,) smoothed tokens per step, NaN before the first decision
        self.g: float | None = None  # last step's predicted goodput: the optimiser's warm start
        self._arange = np.arange(slots)
        self.lookup_k: np.ndarray | None = None  # (K+1,) held draft length by lookup proposal (module doc)
        self.lookup_exec = -1  # executor index of the drafter ``lookup_k`` is for

    def grow(self, size: int) -> None:
        if size > self.pace.size:
            self.pace = np.concatenate([self.pace, np.full(size - self.pace.size, np.nan)])

    def reset(self, slots: np.ndarray) -> None:
        self.pace[slots] = np.nan

    def run(self, plan: StepPlan, cost: StepCostModel, k0: np.ndarray | None, stays: bool = False) -> None:
        """Fill ``plan.csum``, ``pace``, ``known``, ``weights``, ``choice``, ``g_value`` and ``accepted``
        (``k0``, (n,): the last decision's draft lengths, a lower bound for the warm start; ``stays``:
        the requests stay on their drafters beyond this step, module doc)."""
        view, n = plan.view, plan.n
        plan.csum = prefix_sums(plan.surv) if n > 1 else None  # (n, K+1)
        pace = self.pace[view.slots]  # (n,) NaN where not yet decided on
        known = np.isfinite(pace)  # (n,) bool
        plan.pace, plan.known = pace, (True if n > 1 and known.all() else known)
        w = plan.weights = residence_weights(view, cost, pace, plan.known)
        lag = amortised_lag(plan.lag, plan.surv, plan.csum, plan.cap, view.remaining, self.rows(n)) if plan.lagged else None
        sunk = self._prefilled(plan, cost, lag, k0) if lag is not None and plan.sunk is not None else None
        charged = lag if sunk is None else np.where(sunk, 0.0, lag)
        choice = optimizer_call(cost, view.ctx_lens, plan.surv, plan.cap, plan.cons, plan.d_ctx, charged, self.g, k0,
                                plan.csum, w)
        if sunk is not None:  # their catch-up runs in this step all the same
            paid = float(self._share_ms(plan, cost, lag)[sunk & (choice.k > 0)].sum())
            choice = Choice(choice.k, choice.tokens, choice.step_ms + paid, choice.plain_ms, choice.next_cost)
        if lag is not None and stays:
            choice = self._sunk_catch_up(plan, cost, choice, charged, k0)
        if plan.lookup_curves is not None:
            choice = self._lookup_fallback(plan, cost, choice, lag, k0)
            self._hold_lookup(plan, choice)
        plan.g_value = self.g = choice.goodput  # in residence-weighted tokens per ms: the scale of the cuts
        plan.accepted = self.accepted(plan, choice.k)  # (n,)
        if w is not None:  # report the prediction in plain tokens
            choice = Choice(choice.k, float(n + plan.accepted.sum()), choice.step_ms, choice.plain_ms, choice.next_cost)
        plan.choice = choice

    def _prefilled(self, plan: StepPlan, cost: StepCostModel, lag: np.ndarray, k0: np.ndarray | None) -> np.ndarray | None:
        """(n,) bool: the new requests priced in sync with their draft model (``plan.sunk``) whose catch-up
        their remaining life repays at the last step's goodput (the test of ``_sunk_catch_up``; at the
        first decision, this step's with every catch-up charged), decided with no charge, as if
        prefilled (module doc); None: none."""
        g = self.g
        if g is None:
            g = optimizer_call(cost, plan.view.ctx_lens, plan.surv, plan.cap, plan.cons, plan.d_ctx, lag, None, k0,
                               plan.csum, plan.weights).goodput
        out = plan.sunk & self._repaid(plan, self._share_ms(plan, cost, lag), g)
        return out if out.any() else None

    def _share_ms(self, plan: StepPlan, cost: StepCostModel, lag: np.ndarray) -> np.ndarray:
        """(n,) the catch-up charged to this step (``lag``, amortised tokens) in ms of each request's draft."""
        return cost.catch_up_ms_per_token()[np.maximum(plan.d_ctx, 0)] * lag

    def _repaid(self, plan: StepPlan, share_ms: np.ndarray, g: float) -> np.ndarray:
        """(n,) bool: a catch-up that its remaining life repays: its share per step left (``share_ms``)
        against what the tokens drafting at its cap adds per step are worth at the goodput g (gain / g ms)."""
        gain = (plan.csum if plan.csum is not None else prefix_sums(plan.surv))[self.rows(plan.n), plan.cap]  # (n,)
        return share_ms * g <= gain

    def _sunk_catch_up(self, plan: StepPlan, cost: StepCostModel, choice: Choice, lag: np.ndarray,
                       k0: np.ndarray | None) -> Choice:
        """``choice``, or with the lagging requests it gives no tokens decided as if their catch-up
        were paid (module doc); ``lag`` (n,): the amortised catch-up charged to this step."""
        waits = (choice.k == 0) & (plan.lag > 0) & (plan.cap > 0)  # (n,) bool
        if not waits.any():
            return choice
        share = self._share_ms(plan, cost, lag)  # (n,) ms
        waits &= self._repaid(plan, share, choice.goodput)
        if not waits.any():
            return choice
        alt = optimizer_call(cost, plan.view.ctx_lens, plan.surv, plan.cap, plan.cons, plan.d_ctx,
                             np.where(waits, 0.0, lag), self.g, k0, plan.csum, plan.weights)
        caught = waits & (alt.k > 0)  # (n,) bool: their share of the catch-up is in the step after all
        return Choice(alt.k, alt.tokens, alt.step_ms + float(share[caught].sum()), alt.plain_ms, alt.next_cost)

    def _lookup_fallback(self, plan: StepPlan, cost: StepCostModel, choice: Choice, lag: np.ndarray | None,
                         k0: np.ndarray | None) -> Choice:
        """``choice``, or the choice with the requests it gives no draft-model tokens moved to the
        lookup where that has a better goodput (module doc; updates ``plan``'s drafter fields)."""
        view, i, curves = plan.view, plan.lookup_ctx, plan.lookup_curves
        K = curves.shape[1]
        avail = np.minimum(view.ngram_avail, K)  # (n,)
        moved = (choice.k == 0) & (plan.d_ctx != i) & (plan.cap > 0) & (curves[avail, 0] > 0)  # (n,) bool
        if not moved.any():
            return choice
        d_ctx = np.where(moved, i, plan.d_ctx)
        surv = plan.surv.copy()
        surv[moved] = curves[avail[moved]]
        cap = np.where(moved, np.minimum(plan.cap, avail), plan.cap)
        lag = None if lag is None else np.where(moved, 0.0, lag)
        csum = prefix_sums(surv) if plan.csum is not None else None
        alt = optimizer_call(cost, view.ctx_lens, surv, cap, plan.cons, d_ctx, lag, self.g, k0, csum, plan.weights)
        if not alt.goodput > choice.goodput:
            return choice
        plan.d_ctx, plan.d_exec = d_ctx, np.where(moved, plan.lookup_exec, plan.d_exec)
        plan.lag = np.where(moved, 0, plan.lag)
        plan.surv, plan.csum, plan.cap, plan.uniform = surv, csum, cap, bool((d_ctx == d_ctx[0]).all())
        return alt

    def _hold_lookup(self, plan: StepPlan, choice: Choice) -> None:
        """The lookup's draft length by proposal length for the steps until the next full decision."""
        on = plan.d_ctx == plan.lookup_ctx  # (n,) bool
        if choice.next_cost is None or not on.any():
            return
        tau = choice.goodput * choice.next_cost  # (n,) in survival
        if plan.weights is not None:
            tau = tau / plan.weights
        t = float(np.sort(tau[on])[int(on.sum()) // 2])
        self.lookup_k = np.cumprod(plan.lookup_curves >= t, axis=1).sum(axis=1)  # (K+1,)
        self.lookup_exec = plan.lookup_exec

    def held_lookup(self, view, k: np.ndarray, d_exec: np.ndarray, cap: np.ndarray) -> np.ndarray:
        """(n,) the held draft lengths ``k`` with the lookup's requests at ``lookup_k`` of what their
        lookup proposes now, within ``cap`` (n,)."""
        if self.lookup_k is None or view.ngram_avail is None:
            return k
        on = d_exec == self.lookup_exec  # (n,) bool
        if not on.any():
            return k
        a = np.minimum(view.ngram_avail, self.lookup_k.size - 1)
        return np.where(on, np.minimum(cap, self.lookup_k[a]), k)

    def accepted(self, plan: StepPlan, k: np.ndarray) -> np.ndarray:
        """(n,) expected accepted draft tokens at draft lengths ``k`` (n,) (batch 1: from ``surv`` on
        plain floats, the same additions in the same order as ``csum``'s)."""
        if plan.csum is not None:
            return plan.csum[self.rows(k.shape[0]), k]
        return np.array([sum(plan.surv[0, : int(k[0])].tolist())])

    def note_pace(self, plan: StepPlan) -> None:
        """Smooth each request's expected tokens per step at the chosen k into its pace."""
        slots, accepted, old, known = plan.view.slots, plan.accepted, plan.pace, plan.known
        if slots.shape[0] == 1:  # plain floats, same bits
            now1, old1 = 1.0 + float(accepted[0]), float(old[0])
            self.pace[int(slots[0])] = (PACE_SMOOTHING * old1 + (1.0 - PACE_SMOOTHING) * now1 if known[0] else now1)
            return
        now = 1.0 + accepted  # (n,)
        if known is not True:  # a new request's pace starts from the prior its weight took (module doc)
            old = np.where(known, old, old[known].mean() if known.any() else now.mean())
        self.pace[slots] = PACE_SMOOTHING * old + (1.0 - PACE_SMOOTHING) * now

    def rows(self, n: int) -> np.ndarray:
        """np.arange(n), from a cached range grown as needed (row indices for per-request gathers)."""
        if n > self._arange.size:
            self._arange = np.arange(max(n, 2 * self._arange.size))
        return self._arange[:n]


def optimizer_call(cost, ctx_lens, surv, cap, cons, d_ctx, lag, g0, k0, csum, w) -> Choice:
    """``admit_parametric`` on one step's arrays (a seam the decision-cost benchmark times)."""
    return optimizer.admit_parametric(cost, ctx_lens, surv, cap, cons, drafter=d_ctx, lag=lag, g0=g0,
                                      k0=k0, psum=csum, weights=w)


def residence_weights(view, cost: StepCostModel, pace: np.ndarray, known: np.ndarray | bool) -> np.ndarray | None:
    """(n,) value of an accepted token per request, relative to the batch mean (None: all equal).

    The plain ratio (n + sum p) / T counts tokens alike, so it under-drafts long contexts and gives
    its drafts to the fast requests, leaving the slow ones in the batch for many steps; mean latency
    follows request-steps (docs/decisions.md, 2026-11-23). ``pace`` (n,) is finite where ``known``
    (or everywhere where it is True); a request not yet decided on takes the batch mean."""
    n = view.n
    if n < 2:
        return None
    if known is True:
        w = 1.0 / pace  # (n,)
    elif known.any():
        w = 1.0 / np.where(known, pace, pace[known].mean())
    else:
        w = np.ones(n)
    t = cost.target
    ctx = view.ctx_lens  # (n,)
    if t.a > 0.0 and ctx.min() != ctx.max():
        w = w * (t.a * ctx + (t.b + t.d + (t.c + cost.overhead_ms) / n))
    w_max = w.max()
    if w_max - w.min() <= EQUAL_WEIGHTS_TOL * w_max:
        return None
    return w * (n / float(w.sum()))


def amortised_lag(lag: np.ndarray, surv: np.ndarray, csum: np.ndarray | None, cap: np.ndarray,
                  remaining: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(n,) catch-up tokens charged to this step: ``lag`` (n,) over the steps left, about
    remaining / (1 + P(cap)) of them (a myopic step-level optimiser would never catch up, and a
    draft that fell behind while the gate was off would stay behind for good). ``csum``: ``surv``'s
    prefix sums (None: not taken yet)."""
    if not lag.any():
        return lag
    if csum is None:
        csum = prefix_sums(surv)
    per_step = 1.0 + csum[rows, cap]  # (n,); cap is within 0..K (``caps``)
    steps_left = np.maximum(remaining / per_step, 1.0)
    return lag / steps_left


def prefix_sums(surv: np.ndarray) -> np.ndarray:
    """(n, K+1): each request's expected accepted draft tokens at k = 0..K (its survivals' prefix sums)."""
    csum = np.empty((surv.shape[0], surv.shape[1] + 1))
    csum[:, 0] = 0.0
    np.cumsum(surv, axis=1, out=csum[:, 1:])
    return csum
