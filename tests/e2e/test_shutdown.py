"""A server that refused requests still shuts down at once: every model unloads and the llm model
finalizes, well inside tritonserver's exit timeout. A server stopped with requests in flight ends
each of them with an error saying so, and stops in bounded time even while clients hold their gRPC
streams open.

Refusals raised out of ``execute()`` used to leave ``llm`` unloadable (Triton 2.51's Python backend
reads an uninitialised flag on that path and may keep the request's response factory), so
tritonserver waited out its whole exit timeout and killed the stub (docs/decisions.md, 2026-11-28).
Two kinds of refusal in turn set it off in nearly every run."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

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


STREAMS = 12  # more than max_batch: some wait in the queue, some run
LONG = 960  # tokens each asks for (the quick pair holds 1,024 in all): none finishes before the stop


def _open_streams(dep, n: int) -> tuple[list, queue.Queue]:
    """``n`` gRPC streams, each with one long streaming request; the callbacks' (result, error) pairs."""
    got: queue.Queue = queue.Queue()
    clients = []
    for i in range(n):
        c = grpcclient.InferenceServerClient(dep.grpc_url)
        c.start_stream(callback=lambda result=None, error=None: got.put((result, error)))
        inputs = []
        for name, dtype, value in (("text_input", "BYTES", np.array([f"def f{i}(x):".encode()], dtype=object)),
                                   ("max_tokens", "INT32", np.array([LONG], dtype=np.int32)),
                                   ("stream", "BOOL", np.array([True]))):
            t = grpcclient.InferInput(name, [1], dtype)
            t.set_data_from_numpy(value)
            inputs.append(t)
        c.async_stream_infer("llm", inputs, request_id=str(i))
        clients.append(c)
    return clients, got


def _stopping_errors(got: queue.Queue, want: int, timeout_s: float) -> list[str]:
    """The drain's errors among the callbacks, waiting up to ``timeout_s`` for ``want`` of them."""
    out: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        try:
            _, error = got.get(timeout=0.2)
        except queue.Empty:
            continue
        if error is not None:
            out.append(str(error))
    return out


def test_stopping_ends_the_requests_in_flight_with_a_message(quick_engines, tmp_path):
    cfg = DeploymentConfig(engine_dir=Path(quick_engines), run_dir=tmp_path / "run", http_port=0, grpc_port=0,
                           metrics_port=0, control_port=0, service=False, max_batch=8)
    dep = Deployment(cfg).start()
    clients, got = _open_streams(dep, STREAMS)
    try:
        first = got.get(timeout=60)  # generation is under way
        assert first[1] is None, str(first[1])
        assert dep.drain()
        errors = _stopping_errors(got, STREAMS, 30.0)  # each stream's final response, before Triton stops
        r = httpx.post(f"{dep.http_url}/v2/models/llm/generate", json={"text_input": "def f(", "max_tokens": 4},
                       timeout=30)
        assert r.status_code == 400 and "the server is stopping" in r.json()["error"], r.text[:200]
    finally:
        t0 = time.monotonic()
        dep.stop()  # the clients still hold their streams open
        stop_s = time.monotonic() - t0
        for c in clients:
            c.stop_stream()
    # A request the model had when the drain came is ended mid-flight; one that reached it later (the
    # streams open one by one, and a busy machine may hold some back) is refused on arrival. Either
    # way its stream ends with the stop's message, and the drain counts those it ended.
    ended = [e for e in errors if "the server is stopping: this request ended after" in e and "retry it" in e]
    refused = [e for e in errors if "the server is stopping; retry this request once it is back" in e]
    other = [e for e in errors if e not in ended and e not in refused]
    assert len(errors) == STREAMS and not other and ended, (len(errors), other)  # (the errors that are not the drain's)
    log = (tmp_path / "run" / "tritonserver.log").read_text()
    assert f"drained: {len(ended)} requests in flight ended" in log, log[-3000:]
    # An open stream holds the model past its unload (Triton 2.51): the stop gives up on it after
    # DRAINED_STOP_S, where it used to wait out the exit timeout and then tritonserver's abort.
    assert stop_s < EXIT_TIMEOUT_S + PROMPT_STOP_S, f"stopping took {stop_s:.1f} s"
