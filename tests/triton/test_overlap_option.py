"""``overlap_policy`` from ``specctl serve`` to the engine: the flag, the rendered model parameter, its
validation, and greedy output through a real tritonserver with the policy off the critical path."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

from control.errors import ConfigError
from control.triton.repo import render_llm_repo
from control.triton.sender import ModelParams

MAX_TOKENS = 320  # past the bandit's first epochs, which decide on the loop (wants_fresh)


def _config(**params):
    return {"parameters": {k: {"string_value": v} for k, v in {"engine_dir": "/e", **params}.items()}}


@pytest.mark.parametrize("text, want", [("true", True), ("false", False), ("TRUE", True), ("", False)])
def test_the_model_parameter_is_true_or_false(text, want):
    assert ModelParams.from_config(_config(overlap_policy=text)).overlap_policy is want


@pytest.mark.parametrize("text", ["yes", "1", "on"])
def test_any_other_value_is_refused_naming_it_and_what_is_accepted(text):
    with pytest.raises(ConfigError, match=rf"overlap_policy = '{text}': accepted: true, false"):
        ModelParams.from_config(_config(overlap_policy=text))


def test_only_the_reference_executor_takes_it(tmp_path):
    with pytest.raises(ConfigError, match="only executor reference .* executor is sim"):
        ModelParams.from_config(_config(executor="sim", profile="/p.yaml", overlap_policy="true"))
    assert not ModelParams.from_config(_config(executor="sim", profile="/p.yaml", overlap_policy="false")).overlap_policy


@pytest.mark.parametrize("on", [True, False])
def test_the_rendered_config_carries_it_to_the_model(tmp_path, on):
    repo = render_llm_repo(tmp_path / "repo", engine_dir=tmp_path, profile=None, overlap_policy=on)
    text = (repo / "llm" / "config.pbtxt").read_text()
    found = re.findall(r'key: "overlap_policy" value: \{ string_value: "(\w+)" \}', text)
    assert found == [str(on).lower()]
    assert ModelParams.from_config(_config(overlap_policy=found[0])).overlap_policy is on


def test_serve_refuses_a_bad_value_in_one_line():
    r = subprocess.run([sys.executable, "-m", "control", "serve", "--engine-dir", "x", "--overlap-policy", "maybe"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--overlap-policy: 'maybe' is not one of: on, off, auto" in r.stderr.strip().splitlines()[-1]


def test_serve_passes_it_to_the_deployment(tmp_path, quick_engines):
    import argparse

    from control.commands.serve import add_deployment_args, deployment_config
    from control.triton.deploy import DEFAULT_OVERLAP_POLICY

    p = argparse.ArgumentParser()
    add_deployment_args(p)
    base = ["--engine-dir", str(quick_engines), "--run-dir", str(tmp_path)]
    assert DEFAULT_OVERLAP_POLICY is None  # auto
    assert deployment_config(p.parse_args(base)).overlap_policy is None
    assert deployment_config(p.parse_args([*base, "--overlap-policy", "Auto"])).overlap_policy is None
    assert deployment_config(p.parse_args([*base, "--overlap-policy", "on"])).overlap_policy is True
    assert deployment_config(p.parse_args([*base, "--overlap-policy", "OFF"])).overlap_policy is False


@pytest.mark.parametrize("pair, threads, cores, want", [
    ("stdlib-full", 1, 2, True),  # a 17.7 ms pass, a free core
    ("stdlib-full", 2, 2, False),  # torch's threads take every core
    ("stdlib-full", 1, 1, False),
    ("stdlib-quick", 1, 2, False),  # a 0.5 ms pass: Python-bound, the worker would slow it
])
def test_auto_puts_the_policy_beside_long_passes_on_a_free_core(pair, threads, cores, want):
    from control.profile import load_profile
    from control.triton.deploy import ROOT, overlap_for

    pass_ms = load_profile(ROOT / "profiles" / "cpu" / f"{pair}.yaml").models["target"].c_ms
    on, why = overlap_for(pass_ms, threads, 1, cores)
    assert on is want
    assert f"{pass_ms:.1f} ms" in why or "no core left" in why


def test_auto_counts_every_instance_s_threads():
    from control.triton.deploy import OVERLAP_MIN_PASS_MS, overlap_for

    assert overlap_for(OVERLAP_MIN_PASS_MS, 1, 1, 4)[0]
    assert not overlap_for(OVERLAP_MIN_PASS_MS, 1, 4, 4)[0]
    assert not overlap_for(OVERLAP_MIN_PASS_MS * 0.99, 1, 1, 4)[0]


@pytest.mark.e2e
def test_greedy_output_through_triton_with_the_policy_off_the_critical_path(quick_engines, tmp_path):
    """A real tritonserver serving the quick pair with overlap_policy on (adaptive, the default plan):
    concurrent greedy streams equal the reference engine without speculation, token for token, and
    the steps decoded with decisions the worker prepared."""
    import torch
    import tritonclient.grpc.aio as aio

    from control.clients.triton import GenParams, model_stats, stream_generate
    from control.executors.base import SamplingParams
    from control.executors.reference.engine import EngineConfig, PlainDecoding, ReferenceEngine
    from control.executors.reference.loader import load_engine_dir
    from control.triton.deploy import Deployment, DeploymentConfig
    from tests.e2e.prompts import many

    prompts = many(12)
    torch.set_num_threads(1)
    loaded = load_engine_dir(quick_engines)
    plain = ReferenceEngine(loaded.target, loaded.drafters, PlainDecoding(), EngineConfig(max_batch=16))
    want = [r.token_ids for r in plain.generate([loaded.encode(p) for p in prompts], SamplingParams(max_tokens=MAX_TOKENS))]

    cfg = DeploymentConfig(engine_dir=Path(quick_engines), run_dir=tmp_path / "run", http_port=0, grpc_port=0,
                           metrics_port=0, control_port=0, service=False, max_batch=16, overlap_policy=True)

    async def run(url: str):
        client = aio.InferenceServerClient(url)
        try:
            return await asyncio.gather(*(stream_generate(client, p, GenParams(max_tokens=MAX_TOKENS)) for p in prompts))
        finally:
            await client.close()

    with Deployment(cfg) as dep:
        results = asyncio.run(asyncio.wait_for(run(dep.grpc_url), 180))
        stats = model_stats(dep.http_url)
    assert [r.error for r in results] == [None] * len(prompts)
    assert [r.token_ids for r in results] == want
    assert sum(r.drafted for r in results) > 0  # it speculated
    assert stats["overlap_policy"] is True and stats["policy"] == "adaptive"
    # a prepared decision per decode step, but for those decided fresh while the bandit was young
    assert stats["policy_fresh_steps"] > 0
    assert stats["policy_worker_jobs"] + stats["policy_fresh_steps"] >= stats["decode_steps"] - 2
    assert stats["policy_prepared_used"] >= (stats["decode_steps"] - stats["policy_fresh_steps"]) // 2
    assert 0 <= stats["policy_wait_ms"] <= stats["policy_ms"]  # the wait is part of the step loop's policy time
    assert 0 < stats["policy_worker_cpu_ms"] <= stats["policy_worker_ms"] + 1
