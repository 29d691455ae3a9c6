"""The service's state: online refit, acceptance tracking, materiality, overrides, persistence."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from control.agent import TelemetryWindow
from control.agent.wire import TelemetryBatch
from control.errors import ConfigError
from control.plan import compile_plan
from control.policy import build_policy
from control.service.overrides import Overrides
from control.service.state import ControlState, ServiceConfig
from tests.conftest import make_profile
from tests.service.driver import SyntheticEngine


class Recorder:
    """A real policy whose steps are also aggregated into telemetry windows, as the agent does."""

    def __init__(self, policy, drafters=("draft", "ngram"), samples=256):
        self.policy = policy
        self.drafters = drafters
        self.samples = samples
        self.rng = random.Random(0)
        self.window = TelemetryWindow(drafters, samples, 0.0, self.rng)
        self.seq = 0

    @property
    def name(self):
        return self.policy.name

    def decide(self, view):
        d = self.policy.decide(view)
        self.window.on_decide(d.k)
        self._d = d
        return d

    def observe(self, outcome):
        self.policy.observe(outcome)
        self.window.on_outcome(outcome, self._d.predicted_step_ms)

    def take(self, source="agent-0") -> TelemetryBatch:
        w, self.window = self.window, TelemetryWindow(self.drafters, self.samples, 0.0, self.rng)
        w.closed_at = 1.0
        self.seq += 1
        doc = w.to_payload(source=source, seq=self.seq, plan_version=1, plan_id="x:1", dropped_windows=0, dropped_steps=0)
        return TelemetryBatch.model_validate(json.loads(json.dumps(doc)))


def _engines(profile, true_profile, alpha, policies=("fixed:6", "fixed:1", "fixed:4", "fixed:2"), batches=(2, 8, 24, 64),
             seed=0):
    """Agents at different batch sizes and draft lengths (so the cost model's features vary independently)."""
    plan = compile_plan(profile)
    return [SyntheticEngine(Recorder(build_policy(pol, plan)), true_profile.step_cost(), batch=b, alpha=alpha,
                            seed=seed + i) for i, (pol, b) in enumerate(zip(policies, batches, strict=True))]


def _feed(state, engines, steps, clock, windows=1):
    for _ in range(windows):
        for i, e in enumerate(engines):
            for _ in range(steps):
                e.step()
            state.ingest(e.policy.take(source=f"agent-{i}"))
        clock[0] += 1.0


def _replanned_after_jitter(profile, truth, batches, noise):
    """A service fed 3 windows from agents at ``batches`` whose step times follow ``truth`` with
    relative jitter ``noise``, after one replan."""
    st, clock = _state(profile)
    engines = _engines(profile, truth, {"draft": 0.7, "ngram": 0.4}, batches=batches)
    for e in engines:
        e.noise = noise
    _feed(st, engines, 80, clock, windows=3)
    st.maybe_replan()
    return st


def _state(profile, **cfg):
    clock = [1000.0]
    st = ControlState(profile, ServiceConfig(**{"min_replan_s": 0.0, **cfg}), clock=lambda: clock[0])
    return st, clock


def test_refit_learns_a_slower_gpu_and_republishes():
    profile = make_profile(target=(2.0e-5, 0.02, 6.0), draft=(2.5e-6, 0.003, 1.0))
    truth = make_profile(target=(3.0e-5, 0.035, 9.0), draft=(4.0e-6, 0.005, 1.6))
    st, clock = _state(profile)
    engines = _engines(profile, truth, {"draft": 0.7, "ngram": 0.4})
    _feed(st, engines, 80, clock, windows=2)
    before = st.totals.model.abs_pct / st.totals.model.count
    plan = st.maybe_replan()
    assert plan is not None and plan.version == 2
    assert plan.reason.startswith("refit:"), plan.reason
    for key in ("target", "draft"):
        got, want = plan.profile.models[key], truth.models[key]
        for coef in ("a_ms_per_ctx_token", "b_ms_per_batched_token", "c_ms"):
            assert abs(getattr(got, coef) / getattr(want, coef) - 1) < 0.15, (key, coef, got, want)
    # The refit model predicts fresh steps far better than the profile did.
    n0 = st.totals.model.count
    p0 = st.totals.model.abs_pct
    _feed(st, engines, 80, clock)
    after = (st.totals.model.abs_pct - p0) / (st.totals.model.count - n0)
    assert before > 25.0 and after < 6.0, (before, after)


def test_an_accurate_profile_on_a_jittery_machine_is_kept_not_refitted():
    """Step times that scatter +-20% around the profile: a refit would only fit the noise, so the
    service keeps the profile's coefficients (the policies then plan with the true costs)."""
    profile = make_profile(target=(2.0e-5, 0.02, 6.0), draft=(2.5e-6, 0.003, 1.0))
    st = _replanned_after_jitter(profile, profile, batches=(12, 14, 16, 16), noise=0.2)
    assert st.refit.samples_in("target") >= 32 and not st.refit.refitted
    assert st.plan.profile.models == profile.models
    assert "online_refit" not in st.plan.profile.environment or not st.plan.profile.environment["online_refit"]


def test_a_level_shift_under_a_narrow_batch_mix_refits_the_constant_not_the_slopes():
    """A machine 3 ms slower per pass than profiled, at one steady batch size with jitter: the level
    is identified, the per-token slopes are not. The service moves the constant and keeps the
    profile's slopes, instead of a full refit that trades them against each other."""
    profile = make_profile(target=(2.0e-5, 0.02, 6.0), draft=(2.5e-6, 0.003, 1.0))
    truth = make_profile(target=(2.0e-5, 0.02, 9.0), draft=(2.5e-6, 0.003, 1.0))
    st = _replanned_after_jitter(profile, truth, batches=(16, 16, 16, 16), noise=0.05)
    assert "target" in st.refit.refitted
    got, base = st.refit.coeffs["target"], profile.models["target"]
    assert got.a_ms_per_ctx_token == base.a_ms_per_ctx_token and got.b_ms_per_batched_token == base.b_ms_per_batched_token
    assert abs(got.c_ms - 9.0) < 0.6, got


def test_steady_state_is_not_republished_but_an_acceptance_shift_is():
    profile = make_profile(acceptance={"draft": 0.7, "ngram": 0.4})
    st, clock = _state(profile)
    engines = _engines(profile, profile, {"draft": 0.7, "ngram": 0.4})
    for _ in range(6):
        _feed(st, engines, 60, clock)
        assert st.maybe_replan() is None, st.plan.reason
    assert st.version == 1
    engines = _engines(profile, profile, {"draft": 0.9, "ngram": 0.4}, seed=10)
    _feed(st, engines, 60, clock, windows=3)
    plan = st.maybe_replan()
    assert plan is not None and "acceptance of draft" in plan.reason
    assert 0.75 < plan.acceptance.rate["draft"] < 0.9  # old and new evidence, weighted by age
    assert st.totals.replans.get("acceptance") == 1
    clock[0] += 5 * st.config.acceptance_halflife_s  # the old evidence fades
    _feed(st, engines, 60, clock, windows=2)
    plan = st.maybe_replan()
    assert plan is not None and abs(plan.acceptance.rate["draft"] - 0.9) < 0.03


def test_replans_wait_for_the_minimum_interval():
    profile = make_profile()
    st, clock = _state(profile, min_replan_s=30.0)
    engines = _engines(profile, profile, {"draft": 0.95, "ngram": 0.4})
    _feed(st, engines, 60, clock, windows=2)
    assert st.maybe_replan() is None  # material, but the last publication was 2 s ago
    clock[0] += 30.0
    assert st.maybe_replan() is not None


def test_overrides_recompile_and_are_validated():
    st, _ = _state(make_profile())
    plan = st.set_overrides(Overrides(policy="fixed:2", max_k=2, slo_tpot_ms=50.0))
    assert (plan.version, plan.policy, plan.max_k, plan.slo.tpot_ms) == (2, "fixed:2", 2, 50.0)
    assert all(plan.lookup_k(b, 512) <= 2 for b in (1, 8, 64))
    plan = st.set_overrides(Overrides(force_off=True))
    assert plan.force_off and plan.policy == "adaptive" and plan.max_k == 8  # a PUT replaces the whole set
    assert all(plan.lookup_k(b, 512) == 0 for b in (1, 8, 64))
    plan = st.set_overrides(Overrides(drafters=["ngram"]))
    assert plan.drafters == ["ngram"] and plan.default_drafter == "ngram"
    with pytest.raises(ConfigError, match="drafter 'eagle' is not in profile test/target\\+draft; it has: draft, ngram"):
        st.set_overrides(Overrides(drafters=["eagle"]))
    with pytest.raises(ConfigError, match="default_drafter 'draft' is not an active drafter"):
        st.set_overrides(Overrides(drafters=["ngram"], default_drafter="draft"))
    assert st.version == 4  # rejected overrides publish nothing
    with pytest.raises(ValueError, match="unknown policy 'nope'; accepted: none, fixed:K"):
        Overrides(policy="nope")
    with pytest.raises(ValueError, match="simulator"):
        Overrides(policy="oracle")


def test_state_file_keeps_overrides_and_versions_across_restarts(tmp_path):
    path = tmp_path / "state.json"
    st = ControlState(make_profile(), ServiceConfig(state_path=path))
    st.set_overrides(Overrides(max_k=3))
    again = ControlState(make_profile(), ServiceConfig(state_path=path))
    assert again.overrides.max_k == 3 and again.plan.max_k == 3
    assert again.version == st.version + 1 and again.instance != st.instance
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="state.json' is unreadable"):
        ControlState(make_profile(), ServiceConfig(state_path=path))


def test_telemetry_naming_an_unknown_drafter_is_refused():
    st, _ = _state(make_profile())
    rec = Recorder(build_policy("fixed:2", compile_plan(make_profile())), drafters=("eagle", "ngram"))
    e = SyntheticEngine(rec, make_profile().step_cost(), batch=4, drafters=("eagle", "ngram"))
    for _ in range(5):
        e.step()
    with pytest.raises(ConfigError, match="drafter 'eagle' is not in profile"):
        st.ingest(rec.take())
    assert st.totals.windows == 0 and np.all(st.totals.k_hist == 0)
