"""The fault-injection switch: off unless set, refused when it could match ordinary prompts."""

from __future__ import annotations

import pytest

from control.errors import ConfigError
from control.triton.faults import (
    DELIVER_FAULT_ENV,
    STEP_FAULT_ENV,
    InjectedFault,
    failing_deliver,
    failing_step,
    fault_prefix,
)
from control.triton.sender import Live


def test_off_unless_the_environment_sets_it():
    assert fault_prefix(STEP_FAULT_ENV, {}) == ()
    assert fault_prefix(STEP_FAULT_ENV, {STEP_FAULT_ENV: " 3,1,4,1,5 "}) == (3, 1, 4, 1, 5)
    assert fault_prefix(DELIVER_FAULT_ENV, {STEP_FAULT_ENV: "3,1,4,1,5"}) == ()


@pytest.mark.parametrize("name", [STEP_FAULT_ENV, DELIVER_FAULT_ENV])
@pytest.mark.parametrize("raw", ["3,1,x,1", "3,1", "1.5,2,3,4"])
def test_a_bad_or_too_short_prefix_is_refused_by_name(raw, name):
    with pytest.raises(ConfigError, match=name):
        fault_prefix(name, {name: raw})


class Req:
    def __init__(self, ids):
        self.prompt_ids = ids


def _live() -> dict[int, Live]:
    return {1: Live(1, None, True, None, 0.0, Req([3, 1, 4, 1, 7])), 2: Live(2, None, True, None, 0.0, Req([9, 9, 9, 9]))}


def test_the_step_fails_only_once_a_matching_request_has_tokens():
    calls = []
    live = _live()
    step = failing_step(lambda: calls.append(1) or [], live, (3, 1, 4, 1))
    step()
    live[2].ids.append(5)  # an ordinary request with tokens: still no fault
    step()
    assert len(calls) == 2
    live[1].first_token_ns = 1
    with pytest.raises(InjectedFault, match=STEP_FAULT_ENV):
        step()
    assert len(calls) == 2


def test_delivery_fails_only_for_the_matching_request_once_it_has_tokens():
    class Out:
        def __init__(self, rid):
            self.request_id = rid

    got = []
    live = _live()
    deliver = failing_deliver(lambda out: got.append(out.request_id), live, (3, 1, 4, 1))
    deliver(Out(1))  # no tokens yet
    live[1].first_token_ns = 1
    live[2].ids.append(5)
    with pytest.raises(InjectedFault, match=DELIVER_FAULT_ENV):
        deliver(Out(1))
    deliver(Out(2))
    deliver(Out(3))  # not live (cancelled meanwhile): passed on, the model's own deliver drops it
    assert got == [1, 2, 3]
