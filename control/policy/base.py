"""What every policy shares: the context compiled from a plan, slot bookkeeping, per-request caps."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from control.goodput.estimators import MovingWindow, chain_trials
from control.goodput.granular import granular_choice
from control.goodput.granularity import PER_REQUEST, VerifyGranularity
from control.goodput.optimizer import Constraints
from control.goodput.stepcost import DrafterKind, StepCostModel
from control.plan import BanditParams, GateParams, Plan
from control.policy.types import Decision, StepOutcome, StepView

I64 = np.int64


@dataclass(slots=True)
class PolicyContext:
    """Everything a policy needs from a plan, in array form, indexed by active drafter."""

    plan: Plan
    cost: StepCostModel  # drafters in the order of ``drafters``
    default_cost: StepCostModel  # the default drafter only
    drafters: tuple[str, ...]
    default: int
    max_k: int
    cons: Constraints
    prior_rate: np.ndarray  # (m,)
    prior_positions: np.ndarray  # (m, K) conditional per-position rates
    confidences: np.ndarray  # (m,) bool: drafter reports confidences
    gate: GateParams
    bandit: BanditParams
    force_off: bool

    @classmethod
    def from_plan(cls, plan: Plan) -> PolicyContext:
        names = tuple(plan.drafters)
        K = max(plan.max_k, 1)
        prior = np.array([plan.prior_rate(d) for d in names])
        pos = np.empty((len(names), K))
        for i, d in enumerate(names):
            given = plan.acceptance.per_position.get(d)
            if given:
                g = np.asarray(given[:K], dtype=np.float64)
                pos[i] = np.concatenate([g, np.full(K - g.size, g[-1])]) if g.size < K else g
            else:
                pos[i] = prior[i]
        cost = plan.profile.step_cost(list(names))
        default = names.index(plan.default_drafter)
        return cls(
            plan=plan,
            cost=cost,
            default_cost=StepCostModel(cost.target, (cost.drafters[default],), cost.overhead_ms),
            drafters=names,
            default=default,
            max_k=plan.max_k,
            cons=Constraints(slo_tpot_ms=plan.slo.tpot_ms, slo_quantile=plan.slo.quantile),
            prior_rate=prior,
            prior_positions=pos,
            confidences=np.array([plan.profile.drafter(d).confidences and plan.profile.drafter(d).kind.value != "ngram"
                                  for d in names]),
            gate=plan.gate,
            bandit=plan.bandit,
            force_off=plan.force_off,
        )


class BasePolicy:
    """Slot bookkeeping and the per-request caps every policy applies.

    Subclasses implement ``_decide(view, cap, ctx_drafter)`` and may override ``observe``. The cap
    of request r is min(K, its num_draft_tokens, remaining - 1) (drafting past max_tokens is waste),
    and 0 for every request when the plan forces speculation off.
    """

    name = "base"

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx
        self._slot_rid = np.full(64, -1, dtype=I64)
        self._map_key: tuple[str, ...] | None = None
        self._to_ctx = np.zeros(0, dtype=I64)  # executor drafter index -> ctx index (-1: not active)
        self._to_exec = np.zeros(0, dtype=I64)  # ctx drafter index -> executor index (-1: executor lacks it)
        self.verify: VerifyGranularity = PER_REQUEST  # the executor's, from its views (``use_verify``)

    # -- plan updates ----------------------------------------------------------------------------
    def update_context(self, ctx: PolicyContext) -> None:
        """Apply a new plan of the same policy, keeping learned state where it still applies."""
        changed = ctx.drafters != self.ctx.drafters
        self.ctx = ctx
        if changed:
            self._map_key = None
        if ctx.cost.verify != self.verify:  # the new plan's costs, priced as the executor verifies
            self.use_verify(self.verify)

    # -- helpers ---------------------------------------------------------------------------------
    def _drafter_maps(self, view: StepView) -> None:
        if self._map_key == view.drafters:
            return
        self._map_key = view.drafters
        names = self.ctx.drafters
        self._to_ctx = np.array([names.index(d) if d in names else -1 for d in view.drafters], dtype=I64)
        self._to_exec = np.array([view.drafters.index(d) if d in view.drafters else -1 for d in names], dtype=I64)

    def _new_slots(self, view: StepView) -> np.ndarray:
        """Slots that hold a request this policy has not seen before (their state must be reset)."""
        slots = view.slots
        try:
            known = self._slot_rid[slots]
        except IndexError:  # a slot past the per-slot arrays (rare): grow them, no max() every step
            self._grow_slots(max(int(slots.max()) + 1, 2 * self._slot_rid.size))
            known = self._slot_rid[slots]
        fresh = known != view.request_ids
        if not fresh.any():  # the usual step: no new request, nothing to write
            return slots[:0]
        self._slot_rid[slots] = view.request_ids
        return slots[fresh]

    def _grow_slots(self, size: int) -> None:
        """Grow the per-slot arrays to ``size`` slots; subclasses with their own extend this."""
        grown = np.full(size, -1, dtype=I64)
        grown[: self._slot_rid.size] = self._slot_rid
        self._slot_rid = grown

    def caps(self, view: StepView) -> np.ndarray:
        if self.ctx.force_off or self.ctx.max_k <= 0:
            return np.zeros(view.n, dtype=I64)
        if view.n == 1:  # plain ints
            one = min(int(view.k_cap[0]), int(view.remaining[0]) - 1, self.ctx.max_k, view.max_k)
            return np.array([max(one, 0)], dtype=I64)
        cap = np.minimum(np.minimum(view.k_cap, view.remaining - 1), min(self.ctx.max_k, view.max_k))
        return np.maximum(cap, 0)

    def exec_drafter(self, ctx_idx) -> np.ndarray:
        """Executor drafter indices for ctx drafter indices (falls back to the executor's first)."""
        out = self._to_exec[ctx_idx]
        return np.where(out < 0, 0, out)

    def default_exec_drafter(self) -> int:
        e = int(self._to_exec[self.ctx.default]) if self._to_exec.size else 0
        return max(e, 0)

    def lag_of(self, view: StepView, exec_drafter: np.ndarray) -> np.ndarray:
        return view.draft_lag[np.arange(exec_drafter.shape[0]), exec_drafter]

    # -- protocol --------------------------------------------------------------------------------
    def decide(self, view: StepView) -> Decision:
        self._drafter_maps(view)
        fresh = self._new_slots(view)
        if fresh.size:
            self.reset_slots(fresh)
        if view.verify is not self.verify:
            self.use_verify(view.verify)
        if view.n == 0:
            return Decision(np.zeros(0, dtype=I64), np.zeros(0, dtype=I64), prefill_draft=self.wants_draft_prefill(view),
                            prefill_drafter=self.prefill_drafter())
        return self._decide(view, self.caps(view))

    def use_verify(self, verify: VerifyGranularity) -> None:
        """Price verification as the executor does it from now on (its views carry ``verify``)."""
        self.verify = verify
        c = self.ctx
        if c.cost.verify != verify:  # a copy: a context may be shared with the policy it came from
            self.ctx = replace(c, cost=replace(c.cost, verify=verify), default_cost=replace(c.default_cost, verify=verify))

    def granular(self, view: StepView, cap: np.ndarray, surv: np.ndarray, cost: StepCostModel) -> Decision:
        """k where the target pads drafts or verifies per batch (``cost.verify``): speculation on or
        off for the whole step, then per-request k against drafting cost alone
        (``control.goodput.granular``)."""
        c = self.ctx.cons
        cons = Constraints(view.free_kv_slots, view.token_budget, c.slo_tpot_ms, c.slo_quantile)
        ch = granular_choice(cost, view.ctx_lens, surv, cap, cons)
        return Decision(ch.k, np.full(view.n, self.default_exec_drafter(), dtype=I64), prefill_draft=True,
                        prefill_drafter=self.prefill_drafter(), predicted_step_ms=ch.step_ms,
                        predicted_tokens=ch.tokens)

    def reset_slots(self, slots: np.ndarray) -> None:  # noqa: B027 - optional hook
        """Called with the slots that now hold new requests."""

    def wants_draft_prefill(self, view: StepView) -> bool:
        """Prefill new requests' draft state: only when speculation may run and the default drafter
        keeps state (an n-gram lookup has none to build; prefilling a draft model it never runs is
        pure cost)."""
        if self.ctx.force_off or self.ctx.max_k <= 0:
            return False
        drafters = self.ctx.cost.drafters
        return not drafters or drafters[self.ctx.default].kind != DrafterKind.ngram

    def prefill_drafter(self) -> int:
        """Executor index of the drafter whose state new requests prefill (-1: the executor's default)."""
        return -1

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        raise NotImplementedError

    def observe(self, outcome: StepOutcome) -> None:  # noqa: B027 - optional hook
        """Default: learn nothing."""


class GlobalRateMixin:
    """A global moving-window acceptance estimate for the default drafter (SmartSpec's)."""

    def _init_rate(self, ctx: PolicyContext, window: int = 64) -> None:
        self.rate_est = MovingWindow(window=window, prior=float(ctx.prior_rate[ctx.default]))

    def _observe_rate(self, outcome: StepOutcome) -> None:
        s, t = chain_trials(outcome.verified, outcome.accepted)
        self.rate_est.update(float(s.sum()), float(t.sum()))
