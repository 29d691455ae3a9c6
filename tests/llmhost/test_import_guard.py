"""Without TensorRT-LLM, the rendered ``executor: trtllm`` llm model fails to load with one line saying
what is missing and what to install, and tritonserver (``--exit-on-error``) exits instead of hanging."""

from __future__ import annotations

import time

import pytest

from control.errors import SpecctlError
from control.triton.server import TritonServer, free_server_ports
from tests.llmhost.deploy import ROOT, render

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
