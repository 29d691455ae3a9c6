"""The replica container's entrypoint (deploy/docker/triton_entrypoint.py): a built GPU repository is
filled in and pointed at the control plane; on CPU it renders the reference pair's repository and
becomes a tritonserver whose llm model gets ready and registers its replica with the control plane."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from control.buildsys.triton_launch import ADMIN_HEADER, ADMIN_KEY_FILE
from control.triton.server import free_ports
from tests.service.conftest import TOKEN, ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "docker" / "triton_entrypoint.py"
GOLDEN = ROOT / "tests" / "buildsys" / "golden" / "h100-llama3.1-8b-draft-pytorch"


def _module():
    spec = importlib.util.spec_from_file_location("triton_entrypoint", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_built_repository_is_filled_in_and_pointed_at_the_control_plane(tmp_path):
    ep = _module()
    out = ep.copy_built_repo(GOLDEN / "triton_repo", tmp_path / "repo", Path("/models/h100"),
                             "http://specctl-control-plane:8700", "/var/run/specctl/token")
    cfg = (out / "llm" / "config.pbtxt").read_text()
    assert "@OUT@" not in cfg and '"/models/h100/llm_api_options.yaml"' in cfg
    assert cfg.count('key: "control_url"') == 1 and "http://specctl-control-plane:8700" in cfg
    assert cfg.count('key: "control_token_file"') == 1 and TOKEN not in cfg
    again = ep.copy_built_repo(out, tmp_path / "again", Path("/models/h100"), "http://other:8700", "/t")
    cfg2 = (again / "llm" / "config.pbtxt").read_text()
    assert cfg2.count('key: "control_url"') == 1 and "http://other:8700" in cfg2  # replaced, not doubled
    assert (GOLDEN / "triton_repo" / "llm" / "config.pbtxt").read_text().count("@OUT@") > 0  # source untouched


def test_on_cpu_it_becomes_a_ready_tritonserver_that_joins_the_control_plane(quick_engines, tmp_path):
    from control.agent.wire import group_name
    from control.profile import load_profile
    from control.triton.deploy import resolve_profile

    prof = resolve_profile(Path(quick_engines), None, tmp_path)
    svc = ServiceProcess(prof).start()
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    http, grpc, metrics = free_ports(3)
    env = {**os.environ, "SPECCTL_RUN_DIR": str(tmp_path / "run"), "SPECCTL_ENGINE_DIR": str(quick_engines),
           "SPECCTL_PROFILE": str(prof), "SPECCTL_CONTROL_URL": svc.url, "SPECCTL_TOKEN_FILE": str(token),
           "SPECCTL_REPLICA": "pod-abc", "SPECCTL_MAX_BATCH": "4", "SPECCTL_TRITON_HTTP_PORT": str(http),
           "SPECCTL_TRITON_GRPC_PORT": str(grpc), "SPECCTL_TRITON_METRICS_PORT": str(metrics),
           "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "entrypoint.log", "wb")  # noqa: SIM115 - the child's output until it is stopped
    proc = subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "entrypoint.log").read_text()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{http}/v2/models/llm/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "entrypoint.log").read_text()[-2000:]
            time.sleep(0.2)
        p = load_profile(prof)
        group = group_name(p.sku, p.pair)
        for _ in range(100):
            rows = httpx.get(f"{svc.url}/v1/replicas", timeout=5).json()["groups"][group]["replicas"]
            if any(r["replica"] == "pod-abc" and r["streams"] == 1 for r in rows):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the replica never subscribed to its plans: {rows}")
        assert "127.0.0.1" in (tmp_path / "entrypoint.log").read_text().split("--http-address=")[1][:12]
        # Triton's administration behind the key, which is in the run directory and not in the log
        key = (tmp_path / "run" / ADMIN_KEY_FILE).read_text().strip()
        assert key and key not in (tmp_path / "entrypoint.log").read_text()
        logging = f"http://127.0.0.1:{http}/v2/logging"
        assert httpx.get(logging, timeout=5).status_code in (401, 403)
        assert httpx.get(logging, headers={ADMIN_HEADER: key}, timeout=5).status_code == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
        svc.stop()
