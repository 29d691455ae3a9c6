"""Cost model fitting: NNLS recovers coefficients; RLS tracks a drifting system."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.errors import ConfigError
from control.goodput.cost import LinearCost, RecursiveCost, fit_linear_cost
from control.goodput.stepcost import DrafterCost, DrafterKind, StepCostModel, uniform_step_ms


@settings(max_examples=40, deadline=None)
@given(
    a=st.floats(1e-7, 1e-3),
    b=st.floats(1e-4, 0.5),
    c=st.floats(0.1, 20.0),
    noise=st.floats(0.0, 0.03),
    seed=st.integers(0, 1000),
)
def test_fit_recovers_coefficients_from_noisy_timings(a, b, c, noise, seed):
    rng = np.random.default_rng(seed)
    batch = rng.integers(1, 256, 200)
    ctx = batch * rng.integers(64, 8192, 200)
    tok = batch * rng.integers(1, 9, 200)
    t = a * ctx + b * tok + c
    t_noisy = t * (1 + noise * rng.standard_normal(t.size))
    fit = fit_linear_cost(ctx, tok, t_noisy)
    # Each term's contribution at the grid's median point is recovered to within a few noise levels.
    mid_ctx, mid_tok = np.median(ctx), np.median(tok)
    scale = a * mid_ctx + b * mid_tok + c
    for got, want in ((fit.a * mid_ctx, a * mid_ctx), (fit.b * mid_tok, b * mid_tok), (fit.c, c)):
        assert abs(got - want) <= 0.02 * scale + 8 * noise * scale
    if noise == 0:
        assert fit.r2 > 0.999 and fit.mape < 0.5
    pred = fit.predict(ctx, tok)
    assert np.mean(np.abs(pred - t) / t) < 0.02 + 3 * noise


def test_fit_never_returns_negative_coefficients():
    rng = np.random.default_rng(0)
    ctx = rng.integers(100, 10_000, 50)
    tok = rng.integers(1, 64, 50)
    t = 5.0 - 1e-4 * ctx + 0.1 * tok  # a negative true slope: NNLS clips it to 0
    fit = fit_linear_cost(ctx, tok, np.maximum(t, 0.1))
    assert min(fit.a, fit.b, fit.c) >= 0


def test_fit_rejects_bad_input():
    with pytest.raises(ConfigError, match="at least 3"):
        fit_linear_cost([1, 2], [1, 2], [1, 2])
    with pytest.raises(ConfigError, match="finite"):
        fit_linear_cost([1, 2, 3], [1, 2, 3], [1, np.nan, 3])
    with pytest.raises(ConfigError, match="coefficient a"):
        LinearCost(-1.0, 0.0, 0.0)


def test_recursive_fit_tracks_a_drifting_system():
    rng = np.random.default_rng(1)
    true = np.array([2e-5, 0.02, 6.0])
    rls = RecursiveCost(LinearCost(*true), forgetting=0.98)
    for step in range(3000):
        if step == 1000:
            true = true * np.array([1.0, 1.6, 1.3])  # the GPU slowed down (e.g. throttling)
        B = rng.integers(1, 128)
        ctx = B * rng.integers(100, 4000)
        tok = B * rng.integers(1, 6)
        t = true @ [ctx, tok, 1.0] * (1 + 0.02 * rng.standard_normal())
        rls.update(ctx, tok, t)
    c = rls.cost
    # After the drift the online model predicts the new system, not the old one.
    for B, S, T in ((1, 500, 1), (32, 2000, 4), (128, 4000, 2)):
        want = true @ [B * S, B * T, 1.0]
        assert abs(c.predict(B * S, B * T) - want) / want < 0.05


def test_the_online_fit_replaces_the_prior_only_when_it_predicts_better():
    rng = np.random.default_rng(2)
    true = np.array([5e-3, 0.6, 18.0])  # the CPU pair's target at one thread
    rls = RecursiveCost(LinearCost(*true))

    def steps(n, coef, jitter):
        for _ in range(n):
            B = int(rng.integers(1, 17))
            ctx, tok = B * int(rng.integers(64, 300)), B * int(rng.integers(1, 9))
            rls.update(ctx, tok, float(coef @ [ctx, tok, 1.0]) * (1 + jitter * rng.standard_normal()))

    steps(400, true, 0.15)  # an accurate profile on a jittery machine: the refit only chases noise
    assert not rls.improves_on_prior()
    steps(400, true * np.array([1.0, 1.5, 1.4]), 0.15)  # the machine slowed down: the prior is now wrong
    assert rls.improves_on_prior()
    want = true * np.array([1.0, 1.5, 1.4]) @ [16 * 200, 16 * 3, 1.0]
    assert abs(rls.cost.predict(16 * 200, 16 * 3) - want) / want < 0.1
    assert not RecursiveCost(LinearCost(*true)).improves_on_prior()  # no evidence yet


def test_step_cost_composition_per_drafter_kind():
    target = LinearCost(1e-4, 0.05, 5.0)
    dm = DrafterCost("d", DrafterKind.draft_model, LinearCost(1e-5, 0.01, 1.0))
    ng = DrafterCost("n", DrafterKind.ngram, const_ms=0.3)
    ss = DrafterCost("s", DrafterKind.self_spec, LinearCost(1e-4, 0.05, 5.0), sink=4, window=60)
    ctx = np.array([1000.0, 3000.0])
    k = np.array([3, 1])
    verify = target.predict(4000, 6)
    # draft model: depth 1 both (ctx 1000+3000), depth 2 and 3 only the first (1001, 1002)
    draft = 1e-5 * (4000 + 1001 + 1002) + 0.01 * 4 + 1.0 * 3
    m = StepCostModel(target, (dm, ng, ss))
    assert m.step_ms(ctx, k, np.array([0, 0])) == pytest.approx(verify + draft)
    assert m.step_ms(ctx, k, np.array([1, 1])) == pytest.approx(verify + 0.3)
    # self-spec: draft context capped at sink + window = 64 per request
    selfd = 1e-4 * (64 + 64 + 65 + 66) + 0.05 * 4 + 5.0 * 3
    assert m.step_ms(ctx, k, np.array([2, 2])) == pytest.approx(verify + selfd)
    # catch-up: a lag of 50 tokens on the first request adds 50 batched tokens to its first draft pass
    assert m.step_ms(ctx, k, np.array([0, 0]), lag=np.array([50, 0])) == pytest.approx(verify + draft + 0.01 * 50)
    # closed form for homogeneous batches agrees with the general path
    one = StepCostModel(target, (dm,))
    for B, S, kk in ((1, 100, 0), (8, 2000, 3), (64, 500, 7)):
        assert float(uniform_step_ms(one, B, S, kk)) == pytest.approx(one.step_ms(np.full(B, S), np.full(B, kk)))


def _host_bound_points(rng, d=4.9, c=16.0, b=0.0, noise=0.03):
    """Passes whose time grows per request, not per token (the reference executor on a GPU)."""
    batch = np.repeat([1, 2, 4, 8, 16, 32, 64], 20)
    per_req = rng.integers(1, 9, batch.size)  # k + 1 verified tokens
    ctx = batch * rng.integers(128, 8192, batch.size)
    t = (d * batch + b * batch * per_req + c) * (1 + noise * rng.standard_normal(batch.size))
    return ctx, batch * per_req, batch, t


def test_the_per_request_term_is_fitted_where_passes_grow_per_request_and_only_there():
    from control.goodput.cost import fit_target_cost

    rng = np.random.default_rng(0)
    ctx, tok, req, t = _host_bound_points(rng)
    three = fit_linear_cost(ctx, tok, t)
    four = fit_target_cost(ctx, tok, t, req)
    assert four.d == pytest.approx(4.9, rel=0.1) and four.b < 0.1
    assert four.r2 > 0.95 > three.r2 + 0.05
    # where time grows per token, a fourth column only chases noise: the three-term model stays
    batch = rng.integers(1, 64, 200)
    tok2 = batch * rng.integers(1, 9, 200)
    t2 = (0.5 * tok2 + 17.0) * (1 + 0.03 * rng.standard_normal(200))
    plain = fit_target_cost(batch * 300, tok2, t2, batch)
    assert plain.d == 0.0 and plain.b == pytest.approx(0.5, rel=0.1)


def test_a_per_request_term_enters_every_prediction_of_a_step():
    from control.goodput.optimizer import Constraints, admit_parametric

    target = LinearCost(a=1e-5, b=0.01, c=4.0, d=0.7)
    with pytest.raises(ValueError, match="requests="):
        target.predict(1000.0, 10.0)  # a call site that forgot the requests would drop d silently
    draft = DrafterCost("tiny", DrafterKind.draft_model, LinearCost(a=0.0, b=0.14, c=1.7))
    cost = StepCostModel(target, (draft,), overhead_ms=0.5)
    ctx = np.full(32, 600.0)
    assert cost.plain_ms(ctx) == pytest.approx(1e-5 * 32 * 600 + 0.01 * 32 + 4.0 + 0.7 * 32 + 0.5)
    k = np.full(32, 3)
    assert cost.verify_ms(ctx, k) == pytest.approx(1e-5 * 32 * 600 + 0.01 * 128 + 4.0 + 0.7 * 32)
    assert uniform_step_ms(cost, 32, 600.0, 0.0) == pytest.approx(cost.plain_ms(ctx))
    surv = np.tile(0.7 ** np.arange(1, 7), (32, 1))
    choice = admit_parametric(cost, ctx, surv, np.full(32, 6), Constraints(10**6, 10**6))
    assert choice.plain_ms == pytest.approx(cost.plain_ms(ctx))  # the optimiser's shortcut agrees
    assert choice.step_ms == pytest.approx(cost.step_ms(ctx, choice.k))
    # The same passes priced per token instead (what a three-term fit makes of them) make
    # speculation look dear: verifying k tokens is nearly free when the pass costs per request.
    misfit = StepCostModel(LinearCost(a=1e-5, b=0.7, c=4.0), (draft,), overhead_ms=0.5)
    wrong = admit_parametric(misfit, ctx, surv, np.full(32, 6), Constraints(10**6, 10**6))
    assert choice.k.mean() > wrong.k.mean()


def test_the_online_fit_keeps_the_prior_per_request_term_and_learns_the_rest():
    rng = np.random.default_rng(1)
    prior = LinearCost(a=0.0, b=0.0, c=16.0, d=4.9)
    rls = RecursiveCost(prior)
    with pytest.raises(ValueError, match="requests="):
        rls.update(1000.0, 8.0, 40.0)  # without the request count d could not be taken out
    for _ in range(300):  # the machine drifted: its fixed cost per pass is 24 ms now, not 16
        B = int(rng.integers(1, 64))
        tok = B * int(rng.integers(1, 9))
        rls.update(B * 1000.0, tok, 24.0 + 4.9 * B, 1.0, B)
    fit = rls.cost
    assert fit.d == 4.9 and fit.c == pytest.approx(24.0, abs=1.0)
    assert fit.predict(32000.0, 96.0, 1, 32) == pytest.approx(24.0 + 4.9 * 32, rel=0.03)
    assert rls.improves_on_prior()


def test_profile_carries_the_per_request_term_and_folds_a_drafts_into_b():
    from control.profile import CostCoeffs

    cc = CostCoeffs(a_ms_per_ctx_token=0.0, b_ms_per_batched_token=0.1, c_ms=2.0, d_ms_per_request=0.5)
    assert cc.to_cost().d == 0.5 and CostCoeffs.from_cost(cc.to_cost()) == cc
    assert CostCoeffs(a_ms_per_ctx_token=0.0, b_ms_per_batched_token=0.1, c_ms=2.0).d_ms_per_request == 0.0
    with pytest.raises(ValueError, match="d_ms_per_request"):
        CostCoeffs(a_ms_per_ctx_token=0.0, b_ms_per_batched_token=0.1, c_ms=2.0, d_ms_per_request=-1.0)
    folded = cc.to_cost().per_token_draft()
    assert folded.d == 0.0 and folded.b == pytest.approx(0.6)


def test_a_caught_up_token_pays_the_drafts_per_token_price_without_its_per_request_term():
    """A profile folds a draft's per-request term into b (one token per request per pass); a lagging
    request's catch-up adds tokens to its first pass, not sequences, in every price the policies use."""
    from tests.conftest import make_profile

    prof = make_profile(draft=(0.0, 0.001, 0.5, 0.035))
    cost = prof.step_cost(["draft"])
    d = cost.drafters[0]
    assert d.model.b == pytest.approx(0.036) and d.catch_up_ms == pytest.approx(0.001)
    assert cost.catch_up_ms_per_token()[0] == pytest.approx(0.001)
    ctx, k, lag = np.array([300.0, 500.0]), np.array([1, 1]), np.array([300, 0])
    assert d.draft_ms(ctx, k, lag) - d.draft_ms(ctx, k) == pytest.approx(0.3)
    assert d.slot_costs(ctx, lag.astype(float), 2)[:, 0] == pytest.approx([0.036 + 0.3, 0.036])
    plain = make_profile(draft=(0.0, 0.001, 0.5)).step_cost(["draft"]).drafters[0]
    assert plain.catch_up_ms == plain.model.b and plain.catch_up_share == 1.0


def test_loop_overhead_recovers_per_step_and_per_request_terms():
    from control.goodput.overhead import LoopOverhead

    rng = np.random.default_rng(3)
    lo = LoopOverhead()
    assert lo.fit() == (0.0, 0.0)  # nothing measured: no overhead assumed
    for _ in range(400):
        n = int(rng.integers(1, 12))
        lo.update(1.5 + 0.5 * n + 0.05 * rng.standard_normal(), n)
    per_step, per_req = lo.fit()
    assert per_step == pytest.approx(1.5, abs=0.1) and per_req == pytest.approx(0.5, abs=0.02)


def test_loop_overhead_ignores_unmeasured_steps_clips_stalls_and_never_goes_negative():
    from control.goodput.overhead import LoopOverhead

    lo = LoopOverhead(clip_ms=10.0)
    for v in (float("nan"), -1.0, float("inf")):
        lo.update(v, 4)
    assert lo.n_obs == 0
    for n in (2, 4, 8) * 50:
        lo.update(0.4 * n, n)
    lo.update(5000.0, 4)  # one stalled step (another thread held the interpreter) moves it only a little
    per_step, per_req = lo.fit()
    assert per_req == pytest.approx(0.4, abs=0.05) and per_step < 0.5
    falling = LoopOverhead()
    for n in (2, 4, 8) * 50:
        falling.update(6.0 - 0.5 * n, n)  # falls with the batch: a per-step constant, never a negative slope
    s, r = falling.fit()
    assert r == 0.0 and s > 0
    with pytest.raises(ConfigError, match="forgetting"):
        LoopOverhead(forgetting=0.0)


def test_a_draft_fit_tells_its_per_request_work_from_its_tokens_with_catch_up_steps():
    """Draft steps of k one-token passes, and one-pass steps that catch up L tokens: the fit recovers
    the per-token price (what a caught-up token costs) apart from the per-request-and-pass work."""
    from control.goodput.cost import fit_draft_cost

    rows = []
    for B in (1, 2, 4, 8):
        for ctx in (32, 128, 512):
            for k, lag in ((1, 0), (2, 0), (4, 0), (1, ctx // 2)):
                n_ctx = B * sum(ctx + 1 + j for j in range(k))
                n_batched, passes, req = B * (k + lag), k, B * k
                rows.append((n_ctx, n_batched, passes, req, 2e-4 * n_ctx + 0.01 * n_batched + 1.5 * passes + 0.2 * req))
    n_ctx, n_batched, passes, req, t = (list(c) for c in zip(*rows, strict=True))
    fit = fit_draft_cost(n_ctx, n_batched, t, passes=passes, request_passes=req)
    assert (fit.a, fit.b, fit.c, fit.d) == pytest.approx((2e-4, 0.01, 1.5, 0.2), rel=1e-6)
    # no per-request work: the three-term fit
    t3 = [x - 0.2 * r for x, r in zip(t, req, strict=True)]
    assert fit_draft_cost(n_ctx, n_batched, t3, passes=passes, request_passes=req).d == pytest.approx(0.0, abs=1e-12)
