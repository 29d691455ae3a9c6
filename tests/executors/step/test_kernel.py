"""The step procedure (run_step, step_outcome) over a small plane whose target continues a known
sequence: lossless whatever the policy asks, a refused decision runs plain, the prune is bounded."""

from __future__ import annotations

import numpy as np
import pytest

from control.executors.step.accept import accept_greedy
from control.executors.step.clamp import Clamped
from control.executors.step.kernel import Drafts, Verdict, run_step, step_outcome
from control.executors.step.ngram import ngram_propose
from control.executors.step.view import build_view
from control.policy.types import Decision, StepView

I64 = np.int64
TRUTH = np.array([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4], dtype=I64)  # the target's greedy output


class SequencePlane:
    """StepParts of one request whose target continues TRUTH: n-gram drafts, greedy acceptance."""

    n_drafters = 1
    default_drafter = 0

    def __init__(self, at: int, prune=None) -> None:
        self.at = at  # tokens known so far
        self.refusals: list[Exception] = []
        self._prune = prune

    def refused(self, view: StepView, error: Exception) -> None:
        self.refusals.append(error)

    def draft(self, view: StepView, plan: Clamped) -> Drafts:
        prop = ngram_propose(TRUTH[: self.at], int(plan.k[0]))
        tokens = np.full((1, max(int(plan.k[0]), 0)), -1, dtype=I64)  # (1, K')
        tokens[0, : prop.size] = prop
        return Drafts(np.array([prop.size], dtype=I64), tokens)

    def prune(self, view: StepView, decision: Decision, drafts: Drafts):
        return None if self._prune is None else self._prune(drafts.count)

    def verify(self, view: StepView, drafts: Drafts, verified: np.ndarray) -> Verdict:
        K = drafts.tokens.shape[1]
        target = np.full((1, K + 1), -1, dtype=I64)  # (1, K + 1) the target's token after each prefix
        tail = TRUTH[self.at: self.at + K + 1]
        target[0, : tail.size] = tail
        acc, bonus = accept_greedy(drafts.tokens, verified, target)
        return Verdict(acc, bonus)


def _view(at: int, step: int = 0) -> StepView:
    one = np.zeros(1, dtype=I64)
    return build_view(slots=one, request_ids=one, ctx_lens=np.array([at], dtype=I64),
                      remaining=np.array([TRUTH.size - at], dtype=I64), drafters=("ngram",), max_k=4,
                      token_budget=64, step=step)


@pytest.mark.parametrize("k", [0, 1, 3, 9])
def test_any_k_gives_the_targets_sequence(k):
    at, out = 4, list(TRUTH[:4])
    while at < TRUTH.size:
        plane = SequencePlane(at)
        res = run_step(_view(at), Decision(np.array([k], dtype=I64), np.zeros(1, dtype=I64)), plane)
        a = int(res.verdict.accepted[0])
        new = list(res.drafts.tokens[0, :a]) + [int(res.verdict.bonus[0])]
        out += new[: TRUTH.size - at]
        at = len(out)
    assert out == TRUTH.tolist()


def test_a_refused_decision_runs_the_step_without_speculation():
    plane = SequencePlane(9)
    res = run_step(_view(9), Decision(np.array([2, 2], dtype=I64), np.zeros(2, dtype=I64)), plane, who="two")
    assert len(plane.refusals) == 1 and "policy 'two'" in str(plane.refusals[0])
    assert res.plan.k.tolist() == [0] and res.drafts.count.tolist() == [0]
    assert res.verdict.bonus.tolist() == [TRUTH[9]]


@pytest.mark.parametrize(("answer", "verified"), [(lambda c: c - 1, 2), (lambda c: c + 5, 3),
                                                  (lambda c: np.array([1, 1]), 3), (lambda c: None, 3)])
def test_the_prune_is_kept_within_the_drafts(answer, verified):
    plane = SequencePlane(8, prune=answer)  # after TRUTH[:8] lookup drafts 1 2 3, all right
    res = run_step(_view(8), Decision(np.array([3], dtype=I64), np.zeros(1, dtype=I64)), plane)
    assert res.drafts.count.tolist() == [3]
    assert res.verified.tolist() == [verified]  # fewer, never more; a wrong length or None: all
    assert res.verdict.accepted.tolist() == [min(verified, 3)]


def test_the_outcome_reports_the_idle_drafter_where_nothing_was_drafted():
    view = _view(8, step=7)
    res = run_step(view, Decision(np.array([0], dtype=I64), np.zeros(1, dtype=I64)), SequencePlane(8))
    out = step_outcome(view, res, np.array([5], dtype=I64), np.zeros(0, dtype=I64), verify_ms=1.0, total_ms=2.0,
                       now=3.0, step=7)
    assert out.drafter.tolist() == [5] and out.step == 7 and out.verified.tolist() == [0]
    res = run_step(view, Decision(np.array([2], dtype=I64), np.zeros(1, dtype=I64)), SequencePlane(8))
    out = step_outcome(view, res, np.array([5], dtype=I64), np.zeros(0, dtype=I64), verify_ms=1.0, total_ms=2.0,
                       now=3.0, step=7)
    assert out.drafter.tolist() == [0] and out.accepted.tolist() == [2]
