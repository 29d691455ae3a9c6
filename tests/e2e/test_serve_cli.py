"""``specctl serve`` as a user runs it: endpoints printed, SIGTERM stops everything, clear errors."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from control.triton.server import free_port
from control.triton.supervisor import descendants, process_alive

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _serve(engine_dir, run_dir, *extra):
    cmd = [sys.executable, "-m", "control", "serve", "--engine-dir", str(engine_dir), "--run-dir", str(run_dir),
           "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--control-port", "0", "--max-batch", "4",
           *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_serve_prints_endpoints_serves_and_stops_on_sigterm_without_orphans(quick_engines, deployment, tmp_path):
    profile = deployment.profile_path  # skip the calibration: the session deployment already made one
    p = _serve(quick_engines, tmp_path / "run", "--profile", str(profile))
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("ready"):
            break
    assert lines and lines[-1].startswith("ready"), "".join(lines) + p.stderr.read()
    urls = {ln.split()[0]: ln.split()[-1] for ln in lines if ln.startswith("  ")}
    assert urls["http"].startswith("http://127.0.0.1:") and urls["grpc"].startswith("127.0.0.1:")
    r = httpx.post(f"{urls['http']}/v2/models/llm/generate", json={"text_input": "import os\n", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200 and r.json()["text_output"]
    assert httpx.get(f"{urls['dashboard']}", timeout=5).status_code == 200
    kids = descendants(p.pid)
    assert len(kids) >= 2  # tritonserver (and its stub) and the control-plane service
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 0
    time.sleep(0.5)
    assert [k for k in kids if process_alive(k)] == []
    for url in (urls["http"], urls["control"]):
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, timeout=1)


def test_serve_names_a_taken_port(quick_engines, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "control", "serve", "--engine-dir", str(quick_engines), "--run-dir", str(tmp_path),
               "--http-port", str(free_port()), "--grpc-port", str(port), "--metrics-port", "0", "--control-port", "0"]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"grpc port {port} already in use" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_serve_names_a_missing_engine_dir(tmp_path):
    r = subprocess.run([sys.executable, "-m", "control", "serve", "--engine-dir", str(tmp_path / "nope")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no manifest.json" in r.stderr and "specctl build --sku cpu" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
