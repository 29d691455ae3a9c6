"""The n-gram lookup's rates per proposal length, learned in one pass over every length."""

import numpy as np
import pytest

from control.goodput.estimators import PositionRates
from control.policy.adaptive.survival import LookupRates

K = 6


def _rows(rng, steps, n):
    """Several steps' rows with proposal lengths 1..K+2 (capped at K), non-decreasing steps."""
    step = np.sort(rng.integers(0, steps, n))
    avail = rng.integers(1, K + 3, n)
    tried = np.minimum(rng.integers(1, K + 1, n), np.minimum(avail, K))
    accepted = np.minimum(rng.integers(0, K + 1, n), tried)
    return avail, accepted, tried, step


@pytest.mark.parametrize("seed", range(4))
def test_one_pass_over_several_steps_matches_each_proposal_length_learned_on_its_own(seed):
    """Each proposal length's estimator ends as ``PositionRates.update_steps`` would leave it alone:
    it decays once per step that has a row of its length, and the lengths past K share row K."""
    rng = np.random.default_rng(seed)
    prior = np.linspace(0.8, 0.5, K)
    lr = LookupRates(K, prior)
    ref = [PositionRates(K, prior=prior) for _ in range(K)]
    for flush in range(3):  # three flushes, each of several steps (the last with its rows out of step order)
        avail, accepted, tried, step = _rows(rng, steps=5, n=40)
        if flush == 2:
            p = rng.permutation(step.shape[0])
            avail, accepted, tried, step = avail[p], accepted[p], tried[p], step[p]
        lr.update_steps(avail, accepted, tried, step)
        a = np.minimum(avail, K)
        for v in range(1, K + 1):
            sel = a == v
            if sel.any():
                uniq = np.unique(step[sel])
                age = (uniq.size - 1) - np.searchsorted(uniq, step[sel])
                ref[v - 1].update_steps(accepted[sel], tried[sel], age, int(uniq.size))
    for v in range(K):
        np.testing.assert_allclose(lr.rates[v]._counts, ref[v]._counts, rtol=1e-12)
        np.testing.assert_allclose(lr.rates[v].rates, ref[v].rates, rtol=1e-12)
    np.testing.assert_allclose(lr.curves()[1:], np.cumprod(np.vstack([r.rates for r in ref]), axis=1)
                               * (np.arange(K)[None, :] < np.arange(1, K + 1)[:, None]), rtol=1e-12)


def test_one_step_skips_lookups_that_proposed_nothing():
    lr = LookupRates(K, np.full(K, 0.6))
    lr.update(np.array([0, 3, 3]), np.array([0, 2, 3]), np.array([0, 3, 3]))
    assert lr.rates[2].trials[0] == 2.0 and lr.rates[2].succ[1] == 2.0 and lr.rates[2].succ[2] == 1.0
    assert sum(r.trials.sum() for r in lr.rates) == lr.rates[2].trials.sum()  # nothing learned for a = 0
    assert lr.curves()[3, 3:].sum() == 0.0 and lr.curves()[3, 0] > lr.curves()[2, 0]


def test_a_proposal_length_no_longer_drafted_fades_back_to_its_prior():
    """Evidence ages with the steps, drafted on or not: a proposal length whose early lookups failed
    and that the held table then stopped drafting returns to its prior (and so is drafted and
    measured again), while one drafted every step keeps what it learned."""
    prior = np.full(K, 0.6)
    lr = LookupRates(K, prior)
    hits = np.array([2])
    for _ in range(40):  # early on a K-token lookup fails at its first token, a 2-token one is accepted
        lr.age(1)
        lr.update(np.array([K, 2]), np.array([0, 2]), np.array([1, 2]))
    assert lr.curves()[K, 0] < 0.2 and lr.curves()[2, 0] > 0.9
    for _ in range(160):  # then only the 2-token lookups draft
        lr.age(1)
        lr.update(hits, hits, hits)
    assert 0.45 < lr.curves()[K, 0] <= prior[0]  # five half-lives: most of the way back
    assert lr.curves()[2, 0] > 0.9



def test_a_lookup_scored_on_another_drafters_step_teaches_its_rates_up_to_the_committed_tokens():
    """Requests drafting on a draft model still have their lookup scored against the tokens the step
    committed (``StepOutcome.ngram_match``): the lookup's rates learn those positions, and no further;
    a request drafting on the lookup is learned once, from its draft."""
    from control.goodput.estimators import chain_trials
    from control.policy.adaptive.survival import AcceptanceModel
    from control.policy.types import StepOutcome

    d = np.array([0, 0, 0, 0, 1])  # four on the draft model, one on the lookup
    drafted = np.array([3, 3, 3, 3, 2])
    accepted = np.array([3, 1, 0, 2, 2])  # committed: accepted + 1
    avail = np.array([4, 4, 4, 0, 4])
    match = np.array([4, 1, 0, -1, 2])  # all 4 committed; a miss at 1; a miss at 0; no proposal; its own draft
    s, t = chain_trials(drafted, accepted)

    def learned(ngram_match):
        model = AcceptanceModel(np.full((2, K), 0.6), 8.0, 8, np.array([True, False]), np.array([False, True]))
        out = StepOutcome(slots=np.arange(5), request_ids=np.arange(5), drafter=d, ctx_lens=np.full(5, 50),
                          drafted=drafted, verified=drafted, accepted=accepted, ngram_avail=avail,
                          ngram_match=ngram_match)
        model.learn(out, d, drafted, drafted > 0, s, t, False)
        return model.by_avail[1].rates[3]  # proposal length 4

    scored, alone = learned(match), learned(None)
    # the lookup's own draft: positions 0-1 tried and accepted; scored: 4 positions all accepted,
    # 2 with a miss at 1, 1 with a miss at 0
    np.testing.assert_allclose(alone.trials[:4], [1, 1, 0, 0])
    np.testing.assert_allclose(alone.succ[:4], [1, 1, 0, 0])
    np.testing.assert_allclose(scored.trials[:4], [4, 3, 1, 1])
    np.testing.assert_allclose(scored.succ[:4], [3, 2, 1, 1])
