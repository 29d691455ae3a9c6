"""The fault-injection switch: off unless set, refused when it could match ordinary prompts."""

from __future__ import annotations

import pytest

from control.errors import ConfigError
from control.triton.faults import STEP_FAULT_ENV, InjectedFault, failing_step, step_fault_prefix
from control.triton.sender import Live


def test_off_unless_the_environment_sets_it():
    assert step_fault_prefix({}) == ()
    assert step_fault_prefix({STEP_FAULT_ENV: " 3,1,4,1,5 "}) == (3, 1, 4, 1, 5)


@pytest.mark.parametrize("raw", ["3,1,x,1", "3,1", "1.5,2,3,4"])
def test_a_bad_or_too_short_prefix_is_refused_by_name(raw):
    with pytest.raises(ConfigError, match=STEP_FAULT_ENV):
        step_fault_prefix({STEP_FAULT_ENV: raw})


def test_the_step_fails_only_once_a_matching_request_has_tokens():
    class Req:
        def __init__(self, ids):
            self.prompt_ids = ids

    calls = []
    live = {1: Live(1, None, True, None, 0.0, Req([3, 1, 4, 1, 7])), 2: Live(2, None, True, None, 0.0, Req([9, 9, 9, 9]))}
    step = failing_step(lambda: calls.append(1) or [], live, (3, 1, 4, 1))
    step()
    live[2].ids.append(5)  # an ordinary request with tokens: still no fault
    step()
    assert len(calls) == 2
    live[1].first_token_ns = 1
    with pytest.raises(InjectedFault, match=STEP_FAULT_ENV):
        step()
    assert len(calls) == 2
