"""The plain-Python parts of the llm model's LLM API path: request -> SamplingParams, validation with the
reference engine's messages, k control per method, num_draft_tokens caps in the drafter hook, and
per-request speculation metrics -> the agent's telemetry -> the service's acceptance estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.agent import Agent
from control.agent.wire import DrafterStats, TelemetryBatch
from control.errors import ConfigError, SpecctlError
from control.executors.base import check_prompt
from control.executors.trtllm.drafter_hook import KPlanner
from control.executors.trtllm.llmapi import chain_positions, sampling_kwargs
from control.executors.trtllm.llmapi_steps import llmapi_sampling
from control.plan import compile_plan
from control.policy import build_policy
from control.service.estimates import AcceptanceTracker
from control.triton.llm_request import Limits, parse_request
from control.triton.llmapi_host import KControl, choose_control
from control.triton.sender import ModelParams
from tests.conftest import make_profile


def _words(s: str) -> list[int]:
    return [ord(c) % 50 + 3 for c in s]


def _parse(**tensors):
    arrays = {k: (v if isinstance(v, np.ndarray) else np.array([v], dtype=object if isinstance(v, str | bytes) else None))
              for k, v in tensors.items()}
    return parse_request(arrays, limits=Limits(max_tokens=100, default_max_tokens=7), encode=lambda s: [1, *_words(s)],
                         encode_words=_words, deployment_policy="adaptive")


def test_a_request_maps_to_tensorrt_llm_sampling_params():
    greedy = _parse(text_input="abc", max_tokens=np.array([12], dtype=np.int32),
                    stop_words=np.array([b"ab", b"", b"xy"], dtype=object), bad_words=np.array([b"q"], dtype=object),
                    end_id=np.array([2], dtype=np.int32), random_seed=np.array([9], dtype=np.uint64))
    kw = sampling_kwargs(**llmapi_sampling(greedy.params))
    assert kw == {"max_tokens": 12, "return_perf_metrics": True, "top_k": 1, "seed": 9, "end_id": 2,
                  "stop": ["ab", "xy"], "bad": ["q"], "include_stop_str_in_output": True}
    assert greedy.params.stop_words == (tuple(_words("ab")), tuple(_words("xy")))  # the same words, as ids
    sampled = _parse(text_input="abc", temperature=np.array([0.8], dtype=np.float32), top_k=np.array([4], dtype=np.int32),
                     top_p=np.array([0.5], dtype=np.float32))
    kw = sampling_kwargs(**llmapi_sampling(sampled.params))
    assert (kw["temperature"], kw["top_k"], kw["top_p"]) == (pytest.approx(0.8), 4, 0.5) and "stop" not in kw
    assert "ignore_eos" not in kw
    fixed_length = _parse(text_input="abc", ignore_eos=np.array([True]))
    assert fixed_length.params.ignore_eos
    assert sampling_kwargs(**llmapi_sampling(fixed_length.params))["ignore_eos"] is True
    with pytest.raises(SpecctlError, match="ignore_eos = 1: must be true or false"):
        sampling_kwargs(5, ignore_eos=1)


def test_validation_gives_the_reference_engines_messages(tiny_checkpoints):
    import torch

    from control.executors.reference.engine import EngineConfig, PlainDecoding, ReferenceEngine
    from control.executors.reference.model import load_pretrained

    torch.set_num_threads(1)
    target = load_pretrained(tiny_checkpoints / "target")
    engine = ReferenceEngine(target, {}, PlainDecoding(), EngineConfig(max_batch=2))
    vocab, max_len = target.config.vocab_size, engine.max_len
    cases = [
        _parse(input_ids=np.array([1, 5, vocab], dtype=np.int32)),  # outside the vocabulary
        _parse(input_ids=np.arange(1, max_len - 3, dtype=np.int32) % vocab, max_tokens=np.array([9], dtype=np.int32)),
        _parse(text_input="abc", end_id=np.array([vocab + 4], dtype=np.int32)),
    ]
    for req in cases:
        with pytest.raises(ConfigError) as ours:
            check_prompt(req.prompt_ids, req.params, vocab, max_len)
        with pytest.raises(ConfigError) as ref:
            engine.add_request(req.prompt_ids, req.params)
        assert str(ours.value) == str(ref.value)
    good = _parse(input_ids=np.array([1, 5], dtype=np.int32))
    check_prompt(good.prompt_ids, good.params, vocab, max_len)  # a good one passes


@pytest.mark.parametrize(("requested", "options", "env", "mode"), [
    ("drafter-hook", {"speculative_config": {"decoding_type": "NGram"}}, {}, "drafter-hook"),
    ("drafter-hook", {"speculative_config": {"decoding_type": "NGram"}, "tensor_parallel_size": 2}, {},
     "static-schedule"),
    ("drafter-hook", {"speculative_config": {"decoding_type": "NGram"}}, {"TLLM_WORKER_USE_SINGLE_PROCESS": "0"},
     "static-schedule"),
    ("static-schedule", {"speculative_config": {"decoding_type": "NGram"}}, {}, "static-schedule"),
    ("drafter-hook", {"speculative_config": {"decoding_type": "Draft_Target"}}, {}, "static-schedule"),
    ("drafter-hook", {"speculative_config": {"decoding_type": "Eagle3"}}, {}, "static-schedule"),
    ("drafter-hook", {"speculative_config": {"decoding_type": "MTP"}}, {}, "static-schedule"),
    ("drafter-hook", {}, {}, "none"),
])
def test_k_control_per_method(requested, options, env, mode):
    c = choose_control(requested, options, env)
    assert isinstance(c, KControl) and c.mode == mode and c.reason
    if c.method in ("Eagle3", "MTP"):
        assert "fixed once the LLM is built" in c.reason


@pytest.mark.parametrize(("params", "message"), [
    ({"executor": "trtllm"}, "llm_api_options is empty"),
    ({"executor": "trtllm", "llm_api_options": "@OUT@/llm_api_options.yaml"}, "run the deployment's build.sh"),
    ({"executor": "trtllm", "llm_api_options": "o.yaml", "control": "live"}, "control = 'live': accepted: drafter-hook"),
    ({"executor": "vllm"}, "executor = 'vllm': accepted: reference, trtllm, sim"),
    ({"executor": "trtllm", "llm_api_options": "o.yaml", "cancel_check_ms": "0"}, "cancel_check_ms = 0"),
])
def test_bad_model_parameters_are_named(params, message):
    cfg = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    with pytest.raises(ConfigError, match=None) as e:
        ModelParams.from_config(cfg)
    assert message in str(e.value)
    ok = ModelParams.from_config({"parameters": {"executor": {"string_value": "trtllm"},
                                                 "llm_api_options": {"string_value": "o.yaml"}}})
    assert ok.engine_dir == "" and ok.control == "static-schedule"


def test_the_hook_caps_k_per_request_and_times_iterations():
    planner = KPlanner(build_policy("fixed:3", compile_plan(make_profile(), max_k=4)), max_k=4)
    planner.set_cap(101, 0)
    planner.set_cap(102, 1)
    caps = planner.caps_for([101, 102, 103])
    assert caps.tolist() == [0, 1, 4]
    assert planner.plan([7, 8, 9], [20, 20, 20], [50, 50, 50], k_cap=caps).tolist() == [0, 1, 3]
    planner.set_cap(101, None)
    assert planner.caps_for([101]).tolist() == [4]
    total, _ = planner.step_time(10.0)
    assert math.isnan(total)  # no previous iteration
    assert planner.step_time(10.025)[0] == pytest.approx(25.0)
    assert math.isnan(planner.step_time(12.5)[0])  # the hook was idle in between: not a step time


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400), st.integers(0, 400), st.integers(1, 300), st.integers(1, 8))
def test_chain_positions_are_valid_telemetry(drafted, accepted, steps, max_k):
    accepted = min(accepted, drafted)
    trials, acc = chain_positions(drafted, accepted, steps, max_k)
    k = len(trials)
    assert 1 <= k <= max_k and len(acc) == k
    assert trials[0] == -(-drafted // k)  # speculative steps of k tokens
    DrafterStats(name="d", requests=trials[0], drafted=drafted, verified=drafted, accepted=accepted,
                 position_trials=trials, position_accepted=acc)  # validates monotone, acc <= trials
    assert abs(sum(acc) - accepted) <= k  # the totals survive up to rounding


def _simulate(rng, rate: float, k: int, n: int) -> list[tuple[int, int, int]]:
    """(drafted, accepted, generated) of n requests under a single-rate chain with k drafts per step."""
    out = []
    for _ in range(n):
        steps = int(rng.integers(8, 40))
        acc = np.minimum(rng.geometric(1 - rate, steps) - 1, k)  # accepted draft tokens per step
        out.append((steps * k, int(acc.sum()), 1 + int(acc.sum()) + steps))
    return out


@pytest.mark.parametrize("rate", [0.3, 0.75])
def test_request_metrics_give_the_service_the_acceptance_rate(rate):
    profile = make_profile(acceptance={"draft": 0.5, "ngram": 0.4})
    agent = Agent(profile, url="http://127.0.0.1:9", drafters=("draft",), max_k=4, telemetry_interval_s=1e-9,
                  queue_windows=1000)  # never started: every request closes a window onto the queue
    for drafted, accepted, generated in _simulate(np.random.default_rng(0), rate, 3, 300):
        trials, acc = chain_positions(drafted, accepted, max(generated - 1 - accepted, 1), 4)
        agent.observe_positions("draft", trials[0], drafted, accepted, trials, acc)
    agent.observe_positions("nope", 1, 1, 0, [1], [0])  # an unknown drafter is refused and counted
    assert agent.policy_errors == 1
    tracker = AcceptanceTracker(profile)
    windows = list(agent.queue)
    assert windows
    for i, w in enumerate(windows):
        doc = TelemetryBatch.model_validate(w.to_payload(source="t", seq=i, plan_version=1, plan_id="p",
                                                         dropped_windows=0, dropped_steps=0))
        tracker.add(doc, now=0.0)
    assert tracker.pooled("draft") == pytest.approx(rate, abs=0.03)
    assert np.allclose(tracker.positions("draft", 3), rate, atol=0.05)
