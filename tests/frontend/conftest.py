"""The front end started in front of the session's real deployment (tests/e2e/conftest.py):
Triton serving the quick CPU pair, with the front end as its own process on a free loopback port."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.frontend.process import FrontendProcess, frontend_args
from control.triton.server import free_port
from tests.e2e.conftest import (  # noqa: F401  (shared session fixtures, and the liveness check)
    deployment,
    deployment_alive,
    deployment_stubs,
    policy,
    reference,
)

MAX_K = 8


@pytest.fixture(scope="session")
def frontend(deployment):  # noqa: F811
    args = frontend_args(triton_grpc=deployment.grpc_url, triton_http=deployment.http_url,
                         tokenizer_dir=Path(deployment.cfg.engine_dir) / "target", max_k=MAX_K)
    fe = FrontendProcess(args, host="127.0.0.1", port=free_port(), run_dir=deployment.run_dir).start()
    yield fe
    fe.stop()


@pytest.fixture(scope="session")
def oai(frontend):
    import openai

    return openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0, timeout=120)
