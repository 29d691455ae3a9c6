"""overlap_policy's hand-over: a decision prepared for a predicted view serves the requests that
actually decode (a subset), and none at all when a request was not predicted."""

from __future__ import annotations

import numpy as np
import pytest

from control.executors.reference.overlap import PolicyWorker, Prepared
from control.policy.types import Decision, StepView


def view(slots, rids) -> StepView:
    n = len(slots)
    return StepView.build(slots=slots, request_ids=rids, ctx_lens=np.full(n, 10), remaining=np.full(n, 5),
                          drafters=("a", "b"), max_k=4, free_kv_slots=100, token_budget=100)


def prepared(decision=None) -> Prepared:
    pred = view([0, 2, 5, 7], [10, 12, 15, 17])
    d = decision or Decision(np.array([1, 2, 3, 4]), np.array([0, 1, 0, 1]), conf_cut=np.array([0.1, 0.2, 0.3, 0.4]),
                             prefill_drafter=1)
    return Prepared(policy=None, view=pred, decision=d, errors=[], busy_s=0.0, cpu_s=0.0)


def test_the_same_requests_take_the_decision_whole():
    p = prepared()
    assert p.decision_for(view([0, 2, 5, 7], [10, 12, 15, 17])) is p.decision


def test_requests_that_finished_drop_out_row_by_row():
    d = prepared().decision_for(view([2, 7], [12, 17]))
    assert d.k.tolist() == [2, 4] and d.drafter.tolist() == [1, 1] and d.conf_cut.tolist() == [0.2, 0.4]
    assert d.prefill_drafter == 1


@pytest.mark.parametrize("slots, rids", [([1], [11]), ([2, 9], [12, 19]), ([2], [99])])
def test_a_request_not_predicted_gets_no_prepared_decision(slots, rids):
    assert prepared().decision_for(view(slots, rids)) is None  # an unknown slot, one past the end, a new request


class Counting:
    name = "counting"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def observe(self, outcome) -> None:
        self.calls.append(f"observe {outcome}")

    def decide(self, v: StepView) -> Decision:
        self.calls.append(f"decide {v.step}")
        if v.step == 3:
            raise RuntimeError("boom")
        return Decision.plain(v.n)


def test_the_worker_observes_before_it_decides_and_reports_failures():
    pol, w = Counting(), PolicyWorker()
    v = view([0], [1])
    w.submit(pol, None, v)
    with pytest.raises(RuntimeError, match="not collected"):
        w.submit(pol, None, v)
    assert w.collect().decision.k.tolist() == [0]
    v.step = 3
    w.submit(pol, "outcome-2", v)
    prep = w.collect()
    assert prep.decision is None and [what for what, _ in prep.errors] == ["decide"]
    assert pol.calls == ["decide 0", "observe outcome-2", "decide 3"]
    assert w.collect() is None and w.jobs == 2
    w.close()
