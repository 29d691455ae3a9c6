"""The controller decides as recorded: its numeric fast paths change no decision.

``data/adaptive_decisions.npz`` holds adaptive's decisions on ``decision_trace``'s step sequence:
deciding fully every step (``adaptive-every-step``, first recorded before the optimiser's numeric
fast paths existed), and as built, a full decision every few steps with look-ups between (``adaptive``),
both re-recorded with ``python -m tests.policy.decision_trace`` where a change of behaviour moved them
(last when each request's rate began to be compared with the curve at the positions it tried). Draft
lengths, drafters and the gate's choices must match exactly; predicted times, tokens and confidence
cuts to rounding (the fast paths sum in another order).
"""

from pathlib import Path

import numpy as np
import pytest

from tests.policy.decision_trace import CASES, flatten, replay

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


def test_per_slot_state_grows_with_the_slots_and_survives_a_new_drafter_set():
    from control.plan import compile_plan
    from control.policy import StepOutcome, StepView, build_policy
    from control.policy.base import PolicyContext
    from tests.conftest import make_profile

    prof = make_profile()
    pol = build_policy("adaptive", compile_plan(prof, max_k=6), seed=1)
    n = 150  # slots past the initial 64

    def step(i):
        v = StepView.build(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 500 + i),
                           remaining=np.full(n, 100), drafters=("draft", "ngram"), max_k=6, free_kv_slots=10**6,
                           token_budget=10**6, step=i)
        d = pol.decide(v)
        assert d.k.shape == (n,) and (d.k >= 0).all() and (d.k <= 6).all()
        pol.observe(StepOutcome(slots=v.slots, request_ids=v.request_ids, drafter=d.drafter, ctx_lens=v.ctx_lens,
                                drafted=d.k, verified=d.k, accepted=d.k // 2, verify_ms=10.0, step=i))
        return d

    step(0)
    assert pol._asked.size >= n and pol._pace.size >= n and pol._slot_rid.size >= n
    pol.update_context(PolicyContext.from_plan(compile_plan(prof, max_k=6, drafters=["draft"])))  # new drafter set
    d = step(1)
    assert np.isfinite(d.predicted_step_ms)


def test_the_decision_cost_benchmark_times_every_stage(tmp_path):
    """Each stage the benchmark names is a method or function adaptive still calls (a renamed stage
    would silently time nothing)."""
    import json

    from benchmarks.decision_cost import BANDIT_STAGES, MATCHING_STAGES, STAGES, StageTimer, bench, main
    from control.plan import compile_plan
    from control.profile import load_profile

    out = tmp_path / "dc.json"
    assert main(["--batches", "4", "--policies", "adaptive", "--steps", "40", "--stages", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["share_pct"] > 0 and row["modelled_step_ms"] > 0
    (stages,) = doc["stages"]
    for name, _ in STAGES:
        if name not in BANDIT_STAGES + MATCHING_STAGES:  # one drafter on this profile: no bandit
            assert stages[name] > 0, name
    # the CPU pair's three drafters take the bandit's path (40 steps: mostly its first exploration stage;
    # the matching's stages run only with drafter capacities)
    cpu = Path(__file__).resolve().parents[2] / "profiles" / "cpu" / "stdlib-quick.yaml"
    assert main(["--profile", str(cpu), "--ctx", "256", "--batches", "4", "--policies", "adaptive", "--steps", "40",
                 "--stages", "--clock", "cpu", "--json", str(out)]) == 0
    (stages,) = json.loads(out.read_text())["stages"]
    for name in BANDIT_STAGES:
        if name != "exploit":  # a few full decisions per exploitation stage: its median step is 0
            assert stages[name] > 0, name
    timer = StageTimer()
    bench("adaptive", compile_plan(load_profile(cpu), policy="adaptive", max_k=8), 4, 256, 200, timer=timer)
    assert sum(r.get("exploit", 0.0) for r in timer.rows) > 0


def test_the_decision_cost_benchmark_runs_the_policy_off_the_critical_path(tmp_path):
    """``--overlap``: a worker thread decides step t+1 while step t sleeps; every step gets a
    decision, and the worker's own time is reported next to the step loop's hand-over and wait."""
    import json

    from benchmarks.decision_cost import main

    out = tmp_path / "dc.json"
    assert main(["--batches", "3", "--policies", "adaptive", "--steps", "20", "--overlap", "--overlap-steps", "15",
                 "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["overlap"]
    assert row["batch"] == 3 and row["modelled_step_ms"] > 0
    assert row["on_path_us_p50"] > 0 and row["off_path_us_p50"] > 0
    assert row["on_path_share_pct"] == pytest.approx(row["on_path_us_p50"] / (row["modelled_step_ms"] * 10))


def test_the_scalar_confidence_cut_gives_the_array_cut_bit_for_bit():
    """Batch 1 maps its cut through ``raw_cut_one`` on plain floats; it must equal ``raw_cut`` exactly,
    across bins, at the curve's knots, and past both ends (never stop / always stop)."""
    from control.goodput.estimators import ConfidenceMap

    rng = np.random.default_rng(3)
    for _ in range(40):
        cm = ConfidenceMap()
        for _ in range(int(rng.integers(0, 25))):
            prod = rng.random(24) ** 3
            cm.update(prod, rng.random(24) < prod ** 0.3)
        cuts = np.concatenate([rng.random(100), cm.curve(), cm._ramped, [-0.1, 0.0, 1.0, 1.5]])
        want = cm.raw_cut(cuts)
        got = np.array([cm.raw_cut_one(float(c)) for c in cuts])
        assert np.array_equal(got, want), np.flatnonzero(got != want)


def test_request_posteriors_grow_on_update_and_new_slots_start_empty():
    """``RequestBeta.update`` grows its arrays when a slot lies past them (no max() every step), and
    the slots it adds start from the prior, not from copies of earlier slots."""
    from control.goodput.estimators import RequestBeta

    rb = RequestBeta(strength=8.0, capacity=4)
    rb.update(np.array([0, 1, 2, 3]), np.array([3, 1, 0, 2]), np.array([4, 2, 1, 3]))
    rb.update(np.array([1, 9]), np.array([1, 2]), np.array([2, 3]))
    assert rb.s.size >= 10 and rb.t.size == rb.s.size == rb.h.shape[0]
    np.testing.assert_array_equal(rb.s[:4], [3, 2, 0, 2])
    np.testing.assert_array_equal(rb.t[:4], [4, 4, 1, 3])
    np.testing.assert_array_equal(rb.h[:4, :5], [[0, 0, 0, 0, 1], [0, 0, 2, 0, 0], [0, 1, 0, 0, 0], [0, 0, 0, 1, 0]])
    np.testing.assert_array_equal(rb.s[4:9], 0.0)  # added slots start empty
    assert (rb.h[4:9] == 0.0).all() and rb.s[9] == 2 and rb.t[9] == 3 and rb.h[9, 3] == 1
    rb.update(np.array([12]), np.array([1]), np.array([2]))  # batch 1 grows too
    assert rb.t[12] == 2 and rb.mean(np.array([12]), 0.5)[0] == (1 + 8 * 0.5) / (2 + 8)
    prefix = np.concatenate(([0.0], np.cumsum(np.linspace(0.9, 0.2, 8))))  # (K+1,)
    assert rb.reference(np.array([12]), prefix, 0.5) == (prefix[2] + 8 * 0.5) / (2 + 8)
    np.testing.assert_allclose(rb.reference(np.array([1, 12]), prefix, 0.5),
                               [(2 * prefix[2] + 8 * 0.5) / (4 + 8), (prefix[2] + 8 * 0.5) / (2 + 8)])


def test_weights_and_prefix_sums_given_to_the_optimiser_equal_weighted_survival():
    """``admit_parametric(surv, weights=w, psum=...)`` decides as ``admit_parametric(surv * w)``: one
    drafter or several, capped or not, with catch-up, and where a KV limit binds (the fallback)."""
    from control.goodput.cost import LinearCost
    from control.goodput.optimizer import Constraints, admit_parametric
    from control.goodput.stepcost import DrafterCost, DrafterKind, StepCostModel

    rng = np.random.default_rng(11)
    drafters = (DrafterCost("d", DrafterKind.draft_model, LinearCost(a=3e-6, b=0.01, c=0.6), const_ms=0.1),
                DrafterCost("ng", DrafterKind.ngram, None, const_ms=0.05),
                DrafterCost("e", DrafterKind.eagle, LinearCost(a=1e-6, b=0.004, c=0.3)))
    K = 8
    for _ in range(300):
        m = int(rng.integers(1, 4))
        cost = StepCostModel(LinearCost(a=2e-5, b=0.05, c=5.0), drafters[:m], overhead_ms=0.5)
        n = int(rng.integers(2, 30))
        surv = np.cumprod(rng.uniform(0.2, 0.99, (n, K)), axis=1)
        cap = np.minimum(rng.integers(0, K + 3, n), K)
        ctx = rng.integers(16, 4000, n).astype(float)
        drafter = np.full(n, int(rng.integers(0, m))) if rng.random() < 0.6 else rng.integers(0, m, n)
        lag = (rng.random(n) < 0.3) * rng.uniform(0, 30, n)
        w = rng.uniform(0.5, 2.0, n)
        cons = Constraints(free_kv_slots=int(rng.integers(0, 3 * n))) if rng.random() < 0.4 else Constraints()
        psum = np.concatenate([np.zeros((n, 1)), np.cumsum(surv, axis=1)], axis=1)
        want = admit_parametric(cost, ctx, surv * w[:, None], cap, cons, drafter=drafter, lag=lag)
        got = admit_parametric(cost, ctx, surv, cap, cons, drafter=drafter, lag=lag, psum=psum, weights=w)
        np.testing.assert_array_equal(got.k, want.k)
        assert got.tokens == pytest.approx(want.tokens, rel=1e-9) and got.step_ms == pytest.approx(want.step_ms, rel=1e-9)


@pytest.mark.parametrize("batches,said", [("x", "'x' is not an integer"), ("4,0", "0 is below 1"), ("", "comma-separated")])
def test_the_decision_cost_benchmark_names_a_bad_batch_list(capsys, batches, said):
    from benchmarks.decision_cost import main

    with pytest.raises(SystemExit) as e:
        main(["--batches", batches])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--batches" in err and said in err and "Traceback" not in err
