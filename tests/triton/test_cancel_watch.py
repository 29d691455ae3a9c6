"""The engine loop's cancellation checks: a fixed number per step, every request asked in turn."""

import math

import pytest

from control.triton.cancel_watch import CancelWatch


@pytest.mark.parametrize("inflight", [32, 200, 1000])
def test_a_fixed_number_per_step_and_everyone_in_turn(inflight):
    w = CancelWatch(running_per_step=8, queued_per_step=8)
    live = set(range(inflight))
    for rid in range(inflight):
        w.add(rid)
    running = list(range(min(32, inflight)))
    queued = inflight - len(running)
    w.ran(running)
    steps = max(math.ceil(len(running) / 8), math.ceil(queued / 8) if queued else 0)
    asked: set[int] = set()
    for _ in range(steps):
        due = w.due(live)
        assert len(due) <= 16  # independent of the queue
        assert len(due) == len(set(due))
        asked.update(due)
    assert asked == live  # within ceil(batch / 8) and ceil(queue / 8) steps, everyone was asked once


def test_finished_requests_are_never_asked_and_leave_the_ring():
    w = CancelWatch(running_per_step=2, queued_per_step=3)
    for rid in range(10):
        w.add(rid)
    w.ran([0, 1])
    live = {0, 5, 6, 7, 8, 9}  # 1..4 finished
    seen = [rid for _ in range(4) for rid in w.due(live)]
    assert set(seen) <= live and {5, 6, 7, 8, 9, 0} <= set(seen)
    assert not {1, 2, 3, 4} & set(w._ring)


def test_budgets_must_be_positive():
    with pytest.raises(ValueError, match="running_per_step = 0"):
        CancelWatch(running_per_step=0)
