"""Acceptance processes reproduce their configured rates; confidences are calibrated and informative."""

from __future__ import annotations

import numpy as np
import pytest

from control.bench.acceptance import AcceptanceTable, rate_from_tau, request_rates
from control.bench.simrun import SimSetup, run_policy
from control.bench.workloads import Workload, poisson
from control.errors import ConfigError
from control.executors.sim import AcceptanceProcess
from control.goodput.acceptance import chain_expected
from tests.conftest import make_profile


def test_conditional_rates_per_position_match_the_configuration():
    n = 40000
    rate, decay = 0.7, 0.9
    proc = AcceptanceProcess(np.full((n, 1), rate), np.array([decay]), np.array([np.nan]), 5, seed=3)
    acc, conf = proc.draw(np.arange(n), np.zeros(n, dtype=np.int64), 0)
    assert conf is None
    # position j's conditional rate: accepted at j among those that reached it is not what we test;
    # each position's own Bernoulli probability is rate * decay^(j-1)
    want = rate * decay ** np.arange(5)
    got = acc.mean(axis=0)
    assert np.all(np.abs(got - want) < 4 * np.sqrt(want * (1 - want) / n))
    lead = AcceptanceProcess.leading(acc)
    assert lead.mean() == pytest.approx((np.cumprod(want)).sum(), rel=0.02)


def test_confidences_are_calibrated_informative_and_keep_the_rate():
    n = 60000
    proc = AcceptanceProcess(np.full((n, 1), 0.6), np.ones(1), np.array([0.9]), 1, seed=5)
    acc, conf = proc.draw(np.arange(n), np.full(n, 7, dtype=np.int64), 0)
    acc, conf = acc[:, 0], conf[:, 0]
    assert acc.mean() == pytest.approx(0.6, abs=0.01)
    assert conf.mean() == pytest.approx(0.6, abs=0.005)
    bins = np.digitize(conf, [0.3, 0.45, 0.6, 0.75])
    for b in np.unique(bins):
        sel = bins == b
        assert acc[sel].mean() == pytest.approx(conf[sel].mean(), abs=0.02)
    assert np.corrcoef(acc, conf)[0, 1] > 0.25


def test_same_key_same_outcome_whatever_the_draft_length():
    proc = AcceptanceProcess(np.full((50, 2), 0.5), np.ones(2), np.array([np.nan, 0.5]), 8, seed=1)
    rid = np.arange(50)
    pos = np.arange(50) * 3
    full, _ = proc.draw(rid, pos, 1)
    short, _ = proc.draw(rid, pos, 1, 3)
    np.testing.assert_array_equal(full[:, :3], short)
    other, _ = proc.draw(rid, pos, 0)
    assert not np.array_equal(full, other)  # drafters have their own luck


def test_request_rates_follow_the_beta_and_category_shifts():
    table = AcceptanceTable.load()
    n = 20000
    w = poisson(n, 1.0, seed=0)
    rr = request_rates(w, [("llama-160m", "draft_model", True), ("ngram", "ngram", False)], seed=2)
    p = table.params("chat", "llama-160m", "draft_model")
    assert rr.rates[:, 0].mean() == pytest.approx(p.mean, abs=0.01)
    var = p.mean * (1 - p.mean) / (p.concentration + 1)
    assert rr.rates[:, 0].var() == pytest.approx(var, rel=0.1)
    assert np.isnan(rr.informativeness[1]) and rr.informativeness[0] == 0.5
    # one latent difficulty: a request easy for one drafter is easy for the other
    assert np.corrcoef(rr.rates[:, 0], rr.rates[:, 1])[0, 1] > 0.9
    cats = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
    wc = Workload("cats", np.arange(600.0), np.full(600, 10), np.full(600, 10), np.repeat(np.arange(6), 100),
                  categories=cats)
    rc = request_rates(wc, [("ngram", "ngram", False)], seed=2)
    by_cat = [rc.rates[wc.category == i, 0].mean() for i in range(6)]
    # Spec-Bench's PLD: summarization accepts far more than translation
    assert by_cat[2] > 2 * by_cat[1]


def test_rate_from_tau_inverts_the_chain_formula():
    for a in (0.2, 0.5, 0.8):
        assert rate_from_tau(float(chain_expected(a, 5)), 5) == pytest.approx(a, abs=1e-6)
    with pytest.raises(ConfigError, match="must be in"):
        rate_from_tau(7.0, 5)


def test_the_simulator_measures_the_configured_acceptance():
    prof = make_profile()
    w = poisson(400, 20.0, "100", "lognormal:120:40", seed=3)
    setup = SimSetup(prof, w, drafters=["draft"], max_k=1, acceptance_overrides={"draft": 0.65})
    res = run_policy(setup, w, "fixed:1", 0)
    # k = 1: every verified token is a Bernoulli trial at the request's rate (Beta mean 0.65)
    se = np.sqrt(0.65 * 0.35 / res.verified) + 0.02  # + the spread of per-request rates over 400 requests
    assert res.accepted / res.verified == pytest.approx(0.65, abs=3 * se)


def test_a_malformed_table_is_rejected_with_its_location(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("schema: specctl.acceptance/v1\nfamilies:\n  chat:\n    drafters:\n      x: {mean: 1.5, concentration: 2}\n")
    with pytest.raises(ConfigError, match=r"mean 1.5 must be in \(0, 1\)"):
        AcceptanceTable.load(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        AcceptanceTable.load(str(tmp_path / "missing.yaml"))
