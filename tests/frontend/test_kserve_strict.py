"""Through the front end's KServe proxy, the generate bodies Triton's JSON layer mishandles (a wrong
type: an unnamed 500; an integer beyond int32: truncated; stream on generate: 200 with an error;
a misspelt field: ignored) get a 400 naming the field, for llm and its tensorrtllm_backend aliases."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_strict_requests import JSON_LAYER

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("model", ["llm", "ensemble", "tensorrt_llm_bls"])
def test_json_layer_cases_get_a_400_naming_the_field(frontend, deployment, model):
    for body, field in JSON_LAYER:
        r = httpx.post(f"{frontend.url}/v2/models/{model}/generate", json=body, timeout=30)
        assert r.status_code == 400 and field in r.json()["error"], (body, r.status_code, r.text[:300])
    # Straight to Triton, the first of them is the unnamed 500 the proxy prevents.
    r = httpx.post(f"{deployment.http_url}/v2/models/{model}/generate", json=JSON_LAYER[0][0], timeout=30)
    assert r.status_code == 500 and "max_tokens" not in r.json()["error"]


def test_good_bodies_pass_through_the_check(frontend):
    body = {"text_input": "def parse(", "max_tokens": 6, "stop_words": "", "bad_words": ""}
    r = httpx.post(f"{frontend.url}/v2/models/ensemble/generate", json=body, timeout=60)
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 6
    with httpx.stream("POST", f"{frontend.url}/v2/models/llm/generate_stream", json={**body, "stream": True},
                      timeout=60) as s:
        assert s.status_code == 200 and sum(1 for line in s.iter_lines() if line.startswith("data: ")) >= 1
