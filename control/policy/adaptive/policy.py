"""``adaptive``: our policy. Request-level, per-position, SLO-aware, context-aware, gated, multi-drafter.

One step is a pipeline of named stages over a typed ``StepPlan`` (``step_plan.py``), each in its
own module with its formula in its docstring:

1. gate (``gate_stage.py``): hysteresis on batch size, dwell, periodic retune from the live cost
   model; while off the draft prefill is skipped.
2. drafter choice (``drafters.py``): the drafter bandit (SPIN) with Thompson exploration, one draft
   model per step.
3. survival (``survival.py``): each request's Beta-posterior rate, shrunk to its category's or the
   drafter's pooled rate, on the drafter's per-position curve.
4. optimiser (``optimise.py``): per-request k maximising residence-weighted goodput under the live
   cost model, KV, token budget, SLO and catch-up costs.
5. probes (``probes.py``): while exploring, unmeasured drafters draft one token.
6. gate evidence (``gate_stage.py``): steps of k = 0 for all at pooled rates close the gate.
7. cuts (``cuts.py``): marginal-cost confidence cuts mapped through each drafter's calibration.
8. pace (``optimise.py``): each request's smoothed tokens per step, the next step's weights.

That full decision runs every few steps, as often as ``DECISION_SHARE`` of the step time allows
(and when the batch size doubled or halved, or the drafters changed); in between, a step only
looks up each request's held draft length, and a new request's from a table over acceptance rates
(``held.py``). Outcomes are queued and learned, in order, when the next full decision (or a
reader of the estimates) needs them.

``observe`` updates the estimators (``survival.py``), refits the cost model online (``refit.py``)
and feeds the bandit.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from control.goodput.estimators import chain_trials
from control.goodput.optimizer import Constraints
from control.goodput.stepcost import StepCostModel
from control.policy.adaptive.cuts import confidence_cuts
from control.policy.adaptive.drafters import DrafterChoice
from control.policy.adaptive.gate_stage import GateStage
from control.policy.adaptive.held import MOVE_FRACTION, HeldDecisions
from control.policy.adaptive.optimise import Optimiser
from control.policy.adaptive.probes import probe_unmeasured
from control.policy.adaptive.refit import CostRefit
from control.policy.adaptive.step_plan import StepPlan
from control.policy.adaptive.survival import AcceptanceModel, PooledRows, is_uniform, lookup_drafters
from control.policy.adaptive.uniform_steps import UniformSteps
from control.policy.base import I64, BasePolicy, PolicyContext
from control.policy.gate import Gate
from control.policy.types import Decision, StepOutcome, StepView, stopped_short

# pseudo-trials the pooled rate is worth in a request's Beta posterior: the spread of acceptance
# between requests on the recorded prompt sets puts it at 9-24 (empirical Bayes, counting a request's
# trials as independent, which they are not: more), and a request's early rate predicts its later one
# only in part (correlation 0.3-0.7 between halves), so its own first steps should not set its k alone
REQUEST_STRENGTH = 16.0
FRESH_EPOCHS = 3  # bandit epochs decided on every outcome so far, even by an engine that prepares a step ahead


class AdaptivePolicy(BasePolicy):
    name = "adaptive"

    def __init__(self, ctx: PolicyContext, seed: int = 0, request_strength: float = REQUEST_STRENGTH,
                 refresh_every: int | None = None) -> None:
        """``refresh_every``: steps between full decisions (1: every step; None: as many as the step
        time allows, ``held.refresh_interval``)."""
        if refresh_every is not None and refresh_every < 1:
            raise ValueError(f"refresh_every = {refresh_every!r}: must be >= 1 (1: a full decision every step)")
        super().__init__(ctx)
        self._seed = seed
        self._strength = request_strength
        self._every = refresh_every
        self._setup(ctx)

    def _setup(self, ctx: PolicyContext) -> None:
        K = max(ctx.max_k, 1)
        self.K = K
        slots = self._slot_rid.size  # per-slot arrays as long as the base's (grown together)
        self.acceptance = AcceptanceModel(ctx.prior_positions, self._strength, slots, ctx.confidences, lookup_drafters(ctx))
        self.refit = CostRefit(ctx.cost)
        self._cost = ctx.cost
        g = ctx.gate
        self.steps = UniformSteps(len(ctx.drafters), K)
        self.gate_stage = GateStage(Gate(g.b_off, g.b_on_ratio, g.min_dwell_steps, g.probe_every_steps), self.steps)
        self.choice = DrafterChoice(ctx, self.acceptance.pos, self.steps, self._seed, self.refit.prices)
        self.optimiser = Optimiser(slots)
        self.held = HeldDecisions(slots, len(ctx.drafters), K, self._every)
        self._held_steps = 0  # look-up steps since the last full decision (the bandit's clock counts them)
        # with several drafters, early outcomes decide which drafter the bandit explores for a whole
        # stage: a full decision as well while the queued outcomes would still move the estimates
        self._watch_moves = self.choice.bandit is not None
        self._trials_queued = 0  # draft tokens verified in the queued outcomes (while watched)
        self._trials_learned = 0  # ... in the outcomes learned so far
        self._steps_ms, self._steps_n = 0.0, 0  # time of the steps observed since the last refresh (held.py)
        self._pending: list[tuple[Any, ...]] = []  # outcomes and slot resets not learned yet, in order
        # per slot, grown together (``_grow_slots``): the k the last decision asked for, and the one before
        # (its outcome may arrive after this step's decision, ``OneStepStale``)
        self._asked = np.zeros(slots, dtype=I64)
        self._asked_prev = np.zeros(slots, dtype=I64)
        self._asked_step = self._asked_prev_step = -1
        self._cons_key: tuple | None = None
        self._cons = self.ctx.cons

    # -- views kept for callers and tests (what they read is learned up to the last outcome) -----
    @property
    def pos(self):
        self.flush()
        return self.acceptance.pos

    @property
    def req(self):
        self.flush()
        return self.acceptance.req

    @property
    def cost(self) -> StepCostModel:
        self.flush()
        return self._cost

    @cost.setter
    def cost(self, cost: StepCostModel) -> None:
        self._cost = cost

    @property
    def gate(self) -> Gate:
        return self.gate_stage.gate

    @property
    def bandit(self):
        return self.choice.bandit

    @property
    def _pace(self) -> np.ndarray:
        return self.optimiser.pace

    def drafter_state(self) -> dict | None:
        """The drafter choice's state (``DrafterChoice.state``); None with one drafter."""
        return self.choice.state() if self.choice.bandit is not None else None

    def pooled_rate(self, i: int) -> float:
        self.flush()
        return self.acceptance.pooled_rate(i)

    def update_context(self, ctx: PolicyContext) -> None:
        # a smaller max_k keeps the estimators (their extra positions are never admitted: caps() bound k)
        same_drafters = ctx.drafters == self.ctx.drafters and max(ctx.max_k, 1) <= self.K
        self.flush()  # what was observed under the old plan
        self.held.invalidate()
        super().update_context(ctx)
        if not same_drafters:
            self._setup(self.ctx)  # the new context as the base priced it (the executor's verification)
            return
        # Same drafters: keep learned acceptance and the bandit; take the new priors, limits and gate.
        self.acceptance.set_priors(ctx.prior_positions)
        self.choice.ctx = self.ctx
        g = ctx.gate
        self.gate.b_on_ratio, self.gate.min_dwell, self.gate.probe_every = g.b_on_ratio, g.min_dwell_steps, g.probe_every_steps
        self.gate.retune(g.b_off)

    def use_verify(self, verify) -> None:
        super().use_verify(verify)
        self._cost = replace(self._cost, verify=verify)
        self.held.invalidate()

    def reset_slots(self, slots: np.ndarray) -> None:
        """New requests in ``slots``: the prior's held decision now, their estimates reset in turn."""
        self.held.admit(slots)
        if self._every == 1:
            self._reset_now(slots)
        else:  # held on the favourite until the next full decision: the bandit keeps them there
            d = int(self._to_ctx[self.held.new_drafter]) if self._to_ctx.size > self.held.new_drafter else -1
            self._pending.append((None, slots.copy(), d))

    def _reset_now(self, slots: np.ndarray, drafter: int = -1) -> None:
        """Forget the old requests of ``slots``; ``drafter``: the plan drafter the new ones were put on
        without the bandit (-1: none, the bandit assigns them at the next full decision)."""
        self.optimiser.reset(slots)
        self.acceptance.reset(slots)
        self.choice.reset(slots)
        if self.bandit is not None:
            self.bandit.reset(slots)
            if drafter >= 0:
                self.bandit.hold(slots, drafter)

    def _grow_slots(self, size: int) -> None:
        super()._grow_slots(size)
        if size > self._asked.size:
            self._asked = np.concatenate([self._asked, np.zeros(size - self._asked.size, dtype=I64)])
            self._asked_prev = np.concatenate([self._asked_prev, np.zeros(size - self._asked_prev.size, dtype=I64)])
            self.optimiser.grow(size)
            self.held.grow(size)

    def wants_fresh(self) -> bool:
        """With several drafters, while the bandit is in its first ``FRESH_EPOCHS`` epochs: which
        draft model it settles on follows from its first outcomes, and one step of staleness changes
        that path (docs/controller-cost.md, section 4)."""
        b = self.bandit
        return b is not None and b.epoch <= FRESH_EPOCHS

    def _runnable(self) -> list[int]:
        """Plan drafter indices the executor runs (all of them before the first step maps them)."""
        m = len(self.ctx.drafters)
        return [i for i in range(m) if not self._to_exec.size or self._to_exec[i] >= 0] or [self.ctx.default]

    # -- decide ----------------------------------------------------------------------------------
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

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        n = view.n
        if not self.gate_stage.open(view, self.ctx.plan, self._cost, self.ctx.max_k, self._runnable(), self.pooled_rate):
            self.held.invalidate()
            self.acceptance.age_pooled(1)  # nothing drafts while the gate is off; the evidence still ages
            return Decision(np.zeros(n, dtype=I64), np.full(n, self.default_exec_drafter(), dtype=I64),
                            prefill_draft=False)
        if not self.verify.per_request:  # the target pads drafts or verifies per batch
            self.flush()
            return self._granular(view, cap)
        moved = self._watch_moves and self._trials_queued > MOVE_FRACTION * self._trials_learned
        if not (moved or self.held.due(n, view.step, self._to_exec)):  # the fast path: look up, no estimates
            k, d_exec, cut = self.held.lookup(view.slots, cap)
            k = self.optimiser.held_lookup(view, k, d_exec, cap)  # n-gram: what its lookup proposes now
            self._held_steps += 1
            return Decision(k, d_exec, conf_cut=cut, prefill_draft=self.wants_draft_prefill(view),
                            prefill_drafter=self.prefill_drafter())
        self.flush()
        sp = self._full_decision(view, cap)
        self.held.hold(sp, self.acceptance, self._to_exec, self.ctx.default, self.choice.newcomer(),
                       self._steps_ms / self._steps_n if self._steps_n else math.nan, on_loop=self.wants_fresh())
        self._steps_ms, self._steps_n = 0.0, 0
        c = sp.choice
        return Decision(c.k, sp.d_exec, conf_cut=sp.conf_cut, prefill_draft=self.wants_draft_prefill(view),
                        prefill_drafter=self.prefill_drafter(),
                        predicted_step_ms=c.step_ms, predicted_tokens=c.tokens)

    def _full_decision(self, view: StepView, cap: np.ndarray) -> StepPlan:
        """Every stage, in order, on the estimates learned up to the last outcome."""
        cost = self._cost
        sp = StepPlan(view, cap)
        self.choice.assign(sp, self._to_exec, cost, self._held_steps)
        self._held_steps = 0
        self._limit_catch_up(sp)
        sp.surv = self.acceptance.survival(view, sp.d_ctx, sp.uniform)
        sp.cons = self._constraints(view)
        stays = self.bandit is None or not self.bandit.exploring  # (the optimiser's module doc)
        self.optimiser.run(sp, cost, None if view.n == 1 else self._asked_prev[view.slots], stays)
        if self.bandit is not None and self.bandit.exploring:
            probed = probe_unmeasured(sp, self.acceptance.pos, cost)
            if probed is not sp.choice:
                sp.choice = probed
                sp.accepted = self.optimiser.accepted(sp, probed.k)
        self.gate_stage.evidence(sp, cost, self._runnable(), self.acceptance.pooled_rate)
        sp.conf_cut = confidence_cuts(sp, self.ctx.confidences, self.acceptance.conf, self.acceptance.pos)
        self.optimiser.note_pace(sp)
        if self.bandit is not None:
            self.choice.note_favourite(sp)
        return sp

    def _limit_catch_up(self, sp: StepPlan) -> None:
        """No drafting this step for requests whose draft lags more than the gate's catch-up limit,
        but one of them: the least behind may catch up (its draft state is built by nothing else, so
        a request whose prompt alone is over the limit would otherwise never draft; one such catch-up
        per step bounds the step's spike by one prompt, which its own prefill already cost)."""
        lag, n = sp.lag, sp.n
        sp.lagged = bool(lag[0]) if n == 1 else bool(lag.any())
        limit = self.ctx.gate.max_catchup_tokens
        if sp.lagged and (lag[0] if n == 1 else lag.max()) > limit:
            over = lag > limit  # (n,) bool
            over[int(np.argmin(np.where(over, lag, np.iinfo(I64).max)))] = False
            sp.cap = np.where(over, 0, sp.cap)

    def _granular(self, view: StepView, cap: np.ndarray) -> Decision:
        """On or off for the step, then k per request against drafting cost (the default drafter, at
        each request's learned survival): what padded or per-batch verification leaves to choose."""
        i, c = self.ctx.default, self._cost
        surv = self.acceptance.survival(view, np.full(view.n, i, dtype=I64), True)
        return self.granular(view, cap, surv, StepCostModel(c.target, (c.drafters[i],), c.overhead_ms, c.verify))

    def _constraints(self, view: StepView) -> Constraints:
        """This step's limits (the last step's object when they did not change)."""
        key = (view.free_kv_slots, view.token_budget, self.ctx.cons)
        if self._cons_key != key:
            c = self.ctx.cons
            self._cons = Constraints(view.free_kv_slots, view.token_budget, c.slo_tpot_ms, c.slo_quantile)
            self._cons_key = key
        return self._cons

    def prefill_drafter(self) -> int:
        fav = self.choice.prefill_model()
        if fav < 0 or not self._to_exec.size:
            return -1
        return int(self._to_exec[fav])

    def wants_draft_prefill(self, view: StepView) -> bool:
        """Not for short prompts: a request's draft state is built by catch-up in the first draft
        pass that runs for it, which the optimiser prices; a separate prefill pass costs a whole pass
        per prefill step and is wasted on requests that never draft (past the crossover) or draft on
        another drafter. (Among several drafters, new requests are priced as if prefilled on the
        favourite draft model while most of the batch is expected to draft there,
        ``DrafterChoice.new_in_sync``, so exploring it charges them no catch-up of their prompt that
        n-gram is spared.) While the gate is on, long prompts prefill it: those of this iteration when
        together they are over the catch-up limit, or any while most of the batch's contexts are
        (a long-context phase; an executor that prefills in iterations of their own decides this a
        step ahead, before it knows the prompts). A catch-up over the limit would not run, and a
        pass's fixed cost is little beside theirs."""
        if self.ctx.force_off or self.ctx.max_k <= 0:
            return False
        if not self.gate_stage.gate.on:  # before the batch's contexts are looked at (every step)
            return False
        limit = self.ctx.gate.max_catchup_tokens
        return view.prefill_tokens > limit or int((view.ctx_lens > limit).sum()) * 2 > view.n

    # -- observe ---------------------------------------------------------------------------------
    def _tried(self, outcome: StepOutcome, d_ctx: np.ndarray, uniform: bool, asked: np.ndarray) -> np.ndarray:
        """(n,) draft tokens verified, plus the position where a drafter stopped short of the k asked
        (``asked``, (n,): the decision of the outcome's step).

        A drafter that drafts fewer than k on its own (an n-gram lookup without a long enough match)
        delivers nothing at the positions it skipped: for the optimiser, which asks for k, that is a
        rejection there. A lookup that found nothing is no trial: the step was plain decoding for that
        request (docs/decisions.md, 2026-11-22 and 2026-11-25). Stops the policy asked for (a
        confidence cut) are not rejections. (``uniform``: one drafter for the whole step.)"""
        v = outcome.verified
        if uniform and d_ctx[0] >= 0 and self.ctx.confidences[d_ctx[0]]:
            return v  # a drafter with confidences stops short only where the policy's cut said so
        short = stopped_short(asked, outcome.drafted, v, outcome.accepted) & (d_ctx >= 0)  # (n,) bool
        if not short.any():
            return v
        short &= ~self.ctx.confidences[np.maximum(d_ctx, 0)] & (outcome.drafted > 0)
        return np.where(short, v + 1, v)

    def _asked_of(self, outcome: StepOutcome) -> np.ndarray:
        """(n,) the k asked of each request at the outcome's step (the step before, when it arrives late)."""
        late = outcome.step == self._asked_prev_step and outcome.step != self._asked_step
        asked_at = self._asked_prev if late else self._asked
        return asked_at[outcome.slots] if outcome.slots.max(initial=-1) < asked_at.size else outcome.verified

    def observe(self, outcome: StepOutcome) -> None:
        """Queue the outcome for the next full decision (learn it now when every step is one)."""
        if outcome.n == 0:
            return
        d_ctx = self._to_ctx[outcome.drafter] if self._to_ctx.size else np.full(outcome.n, self.ctx.default, dtype=I64)
        asked = self._asked_of(outcome)
        ms = outcome.total_ms if outcome.total_ms > 0.0 else outcome.draft_ms + outcome.verify_ms
        if ms > 0.0:  # (not NaN: an engine that could not time the step)
            self._steps_ms += ms
            self._steps_n += 1
        if self._every == 1:
            self._learn(outcome, d_ctx, asked)
            return
        o = outcome  # the executor may reuse its arrays: keep copies of what learning reads
        if self._watch_moves:
            self._trials_queued += int(o.verified.sum())
        self._pending.append((o, (o.slots.copy(), o.ctx_lens.copy(), o.drafted.copy(), o.verified.copy(),
                                  o.accepted.copy(), None if o.confidence is None else o.confidence.copy(),
                                  None if o.category is None else o.category.copy()), d_ctx, asked))

    def flush(self) -> None:
        """Learn the queued outcomes and apply the queued slot resets, in the order they came (the
        pooled estimators from all of them at once, ``AcceptanceModel.learn_pooled``)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        self._trials_learned += self._trials_queued
        self._trials_queued = 0
        rows = PooledRows(self.K)
        for item in pending:
            if item[0] is None:
                self._reset_now(item[1], item[2])
                continue
            o, (slots, ctx_lens, drafted, verified, accepted, confidence, category), d_ctx, asked = item
            self._learn(replace(o, slots=slots, ctx_lens=ctx_lens, drafted=drafted, verified=verified,
                                accepted=accepted, confidence=confidence, category=category), d_ctx, asked, rows)
        self.acceptance.learn_pooled(rows)

    def _learn(self, outcome: StepOutcome, d_ctx: np.ndarray, asked: np.ndarray, rows: PooledRows | None = None) -> None:
        """Learn one outcome (``rows``: collect what the pooled estimators learn, for the caller)."""
        uniform = is_uniform(d_ctx)
        tried = self._tried(outcome, d_ctx, uniform, asked)  # (n,)
        s, t = chain_trials(tried, outcome.accepted)  # (n,), (n,)
        spec = tried > 0  # (n,) bool
        if not (spec[0] if outcome.n == 1 else spec.any()):  # (plain bools instead of reductions)
            spec = None
        elif rows is None:
            self.acceptance.learn(outcome, d_ctx, tried, spec, s, t, uniform)
        else:
            self.acceptance.learn_request(outcome.slots, d_ctx, s, t, spec, uniform)
            rows.add(d_ctx, tried, outcome.accepted, s, t, spec, outcome.drafted, outcome.category, outcome.confidence,
                     uniform, outcome.ngram_avail, outcome.ngram_match)
        self.choice.learn(outcome.slots, d_ctx, s, t, spec, outcome.accepted)
        self.choice.lookups_scored = outcome.ngram_match is not None
        self._refit(outcome, d_ctx, uniform)
        if self.bandit is not None and not self.choice.whole_batch:  # rewards feed the matching alone
            mine = self.choice.rewarded(outcome, d_ctx, spec)
            if mine is not None:
                self.bandit.update(outcome.slots[mine], d_ctx[mine], self.choice.rewards(outcome, d_ctx, self._cost)[mine])

    def _refit(self, outcome: StepOutcome, d_ctx: np.ndarray, uniform: bool) -> None:
        cost = self.refit.update(outcome, d_ctx, outcome.drafted > 0, uniform, self.verify, self.ctx.cost)
        if cost is not None:
            self._cost = cost
