"""SpecServe: confidence-driven adaptive drafting, confidence prior verifier, SLO-aware estimator.

- Adaptive drafter (5.1, predict-execute-correct): predict each position's acceptance from the
  historical mean draft confidence, pick the step's draft depth that maximises predicted efficiency,
  then stop each request's drafting early once its running confidence product falls below the
  marginal-cost cut.
- Confidence prior verifier (5.2): after drafting, drop the least likely draft tokens (by survival =
  product of confidences) while efficiency rises; drafting cost is already paid.
- SLO-aware estimator (5.3): a step whose predicted time exceeds the TPOT SLO is infeasible.
Drafters without confidences (n-gram) fall back to the moving-average acceptance rate.
"""

from __future__ import annotations

import numpy as np

from control.goodput.acceptance import chain_survival, confidence_survival
from control.goodput.optimizer import Constraints, admit_slots, best_uniform_k, confidence_cuts
from control.policy.base import I64, BasePolicy, GlobalRateMixin, PolicyContext
from control.policy.types import Decision, StepOutcome, StepView


class SpecServePolicy(GlobalRateMixin, BasePolicy):
    name = "specserve"

    def __init__(self, ctx: PolicyContext, ema: float = 0.95) -> None:
        super().__init__(ctx)
        self._init_rate(ctx)
        K = max(ctx.max_k, 1)
        self.ema = ema
        self.conf_mean = np.full(K, float(ctx.prior_rate[ctx.default]))
        self.uses_conf = bool(ctx.confidences[ctx.default])

    def _cons(self, view: StepView) -> Constraints:
        c = self.ctx.cons
        return Constraints(view.free_kv_slots, view.token_budget, c.slo_tpot_ms, c.slo_quantile)

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        d = self.default_exec_drafter()
        drafter = np.full(view.n, d, dtype=I64)
        cap = np.where(self.lag_of(view, drafter) > 0, 0, cap)
        K = max(self.ctx.max_k, 1)
        if self.uses_conf:
            surv = np.broadcast_to(np.cumprod(self.conf_mean), (view.n, K))
        else:
            surv = chain_survival(np.full(view.n, self.rate_est.rate), K)
        choice = best_uniform_k(self.ctx.default_cost, view.ctx_lens, surv, cap, self._cons(view))
        cut = confidence_cuts(self.ctx.default_cost, view.ctx_lens, choice) if self.uses_conf else None
        return Decision(choice.k, drafter, conf_cut=cut, predicted_step_ms=choice.step_ms,
                        predicted_tokens=choice.tokens)

    def prune(self, view: StepView, decision: Decision, drafted: np.ndarray, confidence: np.ndarray) -> np.ndarray:
        """Verify the prefix of each request's drafts that maximises predicted efficiency."""
        if not self.uses_conf or confidence is None or drafted.max(initial=0) == 0:
            return drafted
        surv = confidence_survival(confidence)
        choice = admit_slots(self.ctx.default_cost, view.ctx_lens, surv, drafted, self._cons(view),
                             draft_sunk=True)
        return np.minimum(choice.k, drafted)

    def observe(self, outcome: StepOutcome) -> None:
        self._observe_rate(outcome)
        if outcome.confidence is not None and outcome.n:
            conf = outcome.confidence[:, : self.conf_mean.size]
            seen = ~np.isnan(conf)
            cnt = seen.sum(axis=0)
            if cnt.any():
                mean = np.where(cnt > 0, np.nansum(conf, axis=0) / np.maximum(cnt, 1), self.conf_mean[: conf.shape[1]])
                upd = self.conf_mean[: conf.shape[1]]
                self.conf_mean[: conf.shape[1]] = np.where(cnt > 0, self.ema * upd + (1 - self.ema) * mean, upd)
