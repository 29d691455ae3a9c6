"""The service's API fuzzed from its own OpenAPI schema (schemathesis), over HTTP: no 5xx, ever.

Driven programmatically (one hypothesis run per operation) rather than through schemathesis' pytest
plugin, whose lazy fixtures do not work with this pytest.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.service.conftest import AUTH

STREAM = "/v1/plan/stream"  # never ends by design; it has its own tests


def _fuzz(url: str, headers: dict, examples: int) -> tuple[list[str], Counter]:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    problems: list[str] = []
    seen: Counter = Counter()
    for result in schema.get_all_operations():
        op = result.ok()
        if op.path == STREAM:
            continue

        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        @given(case=op.as_strategy())
        def check(case):
            op = case.operation
            r = case.call(headers=headers, timeout=10)
            seen[(op.method.upper(), op.path, r.status_code)] += 1
            if r.status_code >= 500:
                problems.append(f"{op.method.upper()} {op.path} -> {r.status_code}: {r.text[:300]} "
                                f"(query={case.query}, body={str(case.body)[:200]})")
            elif op.method.upper() not in ("GET", "HEAD", "OPTIONS") and not headers and r.status_code != 401:
                problems.append(f"{op.method.upper()} {op.path} without the token -> {r.status_code}")

        check()
    return problems, seen


@pytest.fixture
def restore_overrides(service):
    yield service
    httpx.put(f"{service.url}/v1/overrides", json={}, headers=AUTH, timeout=5).raise_for_status()


@pytest.mark.slow
def test_fuzzed_requests_never_get_a_server_error(restore_overrides):
    url = restore_overrides.url
    problems, seen = _fuzz(url, AUTH, examples=40)
    assert not problems, "\n".join(problems[:10])
    ops = {(m, p) for m, p, _ in seen}
    assert ("PUT", "/v1/overrides") in ops and ("POST", "/v1/telemetry") in ops
    # The fuzzer got past validation too, not only 4xx.
    assert any(m == "PUT" and s == 200 for m, _, s in seen), seen
    problems, seen = _fuzz(url, {}, examples=5)
    assert not problems, "\n".join(problems[:10])
    assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
