"""The controller's fast paths decide exactly as the code did before them.

``data/adaptive_decisions.npz`` holds adaptive's decisions on ``decision_trace``'s step sequence,
recorded before the fast paths existed. Draft lengths, drafters and the gate's choices must match
exactly; predicted times, tokens and confidence cuts to rounding (the fast paths sum in another
order).
"""

from pathlib import Path

import numpy as np
import pytest

from tests.core.decision_trace import CASES, flatten, replay

RECORDED = Path(__file__).parent / "data" / "adaptive_decisions.npz"
EXACT = ("k", "drafter", "prefill_draft", "prefill_drafter")
CLOSE = ("conf_cut", "step_ms", "tokens")


@pytest.fixture(scope="module")
def recorded():
    return np.load(RECORDED)


@pytest.mark.parametrize(("policy", "profile"), CASES)
def test_same_decisions_as_recorded(recorded, policy, profile):
    now = flatten(replay(policy, profile))
    for f in EXACT:
        want = recorded[f"{policy}/{profile}/{f}"]
        assert now[f].shape == want.shape, f
        bad = np.flatnonzero(now[f] != want)
        assert bad.size == 0, f"{f} differs at {bad[:5]}: {now[f][bad[:5]]} vs recorded {want[bad[:5]]}"
    for f in CLOSE:
        np.testing.assert_allclose(now[f], recorded[f"{policy}/{profile}/{f}"], rtol=1e-9, atol=1e-12,
                                   equal_nan=True, err_msg=f)
