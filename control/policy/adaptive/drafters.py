"""Stage: drafter choice. Each request's drafter when several are active (the drafter bandit, SPIN).

Exploration draws each drafter with its posterior probability of being the best (Thompson):

    v ~ Normal(mean, cov)   (each drafter's log-odds chain rate at the workload's position mix,
                             ``drafter_rates.py``: compared at like places in a request), rate_i = sigmoid(v_i)
    best_i = max_k (1 - rate_i^(k+1)) / (1 - rate_i) / (T_i(n, S, k) + (D_i(n, S, k) + catch-up_i) (x_i - 1))
    P(i) = share of THOMPSON_SAMPLES draws in which drafter i has the largest best_i.

T_i includes the drafting part D_i and the catch-up; x_i is a draw of the draft model's price against
the profile's (``draft_prices.py``) while the cost refit still prices it at the profile, else 1.

Requests the bandit puts on different draft models in one step all move to one of them (each model
in a step pays its own k passes; the cohort priced apart, below, and the rest each to their own): the
most used one, or while exploring the one likeliest best, the favourite on a near tie, except that
from the second epoch a model still unmeasured (fewer than ``PROBE_TRIALS`` first-position trials)
keeps the requests drawn for it. The favourite is the model
that drafted most last step (at first the profile's best model). A request builds a draft model's state
by catch-up in its first draft pass there, a price exploration charges the draft models and not n-gram
(docs/decisions.md, 2026-11-27). So new requests, those that never drafted on the favourite, are priced
as if they had prefilled its state while it is likeliest best (P >= ``SYNC_SHARE`` while exploring; at
first, while the profile's best drafter is a model), or while exploiting, while at least that share of
the batch drafts on a model (``new_in_sync``): the drafter choice sees them in sync with it (``lag``),
and the optimiser decides their catch-up there as paid, exploring or not (``StepPlan.sunk``). No prefill
pass runs for them: the catch-up costs the same tokens without a pass of its own, and nothing for a
request that never drafts there (docs/decisions.md, 2026-11-30 (stop 63)).
The requests in sync with the favourite draft model (no lag there) are priced apart when others lag
on it: moving the batch would pay the others' catch-up, not theirs, so their choice charges only their
own (while exploring they draw with those probabilities, ``sync_p``; while exploiting they take that
choice, ``exploit_sync``), and whether new requests count as in sync asks what a request in sync
would choose. Priced with the batch, a batch that had settled on n-gram never moved: its own catch-up
outweighed the draft model's lead, so new requests were not prefilled and fell behind in turn
(docs/decisions.md, 2026-11-29 (stop 59)).
A batch on the favourite only for the catch-up another draft model would cost it moves there as it turns
over: when a request in sync with every model would draft faster on the other one at the posterior means
(by ``MIGRATE_MARGIN``), that model is the target: new requests count as in sync with it, and those in sync
with it are the cohort priced apart, so they draft there while the rest stay, two models drafting in a step
until the favourite (the most used) follows (docs/decisions.md, 2026-11-29 (stop 60)).
Exploitation puts the whole batch on one drafter: the one with the best modelled goodput for this
batch at the posterior means (the same formula with each rate at mean_i, each draft price at its
posterior median). SPIN's per-request matching on measured rewards is kept for drafters
with capacities. Its rewards split a draft model's passes evenly over the requests on it, but moving one
request off the model saves only that request's share of the per-token work, not of the per-pass cost
the rest still pay: the matching moved requests with a few poor rewards to n-gram, and mixed batches
cost more than either drafter alone (docs/decisions.md, 2026-11-27, stop 39).
Rewards per request (the matching's): (accepted + 1) / (verify share + its drafter's draft time share),
over a plain step's tokens per ms; a request on n-gram whose lookup found nothing earns a plain step's
reward. The matching weighs a request's mean reward on a drafter against the drafter's pooled mean as
``REWARD_PRIOR_STEPS`` steps' worth (``DrafterBandit.prior_slots``).

An n-gram lookup proposes a_r <= K tokens for request r (``StepView.ngram_avail``; 0 without a
match), so a request on n-gram drafts min(k, a_r): its cap becomes min(cap_r, a_r) (0 without a match:
plain decoding for it this step). The plan also gets the lookup's survival curves by proposal length
S_a (``survival.LookupRates``), for the optimiser's fallback and held lookups (``optimise.py``), and
the drafter choice prices n-gram at what recent lookups propose (share_a: the share proposing a of the
lookups seen at the full decisions, the last ``LOOKUP_MEMORY`` request-steps of them; held steps are
not counted: a drafter chosen now keeps its requests for a chunk or a stage, longer than one step's
lookups last):

    tokens_ngram(k) = 1 + sum_a share_a sum_{j < min(k, a)} S_a[j]
    T_ngram(k) = T(sum_a share_a min(k, a))   (interpolated between uniform draft lengths).

Where the executor scores every request's lookup against the tokens its step committed
(``StepOutcome.ngram_match``, ``lookups_scored``), S_a is learned whatever drafts, so drafting on the
lookup teaches nothing: exploration draws it only where it beats every draft model at the posterior
means (``_known_lookup``), and a batch on a draft model moves to it only where it models
``LEAVE_MARGIN`` faster than the best model (``_stay_off_lookup``), since its requests fall out of sync
with the models and coming back costs their catch-up (docs/decisions.md, 2026-11-29 (stop 61)).
"""

from __future__ import annotations

import numpy as np

from control.goodput.acceptance import MAX_RATE
from control.goodput.estimators import PositionRates
from control.goodput.stepcost import DrafterKind, StepCostModel, uniform_step_ms
from control.plan import typical_ctx
from control.policy.adaptive.draft_prices import DraftPrices
from control.policy.adaptive.drafter_rates import DrafterEvidence, RatePosterior, rate_posterior, sigmoid
from control.policy.adaptive.probes import PROBE_TRIALS
from control.policy.adaptive.step_plan import StepPlan
from control.policy.adaptive.survival import is_uniform
from control.policy.adaptive.uniform_steps import UniformSteps
from control.policy.bandit import DrafterBandit
from control.policy.base import I64, PolicyContext
from control.policy.types import StepOutcome, StepView

THOMPSON_SAMPLES = 32  # posterior draws per exploring step
EXPLORE_KEEP = 0.1  # an explored drafter keeps its chunk while its chance of being best stays above this:
# below it a long shot costs more steps than it can teach (the evidence of a step or two already says so)
EXPLORE_TIE = 0.25  # while exploring, a step's draft model stays the favourite unless another one drawn
# is likelier best by more than this (one model per step)
REWARD_PRIOR_STEPS = 8.0  # steps' rewards the drafter's pooled mean is worth in a request's estimate for the
# matching: the spread of mean rewards between requests on the replays puts it at 2-11 (empirical Bayes,
# reading low as a request's rewards are correlated), so a few lucky steps do not outweigh a drafter's record
MIN_SHARE_MS = 1e-9  # floor of a request's share of the step time in its reward
UNCAPPED = 1 << 30  # a drafter without a capacity in the plan
LOOKUP_MEMORY = 256.0  # request-steps of lookups whose proposal lengths price n-gram: at batch 1 this step's
# lookup alone flipped the request between n-gram and a draft model, paying a catch-up each time
SYNC_SHARE = 0.5  # new requests are priced in sync with the favourite draft model while it is at least this
# likely the best drafter (exploring), or at least this share of the batch drafts on a draft model (exploiting):
# below it most of them would never draft there (a prefill of its state would have been spent for nothing)
LEAVE_MARGIN = 0.03  # a batch on a draft model moves to a scored lookup only when the lookup models this much
# faster: its requests fall out of sync with the models, and coming back costs their catch-up (a lookup
# within 2% of draft-tiny took batch 16 for good on the AVX2 machine's clock, 0.99 of the best fixed)
MIGRATE_MARGIN = 0.02  # new requests count in sync with another draft model than the batch's when a request in sync
# with both would draft this much faster on it at the posterior means (then while it leads at all): the
# batch moves over as it turns over, two models drafting in a step meanwhile


class DrafterChoice:
    """The bandit, its Thompson exploration, one model per step and the favourite new requests are in sync with."""

    def __init__(self, ctx: PolicyContext, pos: list[PositionRates], steps: UniformSteps, seed: int,
                 prices: DraftPrices | None = None) -> None:
        self.ctx = ctx  # the owner replaces it on a plan update with the same drafters
        self.pos = pos
        self.steps = steps
        m = len(ctx.drafters)
        b = ctx.bandit
        caps = [b.capacities.get(d, UNCAPPED) for d in ctx.drafters] if b.capacities else None
        self.bandit = (DrafterBandit(m, caps, b.explore_slots, b.chunk_slots, b.switch_cost_weight,
                                     b.max_exploit_slots, seed=seed) if (m > 1 and b.enabled) else None)
        if self.bandit is not None:
            self.bandit.keep_p = EXPLORE_KEEP
            self.bandit.prior_slots = REWARD_PRIOR_STEPS
        self._rng = np.random.default_rng(seed)
        self.evidence = DrafterEvidence(m)  # the chain trials the drafter posterior reads (``drafter_rates.py``)
        self.prices = prices  # the draft models' measured prices against the profile's (None: exact prices)
        self.is_model = np.array([d.model is not None for d in ctx.cost.drafters], dtype=bool)  # (m,)
        self.is_ngram = np.array([d.kind == DrafterKind.ngram for d in ctx.cost.drafters], dtype=bool)  # (m,)
        self._rates = RatePosterior(self.is_ngram)
        self._ngram_idx = np.flatnonzero(self.is_ngram).tolist()  # the n-gram drafters' indices
        self._consolidate = bool(self.is_model.sum() > 1 and not b.capacities)
        # new requests may be priced in sync with a draft model: a bandit among drafters with no capacities,
        # at least one of them a draft model (module doc); ``new_in_sync``: they are now, with ``fav``'s state
        self._may_sync_new = bool(self.bandit is not None and self.is_model.any() and not b.capacities)
        self.fav, self.new_in_sync = -1, False
        self.target = -1  # the draft model new requests are in sync with instead of ``fav`` (-1: none; ``_migration_target``)
        self.lag = np.zeros((0, 0), dtype=I64)  # (n, m_exec) the lag the last choice priced (``_choice_lag``)
        self.lookups_scored = False  # the executor scores every lookup (``StepOutcome.ngram_match``): n-gram needs no trial
        if self._consolidate or self._may_sync_new:
            value = self._profile_values(ctx)  # (m,)
            self.fav = int(np.argmax(np.where(self.is_model, value, -np.inf)))
            self.new_in_sync = self._may_sync_new and bool(self.is_model[int(np.argmax(value))])
        # exploitation: the whole batch on the drafter with the best modelled goodput (module doc), unless
        # capacities make the matching necessary; ``exploit``: that drafter at the last full decision
        self.whole_batch = bool(self.bandit is not None and not b.capacities)
        self.exploit = -1
        self._last_values: np.ndarray | None = None  # (m,) the last exploiting decision's modelled goodput
        # the requests in sync with the favourite (or target) draft model where the rest lag there (None: no split),
        # and their choice: exploring, their draw probabilities; exploiting, their drafter (module doc)
        self.sync_rows: np.ndarray | None = None  # (n,) bool
        self.sync_p: np.ndarray | None = None  # (m,)
        self.exploit_sync = -1
        self._sync_pick = -1  # the drafter likeliest for them at the last full decision (for ``state``)
        self._lookups = np.zeros(max(ctx.max_k, 1) + 1)  # (K+1,) recent lookups per proposal length, decayed
        self._default_col = np.full(64, ctx.default, dtype=I64)  # the default drafter per request (read-only use)
        self._allowed_key: np.ndarray | None = None  # ``_allowed``'s and ``_per_token_b``'s caches
        self._allowed_arr = np.ones(m, dtype=bool)
        self._models_key: np.ndarray | None = None  # ``_model_cols``' cache
        self._models_arr = np.zeros(0, dtype=I64)
        self._b_key: StepCostModel | None = None
        self._b_arr = np.zeros(m)
        self._zero_k = np.zeros(64, dtype=I64)  # ``_zeros``' buffer

    def assign(self, sp: StepPlan, to_exec: np.ndarray, cost: StepCostModel, held_steps: int = 0) -> None:
        """Fill ``sp.d_ctx``, ``d_exec``, ``lag`` and ``uniform`` (``to_exec`` (m,): plan -> executor
        drafter index, -1 where the executor lacks it; ``held_steps``: steps the last assignment
        was held without consulting the bandit, which its clock counts), and cap n-gram requests at
        their lookup's proposal."""
        self._assign(sp, to_exec, cost, held_steps)
        self.lookup_caps(sp, to_exec)

    def lookup_caps(self, sp: StepPlan, to_exec: np.ndarray) -> None:
        """``sp.cap`` of the requests on an n-gram drafter at most what its lookup proposes, and the
        plan's lookup fields (module doc)."""
        avail = sp.view.ngram_avail
        if avail is None or not self.is_ngram.any():
            return
        d = sp.d_ctx
        on = self.is_ngram[np.maximum(d, 0)] & (d >= 0)  # (n,) bool
        if on.any():
            sp.cap = np.where(on, np.minimum(sp.cap, avail), sp.cap)
        runs = np.flatnonzero(self.is_ngram & (to_exec >= 0)) if to_exec.size else np.flatnonzero(self.is_ngram)
        rates = getattr(self.pos[int(runs[0])], "by_avail", None) if runs.size else None
        if rates is not None:
            i = int(runs[0])
            sp.lookup_ctx, sp.lookup_exec = i, max(int(to_exec[i]), 0) if to_exec.size else 0
            sp.lookup_curves = rates.curves()

    def _assign(self, sp: StepPlan, to_exec: np.ndarray, cost: StepCostModel, held_steps: int = 0) -> None:
        view, n = sp.view, sp.n
        if self.bandit is None:  # one drafter for everyone: no gathers
            e = max(int(to_exec[self.ctx.default]), 0) if to_exec.size else 0
            if self._default_col.size < n or self._default_col[0] != self.ctx.default:
                self._default_col = np.full(max(n, 2 * self._default_col.size), self.ctx.default, dtype=I64)
            sp.d_ctx, sp.d_exec, sp.lag, sp.uniform = self._default_col[:n], np.full(n, e, dtype=I64), view.draft_lag[:, e], True
            return
        self.bandit.advance(held_steps)
        self._note_lookups(view.ngram_avail)
        self.lag, fresh, e_new = self._choice_lag(view, to_exec)
        switch_cost = None
        allowed = self._allowed(to_exec)
        whole = -1
        self.sync_rows = None
        if self.bandit.exploring:
            # fresh every exploring step, so a drafter that stops winning is dropped at once (the
            # favourite too: the profile's favourite can be the one that fails on this workload)
            self.bandit.explore_p = self.explore_probs(view, allowed, to_exec, cost, self.lag)
            self.bandit.sync_p = self.sync_p
        elif self.whole_batch:
            whole = self.exploit = self.exploit_best(view, allowed, to_exec, cost, self.lag)
            if self.sync_rows is not None and self.exploit_sync != whole:  # the cohort in sync moves alone
                whole = np.where(self.sync_rows, self.exploit_sync, whole)
        elif self.bandit.matches_next():  # only the matching uses it
            lag_ctx = self.lag[:, np.maximum(to_exec, 0)]  # (n, m)
            switch_cost = lag_ctx * self._per_token_b(cost)
        d_ctx = self.bandit.assign(view.slots, switch_cost, allowed=allowed, whole=whole, sync_rows=self.sync_rows)  # (n,)
        uniform = is_uniform(d_ctx)
        if not uniform:
            d_ctx = self._one_model_per_step(d_ctx)
            uniform = is_uniform(d_ctx)
        if uniform:  # one column: no per-request gathers
            e = max(int(to_exec[d_ctx[0]]) if n else 0, 0)
            sp.d_ctx, sp.d_exec, sp.lag, sp.uniform = d_ctx, np.full(n, e, dtype=I64), view.draft_lag[:, e], True
            sp.sunk = None if fresh is None or e != e_new else fresh
            return
        d_exec = np.maximum(to_exec[d_ctx], 0)  # (n,)
        sp.d_ctx, sp.d_exec, sp.lag, sp.uniform = d_ctx, d_exec, view.draft_lag[np.arange(n), d_exec], False
        sp.sunk = None if fresh is None else fresh & (d_exec == e_new)

    def _choice_lag(self, view: StepView, to_exec: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, int]:
        """(lag (n, m_exec), fresh (n,) bool or None, e): the lag the drafter choice prices, the view's
        with the new requests (no draft model's state built: each lags as far as its context goes) at 0
        on the draft model they are in sync with (its executor index e) while they are (``new_in_sync``,
        module doc); ``fresh``: those requests (None: none).

        A request that drafted on n-gram alone since it arrived lags by the tokens it generated since
        as well, which a prefill at its arrival would not have saved; it is priced in sync all the same
        (the view does not say how long its prompt was)."""
        lag = view.draft_lag
        f = self.prefill_model() if self.new_in_sync else -1
        e = int(to_exec[f]) if f >= 0 and to_exec.size else f
        if e < 0 or e >= lag.shape[1]:
            return lag, None, -1
        fresh = lag[:, e] >= view.ctx_lens  # (n,) bool: nothing of it on the draft model (a context is >= 1)
        if not fresh.any():
            return lag, None, -1
        models = self._model_cols(to_exec, lag.shape[1])  # (models,) executor indices
        if models.size > 1:  # nor on any other model (in sync there since it arrived)
            fresh &= lag[:, models].min(axis=1) >= view.ctx_lens
            if not fresh.any():
                return lag, None, -1
        lag = lag.copy()
        lag[fresh, e] = 0
        return lag, fresh, e

    def newcomer(self) -> int:
        """The plan drafter for a request that arrives before the next full decision, as the bandit
        would choose it without a draw: the likeliest best while exploring, else the best pooled
        estimate (-1: no bandit, or nothing to go on yet: the drafter most requests use)."""
        b = self.bandit
        if b is None:
            return -1
        if self.target >= 0:  # in sync there (``note_favourite``: new requests always are with a target)
            return self.target
        if b.exploring:
            p = self.sync_p if self.new_in_sync and self.sync_p is not None else b.explore_p
            return int(np.argmax(p)) if p is not None and p.any() else -1
        if self.whole_batch:
            return self.exploit_sync if self.new_in_sync and self.exploit_sync >= 0 else self.exploit
        return b.best_new() if b.pool_cnt.any() else -1

    def prefill_model(self) -> int:
        """The plan drafter new requests are priced in sync with, and whose state an executor prefills for
        them where the policy asks for a prefill (long prompts, ``AdaptivePolicy.wants_draft_prefill``;
        -1: none known): the migration target while there is one, else the favourite."""
        return self.target if self.target >= 0 else self.fav

    def _allowed(self, to_exec: np.ndarray) -> np.ndarray:
        """(m,) bool: the plan's drafters the executor runs (the same array while the map is)."""
        if self._allowed_key is not to_exec:
            self._allowed_key, self._allowed_arr = to_exec, to_exec >= 0
        return self._allowed_arr

    def _model_cols(self, to_exec: np.ndarray, m_exec: int) -> np.ndarray:
        """(models,) the executor indices of the draft models it runs (the same array while the map is)."""
        if self._models_key is not to_exec:
            cols = to_exec[self.is_model & (to_exec >= 0)] if to_exec.size else np.flatnonzero(self.is_model)
            self._models_key, self._models_arr = to_exec, cols[cols < m_exec]
        return self._models_arr

    def _per_token_b(self, cost: StepCostModel) -> np.ndarray:
        """(m,) each drafter's draft-model ms per context token caught up (0: no model), per cost model."""
        if self._b_key is not cost:
            self._b_key = cost
            self._b_arr = cost.catch_up_ms_per_token()
        return self._b_arr

    def explore_probs(self, view: StepView, allowed: np.ndarray, to_exec: np.ndarray, cost: StepCostModel,
                      lag: np.ndarray | None = None) -> np.ndarray:
        """(m,) each drafter's posterior probability of giving the best goodput for this batch (module doc);
        also sets ``target``, ``sync_rows`` and ``sync_p``, the same for the requests in sync with the
        favourite or the target. ``lag`` (n, m_exec): the lag to price (None: ``_choice_lag``'s)."""
        self.lag = self._choice_lag(view, to_exec)[0] if lag is None else lag
        m = len(self.ctx.drafters)
        mean, cov = self._rates(self.ctx.prior_rate, self.evidence)  # (m,), (m, m) log-odds
        v = mean + self._rng.standard_normal((THOMPSON_SAMPLES, m)) @ np.linalg.cholesky(cov).T  # (S, m)
        rate = np.minimum(sigmoid(v), MAX_RATE)  # (S, m)
        mult = None if self.prices is None else self.prices.draws(self._rng, THOMPSON_SAMPLES)  # (S, m) or None
        at_means = np.minimum(sigmoid(mean), MAX_RATE)[None, :]  # (1, m)
        priced, inv = self._priced(view, cost, np.concatenate([rate, at_means]))  # (S + 1, m, K+1): the draws, the means
        med = None if self.prices is None else self.prices.medians()  # (1, m) or None
        scored = self.lookups_scored and bool(self.is_ngram.any())  # the means row is needed too
        rows = priced if scored else priced[:THOMPSON_SAMPLES]
        mults = np.concatenate([mult, med]) if scored and mult is not None else mult

        def probs(catch: np.ndarray | None) -> np.ndarray:
            vals = self._values(view, cost, rows, inv, mults, catch)  # (S or S + 1, m)
            best = vals[:THOMPSON_SAMPLES]  # (S, m)
            if not allowed.all():
                best[:, ~allowed] = -np.inf
            if scored:
                self._known_lookup(best, vals[THOMPSON_SAMPLES], allowed)
            return np.bincount(np.argmax(best, axis=1), minlength=m) / THOMPSON_SAMPLES

        catch = self._catch_up_ms(view, to_exec, cost)
        p = probs(catch)
        self.target = self._migration_target(view, cost, priced[THOMPSON_SAMPLES:], inv, med, allowed, int(np.argmax(p)))
        anchor = self.target if self.target >= 0 else self.fav
        settled = anchor >= 0 and p[anchor] >= SYNC_SHARE  # the batch's draws favour the anchor already
        self.sync_rows = self._cohort(view, to_exec, None if settled else catch, anchor)
        self.sync_p = p if self.sync_rows is None else probs(self._catch_up_ms(view, to_exec, cost, self.sync_rows))
        self._sync_pick = int(np.argmax(self.sync_p))
        return p

    def exploit_best(self, view: StepView, allowed: np.ndarray, to_exec: np.ndarray, cost: StepCostModel,
                     lag: np.ndarray | None = None) -> int:
        """The drafter with the best modelled goodput for this batch at the posterior means (module doc);
        also sets ``target``, ``sync_rows`` and ``exploit_sync``, the same for the requests in sync with
        the favourite or the target. ``lag`` (n, m_exec): the lag to price (None: ``_choice_lag``'s)."""
        self.lag = self._choice_lag(view, to_exec)[0] if lag is None else lag
        mean, _ = self._posterior()
        rate = np.minimum(mean, MAX_RATE)[None, :]  # (1, m)
        mult = None if self.prices is None else self.prices.medians()  # (1, m) or None
        tokens, inv = self._priced(view, cost, rate)
        catch = self._catch_up_ms(view, to_exec, cost)
        best = self._values(view, cost, tokens, inv, mult, catch)[0]  # (m,)
        self._last_values = best
        whole = int(np.argmax(np.where(allowed, best, -np.inf)))
        whole = self._stay_off_lookup(best, whole, allowed)
        # nothing lagging: the batch's choice is already the one in sync (no second evaluation)
        self.target = -1 if catch is None else self._migration_target(view, cost, tokens, inv, mult, allowed, whole)
        anchor = self.target if self.target >= 0 else self.fav
        self.sync_rows = self._cohort(view, to_exec, None if whole == anchor else catch, anchor)
        if self.sync_rows is None:
            self.exploit_sync = whole
        else:
            synced = self._values(view, cost, tokens, inv, mult, self._catch_up_ms(view, to_exec, cost, self.sync_rows))[0]
            self.exploit_sync = int(np.argmax(np.where(allowed, synced, -np.inf)))
        self._sync_pick = self.exploit_sync
        return whole

    def _known_lookup(self, best: np.ndarray, at_means: np.ndarray, allowed: np.ndarray) -> None:
        """``best`` (S, m), each draw's goodput per drafter, with a scored lookup drawn nowhere unless it
        beats every draft model at the posterior means ``at_means`` (m,) (by ``_leave_factor``), and
        then wherever no model's draw beats it: every step scores the lookup whatever drafts
        (``StepOutcome.ngram_match``), so drafting on it teaches nothing, while the requests it takes
        fall out of sync with the models."""
        models = self.is_model & allowed  # (m,) bool
        if not models.any():
            return
        top = float(at_means[models].max())
        for i in self._ngram_idx:
            if allowed[i] and at_means[i] <= top * self._leave_factor(i):
                best[:, i] = -np.inf

    def _leave_factor(self, i: int) -> float:
        """How much better than the best draft model the lookup ``i`` must model to take a batch that is
        not on it: its requests fall out of sync with the models, and coming back costs their catch-up."""
        return 1.0 if self.exploit == i or not self.lookups_scored else 1.0 + LEAVE_MARGIN

    def _stay_off_lookup(self, best: np.ndarray, whole: int, allowed: np.ndarray) -> int:
        """``whole``, or the best allowed draft model where ``whole`` is a lookup that does not beat it
        by ``_leave_factor`` (``best`` (m,): each drafter's modelled goodput)."""
        models = self.is_model & allowed  # (m,) bool
        if not self.lookups_scored or not self.is_ngram[whole] or not models.any():
            return whole
        top = int(np.argmax(np.where(models, best, -np.inf)))
        return whole if best[whole] > best[top] * self._leave_factor(whole) else top

    def _migration_target(self, view: StepView, cost: StepCostModel, tokens: np.ndarray, inv: np.ndarray,
                          mult: np.ndarray | None, allowed: np.ndarray, whole: int) -> int:
        """The draft model new requests count in sync with instead of the favourite, while the batch stays on the
        favourite (``whole``) only for its catch-up: the one a request in sync with every model would
        draft fastest on at the posterior means (``tokens`` (1, m, K+1) and ``inv``, ``_priced``; ``mult``
        (1, m), the prices' medians), by ``MIGRATE_MARGIN`` (by any margin once it is the target). -1: none."""
        fav = self.fav
        if fav < 0 or whole != fav or not self.is_model[fav] or not self._consolidate:
            return -1
        fresh = self._values(view, cost, tokens, inv, mult, None)[0]  # (m,) nobody lagging
        fresh = np.where(self.is_model & allowed, fresh, -np.inf)
        lead = int(np.argmax(fresh))
        if lead == fav:
            return -1
        need = 1.0 if lead == self.target else 1.0 + MIGRATE_MARGIN
        return lead if fresh[lead] >= need * fresh[fav] else -1

    def _cohort(self, view: StepView, to_exec: np.ndarray, catch: np.ndarray | None, anchor: int) -> np.ndarray | None:
        """(n,) bool: the requests in sync with the draft model ``anchor`` (the favourite, or the
        migration target), where they and the rest differ in what moving the batch would cost
        (``catch``, the whole batch's catch-up; None: no split needed, as when the batch's own choice
        is the anchor; module doc). None while nobody lags there, or nobody is in sync: priced as if
        in sync, a lone new request would be put on a model whose passes it cannot pay for
        beside a batch on n-gram (docs/decisions.md, 2026-11-29 (stop 59))."""
        if catch is None or anchor < 0 or not self.is_model[anchor]:
            return None
        e = int(to_exec[anchor]) if to_exec.size else anchor  # the anchor's executor index
        if not 0 <= e < self.lag.shape[1]:
            return None
        rows = self.lag[:, e] == 0  # (n,) bool
        return rows if rows.any() and not rows.all() else None

    def state(self) -> dict:
        """What the choice rests on now, per plan drafter (for the model's stats; not on the step path):
        the chain rate's posterior mean and sd, its drafting request-steps, the draft price multiplier
        exploration draws around (median), the goodput the last exploiting decision modelled (tokens
        per ms per request, null before one), the exploration chance, plus the favourite, the draft model
        new requests count in sync with instead (``target``, else null), whether they do (``new_in_sync``),
        the stage and, where the last full decision priced the requests in sync with the favourite or the
        target apart, how many there were and the drafter likeliest for them (``in_sync``, else null), and whether the executor scores every
        lookup (``lookups_scored``: n-gram is then learned without drafting, and not explored). Read
        from another thread, so it writes no cache the engine thread reads."""
        mean, sd = self._posterior(cached=False)
        steps = self.evidence.counts[2].sum(axis=1)  # (m,) drafting request-steps (decayed)
        med = self.prices.medians(cached=False) if self.prices is not None else None
        b = self.bandit
        p = b.explore_p if b is not None and b.explore_p is not None else None
        per = {}
        for i, name in enumerate(self.ctx.drafters):
            per[name] = {"chain_rate": round(float(mean[i]), 4), "sd": round(float(sd[i]), 4),
                         "request_steps": round(float(steps[i]), 1),
                         "price_x": None if med is None else round(float(med[0, i]), 3),
                         "value": None if self._last_values is None else round(float(self._last_values[i]), 5),
                         "p_best": None if p is None else round(float(p[i]), 3)}
        fav = self.ctx.drafters[self.fav] if 0 <= self.fav < len(self.ctx.drafters) else None
        stage = "none" if b is None else ("exploring" if b.exploring else "exploiting")
        rows, pick = self.sync_rows, self._sync_pick
        in_sync = None if rows is None else {"requests": int(rows.sum()),
                                             "drafter": self.ctx.drafters[pick] if pick >= 0 else None}
        target = self.ctx.drafters[self.target] if self.target >= 0 else None
        return {"drafters": per, "favourite": fav, "target": target, "new_in_sync": self.new_in_sync, "stage": stage,
                "in_sync": in_sync, "lookups_scored": self.lookups_scored,
                "epoch": None if b is None else b.epoch,
                "exploit": self.ctx.drafters[self.exploit] if 0 <= self.exploit < len(self.ctx.drafters) else None}

    def _posterior(self, cached: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(m,) mean and (m,) sd of each drafter's chain rate (the log-odds posterior's, mapped);
        ``cached=False`` leaves the posterior's cache alone (a read from another thread)."""
        if cached:
            mean, cov = self._rates(self.ctx.prior_rate, self.evidence)
        else:
            mean, cov = rate_posterior(self.ctx.prior_rate, self.is_ngram, self.evidence)
        rate = sigmoid(mean)  # (m,)
        return rate, np.sqrt(np.diag(cov)) * rate * (1.0 - rate)

    def learn(self, slots: np.ndarray, d_ctx: np.ndarray, s: np.ndarray, t: np.ndarray, spec: np.ndarray | None,
              accepted: np.ndarray) -> None:
        """One step's chain trials for the drafter posterior (``DrafterEvidence.learn``; no bandit: nothing)."""
        if self.bandit is not None:
            self.evidence.learn(slots, d_ctx, s, t, spec, accepted)

    def reset(self, slots: np.ndarray) -> None:
        """New requests in ``slots`` (their positions in the request start again)."""
        if self.bandit is not None:
            self.evidence.reset(slots)

    def _priced(self, view: StepView, cost: StepCostModel, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``tokens`` (S, m, K+1), each drafter's tokens a step at uniform k per draw of the chain rates
        ``rate`` (S, m), and ``inv`` (m, K+1), 1 / its step ms for this batch; n-gram priced at the
        recent lookups' proposal lengths (``_lookup_share``; as a draft of k before any)."""
        kk = self.steps.kk
        tokens = (1.0 - np.power.outer(rate, kk + 1.0)) / (1.0 - rate)[:, :, None]  # (S, m, K+1)
        inv = self.steps.inv(cost, view.ctx_lens)  # (m, K+1)
        share = self._lookup_share()
        return self._lookup_priced(share, tokens, inv) if share is not None else (tokens, inv)

    def _values(self, view: StepView, cost: StepCostModel, tokens: np.ndarray, inv: np.ndarray,
                mult: np.ndarray | None, catch: np.ndarray | None) -> np.ndarray:
        """(S, m) each drafter's best goodput over uniform k for this batch, per draw: ``tokens`` and
        ``inv`` from ``_priced``, draft price multipliers ``mult`` (S, m) (None: the profile's prices),
        ``catch`` (m,) the catch-up per step charged to each drafter (``_catch_up_ms``; None: none)."""
        if catch is not None:
            inv = 1.0 / (1.0 / inv + catch[:, None])
        if mult is not None:  # the drafting part of each step, catch-up included, at each draw's price
            part = self.steps.draft_ms(cost, view.ctx_lens) + (0.0 if catch is None else catch[:, None])  # (m, K+1)
            inv = 1.0 / (1.0 / inv[None] + part[None] * (mult[:, :, None] - 1.0))  # (S, m, K+1)
        return (tokens * inv)[:, :, : max(self.ctx.max_k, 1) + 1].max(axis=2)  # (S, m)

    def _lookup_share(self) -> np.ndarray | None:
        """(K+1,) the share of the lookups seen at recent full decisions (``LOOKUP_MEMORY``
        request-steps, this step's included: ``_assign`` notes them first) proposing a = 0..K tokens;
        None before any lookup (no n-gram drafter, or an executor that does not show its lookups)."""
        total = self._lookups.sum()
        return self._lookups / total if total > 0.0 else None

    def _note_lookups(self, avail: np.ndarray | None) -> None:
        """Add this step's lookup proposal lengths ``avail`` (n,) to the decayed histogram the drafter
        choice prices n-gram at (``LOOKUP_MEMORY`` request-steps)."""
        if avail is None or not self.is_ngram.any():
            return
        K = self._lookups.size - 1
        self._lookups *= (1.0 - 1.0 / LOOKUP_MEMORY) ** avail.shape[0]
        self._lookups += np.bincount(np.minimum(avail, K), minlength=K + 1)

    def _lookup_priced(self, share: np.ndarray, tokens: np.ndarray, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``tokens`` (S, m, K+1) and ``inv`` (m, K+1) with each n-gram drafter's column priced at
        lookups proposing a tokens in shares ``share`` (K+1,), on its survival by proposal length (module doc)."""
        kk = self.steps.kk  # (K+1,)
        K = kk.size - 1
        eff = np.minimum.outer(kk, kk) @ share  # (K+1,) mean tokens drafted at k
        tokens, inv = tokens.copy(), inv.copy()
        for i in np.flatnonzero(self.is_ngram):
            rates = getattr(self.pos[i], "by_avail", None)
            if rates is None:
                continue
            S = rates.curves()  # (K+1 a, K)
            acc = np.concatenate([np.zeros((K + 1, 1)), np.cumsum(S, axis=1)], axis=1)  # (K+1 a, K+1 k)
            tokens[:, i, :] = 1.0 + share @ acc  # the posterior mean: the same in every draw
            inv[i] = 1.0 / np.interp(eff, kk, 1.0 / inv[i])
        return tokens, inv

    def _catch_up_ms(self, view: StepView, to_exec: np.ndarray, cost: StepCostModel,
                     rows: np.ndarray | None = None) -> np.ndarray | None:
        """(m,) per drafter, the draft-model time per step of bringing this batch's requests (those in
        ``rows`` (n,) bool; None: all) in sync with it, spread over the steps an explored request stays
        there (a chunk, or what is left of the request). Posterior draws ignore that price otherwise
        (docs/decisions.md, 2026-11-22). The lag is the one the assignment prices (``_choice_lag``).
        None: nothing to catch up."""
        lag = self.lag if rows is None else self.lag[rows]  # (n or rows, m_exec)
        if not lag.any() or self.bandit is None:
            return None
        left = view.remaining if rows is None else view.remaining[rows]
        stay = np.clip(left / 2.0, 1.0, float(self.bandit.beta))  # steps at about 2 tokens each
        per_req = lag[:, np.maximum(to_exec, 0)] / stay[:, None]  # (rows, m)
        return np.where(to_exec >= 0, per_req.sum(axis=0) * self._per_token_b(cost), 0.0)

    def _one_model_per_step(self, d_ctx: np.ndarray) -> np.ndarray:
        """(n,) ``d_ctx`` with every draft-model request moved to one draft model: the most used, or
        while the bandit explores the likeliest best (module doc). Each model in a step runs its own k
        passes; n-gram lookup costs per request and mixes freely (docs/decisions.md, 2026-11-22). The
        cohort priced apart (``sync_rows``) and the rest each get their own: while the batch turns over
        to the cohort's model, two models draft in a step."""
        if not self._consolidate or d_ctx.size < 2:
            return d_ctx
        rows = self.sync_rows
        if rows is None or rows.size != d_ctx.size:
            return self._one_model(d_ctx, False)
        out = d_ctx.copy()
        out[rows] = self._one_model(d_ctx[rows], True)
        out[~rows] = self._one_model(d_ctx[~rows], False)
        return out

    def _one_model(self, d_ctx: np.ndarray, in_sync: bool) -> np.ndarray:
        """(n,) ``d_ctx`` of one group (the cohort in sync: ``in_sync``, drawing with ``sync_p``) on one
        draft model (``_one_model_per_step``). An unmeasured model left out of every step would stay so:
        its rewards empty, exploitation never picks it (docs/decisions.md, 2026-11-26)."""
        used = np.bincount(d_ctx, minlength=self.is_model.size) * self.is_model  # (m,)
        if np.count_nonzero(used) <= 1:
            return d_ctx
        b = self.bandit
        if b is None or not b.exploring or b.explore_p is None:
            return np.where(self.is_model[d_ctx], int(np.argmax(used)), d_ctx)
        # exploring: the drafted model likeliest to be best, the group's anchor on a near tie (not the most
        # drawn one: that turned a first step's coin flip into the model every request then caught up on)
        if b.epoch > 1:  # a model still unmeasured after an epoch keeps the requests drawn for it
            unmeasured = (used > 0) & self._unmeasured()  # (m,) bool
            if unmeasured.any() and not unmeasured[used > 0].all():
                used = np.where(unmeasured, 0, used)
        p = np.where(used > 0, b.sync_p if in_sync and b.sync_p is not None else b.explore_p, -1.0)  # (m,)
        top = int(np.argmax(p))
        anchor = self.target if in_sync and self.target >= 0 else self.fav
        if 0 <= anchor < p.size and used[anchor] and p[anchor] >= p[top] - EXPLORE_TIE:
            top = anchor
        return np.where(self.is_model[d_ctx] & (used[d_ctx] > 0), top, d_ctx)

    def _unmeasured(self) -> np.ndarray:
        """(m,) bool: draft models with fewer than ``PROBE_TRIALS`` first-position trials."""
        return self.is_model & np.array([p.trials[0] < PROBE_TRIALS for p in self.pos])

    def note_favourite(self, sp: StepPlan) -> None:
        """Remember the draft model that drafted for most requests this step (new requests count in
        sync with it; docs/decisions.md, 2026-11-22), and whether enough of the batch is expected to
        draft on a draft model for new requests to count in sync with it at all (``SYNC_SHARE``)."""
        d_ctx, k = sp.d_ctx, sp.choice.k
        b = self.bandit
        if sp.uniform:  # the most used is the only one: no counts
            i = int(d_ctx[0])
            on_model = i >= 0 and self.is_model[i]
            if on_model and k.max(initial=0) > 0:
                self.fav = i
            modelled = float(np.count_nonzero(k)) if on_model else 0.0
        else:
            drafting = (k > 0) & (d_ctx >= 0)  # (n,) bool
            used = np.bincount(d_ctx[drafting], minlength=self.is_model.size) * self.is_model  # (m,)
            if used.any():
                self.fav = int(np.argmax(used))
            modelled = float(used.sum())
        if not self._may_sync_new:
            return
        if b.exploring and b.explore_p is not None:
            p = self.sync_p if self.sync_p is not None else b.explore_p  # a new request is priced in sync
            self.new_in_sync = self.target >= 0 or bool(self.fav >= 0 and p[self.fav] >= SYNC_SHARE)
        else:
            self.new_in_sync = self.target >= 0 or modelled >= SYNC_SHARE * max(sp.n, 1) or (  # or a request in
                self.sync_rows is not None and 0 <= self.fav == self.exploit_sync)  # sync would draft there

    def _profile_values(self, ctx: PolicyContext) -> np.ndarray:
        """(m,) each drafter's goodput by the profile at its prior rate, half the batch limit and a
        typical context (tokens per ms of its best uniform k)."""
        plan = ctx.plan
        n, S = max(1, plan.profile.limits.max_batch // 2), float(typical_ctx(plan.profile))
        kk = np.arange(max(ctx.max_k, 1) + 1, dtype=np.float64)  # (K+1,)
        out = np.empty(len(ctx.drafters))
        for i in range(out.size):
            r = min(float(ctx.prior_rate[i]), MAX_RATE)
            out[i] = float(np.max((1.0 - r ** (kk + 1.0)) / (1.0 - r) / uniform_step_ms(ctx.cost, n, S, kk, drafter=i)))
        return out

    def rewarded(self, outcome: StepOutcome, d_ctx: np.ndarray, spec: np.ndarray | None) -> np.ndarray | None:
        """(n,) bool: the requests whose outcome teaches the bandit (None: none do). Those that drafted
        (``spec``, None when nobody did), and those on an n-gram drafter whose lookup found nothing:
        a plain step is what that drafter gave them (docs/decisions.md, 2026-11-26). A drafter this
        policy does not know (-1) teaches nothing."""
        known = d_ctx >= 0  # (n,) bool
        mine = known if spec is None else spec & known
        avail = outcome.ngram_avail
        if avail is not None and self.is_ngram.any():
            empty = known & (avail == 0) & (outcome.verified == 0)  # (n,) bool
            empty &= self.is_ngram[np.maximum(d_ctx, 0)]
            mine = empty if spec is None else mine | empty
        elif spec is None:
            return None
        return mine if mine.any() else None

    def rewards(self, outcome: StepOutcome, d_ctx: np.ndarray, cost: StepCostModel) -> np.ndarray:
        """(n,) per-request speedup over no speculation in the same step: the tokens each request
        got per ms of the step's cost it used, over what a plain step of this batch gives per ms.

        Tokens per ms alone grow with the batch (each request's share of a step shrinks), so a drafter
        measured in larger batches than another looked better than it is, and the bandit's exploitation
        could settle on a loser; over the plain step's rate the batch divides out."""
        n = outcome.n
        ctx = outcome.ctx_lens
        # (integer contexts: their sums are exact, so the same floats as summing a float copy)
        plain_share = cost.verify_ms(ctx, self._zeros(n)) / n
        verify_share = cost.verify_ms(ctx, outcome.verified) / n
        if d_ctx[0] >= 0 and is_uniform(d_ctx):
            d = cost.drafters[int(d_ctx[0])]
            share = verify_share + d.draft_ms(ctx, outcome.drafted) / n
            return (outcome.accepted + 1) * (plain_share / max(share, MIN_SHARE_MS))
        share = np.full(n, verify_share)  # (n,)
        for i, d in enumerate(cost.drafters):
            sel = d_ctx == i  # (n,) bool
            if sel.any():
                share[sel] += d.draft_ms(ctx[sel].astype(np.float64), outcome.drafted[sel]) / sel.sum()
        return (outcome.accepted + 1) * (plain_share / np.maximum(share, MIN_SHARE_MS))

    def _zeros(self, n: int) -> np.ndarray:
        """(n,) zero draft lengths (read-only; grown as needed)."""
        if self._zero_k.size < n:
            self._zero_k = np.zeros(max(n, 2 * self._zero_k.size), dtype=I64)
        return self._zero_k[:n]
