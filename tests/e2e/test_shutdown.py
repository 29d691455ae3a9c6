"""A server that refused requests still shuts down at once: every model unloads and the llm model
finalizes, well inside tritonserver's exit timeout.

Refusals raised out of ``execute()`` used to leave ``llm`` unloadable (Triton 2.51's Python backend
reads an uninitialised flag on that path and may keep the request's response factory), so
tritonserver waited out its whole exit timeout and killed the stub (docs/decisions.md, 2026-11-28).
Two kinds of refusal in turn set it off in nearly every run."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from control.triton.deploy import EXIT_TIMEOUT_S, Deployment, DeploymentConfig

pytestmark = pytest.mark.e2e

REFUSED = [  # (model, generate body): two kinds of refusal in turn, by llm and by an alias itself
    ("llm", {"text_input": "def f(", "max_tokens": 1_000_000}),
    ("llm", {"text_input": "def f(", "max_tokens": 4, "top_p": 1.5}),
    ("ensemble", {"text_input": "def f(", "max_tokens": 4, "max_tokns": 4}),
    ("ensemble", {"text_input": "def f(", "max_tokens": 4, "temprature": 0.5}),
]
ROUNDS = 8
PROMPT_STOP_S = EXIT_TIMEOUT_S / 2  # a clean shutdown of the quick pair takes 2-3 s here


@pytest.mark.parametrize("decoupled", [True, False], ids=["decoupled", "non-decoupled"])
def test_a_server_that_refused_requests_stops_at_once(quick_engines, tmp_path, decoupled):
    cfg = DeploymentConfig(engine_dir=Path(quick_engines), run_dir=tmp_path / "run", http_port=0, grpc_port=0,
                           metrics_port=0, control_port=0, service=False, decoupled=decoupled, max_batch=8)
    dep = Deployment(cfg).start()
    try:
        for _ in range(ROUNDS):
            for model, body in REFUSED:
                r = httpx.post(f"{dep.http_url}/v2/models/{model}/generate", json=body, timeout=30)
                assert r.status_code == 400, (model, body, r.text[:200])
                assert "Failed to process" not in r.json()["error"], r.text[:200]  # the model's words, not a raise
        r = httpx.post(f"{dep.http_url}/v2/models/llm/generate", json={"text_input": "def f(", "max_tokens": 4},
                       timeout=30)
        assert r.status_code == 200 and r.json()["text_output"], r.text[:200]
    finally:
        t0 = time.monotonic()
        dep.stop()
        stop_s = time.monotonic() - t0
    log = (tmp_path / "run" / "tritonserver.log").read_text()
    assert "Exit timeout expired" not in log and "llm_0_0: finalized" in log, log[-3000:]
    assert stop_s < PROMPT_STOP_S, f"stopping took {stop_s:.1f} s"
