"""SmartSpec (step-level goodput, global moving average) and TurboSpec (+ adaptive disable threshold)."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from control.goodput.acceptance import chain_survival
from control.goodput.optimizer import Constraints, best_uniform_k
from control.policy.base import I64, BasePolicy, GlobalRateMixin, PolicyContext
from control.policy.types import Decision, StepOutcome, StepView


class SmartSpecPolicy(GlobalRateMixin, BasePolicy):
    """One k for the batch maximising predicted goodput with the global moving-average rate
    (SmartSpec Alg. 1-2). Draft prefill is skipped while more than 70% of recent steps chose k = 0
    (SmartSpec's prefill disabling); such requests then stay non-speculative.

    A step counts as k = 0 when the optimiser would choose k = 0 even if every request of the batch
    could draft (``_pays``): a batch whose requests lack draft state (their prefill was skipped) gets
    k = 0 whatever the load, and counting that would keep the prefill off for good."""

    name = "smartspec"
    PREFILL_OFF_SHARE = 0.7

    def __init__(self, ctx: PolicyContext, window: int = 64) -> None:
        super().__init__(ctx)
        self._init_rate(ctx, window)
        self._zero_hist: deque[bool] = deque(maxlen=window)

    def _constraints(self, view: StepView) -> Constraints:
        c = self.ctx.cons
        return Constraints(view.free_kv_slots, view.token_budget, c.slo_tpot_ms, c.slo_quantile)

    def _draft_caps(self, view: StepView, cap: np.ndarray) -> np.ndarray:
        """Per-request caps with 0 for requests whose draft never saw the prompt (its prefill was
        skipped: they stay plain). A draft that only missed the tokens of steps without speculation
        catches up in its next pass, as vLLM keeps its proposer's KV in step on such steps."""
        drafter = np.full(view.n, self.default_exec_drafter(), dtype=I64)
        return np.where(self.lag_of(view, drafter) >= view.ctx_lens, 0, cap)

    def _step_k(self, view: StepView, cap: np.ndarray, catch_up: bool = True) -> np.ndarray:
        """The goodput-maximising uniform k under ``cap`` (already the draft caps), catch-ups priced
        (``catch_up`` False: as if every draft were in step)."""
        surv = chain_survival(np.full(view.n, self.rate_est.rate), max(self.ctx.max_k, 1))
        lag = None
        if catch_up:
            lag = np.where(cap > 0, self.lag_of(view, np.full(view.n, self.default_exec_drafter(), dtype=I64)), 0)
        choice = best_uniform_k(self.ctx.default_cost, view.ctx_lens, surv, cap, self._constraints(view), lag=lag)
        return choice.k

    def wants_draft_prefill(self, view: StepView) -> bool:
        if not super().wants_draft_prefill(view):
            return False
        if len(self._zero_hist) < 8:
            return True
        return sum(self._zero_hist) / len(self._zero_hist) <= self.PREFILL_OFF_SHARE

    def _pays(self, view: StepView, cap: np.ndarray, dcap: np.ndarray, k: np.ndarray) -> bool | None:
        """Whether speculation pays at this batch size: whether the optimiser would draft if every
        request of the batch could draft up to the largest cap (None: no request may draft at all).
        A request without draft state, or one a token from its end, is a passing state of that
        request, not of the load. ``k``: the choice under the draft caps ``dcap``."""
        top = int(cap.max(initial=0))
        if top <= 0:
            return None
        if k.max(initial=0) > 0:
            return True
        if (dcap == top).all():
            return False
        return bool(self._step_k(view, np.full_like(cap, top), catch_up=False).max(initial=0) > 0)

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        dcap = self._draft_caps(view, cap)
        k = self._step_k(view, dcap)
        pays = self._pays(view, cap, dcap, k)
        if pays is not None:
            self._zero_hist.append(not pays)
        return Decision(k, np.full(view.n, self.default_exec_drafter(), dtype=I64),
                        prefill_draft=self.wants_draft_prefill(view))

    def observe(self, outcome: StepOutcome) -> None:
        self._observe_rate(outcome)


class TurboSpecPolicy(SmartSpecPolicy):
    """SmartSpec's optimiser plus TurboSpec's adaptive disable threshold (Listing 1): when the
    optimiser returns k = 0, the batch size is recorded; above it the draft prefill is skipped
    (those requests stay non-speculative) and every RESET_STEPS skipped steps the threshold resets.

    The threshold is recorded only when the optimiser would choose k = 0 even if every request of
    the batch could draft (``_pays``): when some requests cannot (no draft state after a skipped
    prefill, or a token from their end), drafting for the others alone may not pay its passes
    (at batch 2 with one of them finishing: k = 0), and recording that batch size switched the
    prefill off at low load, where speculation pays."""

    name = "turbospec"
    RESET_STEPS = 64

    def __init__(self, ctx: PolicyContext, window: int = 64) -> None:
        super().__init__(ctx, window)
        self.disable_batch_size = math.inf
        self.skip_cnt = 0

    def wants_draft_prefill(self, view: StepView) -> bool:
        if not BasePolicy.wants_draft_prefill(self, view):
            return False
        if view.n > self.disable_batch_size:
            self.skip_cnt += 1
            if self.skip_cnt % self.RESET_STEPS == 0:
                self.disable_batch_size = math.inf
            return False
        return True

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        prefill = self.wants_draft_prefill(view)
        dcap = self._draft_caps(view, cap)
        k = self._step_k(view, dcap)
        if self._pays(view, cap, dcap, k) is False:
            self.disable_batch_size = view.n
        return Decision(k, np.full(view.n, self.default_exec_drafter(), dtype=I64), prefill_draft=prefill)
