"""``oracle`` (simulator only): knows each step's realised outcome and picks the best k in hindsight.

Before each step the simulator tells the oracle, for every request and drafter, how many draft
tokens the target would accept (the leading accepted run L). Drafting past L only costs, so the
oracle chooses k_i in 0..min(L_i, cap_i) maximising the realised goodput
(n + sum k_i) / T_step(k) under the true cost model.

For one drafter this is solved exactly: for every draft depth D the step time is
plain + D * c_draft + (const) + sum_i C_i(k_i), with C_i the request's slot costs (its draft pass
shares, verify tokens and catch-up), a ratio maximised by Dinkelbach's iteration, which is
separable per request. With several drafters each single-drafter optimum is evaluated along with
a per-request mix (each request on the drafter that serves it best at the single-drafter optimum's
goodput); the best realised goodput wins. KV slots, token budget and the TPOT SLO are respected by
trimming the most expensive slots.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from control.errors import ConfigError
from control.goodput.optimizer import Constraints, slo_ok
from control.goodput.stepcost import StepCostModel
from control.policy.base import I64, BasePolicy, PolicyContext
from control.policy.types import Decision, StepView


def realised_goodput(cost: StepCostModel, ctx, k, L, drafter=None, lag=None) -> float:
    """Tokens per ms a step really yields: (n + sum min(k_i, L_i)) / T_step(k)."""
    k = np.asarray(k, dtype=I64)
    tokens = k.shape[0] + float(np.minimum(k, np.asarray(L, dtype=I64)).sum())
    return tokens / cost.step_ms(np.asarray(ctx, dtype=np.float64), k, drafter, lag)


def _slot_cumcost(cost: StepCostModel, d: int, ctx: np.ndarray, lag: np.ndarray, K: int) -> np.ndarray:
    """(n, K + 1) cumulative marginal cost of drafting and verifying j = 0..K tokens on drafter d,
    excluding the per-depth pass cost and the drafter's per-step constant."""
    dc = cost.drafters[d]
    vb, va = cost.verify_slots(ctx)  # verify slot j costs vb + va * j (batch expansion: va > 0)
    per = dc.slot_costs(ctx, lag.astype(np.float64), K) + (vb[:, None] + va * np.arange(K))  # (n, K)
    return np.concatenate([np.zeros((ctx.shape[0], 1)), np.cumsum(per, axis=1)], axis=1)


def _dinkelbach(cum: np.ndarray, limit: np.ndarray, n: int, fixed_ms: np.ndarray, iters: int = 30):
    """For every depth D = 1..Dmax at once: argmax over k_i in 0..min(limit_i, D) of
    (n + sum k) / (fixed_D + sum cum[i, k_i]). Returns (k (Dmax, n), goodput (Dmax,))."""
    Dmax = cum.shape[1] - 1
    j = np.arange(Dmax + 1, dtype=np.float64)
    D = np.arange(1, Dmax + 1)
    mask = j[None, None, :] <= np.minimum(limit[None, :], D[:, None])[:, :, None]  # (Dmax, n, Dmax+1)
    rows = np.arange(cum.shape[0])
    g = n / fixed_ms
    k = np.zeros((Dmax, cum.shape[0]), dtype=I64)
    for _ in range(iters):
        val = np.where(mask, j[None, None, :] - g[:, None, None] * cum[None, :, :], -np.inf)
        k_new = np.argmax(val, axis=2)
        g_new = (n + k_new.sum(axis=1)) / (fixed_ms + cum[rows[None, :], k_new].sum(axis=1))
        better = g_new > g * (1 + 1e-12)
        if not better.any():
            break
        k = np.where(better[:, None], k_new, k)
        g = np.where(better, g_new, g)
    return k, g


def _at_price(cum: np.ndarray, limit: np.ndarray, n: int, fixed_ms: np.ndarray, price: float):
    """For every depth D = 1..Dmax: argmax over k_i in 0..min(limit_i, D) of
    (n + sum k) - price * (fixed_D + sum cum[i, k_i]). Returns (k (Dmax, n), value (Dmax,))."""
    Dmax = cum.shape[1] - 1
    j = np.arange(Dmax + 1, dtype=np.float64)
    D = np.arange(1, Dmax + 1)
    mask = j[None, None, :] <= np.minimum(limit[None, :], D[:, None])[:, :, None]  # (Dmax, n, Dmax+1)
    val = np.where(mask, j[None, None, :] - price * cum[None, :, :], -np.inf)
    k = np.argmax(val, axis=2)
    rows = np.arange(cum.shape[0])
    return k.astype(I64), n + k.sum(axis=1) - price * (fixed_ms + cum[rows[None, :], k].sum(axis=1))


def _trim(cost: StepCostModel, ctx, k, drafter, lag, cons: Constraints, n: int) -> np.ndarray:
    """Drop the deepest slots until KV slots, token budget and the SLO are met."""
    k = k.copy()
    std = cost.step_std_ms()
    while k.sum() > 0:
        total = int(k.sum())
        if (total <= cons.free_kv_slots and n + total <= cons.token_budget
                and bool(slo_ok(cost.step_ms(ctx, k, drafter, lag), cons, std))):
            break
        k[int(np.argmax(k))] -= 1
    return k


def hindsight_k(cost: StepCostModel, ctx, L, cap, cons: Constraints | None = None, lag=None,
                price: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Best per-request (k, drafter) in hindsight.

    Args:
        ctx: (n,) context lengths. L: (n, m) accepted run per drafter (m = len(cost.drafters)).
        cap: (n,) per-request k cap. lag: (n, m) catch-up tokens per drafter.
        price: None maximises the step's own goodput (tokens / ms); a price in tokens per ms
            maximises tokens - price * ms instead, which summed over a run maximises the run's
            goodput when the price is that goodput (Dinkelbach).
    Returns (k, drafter) arrays of shape (n,).
    """
    cons = cons or Constraints()
    ctx = np.asarray(ctx, dtype=np.float64)
    L = np.asarray(L, dtype=I64)
    n = ctx.shape[0]
    m = len(cost.drafters)
    if L.ndim == 1:
        L = L[:, None]
    lag = np.zeros((n, m), dtype=I64) if lag is None else np.asarray(lag, dtype=I64).reshape(n, m)
    cap = np.asarray(cap, dtype=I64)
    zero = np.zeros(n, dtype=I64)
    if n == 0 or m == 0:
        return zero, zero
    plain = cost.plain_ms(ctx)

    def value_of(k, Ld, drafter, lag_d) -> float:
        if price is None:
            return realised_goodput(cost, ctx, k, Ld, drafter, lag_d)
        tokens = n + float(np.minimum(k, Ld).sum())
        return tokens - price * cost.step_ms(ctx, k, drafter, lag_d)

    best = (n / plain if price is None else n - price * plain, zero, zero)
    per_drafter = []
    for d in range(m):
        limit = np.maximum(np.minimum(L[:, d], cap), 0)
        Dmax = int(limit.max(initial=0))
        if Dmax == 0:
            per_drafter.append(None)
            continue
        dc = cost.drafters[d]
        cum = _slot_cumcost(cost, d, ctx, lag[:, d], Dmax)
        drafter = np.full(n, d, dtype=I64)
        fixed = plain + dc.depth_ms * np.arange(1, Dmax + 1) + dc.const_ms
        ks, gs = _dinkelbach(cum, limit, n, fixed) if price is None else _at_price(cum, limit, n, fixed, price)
        top = None
        for D in np.argsort(-gs, kind="stable")[:2]:  # the best depth, and the runner-up in case trimming hurts it
            k = _trim(cost, ctx, ks[D], drafter, lag[:, d], cons, n)
            g = value_of(k, L[:, d], drafter, lag[:, d])
            if top is None or g > top[0]:
                top = (g, k, drafter)
        per_drafter.append((top, cum, limit))
        if top[0] > best[0]:
            best = top
    if m > 1 and sum(p is not None for p in per_drafter) > 1:
        # Mixed: each request on the drafter with the best net value at the best single-drafter goodput
        # (or at the given price).
        g = best[0] if price is None else price
        score = np.full((n, m), -np.inf)
        kk = np.zeros((n, m), dtype=I64)
        for d, p in enumerate(per_drafter):
            if p is None:
                continue
            _, cum, limit = p
            j = np.arange(cum.shape[1], dtype=np.float64)
            val = np.where(j[None, :] <= limit[:, None], j[None, :] - g * cum, -np.inf)
            kk[:, d] = np.argmax(val, axis=1)
            score[:, d] = val[np.arange(n), kk[:, d]]
        drafter = np.argmax(score, axis=1).astype(I64)
        k = kk[np.arange(n), drafter]
        lag_sel = lag[np.arange(n), drafter]
        k = _trim(cost, ctx, k, drafter, lag_sel, cons, n)
        gm = value_of(k, L[np.arange(n), drafter], drafter, lag_sel)
        if gm > best[0]:
            best = (gm, k, drafter)
    return best[1], best[2]


class OraclePolicy(BasePolicy):
    """The hindsight-optimal per-request k; ``peek(view)`` returns the (n, m_exec) accepted runs.

    ``price`` (tokens per ms): None maximises each step's goodput; a price maximises
    tokens - price * step time, the per-step form of the run's goodput (see ``hindsight_k``)."""

    name = "oracle"

    def __init__(self, ctx: PolicyContext, peek: Callable[[StepView], np.ndarray], price: float | None = None) -> None:
        super().__init__(ctx)
        self.peek = peek
        if price is not None and not (np.isfinite(price) and price > 0):
            raise ConfigError(f"oracle price = {price!r}: must be a finite number of tokens per ms > 0")
        self.price = price

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        n = view.n
        L_exec = np.asarray(self.peek(view), dtype=I64).reshape(n, -1)
        # Columns in the plan's drafter order; a drafter the executor lacks can never be chosen.
        cols = self._to_exec
        L = np.where(cols[None, :] >= 0, L_exec[:, np.maximum(cols, 0)], 0)
        lag = view.draft_lag[:, np.maximum(cols, 0)]
        c = self.ctx.cons
        cons = Constraints(view.free_kv_slots, view.token_budget, c.slo_tpot_ms, c.slo_quantile)
        k, d_ctx = hindsight_k(self.ctx.cost, view.ctx_lens, L, cap, cons, lag, self.price)
        return Decision(k, self.exec_drafter(d_ctx), prefill_draft=True)


class RateOraclePolicy(BasePolicy):
    """Diagnostic (simulator only, not a user policy): knows each request's true per-position
    acceptance probabilities but not the step's outcome, and optimises expected goodput with
    ``admit_slots``. It bounds what any causal policy can reach with a perfect acceptance estimate,
    and so separates estimation error from the oracle's foresight.

    ``peek_survival(view)`` returns (n, m_exec, K) survival probabilities."""

    name = "rate-oracle"

    def __init__(self, ctx: PolicyContext, peek_survival: Callable[[StepView], np.ndarray]) -> None:
        super().__init__(ctx)
        self.peek_survival = peek_survival

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        from control.goodput.optimizer import admit_slots

        n = view.n
        surv = np.asarray(self.peek_survival(view))[:, :, : max(self.ctx.max_k, 1)]
        d = self.default_exec_drafter()
        c = self.ctx.cons
        cons = Constraints(view.free_kv_slots, view.token_budget, c.slo_tpot_ms, c.slo_quantile)
        lag = view.draft_lag[:, d]
        choice = admit_slots(self.ctx.default_cost, view.ctx_lens, surv[:, d, :], np.where(lag > 0, 0, cap), cons)
        return Decision(choice.k, np.full(n, d, dtype=I64), prefill_draft=True)
