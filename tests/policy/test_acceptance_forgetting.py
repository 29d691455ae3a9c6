"""How fast ``adaptive``'s pooled acceptance follows a prompt mix whose acceptance moved
(``control/policy/adaptive/survival.py``, POSITION_DECAY)."""

import numpy as np

from control.policy.adaptive.survival import POSITION_DECAY, AcceptanceModel

K = 4


def _model():
    return AcceptanceModel(np.full((1, K), 0.7), 8.0, 16, np.zeros(1, dtype=bool))


def _steps(model, accepted_first, steps):
    """``steps`` drafting steps of 4 requests at k = 1; ``accepted_first`` (4,) of them accepted."""
    for _ in range(steps):
        model.pos[0].update(np.ones(4, dtype=np.int64), np.asarray(accepted_first))


def test_the_pooled_rate_moves_a_third_of_the_way_within_a_hundred_drafting_steps():
    model = _model()
    _steps(model, [1, 0, 0, 0], 500)  # a long phase at 0.25
    assert abs(model.pooled_rate(0) - 0.25) < 0.02
    _steps(model, [1, 1, 1, 1], 100)  # the mix changed: everything is accepted
    mid = model.pooled_rate(0)
    assert mid > 0.25 + (1.0 - 0.25) / 3  # a third of the way within 100 steps (0.999 per step: 0.41)
    _steps(model, [1, 1, 1, 1], 400)
    assert model.pooled_rate(0) > 0.9


def test_the_memory_still_averages_many_steps():
    model = _model()
    rng = np.random.default_rng(0)
    for _ in range(2000):
        model.pos[0].update(np.ones(4, dtype=np.int64), (rng.uniform(size=4) < 0.6).astype(np.int64))
    # ~1 / (1 - decay) steps of 4 trials: the rate's noise stays a few percent
    assert 1.0 / (1.0 - POSITION_DECAY) >= 100
    assert abs(model.pooled_rate(0) - 0.6) < 0.05


def _outcome(slots, drafter, accepted, k):
    from control.policy.types import StepOutcome
    n = len(slots)
    return StepOutcome(slots=np.asarray(slots), request_ids=np.asarray(slots), drafter=np.full(n, drafter),
                       ctx_lens=np.full(n, 100), drafted=np.full(n, k), verified=np.full(n, k),
                       accepted=np.asarray(accepted))


def test_a_drafter_nobody_drafts_with_drifts_back_to_its_prior_step_by_step_and_pooled_alike():
    """Drafter 1 is unlucky on a few steps (nothing accepted), then only drafter 0 drafts: drafter 1's
    counts decay with every learning step as if it had drafted and learned nothing, so its rate
    returns to its prior (0.7) instead of keeping the unlucky 0.14 for ever, and learning the steps
    one by one or pooled (``learn_pooled``, the held decisions' path) leaves the same counts."""
    from control.policy.adaptive.survival import PooledRows

    stepwise, pooled = (AcceptanceModel(np.full((2, K), 0.7), 8.0, 16, np.zeros(2, dtype=bool)) for _ in range(2))
    outcomes = [(_outcome([0, 1], 1, [0, 0], 4), 1)] * 10 + [(_outcome([0, 1], 0, [3, 2], 4), 0)] * 1200
    rows = PooledRows(K)
    for o, d in outcomes:
        d_ctx = np.full(o.n, d)
        s, t = o.accepted, np.minimum(o.accepted + 1, o.verified)
        spec = np.ones(o.n, dtype=bool)
        stepwise.learn(o, d_ctx, o.verified, spec, s, t, True)
        rows.add(d_ctx, o.verified, o.accepted, s, t, spec, o.drafted, None, None, True)
    pooled.learn_pooled(rows)
    after_luck = AcceptanceModel(np.full((2, K), 0.7), 8.0, 16, np.zeros(2, dtype=bool))
    after_luck.pos[1].update(np.full(20, 4), np.zeros(20, dtype=np.int64))
    assert after_luck.pooled_rate(1) < 0.3  # what the unlucky steps alone leave
    assert abs(stepwise.pooled_rate(1) - 0.7) < 0.03
    np.testing.assert_allclose(pooled.pos[1]._counts, stepwise.pos[1]._counts, rtol=1e-9)
    np.testing.assert_allclose(pooled.pos[0]._counts, stepwise.pos[0]._counts, rtol=1e-9)
