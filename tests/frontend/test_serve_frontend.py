"""``specctl serve`` as a user runs it: the printed HTTP endpoint is the front end, the crash requests
of issue 19 get a 4xx there, the server keeps serving OpenAI and KServe requests, and while it
restarts a killed tritonserver the front end answers 503 with ``Retry-After``, which the openai client
waits out and retries through."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from control.frontend.protocol import RETRY_AFTER_S
from control.triton.supervisor import descendants, stub_pids
from tests.triton.listening import listening_on

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _serve(engine_dir, run_dir, profile):
    cmd = [sys.executable, "-m", "control", "serve", "--engine-dir", str(engine_dir), "--run-dir", str(run_dir),
           "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--control-port", "0", "--max-batch", "4",
           "--profile", str(profile), "--spec-decode-metrics"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _endpoints(p) -> dict[str, str]:
    lines, deadline = [], time.monotonic() + 180
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("ready"):
            break
    assert lines and lines[-1].startswith("ready"), "".join(lines) + p.stderr.read()
    return {ln.split()[0]: ln.split()[-1] for ln in lines if ln.startswith("  ")}


def _retried_through_a_restart(p, urls: dict[str, str], prompt: str, answer: str) -> None:
    """Kill tritonserver; a request while it is down gets 503 with ``Retry-After``; the openai client
    with retries waits it out and gets the same greedy answer from the restarted server."""
    triton = [pid for pid in descendants(p.pid) if stub_pids(pid)]
    assert len(triton) == 1, triton
    os.kill(triton[0], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while True:  # the front end sees the server gone once its channel does
        down = httpx.post(f"{urls['openai']}/completions", json={"model": "llm", "prompt": prompt, "max_tokens": 8},
                          timeout=30)
        if down.status_code != 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert down.status_code == 503 and down.headers["retry-after"] == str(RETRY_AFTER_S), (down.status_code, down.text)
    assert "retry the request" in down.json()["error"]["message"]
    health = httpx.get(f"{urls['http']}/health", timeout=30)
    assert (health.status_code, health.headers.get("retry-after")) == (503, str(RETRY_AFTER_S)), health.text
    t0 = time.monotonic()
    client = openai.OpenAI(base_url=urls["openai"], api_key="unused", timeout=60, max_retries=3)
    again = client.completions.create(model="llm", prompt=prompt, max_tokens=8, temperature=0)
    assert again.choices[0].text == answer
    assert time.monotonic() - t0 >= RETRY_AFTER_S - 1  # it waited as told, not the client's own backoff
    assert p.poll() is None


def test_serve_fronts_triton_and_survives_the_crash_requests(quick_engines, deployment, tmp_path):
    p = _serve(quick_engines, tmp_path / "run", deployment.profile_path)
    try:
        urls = _endpoints(p)
        http, internal = urls["http"], urls["triton-http"]
        assert http.startswith("http://127.0.0.1:") and internal.startswith("http://127.0.0.1:") and http != internal
        assert listening_on(int(internal.rsplit(":", 1)[1])) == {"127.0.0.1"}  # Triton's HTTP: loopback only
        assert urls["openai"] == f"{http}/v1"
        form = httpx.post(f"{http}/v2/models/llm/generate", content=b"a=" + b"b" * 4_400_000, timeout=30,
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
        deep = httpx.post(f"{http}/v2/models/llm/generate", content=b"[" * 300_000 + b"]" * 300_000, timeout=30,
                          headers={"Content-Type": "application/json"})
        assert (form.status_code, deep.status_code) == (413, 400)
        assert httpx.get(f"{http}/v2/health/ready", timeout=10).status_code == 200
        client = openai.OpenAI(base_url=urls["openai"], api_key="unused", max_retries=0, timeout=60)
        r = client.completions.create(model="llm", prompt="import os\n", max_tokens=8, temperature=0)
        assert r.usage.completion_tokens > 0 and "speculative_decoding" in r.model_extra["metrics"]  # deployment opt-in
        kserve = httpx.post(f"{http}/v2/models/llm/generate", json={"text_input": "import os\n", "max_tokens": 8},
                            timeout=30).json()
        assert kserve["text_output"] == r.choices[0].text
        assert p.poll() is None
        _retried_through_a_restart(p, urls, "import os\n", r.choices[0].text)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
    with pytest.raises(httpx.HTTPError):
        httpx.get(http, timeout=1)
