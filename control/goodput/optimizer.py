"""The goodput optimiser: choose draft lengths that maximise expected tokens per second.

- ``uniform_curve`` / ``best_uniform_k``: step-level (SmartSpec Alg. 2, TurboSpec Listing 2), one k
  for the whole batch, scanned k = 0..K with KV-slot, token-budget and SLO feasibility, stopping at
  the first drop (goodput is unimodal in k, SpecServe section 4.3).
- ``admit_parametric``: request-level, exact for the unconstrained problem (Dinkelbach's method on the
  goodput ratio, separable per drafter and per request), warm-started from the previous step.
- ``admit_slots``: request-level under binding KV/budget/SLO limits. Draft slots (r, j) are admitted in decreasing survival per
  marginal cost; for each maximum draft depth the best prefix maximises (n + admitted survival) /
  T. One O(nK log nK) sort plus vectorised scans. The same routine with the drafting cost already
  paid is SpecServe's confidence prior verifier (drop the least likely tokens while efficiency rises).
- ``slo_ok``: a choice whose predicted step time exceeds the TPOT SLO is infeasible (a request that
  only gets its bonus token sees the whole step as one token), in mean or quantile form. k = 0 is
  always allowed: it is the fallback, and speculation cannot rescue an SLO that plain decoding misses.
- ``confidence_cuts``: the marginal-cost threshold for adaptive drafting: one more draft token of
  survival p and marginal cost dT raises goodput G = E/T iff p > G * dT.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from control.goodput.granularity import VerifyKind
from control.goodput.stepcost import StepCostModel

CONFIRM_TOL = 1e-12  # F(g) below this share of g * plain-step-ms confirms Dinkelbach's optimum


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
        return NormalDist().inv_cdf(self.slo_quantile) * std_ms


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
    next_cost: np.ndarray | None = None  # marginal ms of each request's next draft token, if known

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
    # padded verification pays K + 1 tokens per request from k = 1 on: goodput is not unimodal in k
    unimodal = cost.verify.kind != VerifyKind.padded
    for k in range(1, min(K, cap_max) + 1):
        kk, tokens, t = _uniform_point(cost, ctx, csum, cap, drafter, lag, k)
        total = int(kk.sum())
        if total > cons.free_kv_slots or n + total > cons.token_budget or not slo_ok(t, cons, std):
            break  # cost and slots only grow with k: every larger k is infeasible too
        g = tokens / t
        if g > best_g:
            best_k, best_tok, best_t, best_g = kk, tokens, t, g
        elif early_stop and unimodal:
            break
    return Choice(best_k, best_tok, best_t, plain)


def _slot_costs(cost: StepCostModel, ctx, rows, cols, drafter, lag, draft_sunk):
    """Marginal cost (ms) of each listed slot excluding per-depth and per-step constants."""
    vb, va = cost.verify_slots(ctx)
    mc = vb[rows] + va * cols
    if draft_sunk:
        return mc
    for d_idx, d in enumerate(cost.drafters):
        if not d.has_passes:
            continue
        sel = drafter[rows] == d_idx
        if not sel.any():
            continue
        r_sel, c_sel = rows[sel], cols[sel]
        m = d.model
        mc[sel] += m.a * (d.draft_ctx(ctx[r_sel]) + c_sel) + m.b + np.where(c_sel == 0, d.catch_up_ms * lag[r_sel], 0.0)
    return mc


def admit_slots(cost: StepCostModel, ctx, surv, cap, cons: Constraints, drafter=None, lag=None,
                draft_sunk: bool = False) -> Choice:
    """Request-level optimum: admit draft slots while predicted goodput rises.

    Goodput (n + sum of admitted survivals) / (T_plain + sum of slot costs + per-depth pass costs) is a
    ratio, so for a fixed draft depth D the best slot set is a prefix of the slots sorted by survival
    per marginal cost (the order in which Dinkelbach's method admits them); survival falls and cost
    rises along a request's draft, so every prefix admits each request's first slots first. The scan
    covers every depth D = 1..K (uniform k = D for all requests is one of its prefixes, so the result
    is never worse than the step-level optimum) and every prefix length, with KV-slot, token-budget
    and SLO feasibility. One sort of the n*K slots plus O(K * n * K) vectorised work.

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
    drafter = zero if drafter is None else np.asarray(drafter, dtype=np.int64)
    lag_arr = np.zeros(n) if lag is None else np.asarray(lag, dtype=np.float64)
    s_lim = min(int(cons.free_kv_slots), int(cons.token_budget) - n)
    if s_lim <= 0:
        return Choice(zero, float(n), plain, plain)

    rows_all, cols_all = np.nonzero(np.arange(K)[None, :] < cap[:, None])
    p_all = surv[rows_all, cols_all]
    mc_all = _slot_costs(cost, ctx, rows_all, cols_all, drafter, lag_arr, draft_sunk)
    # Rank by survival per cost, made non-increasing along each request's draft (a catch-up makes a
    # request's first slot dearer than its second) so every prefix holds each request's first slots.
    ratio = np.full((n, K), np.inf)
    ratio[rows_all, cols_all] = p_all / np.maximum(mc_all, 1e-12)
    key = np.minimum.accumulate(ratio, axis=1)[rows_all, cols_all]
    order = np.argsort(-key, kind="stable")
    rows, cols, p, mc = rows_all[order], cols_all[order], p_all[order], mc_all[order]

    depth_max = int(cols.max()) + 1
    D = np.arange(1, depth_max + 1)[:, None]  # candidate maximum depths
    inside = cols[None, :] < D  # (depth_max, S): slot usable under depth cap D
    count = np.cumsum(inside, axis=1)
    tokens = n + np.cumsum(np.where(inside, p[None, :], 0.0), axis=1)
    times = plain + np.cumsum(np.where(inside, mc[None, :], 0.0), axis=1)
    if not draft_sunk:
        d_of = drafter[rows]
        for d_idx, d in enumerate(cost.drafters):
            mine = (d_of == d_idx)[None, :] & inside
            if not mine.any():
                continue
            if d.has_passes and d.depth_ms:
                times = times + d.depth_ms * np.maximum.accumulate(np.where(mine, cols[None, :] + 1, 0), axis=1)
            if d.const_ms:
                times = times + d.const_ms * np.maximum.accumulate(mine, axis=1)
    ok = inside & (count <= s_lim) & slo_ok(times, cons, cost.step_std_ms())
    g = np.where(ok, tokens / times, -np.inf)
    flat = int(np.argmax(g))
    di, si = divmod(flat, g.shape[1])
    if not np.isfinite(g[di, si]) or g[di, si] <= n / plain:
        return Choice(zero, float(n), plain, plain)
    take = inside[di, : si + 1]
    k = np.bincount(rows[: si + 1][take], minlength=n).astype(np.int64)
    return Choice(k, float(tokens[di, si]), float(times[di, si]), plain)


def admit_parametric(cost: StepCostModel, ctx, surv, cap, cons: Constraints, drafter=None, lag=None,
                     g0: float | None = None, max_iter: int = 6, k0: np.ndarray | None = None,
                     psum: np.ndarray | None = None, weights: np.ndarray | None = None) -> Choice:
    """Request-level optimum by Dinkelbach's method, warm-started from a previous goodput ``g0``.

    For a goodput level G the best slot set maximises sum(p - G * marginal cost) - G * (drafting
    constants); that separates by drafter and, for a drafter's maximum depth D, by request (its best
    prefix within D), so prefix sums over an (n, K) array and a scan over D solve it exactly.
    Iterating G <- tokens / time of the chosen set converges to the best ratio, usually in one pass.
    ``k0`` (one drafter; e.g. last step's k within ``cap``) starts from that choice's ratio instead.
    ``weights`` (n,), optional: the value of each request's tokens (multiplies its survival).
    ``psum`` (n, K+1), optional: ``surv``'s prefix sums along the draft with a leading 0 column, if
    the caller has them (unweighted; used where one drafter serves the batch). KV-slot, token-budget and SLO limits are checked on the
    result; if one binds, ``admit_slots`` decides. ``next_cost`` (marginal ms of each request's next
    draft token) gives the confidence cuts: one more token of survival p pays iff p > goodput * cost.
    """
    ctx = np.asarray(ctx, dtype=np.float64)
    cap = np.asarray(cap, dtype=np.int64)
    n, K = surv.shape
    if n == 1 and K > 0 and cost.drafters:
        surv = surv if weights is None else surv * weights[:, None]
        return _admit_one(cost, ctx, surv, int(cap[0]), cons, drafter, lag)
    plain = cost.plain_ms(ctx)
    capped = n == 0 or K == 0 or int(cap.min()) < K  # (every request uncapped at K: one reduction)
    if n == 0 or K == 0 or (capped and cap.max() <= 0):
        return Choice(np.zeros(n, dtype=np.int64), float(n), plain, plain)
    g = n / plain if g0 is None or not g0 > 0 else float(g0)
    one = _one_drafter(cost, drafter)
    if one is not None:
        k0 = None if k0 is None else np.minimum(k0, cap) if capped else k0
        k, tokens, t, nxt = _dinkelbach_one_drafter(cost.verify_slots(ctx), one, ctx, surv, psum, weights,
                                                    cap if capped else None, lag, plain, g, max_iter, k0)
    else:
        jj = np.arange(K)
        valid = jj < cap[:, None]  # (n, K)
        mc, groups = _marginal_costs(cost, ctx, drafter, lag, jj)
        p = np.where(valid, surv if weights is None else surv * weights[:, None], 0.0)
        k, tokens, t = _dinkelbach_groups(groups, p, mc, valid, plain, g, max_iter)
        nxt = mc[np.arange(n), np.minimum(k, K - 1)]
    if n * K > min(cons.free_kv_slots, cons.token_budget - n) or cons.slo_tpot_ms is not None:  # a limit may bind
        total = int(k.sum())
        if total > cons.free_kv_slots or n + total > cons.token_budget or (
                total and cons.slo_tpot_ms is not None and not slo_ok(t, cons, cost.step_std_ms())):
            return admit_slots(cost, ctx, surv if weights is None else surv * weights[:, None], cap, cons, drafter, lag)
    return Choice(k, tokens, t, plain, next_cost=nxt)


def _one_drafter(cost: StepCostModel, drafter):
    """The DrafterCost serving the whole batch, or None (several drafters, or none in the model)."""
    if not cost.drafters:
        return None
    if drafter is None or len(cost.drafters) == 1:
        return cost.drafters[0 if drafter is None else int(drafter[0])]
    d0 = drafter[0]
    return cost.drafters[int(d0)] if (drafter == d0).all() else None


def _marginal_costs(cost: StepCostModel, ctx: np.ndarray, drafter, lag, jj: np.ndarray) -> tuple[np.ndarray, list]:
    """Marginal ms of each draft slot (n, K) without the per-depth and per-step constants, and the
    drafter groups: (DrafterCost, rows) pairs."""
    n, K = ctx.shape[0], jj.shape[0]
    vb, va = cost.verify_slots(ctx)  # slot j's verify cost: vb + va * j
    mc = np.empty((n, K))
    if drafter is None or len(cost.drafters) == 1 or (drafter == drafter[0]).all():
        groups = [(cost.drafters[0 if drafter is None else int(drafter[0])], slice(None))] if cost.drafters else []
    else:
        groups = [(d, drafter == i) for i, d in enumerate(cost.drafters)]
        groups = [(d, sel) for d, sel in groups if sel.any()]
    if not groups:
        mc[:] = vb[:, None] + va * jj
    for d, sel in groups:
        if d.has_passes:
            m = d.model
            mc[sel] = (vb[sel] + m.b + m.a * d.draft_ctx(ctx[sel]))[:, None] + (m.a + va) * jj
            if lag is not None:
                mc[sel, 0] += d.catch_up_ms * np.asarray(lag, dtype=np.float64)[sel]
        else:
            mc[sel] = vb[sel][:, None] + va * jj
    return mc, groups


@lru_cache(maxsize=16)
def _prefix_grid(K: int) -> tuple[np.ndarray, np.ndarray]:
    """(K+1,) prefix lengths j = 0..K and j (j - 1) / 2, the sum of slot offsets 0..j-1 (read-only)."""
    jj = np.arange(K + 1, dtype=np.float64)
    tri = 0.5 * jj * (jj - 1.0)
    jj.flags.writeable = tri.flags.writeable = False
    return jj, tri


@lru_cache(maxsize=16)
def _per_depth(K: int, depth_ms: float, const_ms: float) -> np.ndarray:
    """(K,) a drafter's constants of drafting to depth D = 1..K (read-only)."""
    out = np.array([depth_ms * j + const_ms for j in range(1, K + 1)])
    out.flags.writeable = False
    return out


def _prefix_tables(verify: tuple[np.ndarray, float], d, ctx: np.ndarray, surv: np.ndarray, psum: np.ndarray | None,
                   weights: np.ndarray | None, cap: np.ndarray | None,
                   lag) -> tuple[np.ndarray, np.ndarray, float, np.ndarray | None]:
    """(n, K+1, 2): survival and marginal cost of each request's first j slots, j = 0..K (one gather
    reads both for a choice), the cost infinite past a request's cap (so g > 0 never takes it); (n,)
    each request's marginal cost of its first slot without catch-up; the slope (slot j adds slope * j);
    and (n,) the catch-up's cost (None: no catch-up).

    The cost of slot j is base + slope * j (base: one verify token, ``verify`` = (base (n,), slope)
    of ``StepCostModel.verify_slots``, and one draft token at the request's context; slope: the
    draft's a plus the verify slope), so its prefix sums are closed-form: j * base + slope * j (j - 1) / 2,
    plus the catch-up."""
    n, K = surv.shape
    pm = np.empty((n, K + 1, 2))
    if psum is None:
        pm[:, 0, 0] = 0.0
        np.cumsum(surv if weights is None else surv * weights[:, None], axis=1, out=pm[:, 1:, 0])
    elif weights is None:
        pm[:, :, 0] = psum
    else:
        np.multiply(psum, weights[:, None], out=pm[:, :, 0])
    jj, tri = _prefix_grid(K)
    mz = pm[:, :, 1]
    catch = None
    vb, slope = verify
    if d.has_passes:
        m = d.model
        base = m.a * d.draft_ctx(ctx) + (vb + m.b)  # (n,)
        slope = slope + m.a
        if lag is not None:
            catch = d.catch_up_ms * np.asarray(lag, dtype=np.float64)
    else:
        base = vb
    np.multiply(base[:, None], jj, out=mz)
    if slope:
        mz += slope * tri
    if catch is not None:
        mz[:, 1:] += catch[:, None]
    if cap is not None:
        np.putmask(mz, jj > cap[:, None], np.inf)
    return pm, base, slope, catch


def _dinkelbach_one_drafter(verify: tuple[np.ndarray, float], d, ctx: np.ndarray, surv: np.ndarray, psum: np.ndarray | None,
                            weights: np.ndarray | None, cap: np.ndarray | None, lag, plain: float, g: float, max_iter: int,
                            k0: np.ndarray | None = None) -> tuple[np.ndarray, float, float, np.ndarray]:
    """Dinkelbach's iterations for a batch on one drafter: (k, tokens, ms, next token's marginal ms)
    of the best ratio.

    The prefix sums of survival and cost are taken once (``_prefix_tables``); an iteration at level
    g is then value(prefix) = P - g * M, and a choice's tokens and time are one gather. Same optimum
    as ``_dinkelbach_groups`` with one group. ``cap`` (n,): each request's cap where some request is
    capped below K (None: none is). ``k0`` (within the caps): start from the better of its ratio and
    plain decoding's instead of ``g``."""
    n, K = surv.shape
    rows = np.arange(n)
    pm, base, slope, catch = _prefix_tables(verify, d, ctx, surv, psum, weights, cap, lag)
    pz, mz = pm[:, 1:, 0], pm[:, 1:, 1]
    depth, const = d.depth_ms, d.const_ms
    per_depth = _per_depth(K, depth, const)  # (K,) drafting constants
    zero = np.zeros(n, dtype=np.int64)
    best = (zero, float(n), plain)
    if k0 is not None:
        k0_max = int(np.maximum.reduce(k0))
        sp, sm = np.add.reduce(pm[rows, k0], axis=0)
        t0 = plain + float(sm) + (depth * k0_max + const if k0_max > 0 else 0.0)
        if (n + float(sp)) / t0 > n / plain:
            best = (k0, n + float(sp), t0)
        g = best[1] / best[2]
    run = np.empty((n, K))
    bp = np.empty((n, K))
    for _ in range(max_iter):
        np.multiply(mz, g, out=run)
        np.subtract(pz, run, out=run)  # (n, K): value of prefix length j + 1 (-inf past the cap)
        np.maximum.accumulate(run, axis=1, out=bp)  # best prefix within depth D = j + 1
        value = np.add.reduce(np.maximum(bp, 0.0), axis=0)  # (K,)
        # depths where no request gains cost their constants here, not 0 as in _dinkelbach_groups:
        # the same argmax wherever some depth's value is positive, and no depth's otherwise
        value -= g * per_depth
        D = int(value.argmax())
        if value[D] <= CONFIRM_TOL * g * plain and g == best[1] / best[2]:
            # no choice beats the best one's ratio g by more than rounding: it is the optimum (the
            # next iteration would only find it again)
            break
        k, extra = zero, 0.0
        if value[D] > 0:
            k = run[:, : D + 1].argmax(axis=1) + 1
            k *= bp[:, D] > 0
            extra = depth * float(np.maximum.reduce(k)) + const
        sp, sm = np.add.reduce(pm[rows, k], axis=0)
        tokens = n + float(sp)
        t = plain + float(sm) + extra
        g_new = tokens / t
        if g_new > best[1] / best[2]:
            best = (k, tokens, t)
        if abs(g_new - g) <= 1e-9 * g:
            break  # F(g) = 0: g is the optimal ratio
        g = g_new  # see _dinkelbach_groups
    k = best[0]
    nxt = base + slope * np.minimum(k, K - 1) if slope else base
    if catch is not None:  # a request that drafts nothing yet would pay its catch-up with its next token
        nxt += catch * (k == 0)
    return k, best[1], best[2], nxt


def _dinkelbach_groups(groups, p: np.ndarray, mc: np.ndarray, valid: np.ndarray, plain: float, g: float,
                       max_iter: int) -> tuple[np.ndarray, float, float]:
    """Dinkelbach's iterations with one group of requests per drafter: (k, tokens, ms) of the best ratio."""
    n, K = p.shape
    jj = np.arange(K)
    zero = np.zeros(n, dtype=np.int64)
    best = (zero, float(n), plain)
    single = len(groups) == 1 and isinstance(groups[0][1], slice)
    dd = np.arange(1, K + 1, dtype=np.float64)
    for _ in range(max_iter):
        run = np.cumsum(np.where(valid, p - g * mc, -np.inf), axis=1)  # value of prefix length j + 1
        bp = np.maximum.accumulate(run, axis=1)  # best prefix within depth D = j + 1
        k = zero if single else zero.copy()
        extra = 0.0
        for d, sel in groups:
            bps = bp if single else bp[sel]
            pos = bps > 0
            value = np.where(pos, bps, 0.0).sum(axis=0) - g * (d.depth_ms * dd + d.const_ms) * pos.any(axis=0)
            D = int(np.argmax(value))
            if value[D] <= 0:
                continue
            runs = run if single else run[sel]
            kd = np.where(bps[:, D] > 0, np.argmax(runs[:, : D + 1], axis=1) + 1, 0)
            if single:
                k = kd
            else:
                k[sel] = kd
            extra += d.depth_ms * float(kd.max()) + d.const_ms
        taken = jj < k[:, None]
        tokens = n + float(p[taken].sum())
        t = plain + float(mc[taken].sum()) + extra
        g_new = tokens / t
        if g_new > best[1] / best[2]:
            best = (k, tokens, t)
        if abs(g_new - g) <= 1e-9 * g:
            break  # F(g) = 0: g is the optimal ratio
        # From below Dinkelbach climbs monotonically; a stale warm start from above drops to the
        # ratio of an actual choice (a lower bound) in one step and climbs from there.
        g = g_new
    return best


def _admit_one(cost, ctx: np.ndarray, surv: np.ndarray, cap: int, cons: Constraints, drafter, lag) -> Choice:
    """One request, one drafter: the optimum by enumerating k = 0..cap (what Dinkelbach converges
    to, without its iterations), on plain floats: at batch 1 numpy's per-call cost is most of the
    work and the policy's own cost shows most. The same operations in the same order as the array
    form, so the same bits."""
    K = surv.shape[1]
    d = cost.drafters[0 if drafter is None else int(drafter[0])]
    t_plain = cost.target
    ctx0 = float(ctx[0])
    plain = float(t_plain.predict(ctx0, 1.0, 1, 1)) + cost.overhead_ms
    if cap <= 0:
        return Choice(np.zeros(1, dtype=np.int64), 1.0, plain, plain)
    ar = t_plain.a_reread
    vb, va = (t_plain.b, 0.0) if not t_plain.expanded else (t_plain.b + t_plain.d + ar * (ctx0 + 1.0), ar)
    if d.has_passes:
        m = d.model
        base = vb + m.b + m.a * float(d.draft_ctx(ctx[:1])[0])
        mc = [base + (m.a + va) * j for j in range(K)]
        if lag is not None:
            mc[0] += d.catch_up_ms * float(lag[0])
    else:
        mc = [vb + va * j for j in range(K)]
    p = surv[0].tolist()
    depth, const = d.depth_ms, d.const_ms
    sp = sm = 0.0
    k, tok, t, best = 0, 1.0, plain, 1.0 / plain
    first = None
    for j in range(min(cap, K)):
        sp += p[j]
        sm += mc[j]
        tokens = 1.0 + sp
        times = plain + sm + depth * (j + 1) + const
        g = tokens / times
        if first is None or g > first:
            first, k_at, tok_at, t_at = g, j + 1, tokens, times
    if first > best:
        k, tok, t = k_at, tok_at, t_at
    if k and (k > cons.free_kv_slots or 1 + k > cons.token_budget or (
            cons.slo_tpot_ms is not None and not slo_ok(t, cons, cost.step_std_ms()))):
        return admit_slots(cost, ctx, surv, np.array([cap]), cons, drafter, lag)
    return Choice(np.array([k], dtype=np.int64), tok, t, plain, next_cost=np.array([mc[min(k, K - 1)]]))


def confidence_cuts(cost: StepCostModel, ctx, choice: Choice, drafter=None) -> np.ndarray:
    """Per-request survival threshold below which one more draft token lowers goodput.

    A draft token with survival p and marginal cost dT (its draft pass share plus one verify token)
    raises goodput G = tokens / T iff p > G * dT. Returned as a probability per request.
    """
    ctx = np.asarray(ctx, dtype=np.float64)
    n = ctx.shape[0]
    g = choice.goodput
    vb, va = cost.verify_slots(ctx)
    dt = vb + va * choice.k
    if cost.drafters:
        drafter = np.zeros(n, dtype=np.int64) if drafter is None else np.asarray(drafter)
        for d_idx, d in enumerate(cost.drafters):
            sel = drafter == d_idx
            if sel.any() and d.has_passes:
                dt[sel] += d.model.a * (d.draft_ctx(ctx[sel]) + choice.k[sel]) + d.model.b
    return np.clip(g * dt, 0.0, 1.0)
