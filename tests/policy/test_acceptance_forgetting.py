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
