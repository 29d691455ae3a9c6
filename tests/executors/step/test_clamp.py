"""The clamp: one rule for every data plane (caps, drafter fallback, budget trimming, bad shapes)."""

from __future__ import annotations

import numpy as np
import pytest

from control.executors.step.clamp import clamp_decision, fit_budget
from control.executors.step.view import build_view
from control.policy.types import Decision

I64 = np.int64


def _view(n=4, remaining=None, k_cap=None, budget=1000, free_kv=1 << 30, max_k=8):
    z = np.arange(n, dtype=I64)
    rem = np.full(n, 100, dtype=I64) if remaining is None else np.asarray(remaining, dtype=I64)
    return build_view(slots=z, request_ids=z, ctx_lens=np.full(n, 10, dtype=I64), remaining=rem, drafters=("a", "b"),
                      max_k=max_k, token_budget=budget, free_kv_slots=free_kv,
                      k_cap=None if k_cap is None else np.asarray(k_cap, dtype=I64))


def _decision(k, d=None):
    k = np.asarray(k, dtype=I64)
    return Decision(k, np.zeros(k.size, dtype=I64) if d is None else np.asarray(d, dtype=I64))


def test_k_is_capped_by_request_cap_remaining_and_max_k():
    view = _view(remaining=[100, 3, 100, 1], k_cap=[2, 8, 8, 8], max_k=6)
    out = clamp_decision(view, _decision([5, 5, 9, 4]), 2, 0)
    assert out.k.tolist() == [2, 2, 6, 0]  # cap 2; remaining 3 -> 2; max_k 6; remaining 1 -> 0


def test_negative_k_is_zero_and_a_foreign_drafter_is_the_default():
    out = clamp_decision(_view(), _decision([-3, 2, 2, 2], [0, -1, 7, 1]), 2, 1)
    assert out.k.tolist() == [0, 2, 2, 2]
    assert out.drafter.tolist() == [0, 1, 1, 1]


def test_a_plane_without_drafters_never_speculates():
    out = clamp_decision(_view(), _decision([3, 3, 3, 3]), 0, 0)
    assert out.k.tolist() == [0, 0, 0, 0]


def test_the_budget_shortens_the_longest_drafts_first_of_equals_first():
    view = _view(budget=4 + 7)  # n = 4 requests leave 7 draft tokens
    assert clamp_decision(view, _decision([5, 5, 2, 1]), 2, 0).k.tolist() == [2, 2, 2, 1]
    view = _view(budget=4 + 5)
    assert clamp_decision(view, _decision([3, 3, 0, 0]), 2, 0).k.tolist() == [2, 3, 0, 0]


def test_free_kv_slots_bind_like_the_budget():
    out = clamp_decision(_view(free_kv=3), _decision([2, 2, 2, 2]), 2, 0)
    assert int(out.k.sum()) == 3 and out.k.tolist() == [0, 1, 1, 1]


def test_fit_budget_equals_shortening_one_token_at_a_time():
    rng = np.random.default_rng(0)
    for _ in range(300):
        k = rng.integers(0, 9, size=int(rng.integers(1, 12))).astype(I64)
        limit = int(rng.integers(-2, int(k.sum()) + 3))
        slow = k.copy()
        while slow.sum() > max(limit, 0) and slow.any():
            slow[int(np.argmax(slow))] -= 1
        assert fit_budget(k, limit).tolist() == slow.tolist()


def test_a_decision_of_the_wrong_length_names_the_policy():
    with pytest.raises(ValueError, match=r"policy 'mine' returned 3 draft lengths and 3 drafters for a step of 4"):
        clamp_decision(_view(), _decision([1, 1, 1]), 2, 0, who="mine")
    bad_cut = Decision(np.ones(4, dtype=I64), np.zeros(4, dtype=I64), conf_cut=np.ones(2))
    with pytest.raises(ValueError, match="2 confidence cuts for 4 requests"):
        clamp_decision(_view(), bad_cut, 2, 0, who="mine")
