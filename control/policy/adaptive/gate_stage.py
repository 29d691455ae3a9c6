"""Stage: gate. Whether the step considers speculation at all, and what a step of k = 0 says about it.

The gate (``control.policy.gate.Gate``) switches off above b_off requests and on below
b_on_ratio * b_off, with a minimum dwell. Every ``probe_every`` steps b_off is re-derived from the
live cost model at the batch's mean context: the largest batch at which some runnable drafter, at
its pooled rate, still pays (``threshold_batch``; None: every batch size pays).

Evidence: a step where every request got k = 0, none of them held back by catch-up, and where no
runnable drafter's pooled rate r makes a uniform k pay,

    max_{k >= 1} (1 - r^(k+1)) / (1 - r) / T(n, S, k)  <=  1 / T(n, S, 0),

counts towards closing the gate at this batch size; ``min_dwell`` such steps in a row lower b_off to n.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from control.goodput.acceptance import MAX_RATE
from control.goodput.stepcost import StepCostModel
from control.plan import Plan, threshold_batch
from control.policy.adaptive.step_plan import StepPlan
from control.policy.adaptive.uniform_steps import UniformSteps
from control.policy.gate import Gate
from control.policy.types import StepView


class GateStage:
    def __init__(self, gate: Gate, steps: UniformSteps) -> None:
        self.gate = gate
        self.steps = steps
        self.zero_run = 0  # consecutive steps of k = 0 that count as evidence

    def open(self, view: StepView, plan: Plan, cost: StepCostModel, max_k: int, runnable: list[int],
             pooled: Callable[[int], float]) -> bool:
        """Advance the gate for this step (re-deriving its threshold when a probe is due)."""
        if self.gate.probe_due(view.step):
            self.retune(view, plan, cost, max_k, runnable, pooled)
        return self.gate.update(view.n, view.step)

    def retune(self, view: StepView, plan: Plan, cost: StepCostModel, max_k: int, runnable: list[int],
               pooled: Callable[[int], float]) -> None:
        """b_off = the batch size above which no runnable drafter pays at its pooled rate."""
        ctx = int(np.mean(view.ctx_lens))
        b_off = 0
        for i in runnable:
            b = threshold_batch(cost, ctx, pooled(i), max_k, plan.profile.limits.max_batch, plan.slo, drafter=i)
            if b is None:
                b_off = None
                break
            b_off = max(b_off, b)
        self.gate.retune(b_off)

    def evidence(self, sp: StepPlan, cost: StepCostModel, runnable: list[int], pooled: Callable[[int], float]) -> None:
        """Count a step of k = 0 for everyone towards closing the gate at this batch size (module doc)."""
        k, cap, n = sp.choice.k, sp.cap, sp.n
        all_zero = int(k[0]) == 0 and int(cap[0]) > 0 if n == 1 else k.max() == 0 and cap.max() > 0
        if (all_zero and not (sp.lagged and sp.lag[cap > 0].any())
                and not self.pays_at_pooled_rates(sp.view, cost, runnable, pooled)):
            # a zero that only reflects catch-up costs, or requests whose own rates are poor, says
            # nothing about the batch size
            self.zero_run += 1
            if self.zero_run >= max(self.gate.min_dwell, 1):
                self.gate.retune(min(self.gate.b_off, n))
        else:
            self.zero_run = 0

    def pays_at_pooled_rates(self, view: StepView, cost: StepCostModel, runnable: list[int],
                             pooled: Callable[[int], float]) -> bool:
        """Whether some drafter, at its pooled rate, makes a uniform k > 0 beat k = 0 for a batch of
        this size and mean context (docs/decisions.md: judging by the requests' own poor rates closed
        the gate at batch 1-2)."""
        inv = self.steps.inv(cost, view.ctx_lens)  # (m, K+1)
        kk = self.steps.kk
        for i in runnable:
            r = min(pooled(i), MAX_RATE)
            g = (1.0 - r ** (kk + 1.0)) / (1.0 - r) * inv[i]  # (K+1,)
            if g[1:].max(initial=0.0) > g[0]:
                return True
        return False
