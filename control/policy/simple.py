"""Baselines: no speculation, fixed k, the HF transformers heuristic, TensorRT-LLM's static schedule."""

from __future__ import annotations

import numpy as np

from control.plan import schedule_lookup, validate_trtllm_schedule
from control.policy.base import I64, BasePolicy, PolicyContext
from control.policy.types import Decision, StepOutcome, StepView


class NonePolicy(BasePolicy):
    """k = 0 always; draft state is never prefilled. The one "no speculation" policy: built from a
    plan by the registry (``none``), or without one as the policy of an executor given none."""

    name = "none"

    def __init__(self, ctx: PolicyContext | None = None) -> None:
        super().__init__(ctx)

    def update_context(self, ctx: PolicyContext) -> None:
        self.ctx = ctx  # nothing learned, nothing priced

    def wants_draft_prefill(self, view: StepView) -> bool:
        return False

    def decide(self, view: StepView) -> Decision:
        return Decision(np.zeros(view.n, dtype=I64), np.zeros(view.n, dtype=I64), prefill_draft=False)


class FixedPolicy(BasePolicy):
    """The same k for every request at every step (capped per request), default drafter."""

    def __init__(self, ctx: PolicyContext, k: int) -> None:
        super().__init__(ctx)
        self.k = int(k)
        self.name = f"fixed:{self.k}"

    def wants_draft_prefill(self, view: StepView) -> bool:
        return self.k > 0 and super().wants_draft_prefill(view)

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        k = np.minimum(cap, self.k)
        return Decision(k, np.full(view.n, self.default_exec_drafter(), dtype=I64),
                        prefill_draft=self.wants_draft_prefill(view))


class HFHeuristicPolicy(BasePolicy):
    """Hugging Face transformers' "heuristic" schedule: per request, k += 2 after a step in which
    every draft token was accepted, k -= 1 (at least 1) otherwise. Starts at min(5, K)."""

    name = "hf-heuristic"
    START = 5

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.k_state = np.zeros(64, dtype=I64)

    def reset_slots(self, slots: np.ndarray) -> None:
        if slots.max() >= self.k_state.size:
            self.k_state = np.resize(self.k_state, max(int(slots.max()) + 1, 2 * self.k_state.size))
        self.k_state[slots] = min(self.START, max(self.ctx.max_k, 1))

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        k = np.minimum(self.k_state[view.slots], cap)
        return Decision(k, np.full(view.n, self.default_exec_drafter(), dtype=I64))

    def observe(self, outcome: StepOutcome) -> None:
        drafted = outcome.verified > 0
        if not drafted.any():
            return
        slots = outcome.slots[drafted]
        all_ok = outcome.accepted[drafted] >= outcome.verified[drafted]
        k = self.k_state[slots]
        self.k_state[slots] = np.clip(np.where(all_ok, k + 2, k - 1), 1, max(self.ctx.max_k, 1))


class StaticSchedulePolicy(BasePolicy):
    """TensorRT-LLM's static knobs: a draft_len_schedule (batch size -> k, first key >= batch; 0 above
    the last key) or max_concurrency (speculate at max_draft_len up to N requests, off above)."""

    name = "static-schedule"

    def __init__(self, ctx: PolicyContext, schedule: dict[int, int] | None = None,
                 max_concurrency: int | None = None) -> None:
        super().__init__(ctx)
        if max_concurrency is not None:
            schedule = {int(max_concurrency): ctx.max_k}
        if schedule is None:
            schedule = dict(ctx.plan.static_schedule)
        if schedule:
            validate_trtllm_schedule(schedule, max(schedule.values()))
        self.schedule = schedule
        keys = sorted(schedule)
        # Dense lookup table over batch sizes 1..last key (index = batch size), 0 beyond.
        self._dense = np.array([0] + [schedule_lookup(schedule, b) for b in range(1, (keys[-1] if keys else 0) + 1)],
                               dtype=I64)

    def k_for_batch(self, batch: int) -> int:
        return int(self._dense[batch]) if batch < self._dense.size else 0

    def _decide(self, view: StepView, cap: np.ndarray) -> Decision:
        k = np.minimum(cap, self.k_for_batch(view.n))
        return Decision(k, np.full(view.n, self.default_exec_drafter(), dtype=I64))
