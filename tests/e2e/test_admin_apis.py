"""Triton's administration APIs answer only the server's admin key, on the gRPC port users reach
and on the internal HTTP port: a shared-memory registration or a log setting is a write."""

from __future__ import annotations

import httpx
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from control.buildsys.triton_launch import ADMIN_GRPC_HEADER, ADMIN_HEADER, ADMIN_KEY_FILE
from control.clients.triton import GenParams, grpc_generate

pytestmark = pytest.mark.e2e


def test_grpc_administration_needs_the_admin_key(deployment):
    client = tg.InferenceServerClient(deployment.grpc_url)
    key = (deployment.run_dir / ADMIN_KEY_FILE).read_text().strip()
    assert key == deployment.triton.admin_key and (deployment.run_dir / ADMIN_KEY_FILE).stat().st_mode & 0o077 == 0
    for call in (lambda h: client.update_log_settings({"log_verbose_level": 1}, headers=h),
                 lambda h: client.register_system_shared_memory("r", "/specctl-test", 8, headers=h),
                 lambda h: client.get_model_repository_index(headers=h),
                 lambda h: client.update_trace_settings(settings={"trace_rate": "1"}, headers=h)):
        with pytest.raises(InferenceServerException, match="(?i)restrict|permission|unavailable|denied"):
            call(None)
    assert client.get_log_settings(headers={ADMIN_GRPC_HEADER: key}, as_json=True)["settings"]["log_verbose_level"][
        "uint32_param"] == 0  # nothing changed, and the key opens it
    assert client.is_model_ready("llm") and client.get_model_metadata("llm")  # reads stay open
    assert grpc_generate(deployment.grpc_url, "def f(", GenParams(max_tokens=3)).token_ids


def test_http_administration_needs_the_admin_key(deployment):
    r = httpx.post(f"{deployment.http_url}/v2/logging", json={"log_verbose_level": 1}, timeout=30)
    assert r.status_code in (401, 403), r.text
    ok = httpx.get(f"{deployment.http_url}/v2/logging", headers={ADMIN_HEADER: deployment.triton.admin_key}, timeout=30)
    assert ok.status_code == 200 and ok.json()["log_verbose_level"] == 0
