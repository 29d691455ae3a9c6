"""The request-level optimiser's slot admission (``admit_slots``) against every uniform k."""

from __future__ import annotations

import numpy as np

from control.goodput.acceptance import chain_survival
from control.goodput.optimizer import Constraints, admit_slots, uniform_curve
from tests.conftest import make_profile


def test_admit_slots_is_never_worse_than_the_best_uniform_k():
    """Draft passes cost a fixed amount per depth, so admission weighs each slot's depth as well as its
    survival: the chosen k's goodput is at least that of the best uniform k."""
    rng = np.random.default_rng(0)
    cost = make_profile(target=(5e-5, 0.0105, 5.0), draft=(1.3e-5, 0.0013, 1.1)).step_cost(["draft"])
    for _ in range(40):
        n = int(rng.integers(1, 120))
        ctx = rng.integers(100, 3000, size=n).astype(np.float64)
        surv = chain_survival(rng.beta(6, 2, size=n), 8)
        cap = np.full(n, 8)
        choice = admit_slots(cost, ctx, surv, cap, Constraints())
        curve = uniform_curve(cost, ctx, surv, cap, Constraints())
        best_uniform = float(np.max(curve.tokens / curve.step_ms))
        assert choice.tokens / choice.step_ms >= best_uniform * (1 - 1e-9)
        # the reported prediction is the cost model's own for the chosen k
        assert np.isclose(choice.step_ms, cost.step_ms(ctx, choice.k))
