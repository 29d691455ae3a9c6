"""Issue 19's crash requests sent to the front end: 4xx, and Triton behind it stays up and serving."""

from __future__ import annotations

import httpx
import pytest

from control.buildsys.triton_launch import ADMIN_HEADER
from control.clients.triton import GenParams, http_generate

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
GENERATE = "/v2/models/llm/generate"


def assert_serving(frontend, deployment):
    assert deployment.triton.alive()
    assert httpx.get(f"{frontend.url}/v2/health/ready", timeout=10).status_code == 200
    assert http_generate(frontend.url, "import os\n", GenParams(max_tokens=4)).token_ids


def test_form_encoded_4mb_body_is_refused_and_triton_stays_up(frontend, deployment):
    body = b"a=" + b"b" * (4_400_000)  # over the ~4.19 MB that crashed tritonserver 2.51
    r = httpx.post(f"{frontend.url}{GENERATE}", content=body, timeout=30,
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413 and "bytes" in r.json()["error"]["message"]
    small = httpx.post(f"{frontend.url}{GENERATE}", content=b'{"text_input": "x"}', timeout=30,
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert small.status_code == 415 and "application/json" in small.json()["error"]["message"]
    assert_serving(frontend, deployment)


def test_chunked_body_over_the_limit_is_refused(frontend, deployment):
    def chunks():
        for _ in range(40):
            yield b"[" * 100_000

    r = httpx.post(f"{frontend.url}{GENERATE}", content=chunks(), headers={"Content-Type": "application/json"},
                   timeout=30)
    assert r.status_code == 413
    assert_serving(frontend, deployment)


def test_deeply_nested_json_is_refused_and_triton_stays_up(frontend, deployment):
    depth = 300_000
    body = b'{"text_input": ' + b"[" * depth + b"]" * depth + b"}"  # ~600 KB, under the size limit
    for path in (GENERATE, "/v2/models/llm/infer", "/v1/completions"):
        r = httpx.post(f"{frontend.url}{path}", content=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 400 and "nested" in r.json()["error"]["message"], (path, r.text[:200])
    assert_serving(frontend, deployment)


def test_get_with_a_large_body_and_unknown_paths(frontend, deployment):
    r = httpx.request("GET", f"{frontend.url}/v2/models/llm", content=b"x" * 2_000_000, timeout=30)
    assert r.status_code == 413
    for method, path, status in (("GET", "/v1/nothing", 404), ("GET", "/v1/completions", 405)):
        r = httpx.request(method, f"{frontend.url}{path}", timeout=10)
        assert r.status_code == status and path in r.json()["error"]["message"]
    assert_serving(frontend, deployment)


def test_multipart_is_refused(frontend, deployment):
    r = httpx.post(f"{frontend.url}{GENERATE}", files={"f": ("a.txt", b"hello")}, timeout=30)
    assert r.status_code == 415
    assert_serving(frontend, deployment)


def test_kserve_through_the_proxy_equals_triton(frontend, deployment):
    p = GenParams(max_tokens=12)
    via = http_generate(frontend.url, "class Config(object):", p)
    direct = http_generate(deployment.http_url, "class Config(object):", p)
    assert via.token_ids == direct.token_ids and via.text == direct.text
    streamed = http_generate(frontend.url, "class Config(object):", p, stream=True)
    assert streamed.token_ids == direct.token_ids and len(streamed.chunk_times) > 1
    bad = httpx.post(f"{frontend.url}{GENERATE}", json={"text_input": "x", "max_tokens": -1}, timeout=30)
    assert bad.status_code == 400 and "max_tokens" in bad.text


def test_tritonclient_http_works_through_the_proxy(frontend, deployment):
    import numpy as np
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    via = th.InferenceServerClient(frontend.url.removeprefix("http://"))
    direct = th.InferenceServerClient(deployment.http_url.removeprefix("http://"))
    assert via.is_server_ready() and via.is_model_ready("llm")
    assert via.get_model_metadata("llm")["inputs"] == direct.get_model_metadata("llm")["inputs"]
    t = th.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([b"import os\n"], dtype=object), binary_data=True)  # octet-stream body
    errors = []
    for client in (via, direct):
        with pytest.raises(InferenceServerException) as e:
            client.infer("llm", [t])
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "decoupled" in errors[0]  # the same answer, passed through unchanged


@pytest.mark.parametrize("path, body", [
    ("/v2/logging", {"log_verbose_level": 1}),
    ("/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    ("/v2/models/llm/trace/setting", {"trace_rate": "1"}),
    ("/v2/repository/models/llm/unload", {}),
    ("/v2/repository/index", {}),
    ("/v2/systemsharedmemory/region/r/register", {"key": "/r", "offset": 0, "byte_size": 8}),
    ("/v2/cudasharedmemory/region/r/register", {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 8}),
])
def test_posts_that_change_the_server_are_not_forwarded(frontend, deployment, path, body):
    """Found by hand: the proxy forwarded every POST, so anyone on the user port could turn on verbose
    logging or tracing, or register shared memory, with no token."""
    ADMIN = {ADMIN_HEADER: deployment.triton.admin_key}  # noqa: N806
    before = httpx.get(f"{deployment.http_url}/v2/logging", headers=ADMIN, timeout=30).json()
    r = httpx.post(f"{frontend.url}{path}", json=body, timeout=30)
    assert r.status_code == 403 and f"POST {path} is not served on this port" in r.json()["error"], r.text
    assert httpx.get(f"{deployment.http_url}/v2/logging", headers=ADMIN, timeout=30).json() == before
    assert_serving(frontend, deployment)
