"""The front end as a child process (``specctl serve``, tests): start, wait until ready, stop."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from control.errors import SpecctlError
from control.triton.server import terminate_group

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class FrontendProcess:
    """``python -m control.frontend ARGS`` listening on host:port; logs to ``run_dir/frontend.log``."""

    def __init__(self, args: list[str], *, host: str, port: int, run_dir: Path) -> None:
        self.args = [*args, "--host", host, "--port", str(port)]
        self.url = f"http://{host}:{port}"
        self.log = Path(run_dir) / "frontend.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> FrontendProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "control.frontend", *self.args], cwd=ROOT, env=env,
                                         stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait(timeout_s)
        return self

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
                raise SpecctlError(f"the front end exited with code {self.proc.returncode} while starting: "
                                   f"{' | '.join(tail)} (log: {self.log})")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/health", timeout=1.0) as r:
                if r.status == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise SpecctlError(f"the front end was not ready within {timeout_s:.0f} s (log: {self.log})")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        terminate_group(self.proc, STOP_TIMEOUT_S)


def frontend_args(*, triton_grpc: str, triton_http: str, tokenizer_dir: Path | None, max_k: int,
                  spec_metrics: bool = False) -> list[str]:
    args = ["--triton-grpc", triton_grpc, "--triton-http", triton_http, "--max-k", str(max_k)]
    if tokenizer_dir is not None:
        args += ["--tokenizer-dir", str(tokenizer_dir)]
    if spec_metrics:
        args.append("--spec-decode-metrics")
    return args
