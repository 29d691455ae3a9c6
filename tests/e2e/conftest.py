"""One real deployment per session: the control-plane service and tritonserver serving the quick
CPU pair through the ``llm`` model (started once; the tests share it and restore what they change)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from control.clients.triton import RequestError, model_stats
from control.triton.deploy import Deployment, DeploymentConfig
from control.triton.supervisor import lost_part, stub_pids

TOKEN = "e2e-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAST_REPLAN = ["--replan-interval", "0.25", "--min-replan", "0.5", "--keepalive", "2"]
MAX_BATCH = 32
MAX_TOKENS_LIMIT = 960
# A prompt starting with these token ids makes the model's engine step fail once it has produced
# tokens (control/triton/faults.py): the engine-failure path, through the real server.
FAULT_PREFIX = (3, 1, 4, 1, 5, 9, 2, 6)
# And these make the delivery of its output fail instead (the loop's own work, for one request).
DELIVER_FAULT_PREFIX = (2, 7, 1, 8, 2, 8, 1, 8)
# Before each test of the shared deployment: how long the llm model has to answer a stats request,
# and how long its engine loop may go without a step or an idle wake-up (either is ~0.5 s at most).
STATS_TIMEOUT_S = 20.0
LOOP_STALL_S = 30.0


@pytest.fixture(scope="session")
def deployment(quick_engines, tmp_path_factory):
    run = tmp_path_factory.mktemp("e2e-run")
    cfg = DeploymentConfig(engine_dir=Path(quick_engines), run_dir=run, http_port=0, grpc_port=0, metrics_port=0,
                           control_port=0, token=TOKEN, max_batch=MAX_BATCH, max_tokens=MAX_TOKENS_LIMIT,
                           service_args=FAST_REPLAN)
    from control.triton.faults import DELIVER_FAULT_ENV, STEP_FAULT_ENV

    with pytest.MonkeyPatch.context() as env:  # tritonserver inherits the environment at start
        env.setenv(STEP_FAULT_ENV, ",".join(map(str, FAULT_PREFIX)))
        env.setenv(DELIVER_FAULT_ENV, ",".join(map(str, DELIVER_FAULT_PREFIX)))
        dep = Deployment(cfg).start()
    yield dep
    dep.stop()


@pytest.fixture(scope="session")
def deployment_stubs(deployment) -> frozenset[int]:
    """The Python backend stubs of the session's tritonserver, as the first test to use it found them."""
    return frozenset(stub_pids(deployment.triton.proc.pid))


@pytest.fixture(autouse=True)
def deployment_alive(request):
    """A test of the shared deployment fails at once, naming the cause, when an earlier test left its
    tritonserver or one of its stubs dead: each request would otherwise wait out its own timeout, and
    every later test with it (Triton keeps a dead stub's requests unanswered and reports itself ready)."""
    if "deployment" in request.fixturenames:
        dep = request.getfixturevalue("deployment")
        why = lost_part(dep.triton.proc, request.getfixturevalue("deployment_stubs"))  # as `specctl serve` checks
        if why:
            pytest.fail(f"{why} during an earlier test: {dep.triton.log_tail()}")
        _assert_loop_serving(dep)
    yield


def _assert_loop_serving(dep: Deployment) -> None:
    """The llm model answers a stats request, and its engine loop is alive and moving."""
    try:
        loop = model_stats(dep.http_url, timeout_s=STATS_TIMEOUT_S)["loop"]
    except RequestError as e:
        pytest.fail(f"the llm model did not answer a stats request after an earlier test ({e}): {dep.triton.log_tail()}")
    if not loop["alive"] or loop["since_progress_s"] > LOOP_STALL_S:
        pytest.fail(f"the llm model's engine loop stopped during an earlier test ({loop}): {dep.triton.log_tail()}")


def set_policy(dep: Deployment, policy: str | None, timeout_s: float = 5.0) -> float:
    """Override the deployment's policy (None: clear overrides); seconds until the model has the plan."""
    body = {} if policy is None else {"policy": policy}
    t0 = time.monotonic()
    httpx.put(f"{dep.control_url}/v1/overrides", json=body, headers=AUTH, timeout=5).raise_for_status()
    want = policy or dep.cfg.policy
    while time.monotonic() - t0 < timeout_s:
        if model_stats(dep.http_url)["plan_received"]["policy"] == want:
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"the llm model did not receive a plan with policy {want} within {timeout_s} s: "
                         f"{model_stats(dep.http_url)}")


@pytest.fixture
def policy(deployment):
    """Set the deployment's policy for one test; overrides are cleared afterwards."""
    yield lambda name: set_policy(deployment, name)
    set_policy(deployment, None)


@pytest.fixture(scope="session")
def reference(quick_engines):
    """Greedy output of the reference engine run directly (no Triton, no speculation)."""
    import torch

    from control.executors.base import SamplingParams
    from control.executors.reference.engine import EngineConfig, PlainDecoding, ReferenceEngine
    from control.executors.reference.loader import load_engine_dir

    torch.set_num_threads(1)
    loaded = load_engine_dir(quick_engines)
    engine = ReferenceEngine(loaded.target, loaded.drafters, PlainDecoding(), EngineConfig(max_batch=MAX_BATCH))

    def generate(prompts: list[str], max_tokens: int) -> list[list[int]]:
        res = engine.generate([loaded.encode(p) for p in prompts], SamplingParams(max_tokens=max_tokens))
        return [r.token_ids for r in res]

    generate.loaded = loaded
    return generate
