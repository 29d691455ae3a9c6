"""One real deployment per session: the control-plane service and tritonserver serving the rendered LLM
API deployment (``executor: trtllm``) with the stand-in ``tensorrt_llm`` package (tests/executors/trtllm/llmapi/standin)
over tiny reference checkpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from control.triton.server import TritonServer, free_port, free_server_ports
from tests.conftest import make_profile
from tests.executors.trtllm.bls.engines import build_tiny_engines
from tests.executors.trtllm.llmapi.deploy import ROOT, build_repository

TOKEN = "llmhost-token-0123456789abcdef"
FAIL_TOKEN = 0  # "<unk>": a prompt holding it fails mid-stream in the stand-in (text prompts of known words never do)


@dataclass
class LlmApiDeployment:
    triton: TritonServer
    control_url: str
    engines: Path
    repo: Path

    @property
    def grpc_url(self) -> str:
        return self.triton.grpc_url

    @property
    def http_url(self) -> str:
        return self.triton.http_url


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> Path:
    return build_tiny_engines(tmp_path_factory.mktemp("llmhost-engines"))


def _start_service(profile: Path, run: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(run / "control-plane.log", "wb")  # noqa: SIM115 - owned by the process
    env = {**os.environ, "SPECCTL_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "control", "control-plane", "--profile", str(profile),
                             "--host", "127.0.0.1", "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the control-plane service exited: {(run / 'control-plane.log').read_text()[-400:]}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    _stop(proc)
    raise AssertionError("the control-plane service was not ready within 60 s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.fixture(scope="session")
def llmapi_profile(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("llmhost-profile") / "profile.yaml"
    path.write_text(yaml.safe_dump(make_profile().to_dict()))
    return path


@pytest.fixture(scope="session")
def llmapi(tmp_path_factory, tiny_checkpoints, llmapi_profile):
    work = tmp_path_factory.mktemp("llmhost")
    service, control_url = _start_service(llmapi_profile, work)
    try:
        repo = build_repository(work, tiny_checkpoints, llmapi_profile, control_url, TOKEN, FAIL_TOKEN)
        srv = TritonServer(repo, work / "run", **free_server_ports(),
                           pythonpath=[str(ROOT)],
                           extra_args=["--model-load-thread-count=2", "--exit-timeout-secs=5"])
        srv.start(timeout_s=240)
        try:
            yield LlmApiDeployment(srv, control_url, tiny_checkpoints, repo)
        finally:
            srv.stop()
    finally:
        _stop(service)


@pytest.fixture(autouse=True)
def llmapi_alive(request):
    """A test of the shared deployment fails at once, with the server's log, when an earlier test left
    its tritonserver dead (every later request would otherwise fail on a refused connection)."""
    if "llmapi" in request.fixturenames:
        dep = request.getfixturevalue("llmapi")
        if dep.triton.proc.poll() is not None:
            last = dep.triton.log_path.read_text(errors="replace").splitlines()[-30:]
            pytest.fail(f"tritonserver exited (code {dep.triton.proc.returncode}) during an earlier test; the "
                        f"end of its log ({dep.triton.log_path}):\n" + "\n".join(last))
    yield


@pytest.fixture(scope="session")
def reference_greedy(tiny_checkpoints):
    """Greedy output of the reference engine run directly on the tiny target (no Triton, no speculation)."""
    import torch

    from control.executors.base import SamplingParams
    from control.executors.reference.engine import EngineConfig, PlainDecoding, ReferenceEngine
    from control.executors.reference.model import load_pretrained

    torch.set_num_threads(1)
    target = load_pretrained(tiny_checkpoints / "target")
    engine = ReferenceEngine(target, {}, PlainDecoding(), EngineConfig(max_batch=16))

    def generate(prompts: list[list[int]], max_tokens: int, **kw) -> list[list[int]]:
        res = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, **kw))
        return [r.token_ids for r in res]

    return generate
