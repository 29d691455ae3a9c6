"""The drafter posterior compares drafters at like places in a request, and counts requests, not steps alone."""

import numpy as np

from control.policy.adaptive.drafter_rates import POSITION_EDGES, DrafterEvidence, rate_posterior

PRIOR = np.array([0.75, 0.75])  # two draft models the profile rates alike
MODELS = np.array([False, False])


def measure(ev, drafter: int, rates, requests: int, steps: int, slot: int = 0) -> None:
    """``requests`` requests, one after another in ``slot``, each drafting ``steps`` one-token drafts on
    ``drafter`` (plan index), accepted with the rate ``rates(position)`` at the request's output
    position, deterministically (the share accepted tracks the rate). ``ev``: ``DrafterEvidence``, or
    anything with its ``learn`` and ``reset`` (``DrafterChoice``)."""
    slots, d, one, yes = np.array([slot]), np.array([drafter]), np.ones(1), np.array([True])
    owed = 0.0
    for _ in range(requests):
        ev.reset(slots)
        pos = 0
        for _ in range(steps):
            owed += rates(pos)
            got = int(owed >= 1.0)
            owed -= got
            ev.learn(slots, d, np.array([got]), one, yes, np.array([got]))
            pos += got + 1


def _rate(ev: DrafterEvidence, i: int, prior=PRIOR, kinds=MODELS) -> tuple[float, float]:
    """Drafter ``i``'s posterior chain rate and its log-odds sd."""
    mean, cov = rate_posterior(prior, kinds, ev)
    return float(1.0 / (1.0 + np.exp(-mean[i]))), float(np.sqrt(cov[i, i]))


def test_before_any_step_the_posterior_is_the_profiles_rate():
    ev = DrafterEvidence(2)
    mean, cov = rate_posterior(np.array([0.8, 0.6]), np.array([False, True]), ev)
    np.testing.assert_allclose(1.0 / (1.0 + np.exp(-mean)), [0.8, 0.6])
    assert cov[0, 1] > 0.0  # one workload factor: evidence on one drafter moves the other


def test_a_drafter_measured_only_on_request_openings_is_read_at_like_positions():
    """Drafter 0 drafted only the first eight tokens of its requests, at 0.6. When drafter 1 shows
    that openings are hard for it too (0.6 there, 0.9 later), most of drafter 0's shortfall is put down
    to where it drafted; when drafter 1 is 0.9 everywhere, it is drafter 0's own. (Pooled without
    positions, the two gaps are 0.083 and 0.097.)"""
    first = POSITION_EDGES[0]

    def gap(other):
        ev = DrafterEvidence(2)
        measure(ev, 1, other, requests=12, steps=30)
        measure(ev, 0, lambda p: 0.6, requests=12, steps=4)  # positions 0-7 only
        return _rate(ev, 1)[0] - _rate(ev, 0)[0]

    hard_openings, flat = gap(lambda p: 0.6 if p < first else 0.9), gap(lambda p: 0.9)
    assert 0.0 < hard_openings < 0.6 * flat


def test_one_requests_steps_are_one_request_of_evidence():
    """64 steps at 0.4 from one request say less about a drafter than 64 steps from 16 requests: a
    request's own rate spreads widely, so one bad request does not condemn the drafter."""
    one, many = DrafterEvidence(2), DrafterEvidence(2)
    measure(one, 0, lambda p: 0.4, requests=1, steps=64)
    for r in range(16):
        measure(many, 0, lambda p: 0.4, requests=1, steps=4, slot=r)
    (r_one, sd_one), (r_many, sd_many) = _rate(one, 0), _rate(many, 0)
    assert sd_one > 1.2 * sd_many  # (without the request term: 0.26 against 0.30)
    assert r_many < r_one < 0.75  # both learn it is worse than the profile says; many requests more surely


def test_evidence_decays_and_a_new_request_starts_at_the_opening():
    ev = DrafterEvidence(2, slots=2)
    measure(ev, 1, lambda p: 0.5, requests=1, steps=3, slot=5)  # a slot past the arrays: they grow
    assert ev.out.size > 5 and ev.counts[2, 1].sum() > 2.9
    ev.reset(np.array([5]))
    assert ev.out[5] == 0.0 and not ev.seen[5].any()
    before = ev.counts.copy()
    ev.learn(np.array([0]), np.array([-1]), np.zeros(1), np.ones(1), np.array([True]), np.zeros(1))  # unknown drafter
    np.testing.assert_allclose(ev.counts, before * 0.995)  # every step ages the evidence; nothing added
    np.testing.assert_allclose(ev.mix(), before[2].sum(axis=0) / before[2].sum())
