"""The agent as an engine loop sees it: default plan, plans from the real service, telemetry, robustness."""

from __future__ import annotations

import random
import re
import time

import httpx
import numpy as np
import pytest

from control.agent import Agent
from control.agent.link import Backoff
from control.errors import ConfigError
from control.plan import compile_plan
from control.policy import build_policy
from control.policy.types import StepView
from tests.conftest import make_profile
from tests.service.conftest import AUTH, TOKEN, free_port
from tests.service.driver import EngineThread, SyntheticEngine

FAST = {"backoff_initial_s": 0.05, "backoff_max_s": 0.3, "timeout_s": 1.0, "keepalive_timeout_s": 6.0}


def test_without_a_service_the_agent_decides_as_its_default_policy_and_drops_telemetry():
    profile = make_profile()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    agent = Agent(profile, url=dead, token=TOKEN, telemetry_interval_s=0.02, queue_windows=3, **FAST).start()
    try:
        engine = SyntheticEngine(agent, profile.step_cost(), batch=12, step_sleep_s=0.001, seed=3)
        stats = engine.run_for(1.0)
    finally:
        agent.stop(timeout_s=0.5)
    s = agent.stats()
    assert stats.failed == 0 and stats.completed > 0 and not stats.errors
    assert s.plan_source == "default" and s.policy == "adaptive" and s.policy_errors == 0
    assert s.connect_failures >= 2 and not s.connected and s.telemetry_sent == 0
    assert s.dropped_windows > 0 and s.dropped_steps > 0 and s.queued_windows <= 3
    # That decide never waits on the network is checked in test_restart.py, against a hung service whose
    # waits (2 s) stand clear of scheduling noise; here the network's waits (backoff <= 0.3 s) do not.
    # The agent on its default plan decides exactly as the plain policy would.
    bare = build_policy("adaptive", compile_plan(profile))
    twin = SyntheticEngine(bare, profile.step_cost(), batch=12, seed=3)
    for _ in range(stats.steps):
        twin.step()
    assert twin.stats.k_by_step == stats.k_by_step and max(stats.k_max_by_step) > 0


def _wait(cond, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.005)
    return time.monotonic() - t0


def test_a_published_plan_reaches_the_agent_within_a_second_and_changes_k(clean_service):
    profile = make_profile()
    agent = Agent(profile, url=clean_service.url, token=TOKEN, **FAST).start()
    engine = SyntheticEngine(agent, profile.step_cost(), batch=16, step_sleep_s=0.002, gen_range=(64, 256))
    try:
        with EngineThread(engine):
            assert agent.wait_for_plan(lambda plan_id, plan: plan_id != "default", 10)
            n0 = engine.stats.steps
            _wait(lambda: engine.stats.steps > n0 + 20, 10, "steps on the service's plan")
            before = engine.stats.k_max_by_step[-10:]
            r = httpx.put(f"{clean_service.url}/v1/overrides", json={"policy": "fixed:1"}, headers=AUTH, timeout=5)
            r.raise_for_status()
            published = time.monotonic()
            version = r.json()["plan_version"]
            n1 = engine.stats.steps
            _wait(lambda: agent.plan.version == version, 5, f"plan v{version} in the agent")
            _wait(lambda: engine.stats.steps > n1 + 5, 5, "steps after the new plan")
            t, kmax = engine.stats.t_by_step, engine.stats.k_max_by_step
            first = next(i for i in range(n1, len(t)) if kmax[i] == 1 and all(k == 1 for k in kmax[i:]))
            latency = t[first] - published
    finally:
        agent.stop()
    assert max(before) >= 2  # adaptive drafted more than one token at batch 16
    assert latency < 1.0, f"plan took {latency:.3f} s from publication to the k used"
    assert agent.stats().policy == "fixed:1" and engine.stats.failed == 0
    print(f"plan publication -> first step with the new k: {latency * 1000:.0f} ms")


def test_telemetry_closes_the_loop_and_keeps_learned_state(clean_service):
    profile = make_profile(acceptance={"draft": 0.6, "ngram": 0.4})
    agent = Agent(profile, url=clean_service.url, token=TOKEN, telemetry_interval_s=0.25, source="loop-agent",
                  **FAST).start()
    engine = SyntheticEngine(agent, profile.step_cost(), batch=16, alpha={"draft": 0.93, "ngram": 0.5},
                             step_sleep_s=0.002)
    try:
        with EngineThread(engine):
            _wait(lambda: agent.stats().plan_source == "service", 10, "the service's plan")
            policy = agent.policy
            _wait(lambda: agent.plan.acceptance.rate.get("draft", 0) > 0.85 and agent.plan.reason.startswith("refit"),
                  15, "a refit plan with the measured acceptance")
            n = engine.stats.steps
            _wait(lambda: engine.stats.steps > n + 5, 5, "steps on the refit plan")
    finally:
        agent.stop()
    s = agent.stats()
    assert agent.policy is policy  # same policy name: update_context kept its learned state
    assert s.telemetry_sent >= 2 and s.dropped_windows == 0 and s.telemetry_rejected == 0 and s.policy_errors == 0
    assert engine.stats.failed == 0
    status = httpx.get(f"{clean_service.url}/v1/status", timeout=5).json()
    assert status["acceptance"]["draft"]["pooled"] > 0.85


def test_plans_the_executor_cannot_run_are_rejected_and_a_broken_step_fails_nothing():
    profile = make_profile()
    agent = Agent(profile, drafters=("ngram",), policy="fixed:2")
    assert agent.plan.drafters == ["ngram"]
    assert not agent.offer_plan(compile_plan(profile, drafters=["draft"], version=7), "svc:7")
    assert agent.stats().plans_rejected == 1 and agent.plan_id == "default"
    # A plan naming another policy replaces the policy; one naming the same keeps the object.
    assert agent.offer_plan(compile_plan(profile, policy="adaptive", version=8), "svc:8")
    view = StepView.build(slots=[0, 1], request_ids=[5, 6], ctx_lens=[100, 200], remaining=[50, 50],
                          drafters=("ngram",), max_k=8, free_kv_slots=1000, token_budget=1000)
    agent.decide(view)
    adaptive = agent.policy
    assert agent.plan_id == "svc:8" and adaptive.name == "adaptive"
    assert agent.offer_plan(compile_plan(profile, policy="adaptive", max_k=4, version=9), "svc:9")
    agent.decide(view)
    assert agent.policy is adaptive and agent.plan.max_k == 4
    # An executor bug (slots that are not integers) must not fail the step: plain decoding, counted.
    broken = StepView(slots=np.array([0.0, 1.0, 2.0]), request_ids=np.array([5, 6, 7]), ctx_lens=np.full(3, 100),
                      remaining=np.full(3, 50), k_cap=np.full(3, 8), drafter=np.zeros(3, dtype=np.int64),
                      draft_lag=np.zeros((3, 1), dtype=np.int64), free_kv_slots=1000, token_budget=1000, max_k=8,
                      drafters=("ngram",))
    d = agent.decide(broken)
    assert np.array_equal(d.k, np.zeros(3)) and agent.stats().policy_errors == 1


def test_backoff_grows_with_jitter_up_to_its_cap():
    b = Backoff(0.1, 1.0, rng=random.Random(4))
    delays = [b.next() for _ in range(8)]
    caps = [min(1.0, 0.1 * 2**i) for i in range(8)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, caps, strict=True))
    assert len({round(d, 6) for d in delays[4:]}) == 4  # jittered: reconnecting agents do not stampede
    b.reset()
    assert b.next() <= 0.1


def test_agent_configuration_is_validated():
    profile = make_profile()
    for kwargs, words in (({"url": "localhost:8700"}, "must look like http://HOST:PORT"),
                          ({"url": "http://127.0.0.1:99999"}, "invalid port"),
                          ({"drafters": ("eagle",)}, "none of the executor's drafters (eagle) is in profile"),
                          ({"policy": "fast"}, "unknown policy 'fast'"),
                          ({"max_k": 40}, "max_k = 40"),
                          ({"source": "has space"}, "agent source 'has space'")):
        with pytest.raises(ConfigError, match=re.escape(words)):
            Agent(profile, **kwargs)


def test_switching_away_and_back_resumes_the_learned_policy():
    """An override to another policy parks the adaptive policy with what it learned; naming adaptive
    again resumes that instance on the new plan instead of starting cold."""
    profile = make_profile(acceptance={"draft": 0.5, "ngram": 0.4})
    agent = Agent(profile, policy="adaptive")
    engine = SyntheticEngine(agent, profile.step_cost(), batch=8, alpha={"draft": 0.95, "ngram": 0.3}, seed=1)
    for _ in range(150):
        engine.step()
    learned = agent.policy
    i = learned.ctx.drafters.index("draft")
    rate = learned.pooled_rate(i)
    assert rate > 0.8  # it measured the draft's 0.95, far from the profile's 0.5
    assert agent.offer_plan(compile_plan(profile, policy="fixed:2", version=2), "svc:2")
    for _ in range(60):  # requests finish and new ones take their slots while adaptive is parked
        engine.step()
    assert agent.policy.name == "fixed:2" and agent.stats().policy_errors == 0
    assert agent.offer_plan(compile_plan(profile, policy="adaptive", max_k=5, version=3), "svc:3")
    engine.step()
    assert agent.policy is learned and agent.policies_resumed == 1 and agent.plan.max_k == 5
    assert learned.pooled_rate(i) >= rate - 0.05  # what it learned survived the round trip
    for _ in range(40):
        engine.step()
    assert engine.stats.failed == 0 and agent.stats().policy_errors == 0
    assert max(engine.stats.k_max_by_step[-40:]) <= 5  # and it runs on the new plan's limits
    # A different drafter set cannot reuse what was learned for the old one: a fresh start.
    assert agent.offer_plan(compile_plan(profile, policy="fixed:1", version=4), "svc:4")
    engine.step()
    assert agent.offer_plan(compile_plan(profile, policy="adaptive", drafters=["ngram"], version=5), "svc:5")
    engine.step()
    assert agent.policy is learned and learned.ctx.drafters == ("ngram",)
    assert learned.pooled_rate(0) < 0.6  # relearned for ngram from its prior, not the draft's 0.95
