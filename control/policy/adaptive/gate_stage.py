"""Stage: gate. Whether the step considers speculation at all, and what a step of k = 0 says about it.

The gate (``control.policy.gate.Gate``) switches off above b_off requests and on below
b_on_ratio * b_off, with a minimum dwell. Every ``probe_every`` steps b_off is re-derived from the
live cost model at the batch's mean context: the largest batch at which some runnable drafter, at
its pooled rate, still pays (``threshold_batch``; None: every batch size pays).

Evidence: a step where every request got k = 0, none of them held back by catch-up, and where no
runnable drafter's pooled rate r makes a uniform k pay,

    max_{k >= 1} (1 - r^(k+1)) / (1 - r) / T(n, S, k)  <=  1 / T(n, S, 0),

counts towards closing the gate at this batch size; ``min_dwell`` such steps in a row lower b_off to n.

Probe windows: while the gate is off nothing drafts, so nothing tells the pooled rates that the
drafters' acceptance rose (a prompt mix that changed while the load was high); the gate would stay
off on the rate it closed at. So every ``probe_every`` steps off, the stage lets ``PROBE_STEPS``
steps through: their first (a full decision) drafts one token for up to ``PROBE_REQUESTS`` of the
requests with the least draft lag (if the probed step meets the SLO), and the held decisions repeat
it for the window. The window's steps are no evidence for closing; at its end b_off is re-derived
from the pooled rates that now include the probes, and the gate reopens if they pay at this batch.
The off steps age the pooled evidence as drafting steps do (``AcceptanceModel.age_pooled``), so a
few probes are not outweighed by what was learned before the gate closed.
A window that leaves the gate off doubles the interval to the next one, up to 2^``PROBE_BACKOFF``
times ``probe_every``, until the gate is on again (past the crossover the windows only cost).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from control.goodput.acceptance import MAX_RATE
from control.goodput.optimizer import Choice, slo_ok
from control.goodput.stepcost import StepCostModel
from control.plan import Plan, threshold_batch
from control.policy.adaptive.step_plan import StepPlan
from control.policy.adaptive.uniform_steps import UniformSteps
from control.policy.gate import Gate
from control.policy.types import StepView

PROBE_STEPS = 8  # steps of a probe window while the gate is off (one refresh of the held decisions)
PROBE_REQUESTS = 8  # requests that draft one token in a probe window (those with the least draft lag)
PROBE_BACKOFF = 3  # a window that leaves the gate off doubles the interval to the next, up to 2^this x


class GateStage:
    def __init__(self, gate: Gate, steps: UniformSteps) -> None:
        self.gate = gate
        self.steps = steps
        self.zero_run = 0  # consecutive steps of k = 0 that count as evidence
        self.probe_left = 0  # steps left in the current probe window (0: none open)
        self._probe_start = None  # the step the current probe window opened at (None: none yet)
        self._off_since = None  # the step the gate was last seen off after being on (None: on)
        self._backoff = 0  # doublings of the probe interval since the gate was last on

    @property
    def probing(self) -> bool:
        return self.probe_left > 0

    def open(self, view: StepView, plan: Plan, cost: StepCostModel, max_k: int, runnable: list[int],
             pooled: Callable[[int], float]) -> bool:
        """Advance the gate for this step (re-deriving its threshold when a probe is due); while it is
        off, open a probe window every ``probe_every`` steps (module doc)."""
        if self.probe_left:
            self.probe_left -= 1
            if self.probe_left:
                return True
            self.retune(view, plan, cost, max_k, runnable, pooled)  # the window's outcomes are in the rates
        elif self.gate.probe_due(view.step):
            self.retune(view, plan, cost, max_k, runnable, pooled)
        if self.gate.update(view.n, view.step):
            self._off_since, self._backoff = None, 0
            return True
        if self._off_since is None:
            self._off_since = view.step
        again = self._probe_start is not None and self._probe_start >= self._off_since  # a window left it off
        if view.step - (self._probe_start if again else self._off_since) < self.gate.probe_every << self._backoff:
            return False
        self._backoff = min(self._backoff + 1, PROBE_BACKOFF) if again else 0
        self.probe_left, self._probe_start = PROBE_STEPS, view.step
        return True

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
        """Count a step of k = 0 for everyone towards closing the gate at this batch size; in a probe
        window, draft the probe's tokens instead (module doc)."""
        if self.probing:
            self.probe(sp, cost)
            return
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

    def probe(self, sp: StepPlan, cost: StepCostModel) -> None:
        """k = 1 for up to ``PROBE_REQUESTS`` requests that may draft and got k = 0, the least lagged
        first, if the probed step meets the SLO; ``sp.choice`` and ``sp.accepted`` follow."""
        k0, cap = sp.choice.k, sp.cap
        lag = np.zeros(sp.n, dtype=np.int64) if sp.lag is None else sp.lag  # (n,)
        order = np.argsort(np.where(cap > 0, lag, np.iinfo(np.int64).max), kind="stable")[:PROBE_REQUESTS]
        pick = order[(cap[order] > 0) & (k0[order] == 0)]  # (<= PROBE_REQUESTS,) rows to probe
        room = min(int(sp.view.free_kv_slots), int(sp.view.token_budget) - sp.n) - int(k0.sum())
        pick = pick[: max(room, 0)]
        if not pick.size:
            return
        k = k0.copy()
        k[pick] = 1
        step = cost.step_ms(sp.view.ctx_lens, k, sp.d_ctx, sp.lag)
        if sp.cons is not None and sp.cons.slo_tpot_ms is not None and not slo_ok(step, sp.cons, cost.step_std_ms()):
            return
        pos = np.arange(sp.surv.shape[1])[None, :]  # (1, K)
        sp.accepted = np.where(pos < k[:, None], sp.surv, 0.0).sum(axis=1)  # (n,)
        sp.choice = Choice(k, float(sp.n + sp.accepted.sum()), step, sp.choice.plain_ms, sp.choice.next_cost)
