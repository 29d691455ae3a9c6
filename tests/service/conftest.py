"""Fixtures for the service area: the real control-plane service in a subprocess on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_profile

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAST_REPLAN = ("--replan-interval", "0.25", "--min-replan", "0.5", "--keepalive", "2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """``specctl control-plane`` as a child process; ``kill`` is SIGKILL (no goodbye to clients)."""

    def __init__(self, profile_path: Path, port: int | None = None, extra=()) -> None:
        self.profile_path = profile_path
        self.port = port or free_port()
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServiceProcess:
        cmd = [sys.executable, "-m", "control", "control-plane", "--profile", str(self.profile_path),
               "--port", str(self.port), "--token", TOKEN, *self.extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Output goes to a file: an undrained pipe fills up (64 KiB of logs) and blocks the service.
        self.log_path = self.profile_path.parent / f"control-plane-{self.port}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"control-plane exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"control-plane not ready within {timeout_s} s")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def profile_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("service") / "profile.yaml"
    make_profile().save(path)
    return path


@pytest.fixture(scope="session")
def service(profile_path):
    """One service for the tests that do not need their own (reset overrides with ``clean_service``)."""
    svc = ServiceProcess(profile_path, extra=FAST_REPLAN).start()
    yield svc
    svc.stop()


@pytest.fixture
def clean_service(service):
    httpx.put(f"{service.url}/v1/overrides", json={}, headers=AUTH, timeout=5).raise_for_status()
    yield service
    httpx.put(f"{service.url}/v1/overrides", json={}, headers=AUTH, timeout=5).raise_for_status()
