"""Without TensorRT-LLM, or with another release than the deployment was built for, the rendered
``executor: trtllm`` llm model fails to load with one line saying what is missing or what it found
and needs, and tritonserver (``--exit-on-error``) exits instead of hanging."""

from __future__ import annotations

import time

import pytest

from control.errors import SpecctlError
from control.executors.trtllm.version import PINNED
from control.triton.server import TritonServer, free_server_ports
from tests.executors.trtllm.llmapi.deploy import ROOT, install_model, render

STANDIN_ENV = "SPECCTL_STANDIN_TRTLLM_VERSION"  # which release the stand-in says it is (tests/executors/trtllm/llmapi/standin)

pytestmark = pytest.mark.e2e


def test_without_tensorrt_llm_the_model_fails_to_load_with_one_line(tmp_path, llmapi_profile):
    deploy = render(tmp_path / "deploy", "draft", llmapi_profile)  # exactly what a user serves, unmodified
    srv = TritonServer(deploy / "triton_repo", tmp_path / "run", **free_server_ports(), pythonpath=[str(ROOT)])
    t0 = time.monotonic()
    with pytest.raises(SpecctlError, match="tritonserver exited with code 1 while starting"):
        srv.start(timeout_s=120)
    assert time.monotonic() - t0 < 60 and not srv.alive()
    lines = [ln for ln in srv.log_path.read_text().splitlines() if "failed to load 'llm' version 1" in ln]
    assert len(lines) == 1, srv.log_tail()
    message = lines[0].split("MissingDependencyError: ", 1)[1].split("\\n", 1)[0]  # ours, before Triton's traceback
    assert message.startswith("the llm model (executor: trtllm, llm_api_options.yaml) needs TensorRT-LLM, which is "
                              "not installed here (No module named 'tensorrt_llm')")
    assert "`pip install tensorrt_llm`" in message and "nvcr.io/nvidia/tritonserver" in message


def test_on_another_tensorrt_llm_release_the_model_refuses_with_one_line(tmp_path, llmapi_profile, monkeypatch):
    """The deployment was built for the pinned 1.2.1; the stand-in installed beside it says it is another
    release: the model fails to load naming both, and the server exits."""
    deploy = render(tmp_path / "deploy", "ngram", llmapi_profile)
    repo = tmp_path / "repo"
    repo.mkdir()
    install_model(repo, deploy, "llm", tmp_path / "engines")  # the stand-in package beside the model's code
    monkeypatch.setenv(STANDIN_ENV, "1.3.0+standin")
    srv = TritonServer(repo, tmp_path / "run", **free_server_ports(), pythonpath=[str(ROOT)])
    with pytest.raises(SpecctlError, match="tritonserver exited with code 1 while starting"):
        srv.start(timeout_s=120)
    lines = [ln for ln in srv.log_path.read_text().splitlines() if "failed to load 'llm' version 1" in ln]
    assert len(lines) == 1, srv.log_tail()
    message = lines[0].split("ConfigError: ", 1)[1].split("\\n", 1)[0]
    assert message.startswith("the llm model (executor: trtllm, llm_api_options-llm.yaml) was built for TensorRT-LLM "
                              f"{PINNED} but 1.3.0+standin is installed: install tensorrt_llm=={PINNED}")
