"""The goodput optimiser: choose draft lengths that maximise expected tokens per second.

- ``uniform_curve`` / ``best_uniform_k``: step-level (SmartSpec Alg. 2, TurboSpec Listing 2), one k
  for the whole batch, scanned k = 0..K with KV-slot, token-budget and SLO feasibility, stopping at
  the first drop (goodput is unimodal in k, SpecServe section 4.3).
- ``admit_slots``: request-level. Draft slots (r, j) are admitted in decreasing survival p[r, j]
  among those no deeper than a depth cap D; the step's cost depends on the slots admitted and the
  draft depth reached, so for every D the best prefix maximises (n + top-S survival sum) / T(S), and
  the best D wins. O(nK log nK + K * nK), vectorised. The same routine with the drafting cost
  already paid is SpecServe's confidence prior verifier (drop the least likely tokens while
  efficiency rises).
- ``slo_ok``: a choice whose predicted step time exceeds the TPOT SLO is infeasible (a request that
  only gets its bonus token sees the whole step as one token), in mean or quantile form. k = 0 is
  always allowed: it is the fallback, and speculation cannot rescue an SLO that plain decoding misses.
- ``confidence_cuts``: the marginal-cost threshold for adaptive drafting: one more draft token of
  survival p and marginal cost dT raises goodput G = E/T iff p > G * dT.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from control.goodput.stepcost import StepCostModel


@dataclass(frozen=True, slots=True)
class Constraints:
    """Per-step feasibility: free KV slots, token budget, and the TPOT SLO (mean or quantile)."""

    free_kv_slots: int = 1 << 62
    token_budget: int = 1 << 62
    slo_tpot_ms: float | None = None
    slo_quantile: float | None = None  # e.g. 0.9: the predicted 90th percentile must meet the SLO

    def slo_margin_ms(self, std_ms: float) -> float:
        """How much to add to a predicted mean step time before comparing with the SLO."""
        if self.slo_quantile is None or std_ms <= 0:
            return 0.0
        return float(norm.ppf(self.slo_quantile)) * std_ms


def slo_ok(step_ms, cons: Constraints, std_ms: float = 0.0):
    """True where ``step_ms`` (scalar or array) meets the SLO in the constraint's form."""
    if cons.slo_tpot_ms is None:
        return np.ones(np.shape(step_ms), dtype=bool) if np.ndim(step_ms) else True
    return np.asarray(step_ms) + cons.slo_margin_ms(std_ms) <= cons.slo_tpot_ms


@dataclass(frozen=True, slots=True)
class Choice:
    """The optimiser's answer: draft lengths and the prediction behind them."""

    k: np.ndarray  # per request
    tokens: float  # expected generated tokens in the step (bonus tokens included)
    step_ms: float
    plain_ms: float  # the same step without speculation, for comparison

    @property
    def goodput(self) -> float:
        """Tokens per millisecond."""
        return self.tokens / self.step_ms if self.step_ms > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Curve:
    """Goodput as a function of a uniform k = 0..K (for ``specctl explain`` and the step-level scan)."""

    k: np.ndarray
    tokens: np.ndarray
    step_ms: np.ndarray
    feasible: np.ndarray

    @property
    def goodput_tok_s(self) -> np.ndarray:
        return self.tokens / self.step_ms * 1000.0

    @property
    def best(self) -> int:
        g = np.where(self.feasible, self.goodput_tok_s, -np.inf)
        return int(self.k[int(np.argmax(g))])


def _uniform_point(cost: StepCostModel, ctx, csum, cap, drafter, lag, k: int):
    """Per-request k, expected tokens and step time for a uniform k; ``csum`` has a leading 0 column."""
    kk = np.minimum(cap, k)
    tokens = float(kk.shape[0] + np.take_along_axis(csum, kk[:, None], axis=1).sum())
    return kk, tokens, cost.step_ms(ctx, kk, drafter, lag)


def _csum0(surv: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((surv.shape[0], 1)), np.cumsum(surv, axis=1)], axis=1)


def uniform_curve(cost: StepCostModel, ctx, surv, cap, cons: Constraints, drafter=None, lag=None) -> Curve:
    """Goodput for every uniform k = 0..K (k_i = min(k, cap_i)); no early stop."""
    ctx = np.asarray(ctx, dtype=np.float64)
    cap = np.asarray(cap, dtype=np.int64)
    K = surv.shape[1]
    n = ctx.shape[0]
    std = cost.step_std_ms()
    csum = _csum0(surv)
    ks, toks, times, feas = [], [], [], []
    for k in range(K + 1):
        kk, tokens, t = _uniform_point(cost, ctx, csum, cap, drafter, lag, k)
        total = int(kk.sum())
        ok = k == 0 or (total <= cons.free_kv_slots and n + total <= cons.token_budget and bool(slo_ok(t, cons, std)))
        ks.append(k)
        toks.append(tokens)
        times.append(t)
        feas.append(ok)
    return Curve(np.array(ks), np.array(toks), np.array(times), np.array(feas))


def best_uniform_k(cost: StepCostModel, ctx, surv, cap, cons: Constraints, drafter=None, lag=None,
                   early_stop: bool = True) -> Choice:
    """Step-level argmax over k = 0..K with feasibility and the unimodal early stop."""
    ctx = np.asarray(ctx, dtype=np.float64)
    cap = np.asarray(cap, dtype=np.int64)
    n = ctx.shape[0]
    K = surv.shape[1]
    std = cost.step_std_ms()
    plain = cost.plain_ms(ctx)
    best_k = np.zeros(n, dtype=np.int64)
    best_tok, best_t = float(n), plain
    best_g = best_tok / best_t if best_t > 0 else 0.0
    cap_max = int(cap.max()) if n else 0
    csum = _csum0(surv)
    for k in range(1, min(K, cap_max) + 1):
        kk, tokens, t = _uniform_point(cost, ctx, csum, cap, drafter, lag, k)
        total = int(kk.sum())
        if total > cons.free_kv_slots or n + total > cons.token_budget or not slo_ok(t, cons, std):
            break  # cost and slots only grow with k: every larger k is infeasible too
        g = tokens / t
        if g > best_g:
            best_k, best_tok, best_t, best_g = kk, tokens, t, g
        elif early_stop:
            break
    return Choice(best_k, best_tok, best_t, plain)


def admit_slots(cost: StepCostModel, ctx, surv, cap, cons: Constraints, drafter=None, lag=None,
                draft_sunk: bool = False) -> Choice:
    """Request-level optimum: admit draft slots in decreasing survival while goodput rises.

    Every draft depth costs one pass of the draft model (``depth_ms``), shared by all requests that
    reach it, so the slots are admitted in decreasing survival among those no deeper than a depth
    cap D, for every D = 1..K, and the best prefix over all D wins. (Admitting in plain survival
    order would reach deep slots of the easiest requests before the first slot of the others and
    pay for every depth early, missing choices such as k = 1 for everyone.)

    Args:
        surv: (n, K) survival probabilities p[r, j], non-increasing in j.
        cap: (n,) per-request maximum k (0 = this request may not draft).
        drafter: (n,) drafter index per request (default 0); lag: (n,) catch-up tokens of that drafter.
        draft_sunk: the draft tokens already exist (verifier pruning): only verification costs.
    """
    ctx = np.asarray(ctx, dtype=np.float64)
    cap = np.asarray(cap, dtype=np.int64)
    n, K = surv.shape
    plain = cost.plain_ms(ctx)
    zero = np.zeros(n, dtype=np.int64)
    if n == 0 or K == 0 or cap.max(initial=0) <= 0:
        return Choice(zero, float(n), plain, plain)
    if drafter is None:
        drafter = zero
    lag_arr = np.zeros(n) if lag is None else np.asarray(lag, dtype=np.float64)

    j = np.arange(K)
    valid = j[None, :] < cap[:, None]
    p = np.where(valid, surv, -1.0)
    n_valid = int(valid.sum())
    s_max = min(n_valid, cons.free_kv_slots, max(cons.token_budget - n, 0))
    if s_max <= 0:
        return Choice(zero, float(n), plain, plain)
    order = np.argsort(-p, axis=None, kind="stable")[:n_valid]
    rows = order // K
    cols = order % K
    p_sorted = p.ravel()[order]

    marginal = np.full(n_valid, cost.target.b)
    passes = []  # (slot mask, depth cost, const cost) per drafter with work on this step
    if not draft_sunk:
        drafter = np.asarray(drafter, dtype=np.int64)
        for d_idx, d in enumerate(cost.drafters):
            sel = drafter[rows] == d_idx
            if not sel.any():
                continue
            if d.has_passes:
                r_sel = rows[sel]
                c_sel = cols[sel]
                dctx = d.draft_ctx(ctx[r_sel])
                m = d.model
                marginal[sel] += m.a * (dctx + c_sel) + m.b + np.where(c_sel == 0, m.b * lag_arr[r_sel], 0.0)
            passes.append((sel, d.depth_ms, d.const_ms))
    std = cost.step_std_ms()
    # One row per depth cap D (one row without caps when drafting is already paid for): slot i is
    # admissible under D when its position is < D; prefixes run over admissible slots only.
    D = np.arange(1, int(cap.max()) + 1) if passes else np.array([K])
    M = cols[None, :] < D[:, None]  # (nD, n_valid)
    M &= np.cumsum(M, axis=1) <= s_max
    tokens = n + np.cumsum(np.where(M, p_sorted[None, :], 0.0), axis=1)
    times = plain + np.cumsum(np.where(M, marginal[None, :], 0.0), axis=1)
    for sel, depth_ms, const_ms in passes:
        ms = M & sel[None, :]
        if depth_ms:
            times += depth_ms * np.maximum.accumulate(np.where(ms, cols[None, :] + 1, 0), axis=1)
        if const_ms:
            times += const_ms * np.maximum.accumulate(ms, axis=1)
    ok = M & slo_ok(times, cons, std)
    g = np.where(ok, tokens / times, -np.inf)
    flat = int(np.argmax(g))
    d_best, i_best = divmod(flat, g.shape[1])
    if not np.isfinite(g[d_best, i_best]) or g[d_best, i_best] <= n / plain:
        return Choice(zero, float(n), plain, plain)
    chosen = M[d_best, : i_best + 1]
    k = np.bincount(rows[: i_best + 1][chosen], minlength=n).astype(np.int64)
    return Choice(k, float(tokens[d_best, i_best]), float(times[d_best, i_best]), plain)


def confidence_cuts(cost: StepCostModel, ctx, choice: Choice, drafter=None) -> np.ndarray:
    """Per-request survival threshold below which one more draft token lowers goodput.

    A draft token with survival p and marginal cost dT (its draft pass share plus one verify token)
    raises goodput G = tokens / T iff p > G * dT. Returned as a probability per request.
    """
    ctx = np.asarray(ctx, dtype=np.float64)
    n = ctx.shape[0]
    g = choice.goodput
    dt = np.full(n, cost.target.b)
    if cost.drafters:
        drafter = np.zeros(n, dtype=np.int64) if drafter is None else np.asarray(drafter)
        for d_idx, d in enumerate(cost.drafters):
            sel = drafter == d_idx
            if sel.any() and d.has_passes:
                dt[sel] += d.model.a * (d.draft_ctx(ctx[sel]) + choice.k[sel]) + d.model.b
    return np.clip(g * dt, 0.0, 1.0)
