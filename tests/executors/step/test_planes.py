"""Every data plane runs the kernel's clamp and view: the TensorRT-LLM drafter hook included."""

from __future__ import annotations

import numpy as np

from control.executors.step.view import UNSEEN_KV
from control.executors.trtllm.drafter_hook import KPlanner
from control.policy.simple import NonePolicy
from control.policy.types import Decision, StepOutcome, StepView

I64 = np.int64


class Greedy:
    """A policy that asks for more than any request may draft, and keeps the views it saw."""

    name = "greedy"

    def __init__(self) -> None:
        self.views: list[StepView] = []

    def decide(self, view: StepView) -> Decision:
        self.views.append(view)
        return Decision(np.full(view.n, 50, dtype=I64), np.full(view.n, 3, dtype=I64))

    def observe(self, outcome: StepOutcome) -> None:
        pass


def test_the_hook_clamps_k_by_the_kernels_rule():
    policy = Greedy()
    planner = KPlanner(policy, max_k=6, token_budget=64)
    k = planner.plan([11, 12, 13], ctx_lens=[10, 20, 30], remaining=[100, 3, 100], k_cap=[6, 6, 2])
    assert k.tolist() == [6, 2, 2]  # max_k; remaining - 1; the request's cap
    view = policy.views[0]
    assert view.free_kv_slots == UNSEEN_KV and view.token_budget == 64


def test_the_hook_trims_to_the_token_budget():
    planner = KPlanner(Greedy(), max_k=6, token_budget=3 + 7)
    k = planner.plan([1, 2, 3], ctx_lens=[10, 10, 10], remaining=[100, 100, 100])
    assert int(k.sum()) == 7 and k.tolist() == [2, 2, 3]


def test_none_needs_no_plan_and_never_drafts_or_prefills():
    planner = KPlanner(NonePolicy(), max_k=6)
    assert planner.plan([1, 2], ctx_lens=[5, 5], remaining=[9, 9]).tolist() == [0, 0]
    policy = Greedy()
    KPlanner(policy, max_k=6).plan([1], ctx_lens=[5], remaining=[9])
    d = NonePolicy().decide(policy.views[0])
    assert d.k.tolist() == [0] and d.prefill_draft is False
