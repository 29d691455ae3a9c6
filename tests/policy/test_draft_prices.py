"""The draft models' price posterior (``draft_prices.py``) and the step times the cost refit feeds it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from control.policy.adaptive.draft_prices import OBS_SD, OWN_SD, PRIOR_SD, SHARED_SD, DraftPrices
from control.policy.adaptive.refit import CostRefit
from control.policy.types import StepOutcome
from tests.conftest import make_profile

IS_MODEL = np.array([True, True, False])  # two draft models and n-gram


def test_the_posterior_starts_at_the_profile_and_narrows_towards_the_measured_price():
    p = DraftPrices(IS_MODEL)
    mean, sd = p.posterior()
    assert mean.tolist() == [0.0, 0.0, 0.0] and sd.tolist() == [PRIOR_SD, PRIOR_SD, 0.0]
    for _ in range(4):
        p.observe(0, 1.0, 1.4)  # model 0 runs at 1/1.4 of its profiled price
    mean, sd = p.posterior()
    var = 1.0 / (1.0 / PRIOR_SD ** 2 + 4 / OBS_SD ** 2)  # nothing else measured: the prior is PRIOR_SD's
    assert mean[0] == pytest.approx(var * 4 * math.log(1 / 1.4) / OBS_SD ** 2)
    assert math.log(1 / 1.4) < mean[0] < 0.85 * math.log(1 / 1.4)  # most of the way, shrunk to the profile
    assert sd[0] == pytest.approx(math.sqrt(var)) and sd[0] < PRIOR_SD / 3
    assert mean[2] == 0.0 and sd[2] == 0.0  # n-gram has no passes to price
    p.observe(1, 0.0, 1.0)  # a step without time is no evidence
    assert p.n[1] == 0


def test_a_model_never_run_is_priced_as_the_measured_ones_are_off():
    """A profile's draft prices are off mostly together (another machine or load): a model never run
    moves towards the measured models' error by the share of the prior that is common (SHARED_SD), and
    its own steps then take over; the measured model's own steps outweigh the other's."""
    p = DraftPrices(IS_MODEL)
    for _ in range(50):
        p.observe(0, 1.0, 2.0)  # model 0 at half its profiled price, measured well
    mean, sd = p.posterior()
    common = SHARED_SD ** 2 / PRIOR_SD ** 2
    assert mean[1] == pytest.approx(common * mean[0], rel=0.05) and mean[1] < 0.6 * math.log(0.5)
    assert OWN_SD < sd[1] < PRIOR_SD  # narrower than the prior, no narrower than its own part
    for _ in range(50):
        p.observe(1, 1.0, 1.0)  # model 1 measured at its profiled price
    mean, sd = p.posterior()
    assert abs(mean[1]) < 0.1 * abs(math.log(0.5)) and mean[0] < 0.9 * math.log(0.5)


def test_medians_are_the_draws_centre_for_the_models_still_at_the_profiles_price():
    """Exploitation prices each draft model at its posterior median: exp(mean) where the profile's
    price stands, 1 where the refit fitted its own or there are no passes; None once none stands."""
    p = DraftPrices(IS_MODEL)
    for _ in range(3):
        p.observe(0, 1.0, 2.0)
    med = p.medians()
    assert med.shape == (1, 3)
    assert med[0, 0] == pytest.approx(math.exp(p.posterior()[0][0])) and med[0, 0] < 1.0
    assert med[0, 0] < med[0, 1] < 1.0 and med[0, 2] == 1.0  # the unmeasured model part of the way
    p.fitted[:2] = True
    assert p.medians() is None


def test_draws_cover_only_the_models_still_at_the_profiles_price():
    p = DraftPrices(IS_MODEL)
    rng = np.random.default_rng(0)
    p.fitted[1] = True  # the cost refit prices model 1 with a fit of its own
    x = p.draws(rng, 4096)
    assert x.shape == (4096, 3)
    assert (x[:, 1] == 1.0).all() and (x[:, 2] == 1.0).all()  # fitted model; n-gram has no passes
    assert np.log(x[:, 0]).std() == pytest.approx(PRIOR_SD, rel=0.05) and (x[:, 0] < 1 / 1.4).mean() > 0.1
    p.fitted[0] = True
    assert p.draws(rng, 8) is None  # nothing to draw: no rng use


def _refit():
    prof = make_profile(draft=(1e-5, 0.01, 1.0), ngram_ms=0.2)
    return CostRefit(prof.step_cost(["draft", "ngram"])), prof.step_cost(["draft", "ngram"])


def _outcome(drafter, draft_ms, passes=3):
    n = len(drafter)
    d = np.asarray(drafter, dtype=np.int64)
    return StepOutcome(slots=np.arange(n), request_ids=np.arange(n), drafter=d, ctx_lens=np.full(n, 100),
                       drafted=np.full(n, 3), verified=np.full(n, 3), accepted=np.ones(n, dtype=np.int64),
                       verify_ms=10.0, draft_ms=draft_ms, total_ms=10.0 + draft_ms, draft_passes=passes,
                       draft_ctx_tokens=300, draft_batched_tokens=6)


def test_a_draft_models_time_beside_ngram_lookups_is_its_own_less_their_profiled_time():
    refit, cost = _refit()
    verify = cost.verify
    model = cost.drafters[0]
    priced = float(model.model.predict(300, 6, 3)) + model.const_ms
    out = _outcome([0, 0, 1, 1], draft_ms=priced / 1.4 + 0.2)  # the model at 1/1.4, plus n-gram's 0.2 ms
    refit.update(out, out.drafter, out.drafted > 0, False, verify, cost)
    assert refit.rls_draft[0].n == 1 and refit.prices.n[0] == 1
    assert refit.prices.sum_y[0] == pytest.approx(math.log(1 / 1.4))


def test_a_step_with_no_model_passes_teaches_no_price():
    refit, cost = _refit()
    out = _outcome([1, 1], draft_ms=0.2, passes=0)  # n-gram only
    refit.update(out, out.drafter, out.drafted > 0, True, cost.verify, cost)
    assert refit.prices.n.sum() == 0 and refit.rls_draft[0].n == 0


def test_the_refit_marks_a_model_fitted_once_its_fit_beats_the_profile():
    refit, cost = _refit()
    model = cost.drafters[0]
    rebuilt = refit.rebuild(cost, cost.verify)
    assert not refit.prices.fitted.any() and rebuilt.drafters[0].model is model.model
    for j in range(64):  # the model at half its profiled price: the fit wins
        ctx, batched, passes = 300 + 37 * (j % 17), 6 + j % 5, 1 + j % 4
        refit.rls_draft[0].update(ctx, batched, 0.5 * float(model.model.predict(ctx, batched, passes)), passes)
    rebuilt = refit.rebuild(cost, cost.verify)
    assert refit.prices.fitted.tolist() == [True, False]
    half = 0.5 * float(model.model.predict(600, 8, 2))
    assert float(rebuilt.drafters[0].model.predict(600, 8, 2)) == pytest.approx(half, rel=0.1)
