"""``adaptive``: our policy. Request-level, per-position, SLO-aware, context-aware, gated, multi-drafter.

Per step:
1. The gate (hysteresis on batch size, dwell, periodic retune from the live cost model) decides
   whether to consider speculation at all; while off the draft prefill is skipped.
2. The drafter bandit (SPIN) picks each request's drafter when several are active; its exploration
   draws each drafter with its posterior probability of being the best (Thompson sampling on the
   pooled acceptance, the profile's rate as a prior, mapped to goodput through the cost model).
3. Survival p[r, j] combines the request's own Beta-posterior rate (shrunk to its category's or the
   drafter's pooled rate) with the drafter's per-position acceptance curve.
4. ``admit_parametric`` picks per-request k maximising (n + sum admitted w * p) / T with the live
   cost model (real per-request contexts, so long contexts keep speculation alive at large batch), KV
   and token-budget limits, the SLO, and the catch-up cost of requests whose draft state lags; w
   values a request's token by the step time it saves (its per-step residence cost over its pace).
5. Where the drafter reports confidences, a marginal-cost cut stops each request's drafting early
   (in survival, mapped to the drafter's raw running confidence by its measured calibration).
After the step, ``observe`` updates the estimators, refits the cost model online (recursive least
squares with forgetting), adds the loop's own time per step and per request-step outside the forward
passes (``LoopOverhead``), and feeds the bandit.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from control.goodput.acceptance import MAX_RATE
from control.goodput.cost import RecursiveCost
from control.goodput.estimators import (
    CategoryRates,
    ConfidenceMap,
    PositionRates,
    RequestBeta,
    chain_trials,
    request_position_survival,
)
from control.goodput.optimizer import Choice, Constraints, admit_parametric, slo_ok
from control.goodput.overhead import LoopOverhead
from control.goodput.stepcost import DrafterCost, StepCostModel, uniform_step_ms
from control.plan import threshold_batch, typical_ctx
from control.policy.bandit import DrafterBandit
from control.policy.base import I64, BasePolicy, PolicyContext
from control.policy.gate import Gate
from control.policy.types import Decision, StepOutcome, StepView, stopped_short

REFIT_EVERY = 32  # steps between rebuilding the cost model from the online fit
PROBE_TRIALS = 32  # first-position trials below which a drafter counts as unmeasured (probed while exploring)
PRIOR_TRIALS = 8.0  # trials the profile's acceptance is worth in the exploration posterior: its Beta has
# a std of 0.14-0.17 at rates 0.6-0.8, about the spread of acceptance across held-out prompts
THOMPSON_SAMPLES = 32  # posterior draws per exploring step
PACE_SMOOTHING = 0.5  # weight of a request's previous pace against this step's (damps k <-> weight feedback)
EXPLORE_KEEP = 0.1  # an explored drafter keeps its chunk while its chance of being best stays above this:
# below it a long shot costs more steps than it can teach (the evidence of a step or two already says so)


class AdaptivePolicy(BasePolicy):
    name = "adaptive"

    def __init__(self, ctx: PolicyContext, seed: int = 0, request_strength: float = 8.0) -> None:
        super().__init__(ctx)
        self._seed = seed
        self._strength = request_strength
        self._setup(ctx)

    def _setup(self, ctx: PolicyContext) -> None:
        m = len(ctx.drafters)
        K = max(ctx.max_k, 1)
        self.K = K
        slots = self._slot_rid.size  # per-slot arrays as long as the base's (grown together)
        self._pos_idx = np.arange(K)[None, :]  # draft positions, for masks over (n, K) arrays
        self._conf = [ConfidenceMap() for _ in range(m)]  # per drafter: running confidence -> survival
        self.pos = [PositionRates(K, prior=ctx.prior_positions[i]) for i in range(m)]
        self.req = [RequestBeta(self._strength, capacity=slots) for _ in range(m)]
        self.cat = CategoryRates(8)
        self.rls_target = RecursiveCost(ctx.cost.target)
        self.rls_draft = [RecursiveCost(d.model) if d.model is not None else None for d in ctx.cost.drafters]
        self.loop = LoopOverhead()
        self.cost = ctx.cost
        self._since_refit = 0
        g = ctx.gate
        self.gate = Gate(g.b_off, g.b_on_ratio, g.min_dwell_steps, g.probe_every_steps)
        self._zero_run = 0
        self._g: float | None = None  # last step's predicted goodput: the optimiser's warm start
        self._rng = np.random.default_rng(self._seed)
        self._kk = np.arange(K + 1, dtype=np.float64)
        self._steps_key: tuple | None = None
        self._steps = np.zeros(0)
        b = ctx.bandit
        caps = None
        if b.capacities:
            caps = [b.capacities.get(d, 1 << 30) for d in ctx.drafters]
        self.bandit = (DrafterBandit(m, caps, b.explore_slots, b.chunk_slots, b.switch_cost_weight,
                                     b.max_exploit_slots, seed=self._seed) if (m > 1 and b.enabled) else None)
        if self.bandit is not None:
            self.bandit.keep_p = EXPLORE_KEEP
        self._is_model = np.array([d.model is not None for d in ctx.cost.drafters], dtype=bool)
        self._consolidate = bool(self._is_model.sum() > 1 and not b.capacities)
        self._fav = self._profile_favourite(ctx) if self._consolidate else -1
        # per slot, grown together (``_grow_slots``): the k the last decision asked for, and the expected
        # tokens per step at the k the request has been given (NaN before its first decision)
        self._asked = np.zeros(slots, dtype=I64)
        # the decision before: its outcome may arrive after this step's decision (``OneStepStale``)
        self._asked_prev = np.zeros(slots, dtype=I64)
        self._asked_step = self._asked_prev_step = -1
        self._pace = np.full(slots, np.nan)
        self._arange = np.arange(slots)
        self._default_col = np.full(slots, ctx.default, dtype=I64)  # the default drafter per request (read-only use)
        self._cons_key: tuple | None = None
        self._cons = self.ctx.cons
        self._allowed_key: np.ndarray | None = None  # ``_allowed``'s and ``_per_token_b``'s caches
        self._allowed_arr = np.ones(m, dtype=bool)
        self._b_key: StepCostModel | None = None
        self._b_arr = np.zeros(m)

    def update_context(self, ctx: PolicyContext) -> None:
        # a smaller max_k keeps the estimators (their extra positions are never admitted: caps() bound k)
        same_drafters = ctx.drafters == self.ctx.drafters and max(ctx.max_k, 1) <= self.K
        super().update_context(ctx)
        if not same_drafters:
            self._setup(self.ctx)  # the new context as the base priced it (the executor's verification)
            return
        # Same drafters: keep learned acceptance and the bandit; take the new priors, limits and gate.
        for i, pr in enumerate(self.pos):
            pr.set_prior(ctx.prior_positions[i])
        g = ctx.gate
        self.gate.b_on_ratio, self.gate.min_dwell, self.gate.probe_every = g.b_on_ratio, g.min_dwell_steps, g.probe_every_steps
        self.gate.retune(g.b_off)

    # -- estimates -------------------------------------------------------------------------------
    def pooled_rate(self, i: int) -> float:
        return self.pos[i].mean_rate

    def survival(self, view: StepView, d_ctx: np.ndarray, uniform: bool | None = None) -> np.ndarray:
        """(n, K) survival of each request's draft positions on its drafter (``uniform``: the caller
        knows one drafter serves the whole batch)."""
        if uniform or (uniform is None and self._uniform(d_ctx)):  # always so at batch 1: no masks
            return self._survival_of(int(d_ctx[0]), view.slots, view.category)
        surv = np.empty((view.n, self.K))
        for i in range(len(self.ctx.drafters)):
            sel = d_ctx == i
            if not sel.any():
                continue
            surv[sel] = self._survival_of(i, view.slots[sel], None if view.category is None else view.category[sel])
        return surv

    def _survival_of(self, i: int, slots: np.ndarray, category: np.ndarray | None) -> np.ndarray:
        pos = self.pos[i]
        pooled = pos.mean_rate
        prior = pooled if category is None else self.cat.rates(category, pooled)
        rate = self.req[i].mean(slots, prior)  # (n,)
        return request_position_survival(rate, pos.rates, pooled, pos.odds)

    @staticmethod
    def _uniform(d: np.ndarray) -> bool:
        return d.size == 1 or bool((d == d[0]).all())

    @classmethod
    def _drafters_in(cls, d: np.ndarray) -> np.ndarray:
        """The distinct drafter indices in ``d`` (np.unique's sort, skipped for the usual one drafter)."""
        if d.size == 0 or cls._uniform(d):
            return d[:1]
        return np.unique(d)

    def reset_slots(self, slots: np.ndarray) -> None:
        self._pace[slots] = np.nan
        for r in self.req:
            r.ensure(int(slots.max()))
            r.reset(slots)
        if self.bandit is not None:
            self.bandit.reset(slots)

    # -- decide ----------------------------------------------------------------------------------
    def _retune_gate(self, view: StepView) -> None:
        """Re-derive the gate's threshold from the live cost model at the current context mix: the
        batch size above which no drafter the executor runs pays at its pooled rate."""
        plan = self.ctx.plan
        ctx = int(np.mean(view.ctx_lens))
        b_off = 0
        for i in self._runnable():
            b = threshold_batch(self.cost, ctx, self.pooled_rate(i), self.ctx.max_k, plan.profile.limits.max_batch,
                                plan.slo, drafter=i)
            if b is None:
                b_off = None
                break
            b_off = max(b_off, b)
        self.gate.retune(b_off)

    def _runnable(self) -> list[int]:
        """Plan drafter indices the executor runs (all of them before the first step maps them)."""
        m = len(self.ctx.drafters)
        return [i for i in range(m) if not self._to_exec.size or self._to_exec[i] >= 0] or [self.ctx.default]

    def _pays_at_pooled_rates(self, view: StepView) -> bool:
        """Whether some drafter, at its pooled rate, makes a uniform k > 0 beat k = 0 for a batch of
        this size and mean context. Called only on steps where every request got k = 0.

        At light load a batch of one or two requests whose own rates are poor (an n-gram lookup
        without matches in their text) gets k = 0 for a while; taking that as evidence about the
        batch size closed the gate at batch 1-2 until the next probe, and the probe, which looked
        at the default draft model only, kept it closed (the quick pair's live demo: k = 0 in 73%
        of request-steps at load 0.5)."""
        inv = self._inv_step_ms(view)
        for i in self._runnable():
            r = min(self.pooled_rate(i), MAX_RATE)
            g = (1.0 - r ** (self._kk + 1.0)) / (1.0 - r) * inv[i]
            if g[1:].max(initial=0.0) > g[0]:
                return True
        return False

    def decide(self, view: StepView) -> Decision:
        """The base protocol, with the per-slot arrays grown first and the k asked of each slot
        remembered, this step's and the step's before (``_tried`` compares a draft to the k asked at
        its own step, which is the one before when outcomes arrive a step late)."""
        if view.step != self._asked_step:  # a new step: the last decision becomes the one before
            self._asked, self._asked_prev = self._asked_prev, self._asked
            self._asked_step, self._asked_prev_step = view.step, self._asked_step
        d = super().decide(view)
        if view.n:
            self._asked[view.slots] = d.k
        return d

    def _grow_slots(self, size: int) -> None:
        super()._grow_slots(size)
        if size > self._asked.size:
            self._asked = np.concatenate([self._asked, np.zeros(size - self._asked.size, dtype=I64)])
            self._asked_prev = np.concatenate([self._asked_prev, np.zeros(size - self._asked_prev.size, dtype=I64)])
            self._pace = np.concatenate([self._pace, np.full(size - self._pace.size, np.nan)])

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        n = view.n
        if self.gate.probe_due(view.step):
            self._retune_gate(view)
        if not self.gate.update(n, view.step):
            return Decision(np.zeros(n, dtype=I64), np.full(n, self.default_exec_drafter(), dtype=I64),
                            prefill_draft=False)
        if not self.verify.per_request:  # the target pads drafts or verifies per batch
            return self._granular(view, cap)
        d_ctx, d_exec, lag, uniform = self._assign_drafters(view)
        lagged = bool(lag[0]) if n == 1 else bool(lag.any())
        if lagged and (lag[0] if n == 1 else lag.max()) > self.ctx.gate.max_catchup_tokens:
            cap = np.where(lag > self.ctx.gate.max_catchup_tokens, 0, cap)
        surv = self.survival(view, d_ctx, uniform)
        csum = self._prefix_sums(surv) if n > 1 else None  # (n, K+1): expected accepted draft tokens at each k
        cons = self._constraints(view)
        pace = self._pace[view.slots]  # (n,) NaN where not yet decided on
        known = np.isfinite(pace)
        known = True if n > 1 and known.all() else known  # True: every request's pace is known
        w = self._residence_weights(view, pace, known)
        choice = admit_parametric(self.cost, view.ctx_lens, surv, cap, cons, drafter=d_ctx,
                                  lag=self._amortised_lag(lag, surv, csum, cap, view.remaining) if lagged else None,
                                  g0=self._g, k0=None if n == 1 else self._asked_prev[view.slots], psum=csum, weights=w)
        g_value = self._g = choice.goodput  # in residence-weighted tokens per ms: the scale of the cuts
        rows = self._rows(n)
        per_req = self._accepted(surv, csum, rows, choice.k)  # (n,) expected accepted
        if w is not None:  # report the prediction in plain tokens
            choice = Choice(choice.k, float(n + per_req.sum()), choice.step_ms, choice.plain_ms, choice.next_cost)
        if self.bandit is not None and self.bandit.exploring:
            probed = self._probe_unmeasured(view, choice, cap, lag, d_ctx, surv, cons)
            if probed is not choice:
                choice = probed
                per_req = self._accepted(surv, csum, rows, choice.k)
        all_zero = int(choice.k[0]) == 0 and int(cap[0]) > 0 if n == 1 else choice.k.max() == 0 and cap.max() > 0
        if (all_zero and not (lagged and lag[cap > 0].any())
                and not self._pays_at_pooled_rates(view)):
            # Speculation did not pay for requests whose drafts are in sync, and would not at the
            # drafters' pooled rates either: evidence about the batch size. (A zero that only
            # reflects catch-up costs, or requests whose own rates are poor, says nothing about it.)
            self._zero_run += 1
            if self._zero_run >= max(self.gate.min_dwell, 1):
                self.gate.retune(min(self.gate.b_off, n))
        else:
            self._zero_run = 0
        conf_cut = self._cuts(choice, d_ctx, w, g_value, uniform)
        self._note_pace(view.slots, per_req, pace, known)
        if self.bandit is not None:
            self._note_favourite(d_ctx, choice.k, uniform)
        return Decision(choice.k, d_exec, conf_cut=conf_cut, prefill_draft=True, prefill_drafter=self.prefill_drafter(),
                        predicted_step_ms=choice.step_ms, predicted_tokens=choice.tokens)

    def use_verify(self, verify) -> None:
        super().use_verify(verify)
        self.cost = replace(self.cost, verify=verify)

    def _granular(self, view: StepView, cap: np.ndarray) -> Decision:
        """On or off for the step, then k per request against drafting cost (the default drafter, at
        each request's learned survival): what padded or per-batch verification leaves to choose."""
        i, c = self.ctx.default, self.cost
        surv = self.survival(view, np.full(view.n, i, dtype=I64), True)
        return self.granular(view, cap, surv, StepCostModel(c.target, (c.drafters[i],), c.overhead_ms, c.verify))

    def _assign_drafters(self, view: StepView) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """Each request's drafter for this step: (plan index, executor index, the draft lag it must
        catch up, whether one drafter serves the whole batch)."""
        n = view.n
        if self.bandit is None:  # one drafter for everyone: no gathers
            e = self.default_exec_drafter()
            if self._default_col.size < n or self._default_col[0] != self.ctx.default:
                self._default_col = np.full(max(n, 2 * self._default_col.size), self.ctx.default, dtype=I64)
            return self._default_col[:n], np.full(n, e, dtype=I64), view.draft_lag[:, e], True
        switch_cost = None
        if not self.bandit.exploring and self.bandit.t_stage == 0:  # only the matching uses it
            lag_ctx = view.draft_lag[:, np.maximum(self._to_exec, 0)]
            switch_cost = lag_ctx * self._per_token_b()
        allowed = self._allowed()
        b = self.bandit
        if b.exploring:
            # fresh every exploring step, so a drafter that stops winning is dropped at once (the
            # favourite too: the profile's favourite can be the one that fails on this workload)
            b.explore_p = self.explore_probs(view, allowed)
        d_ctx = self.bandit.assign(view.slots, switch_cost, allowed=allowed)
        uniform = self._uniform(d_ctx)
        if not uniform:
            d_ctx = self._one_model_per_step(d_ctx)
            uniform = self._uniform(d_ctx)
        if uniform:  # one column: no per-request gathers
            e = int(self._to_exec[d_ctx[0]]) if n else 0
            d_exec = np.full(n, max(e, 0), dtype=I64)
            return d_ctx, d_exec, view.draft_lag[:, max(e, 0)], True
        d_exec = self.exec_drafter(d_ctx)
        return d_ctx, d_exec, self.lag_of(view, d_exec), False

    def _allowed(self) -> np.ndarray:
        """(m,) bool: the plan's drafters the executor runs (the same array while the map is)."""
        if self._allowed_key is not self._to_exec:
            self._allowed_key, self._allowed_arr = self._to_exec, self._to_exec >= 0
        return self._allowed_arr

    def _per_token_b(self) -> np.ndarray:
        """(m,) each drafter's draft-model ms per context token caught up (0: no model), per cost model."""
        if self._b_key is not self.cost:
            self._b_key = self.cost
            self._b_arr = np.array([d.model.b if d.model is not None else 0.0 for d in self.cost.drafters])
        return self._b_arr

    def _constraints(self, view: StepView) -> Constraints:
        """This step's limits (the last step's object when they did not change)."""
        key = (view.free_kv_slots, view.token_budget, self.ctx.cons)
        if self._cons_key != key:
            c = self.ctx.cons
            self._cons = Constraints(view.free_kv_slots, view.token_budget, c.slo_tpot_ms, c.slo_quantile)
            self._cons_key = key
        return self._cons

    def _cuts(self, choice: Choice, d_ctx: np.ndarray, w: np.ndarray | None, g_value: float,
              uniform: bool) -> np.ndarray | None:
        """Per request, the running draft confidence below which drafting stops (None: no drafter
        in the step reports confidences, or the optimiser gave no marginal costs)."""
        if choice.next_cost is None:
            return None
        conf = self.ctx.confidences
        if not (conf[d_ctx[0]] if uniform else conf[d_ctx].any()):
            return None
        if uniform and d_ctx.shape[0] == 1 and d_ctx[0] >= 0:  # batch 1 on plain floats (w is None there)
            one = min(max(g_value * float(choice.next_cost[0]), 0.0), 1.0)
            return np.array([self._conf[int(d_ctx[0])].raw_cut_one(one)])
        # one more token of confidence p pays iff its value w * p beats goodput * its marginal cost
        cuts = g_value * choice.next_cost if w is None else g_value * choice.next_cost / w
        # the executor compares the drafter's raw running confidence; the cut is in survival, so
        # map it through each drafter's measured survival per confidence
        if uniform and d_ctx[0] >= 0:
            return self._conf[int(d_ctx[0])].raw_cut(np.minimum(np.maximum(cuts, 0.0), 1.0))  # np.clip, cheaper
        conf_cut = np.zeros(d_ctx.shape[0])
        for i in self._drafters_in(d_ctx):
            if i >= 0 and self.ctx.confidences[i]:
                sel = d_ctx == i
                conf_cut[sel] = self._conf[i].raw_cut(np.clip(cuts[sel], 0.0, 1.0))
        return conf_cut

    def _note_favourite(self, d_ctx: np.ndarray, k: np.ndarray, uniform: bool = False) -> None:
        """Remember the draft model that drafted for most requests this step: new requests prefill its
        state. The executor prefills its default drafter otherwise, and when the bandit prefers another
        one every new request pays a catch-up of its whole prompt there (docs/decisions.md,
        2026-11-22). (``uniform``: one drafter serves the step.)"""
        if uniform:  # the most used is the only one: no counts
            i = int(d_ctx[0])
            if i >= 0 and self._is_model[i] and k.max(initial=0) > 0:
                self._fav = i
            return
        ran = d_ctx[(k > 0) & (d_ctx >= 0)]
        if ran.size:
            used = np.bincount(ran, minlength=self._is_model.size) * self._is_model
            if used.any():
                self._fav = int(np.argmax(used))

    def _profile_favourite(self, ctx: PolicyContext) -> int:
        """The draft model the profile predicts best at half the batch limit and a typical context: what
        new requests prefill until a step has run (then: the model that drafted most last step)."""
        plan = ctx.plan
        n, S = max(1, plan.profile.limits.max_batch // 2), float(typical_ctx(plan.profile))
        kk = np.arange(max(ctx.max_k, 1) + 1, dtype=np.float64)
        best, fav = -1.0, -1
        for i in np.flatnonzero(self._is_model):
            r = min(float(ctx.prior_rate[i]), MAX_RATE)
            g = float(np.max((1.0 - r ** (kk + 1.0)) / (1.0 - r) / uniform_step_ms(ctx.cost, n, S, kk, drafter=int(i))))
            if g > best:
                best, fav = g, int(i)
        return fav

    def prefill_drafter(self) -> int:
        if self._fav < 0 or not self._to_exec.size:
            return -1
        return int(self._to_exec[self._fav])

    def _one_model_per_step(self, d_ctx: np.ndarray) -> np.ndarray:
        """Requests the bandit put on different draft models this step all use the most used one.

        Each draft model in a step runs its own sequence of k draft passes, each with its fixed
        per-pass cost: two models in one batch pay both. The bandit scores drafters per request from
        per-request goodput, which does not see that shared cost (docs/decisions.md, 2026-11-22).
        Drafters without a model (n-gram lookup) cost per request, not per pass, and mix freely. The
        bandit still learns from what ran.
        """
        if not self._consolidate or d_ctx.size < 2:
            return d_ctx
        used = np.bincount(d_ctx, minlength=self._is_model.size) * self._is_model
        if np.count_nonzero(used) <= 1:
            return d_ctx
        return np.where(self._is_model[d_ctx], int(np.argmax(used)), d_ctx)

    def explore_probs(self, view: StepView, allowed: np.ndarray) -> np.ndarray:
        """Each drafter's posterior probability of giving the best goodput for this batch (Thompson).

        Pooled acceptance per drafter ~ Beta(successes + prior * w, failures + (1 - prior) * w) with
        the profile's rate as the prior worth w = PRIOR_TRIALS trials (drawn from its normal
        approximation); each draw is mapped to the drafter's best uniform-k goodput under the live
        cost model at the batch's size and mean context, and a drafter's probability is the share
        of draws in which it wins. A drafter the
        profile rates far below another, or that measured poorly, is seldom drawn; one that might
        win still is, with a probability that falls as its measurements rule it out.
        """
        m = len(self.ctx.drafters)
        st = np.array([p.totals for p in self.pos])  # (m, 2): successes, trials
        a = st[:, 0] + self.ctx.prior_rate * PRIOR_TRIALS
        t = st[:, 1] + PRIOR_TRIALS
        mean = a / t
        # Beta(a, t - a) by its normal approximation (a Beta draw costs more than the rest together;
        # with >= PRIOR_TRIALS pseudo-trials the two are close where it matters)
        sd = np.sqrt(mean * (1.0 - mean) / (t + 1.0))
        rate = np.clip(mean + sd * self._rng.standard_normal((THOMPSON_SAMPLES, m)), 0.0, MAX_RATE)
        # expected tokens per request for uniform k under a chain of rate r: 1 + r + ... + r^k
        tokens = (1.0 - np.power.outer(rate, self._kk + 1.0)) / (1.0 - rate)[:, :, None]  # (S, m, K+1)
        inv = self._inv_step_ms(view)
        catch = self._catch_up_ms(view)
        if catch is not None:
            inv = 1.0 / (1.0 / inv + catch[:, None])
        best = (tokens * inv)[:, :, : max(self.ctx.max_k, 1) + 1].max(axis=2)
        if not allowed.all():
            best[:, ~allowed] = -np.inf
        return np.bincount(np.argmax(best, axis=1), minlength=m) / THOMPSON_SAMPLES

    def _inv_step_ms(self, view: StepView) -> np.ndarray:
        """(m, K+1): 1 / step ms of a uniform k = 0..K for each drafter at this batch size and mean
        context, cached per 16-token context bucket and cost model."""
        ctx = int(view.ctx_lens.mean()) >> 4
        key = (view.n, ctx, id(self.cost))
        if self._steps_key != key:
            self._steps = 1.0 / np.stack([uniform_step_ms(self.cost, view.n, 16.0 * ctx + 8.0, self._kk, drafter=i)
                                          for i in range(len(self.ctx.drafters))])
            self._steps_key = key
        return self._steps

    def _catch_up_ms(self, view: StepView) -> np.ndarray | None:
        """Per drafter, the draft-model time per step of bringing this batch's requests in sync with it,
        spread over the steps an explored request stays there (a chunk, or what is left of the request).

        A draft model keeps state per request, so moving a request to one it has not run on recomputes
        its whole context there. Posterior draws ignore that price (docs/decisions.md, 2026-11-22)."""
        lag = view.draft_lag
        if not lag.any() or self.bandit is None:
            return None
        e = self._to_exec
        stay = np.clip(view.remaining / 2.0, 1.0, float(self.bandit.beta))  # steps at about 2 tokens each
        per_req = lag[:, np.maximum(e, 0)] / stay[:, None]  # (n, m)
        return np.where(e >= 0, per_req.sum(axis=0) * self._per_token_b(), 0.0)

    def _tokens(self, surv: np.ndarray, k: np.ndarray) -> float:
        """Expected generated tokens of a step with draft lengths ``k``: bonus tokens plus survivals."""
        return float(k.shape[0] + surv[self._pos_idx < k[:, None]].sum())

    def _probe_unmeasured(self, view: StepView, choice, cap: np.ndarray, lag: np.ndarray, d_ctx: np.ndarray,
                          surv: np.ndarray, cons: Constraints):
        """While the bandit explores, a request put on a drafter with almost no measured acceptance
        drafts one token even where the prior says it does not pay: otherwise a pessimistic prior is
        never tested, the drafter's requests never speculate and the bandit never sees a reward."""
        if not (choice.k == 0).any():
            return choice
        unmeasured = np.array([p.trials[0] < PROBE_TRIALS for p in self.pos])
        probe = (choice.k == 0) & (cap > 0) & (lag == 0) & unmeasured[d_ctx]
        room = min(int(view.free_kv_slots), int(view.token_budget) - view.n) - int(choice.k.sum())
        if room <= 0 or not probe.any():
            return choice
        probe &= np.cumsum(probe) <= room
        k = np.where(probe, 1, choice.k)
        step = self.cost.step_ms(view.ctx_lens, k, d_ctx, lag)
        if cons.slo_tpot_ms is not None and not slo_ok(step, cons, self.cost.step_std_ms()):
            return choice
        return Choice(k, self._tokens(surv, k), step, choice.plain_ms)

    def _residence_weights(self, view: StepView, pace: np.ndarray, known: np.ndarray | bool) -> np.ndarray | None:
        """Value of an accepted token per request, relative to the batch mean (None: all equal).

        An accepted token shortens its request's stay by 1 / pace steps, pace being the tokens the
        request makes per step. Each step it stays costs every request in the batch the step's time
        (its latency) and the machine its own KV read (a * ctx), its verify token (b) and a share of
        the pass's fixed cost. So a token is worth own / pace: more for a long-context request, and
        more for a request whose drafts are often rejected, whose next token saves a whole step, than
        for one already making four tokens a step, whose next token saves a quarter of one. The plain
        ratio (n + sum p) / T counts tokens alike, so it under-drafts long contexts and gives its
        drafts to the fast requests, leaving the slow ones in the batch for many steps; mean latency
        follows request-steps (docs/decisions.md, 2026-11-23). Pace is each request's expected tokens per step at the k it was given,
        smoothed over its steps (``_note_pace``, here ``pace``, finite where ``known``, or everywhere
        where it is True); a request not yet decided on takes the batch mean.
        """
        n = view.n
        if n < 2:
            return None
        if known is True:
            w = 1.0 / pace
        elif known.any():
            w = 1.0 / np.where(known, pace, pace[known].mean())
        else:
            w = np.ones(n)
        t = self.cost.target
        ctx = view.ctx_lens
        if t.a > 0.0 and ctx.min() != ctx.max():
            w = w * (t.a * ctx + (t.b + t.d + (t.c + self.cost.overhead_ms) / n))
        w_max = w.max()
        if w_max - w.min() <= 1e-12 * w_max:
            return None
        return w * (n / float(w.sum()))

    def _note_pace(self, slots: np.ndarray, accepted: np.ndarray, old: np.ndarray, known: np.ndarray | bool) -> None:
        """Smooth each request's expected tokens per step at the k just chosen (1 + its expected
        ``accepted`` draft tokens) into its pace (``old``, finite where ``known``, or everywhere where
        it is True)."""
        if slots.shape[0] == 1:  # plain floats, same bits
            now1, old1 = 1.0 + float(accepted[0]), float(old[0])
            self._pace[int(slots[0])] = (PACE_SMOOTHING * old1 + (1.0 - PACE_SMOOTHING) * now1 if known[0] else now1)
            return
        now = 1.0 + accepted
        smoothed = PACE_SMOOTHING * old + (1.0 - PACE_SMOOTHING) * now
        self._pace[slots] = smoothed if known is True else np.where(known, smoothed, now)

    def _amortised_lag(self, lag: np.ndarray, surv: np.ndarray, csum: np.ndarray | None, cap: np.ndarray,
                       remaining: np.ndarray) -> np.ndarray:
        """Catch-up tokens charged to this step: the re-prefill is paid once and serves every later
        step of the request, about remaining / E[tokens per step] of them, so a step carries that
        share of it (a myopic step-level optimiser would never catch up, and a draft that fell
        behind while the gate was off would stay behind for good). ``csum``: ``surv``'s
        ``_prefix_sums`` (None: not taken yet)."""
        if not lag.any():
            return lag
        if csum is None:
            csum = self._prefix_sums(surv)
        per_step = 1.0 + csum[self._rows(cap.shape[0]), cap]  # cap is within 0..K (``caps``)
        steps_left = np.maximum(remaining / per_step, 1.0)
        return lag / steps_left

    @staticmethod
    def _prefix_sums(surv: np.ndarray) -> np.ndarray:
        """(n, K+1): each request's expected accepted draft tokens at k = 0..K (its survivals' prefix sums)."""
        csum = np.empty((surv.shape[0], surv.shape[1] + 1))
        csum[:, 0] = 0.0
        np.cumsum(surv, axis=1, out=csum[:, 1:])
        return csum

    @staticmethod
    def _accepted(surv: np.ndarray, csum: np.ndarray | None, rows: np.ndarray, k: np.ndarray) -> np.ndarray:
        """(n,) expected accepted draft tokens at draft lengths ``k`` (batch 1: from ``surv`` on plain
        floats, the same additions in the same order as ``csum``'s)."""
        if csum is not None:
            return csum[rows, k]
        return np.array([sum(surv[0, : int(k[0])].tolist())])

    def _rows(self, n: int) -> np.ndarray:
        """np.arange(n), from a cached range grown as needed (row indices for per-request gathers)."""
        if n > self._arange.size:
            self._arange = np.arange(max(n, 2 * self._arange.size))
        return self._arange[:n]

    def wants_draft_prefill(self, view: StepView) -> bool:
        return super().wants_draft_prefill(view) and self.gate.on

    # -- observe ---------------------------------------------------------------------------------
    def _tried(self, outcome: StepOutcome, d_ctx: np.ndarray, uniform: bool) -> np.ndarray:
        """Draft tokens verified, plus the position where a drafter stopped short of the k asked.

        A drafter that drafts fewer than k on its own (an n-gram lookup without a long enough match)
        delivers nothing at the positions it skipped: for the optimiser, which asks for k, that is a
        rejection there; counting only what was drafted would give it the rates of its long matches.
        A lookup that found nothing is no trial: it drafted and verified nothing, so the step was
        plain decoding for that request at the lookup's cost alone; as a rejection it would make
        n-gram look worst at the start of every request, when there is no earlier text to match
        (docs/decisions.md, 2026-11-22 and 2026-11-25). Stops the policy asked for (a confidence
        cut) are not rejections. (``uniform``: one drafter for the whole step.)"""
        v = outcome.verified
        if uniform and d_ctx[0] >= 0 and self.ctx.confidences[d_ctx[0]]:
            return v  # a drafter with confidences stops short only where the policy's cut said so
        late = outcome.step == self._asked_prev_step and outcome.step != self._asked_step
        asked_at = self._asked_prev if late else self._asked  # the decision of the outcome's step
        asked = asked_at[outcome.slots] if outcome.slots.max(initial=-1) < asked_at.size else v
        short = stopped_short(asked, outcome.drafted, v, outcome.accepted) & (d_ctx >= 0)
        if not short.any():
            return v
        short &= ~self.ctx.confidences[np.maximum(d_ctx, 0)] & (outcome.drafted > 0)
        return np.where(short, v + 1, v)

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.n == 0:
            return
        d_ctx = self._to_ctx[outcome.drafter] if self._to_ctx.size else np.full(outcome.n, self.ctx.default, dtype=I64)
        uniform = self._uniform(d_ctx)
        tried = self._tried(outcome, d_ctx, uniform)
        s, t = chain_trials(tried, outcome.accepted)
        spec = tried > 0
        one = outcome.n == 1  # (plain bools instead of reductions)
        if not (spec[0] if one else spec.any()):
            self._refit(outcome, d_ctx, outcome.drafted > 0, uniform)
            return
        self._learn(outcome, d_ctx, tried, spec, s, t, uniform)
        self._refit(outcome, d_ctx, outcome.drafted > 0, uniform)
        if self.bandit is not None:
            mine = spec & (d_ctx >= 0)  # outcomes of a drafter this policy does not know teach its bandit nothing
            if mine.any():
                self.bandit.update(outcome.slots[mine], d_ctx[mine], self._rewards(outcome, d_ctx)[mine])

    def _learn(self, outcome: StepOutcome, d_ctx: np.ndarray, tried: np.ndarray, spec: np.ndarray, s: np.ndarray,
               t: np.ndarray, uniform: bool) -> None:
        """Update the acceptance estimators (per position, per request, per category, confidence
        calibration) with the requests that drafted (``spec``); ``s``, ``t``: their chain trials."""
        if uniform and d_ctx[0] >= 0 and (outcome.n == 1 or spec.all()):  # one known drafter, everyone drafted
            # (at batch 1 the caller saw that it drafted): no masks
            i = int(d_ctx[0])
            self.pos[i].update(tried, outcome.accepted, t)
            self.req[i].update(outcome.slots, s, t)
        else:
            for i in range(len(self.ctx.drafters)):
                sel = spec & (d_ctx == i)
                if not sel.any():
                    continue
                self.pos[i].update(tried[sel], outcome.accepted[sel], t[sel])
                self.req[i].update(outcome.slots[sel], s[sel], t[sel])
        if outcome.category is not None:
            self.cat.update(outcome.category[spec], s[spec], t[spec])
        if outcome.confidence is not None and self.ctx.confidences.any():
            self._calibrate(outcome, d_ctx, spec)

    def _calibrate(self, outcome: StepOutcome, d_ctx: np.ndarray, spec: np.ndarray) -> None:
        conf = outcome.confidence
        w = min(conf.shape[1], self.K)
        pos = self._pos_idx[:, :w]
        drafted = (pos < outcome.drafted[:, None]) & np.isfinite(conf[:, :w])
        if not drafted.any():
            return
        prod = np.cumprod(np.where(drafted, conf[:, :w], 1.0), axis=1)  # running confidence per drafted token
        hit = (pos < outcome.accepted[:, None]) & drafted  # observed survival
        for i in self._drafters_in(d_ctx[spec]):
            if i < 0 or not self.ctx.confidences[i]:
                continue
            rows = spec & (d_ctx == i)
            self._conf[i].update(prod[rows][drafted[rows]], hit[rows][drafted[rows]])

    def _rewards(self, outcome: StepOutcome, d_ctx: np.ndarray) -> np.ndarray:
        """Per-request goodput (tokens per ms) with the step's cost shared by what each request used."""
        n = outcome.n
        # (integer contexts: their sums are exact, so the same floats as summing a float copy)
        verify_share = self.cost.verify_ms(outcome.ctx_lens, outcome.verified) / n
        if d_ctx[0] >= 0 and self._uniform(d_ctx):
            d = self.cost.drafters[int(d_ctx[0])]
            share = verify_share + d.draft_ms(outcome.ctx_lens, outcome.drafted) / n
            return (outcome.accepted + 1) / max(share, 1e-9)
        share = np.full(n, verify_share)
        for i, d in enumerate(self.cost.drafters):
            sel = d_ctx == i
            if sel.any():
                share[sel] += d.draft_ms(outcome.ctx_lens[sel].astype(np.float64), outcome.drafted[sel]) / sel.sum()
        return (outcome.accepted + 1) / np.maximum(share, 1e-9)

    def _refit(self, outcome: StepOutcome, d_ctx: np.ndarray, spec: np.ndarray, uniform: bool) -> None:
        self.loop.update(outcome.prev_loop_ms, outcome.prev_loop_requests)
        one = outcome.n == 1  # (plain ints instead of reductions: the same sums)
        if outcome.verify_ms > 0:
            # the pass also computed any prompt chunks mixed into it (chunked prefill)
            ctx_sum = int(outcome.ctx_lens[0]) if one else outcome.ctx_lens.sum()
            if self.verify.per_request:
                verified = float((int(outcome.verified[0]) if one else outcome.verified.sum()) + outcome.n)
            else:
                verified = float(self.verify.verified_tokens(outcome.verified).sum())  # padding included
            self.rls_target.update(float(ctx_sum) + outcome.prefill_ctx_tokens,
                                   verified + outcome.prefill_tokens, outcome.verify_ms, 1.0, float(outcome.n))
        used = d_ctx[:1] if uniform and (spec[0] if one else spec.any()) else self._drafters_in(d_ctx[spec])
        if outcome.draft_ms > 0 and outcome.draft_passes > 0 and used.size == 1:
            rls = self.rls_draft[int(used[0])]
            if rls is not None:
                rls.update(outcome.draft_ctx_tokens, outcome.draft_batched_tokens, outcome.draft_ms, outcome.draft_passes)
        self._since_refit += 1
        if self._since_refit >= REFIT_EVERY:
            self._since_refit = 0
            # each model's online fit replaces the profile's only once it predicts the steps better
            rd = self.rls_draft
            drafters = tuple(
                DrafterCost(d.name, d.kind, rd[i].cost if rd[i] is not None and rd[i].improves_on_prior() else d.model,
                            d.const_ms, d.sink, d.window)
                for i, d in enumerate(self.ctx.cost.drafters)
            )
            target = self.rls_target.cost if self.rls_target.improves_on_prior() else self.ctx.cost.target
            # the loop's own time per step and per request-step: what fewer steps also save
            per_step, per_request = self.loop.fit()
            if per_request > 0.0:
                target = replace(target, d=target.d + per_request)
            self.cost = StepCostModel(target, drafters, self.ctx.cost.overhead_ms + per_step, self.verify)
