"""The real service over HTTP: plans, the stream, overrides behind the token, telemetry limits, metrics, UI."""

from __future__ import annotations

import json
import re
from xml.etree import ElementTree

import httpx
import pytest

from control.agent.wire import group_name
from control.cli import main
from control.goodput.explain import explain
from control.plan import parse_plan
from tests.conftest import make_profile
from tests.service.conftest import AUTH, TOKEN, free_port

GROUP = group_name(make_profile().sku, make_profile().pair)

OVR = "/v1/overrides"


def _telemetry(**over):
    doc = {"schema": "specctl.telemetry/v1", "source": "test-agent", "seq": 1, "plan_version": 1, "window_s": 1.0,
           "steps": 10, "spec_steps": 6, "request_steps": 80, "ctx_tokens": 80_000, "max_batch": 8,
           "k_hist": [20, 0, 30, 30], "measured_ms_sum": 100.0, "predicted_steps": 6, "predicted_ms_sum": 60.0,
           "predicted_measured_ms_sum": 66.0,
           "drafters": [{"name": "draft", "requests": 60, "drafted": 150, "verified": 150, "accepted": 90,
                         "position_trials": [60, 45, 30], "position_accepted": [45, 30, 15]}],
           "samples": {"batch": [8, 8], "ctx_tokens": [8000, 8100], "verify_tokens": [32, 24], "verify_ms": [7.0, 6.9],
                       "draft_ms": [3.1, 2.2], "total_ms": [10.1, 9.1], "predicted_ms": [10.0, None],
                       "draft_passes": [3, 2], "draft_ctx_tokens": [24_000, 16_000], "draft_batched_tokens": [24, 16],
                       "drafter": [0, 0], "drafted": [24, 16], "accepted": [12, 10]},
           "dropped_windows": 2, "dropped_steps": 37}
    doc.update(over)
    return doc


def test_health_plan_and_openapi(service):
    c = httpx.Client(base_url=service.url, timeout=5)
    assert c.get("/healthz").json() == {"status": "ok"}
    ready = c.get("/readyz").json()
    assert ready["ready"] is True
    r = c.get("/v1/plan")
    plan = parse_plan(r.json())
    assert r.headers["x-specctl-plan-id"] == ready["plan_id"].rsplit(":", 1)[0] + f":{plan.version}"
    assert plan.profile.pair == "target+draft" and plan.policy == "adaptive"
    assert c.get("/v1/plan", headers={"If-None-Match": r.headers["etag"]}).status_code == 304
    spec = c.get("/openapi.json").json()
    assert {"/v1/plan", "/v1/plan/stream", "/v1/telemetry", "/v1/overrides", "/metrics", "/"} <= set(spec["paths"])
    assert "HTTPBearer" in json.dumps(spec["paths"]["/v1/overrides"]["put"]["security"])


def test_overrides_need_the_token(clean_service):
    c = httpx.Client(base_url=clean_service.url, timeout=5)
    v0 = c.get("/v1/plan").json()["version"]
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {TOKEN}"}):
        r = c.put(OVR, json={"max_k": 1}, headers=headers)
        assert r.status_code == 401, r.text
        assert "needs the service token" in r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"
    r = c.post("/v1/telemetry", json=_telemetry())
    assert r.status_code == 401
    assert c.get("/v1/plan").json()["version"] == v0  # nothing was published
    r = c.put(OVR, json={"max_k": 1, "policy": "fixed:1"}, headers=AUTH)
    assert r.status_code == 200, r.text
    ack = r.json()
    assert ack["plan_version"] == v0 + 1 and ack["reason"] == "override: policy=fixed:1, max_k=1"
    assert c.get(OVR).json()["max_k"] == 1
    plan = c.get("/v1/plan").json()
    assert (plan["version"], plan["policy"], plan["max_k"]) == (v0 + 1, "fixed:1", 1)


@pytest.mark.parametrize("body, status, words", [
    ({"policy": "bogus"}, 422, ["'bogus'", "accepted: none, fixed:K", "adaptive"]),
    ({"policy": "oracle"}, 422, ["simulator"]),
    ({"max_k": 17}, 422, ["max_k", "17", "less than or equal to 16"]),
    ({"slo_tpot_ms": -3}, 422, ["slo_tpot_ms", "-3", "greater than 0"]),
    ({"slo_quantile": 0.9}, 422, ["slo_quantile needs slo_tpot_ms"]),
    ({"drafters": ["eagle"]}, 422, ["drafter 'eagle' is not in profile", "it has: draft, ngram"]),
    ({"drafters": []}, 422, ["drafters", "at least 1"]),
    ({"force_off": "maybe"}, 422, ["force_off", "'maybe'"]),
    ({"max_k": 2, "unknown": 1}, 422, ["unknown", "Extra inputs are not permitted"]),
    ("not json", 422, ["PUT /v1/overrides: not valid JSON (Expecting value at offset 0)"]),
    ('{"policy": "fixed:3",}', 422, ["not valid JSON", "at offset 21"]),
])
def test_bad_overrides_get_one_line_errors(clean_service, body, status, words):
    c = httpx.Client(base_url=clean_service.url, timeout=5)
    v0 = c.get("/v1/plan").json()["version"]
    kw = {"content": body} if isinstance(body, str) else {"json": body}
    r = c.put(OVR, headers={**AUTH, "Content-Type": "application/json"}, **kw)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert "\n" not in detail
    for w in words:
        assert w in detail, detail
    assert c.get("/v1/plan").json()["version"] == v0


def test_telemetry_is_validated_and_size_limited(service):
    c = httpx.Client(base_url=service.url, timeout=5, headers=AUTH)
    assert c.post("/v1/telemetry", json=_telemetry()).status_code == 202
    r = c.post("/v1/telemetry", json=_telemetry(spec_steps=11))
    assert r.status_code == 422 and "spec_steps = 11 exceeds steps = 10" in r.json()["detail"]
    r = c.post("/v1/telemetry", json=_telemetry(drafters=[{"name": "eagle", "requests": 1, "drafted": 1, "verified": 1,
                                                            "accepted": 0, "position_trials": [1], "position_accepted": [0]}]))
    assert r.status_code == 422 and "drafter 'eagle' is not in profile" in r.json()["detail"]
    big = json.dumps(_telemetry(source="x" * 100)).encode() + b" " * (1 << 20)
    r = c.post("/v1/telemetry", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "exceeds the limit of 1048576 bytes" in r.json()["detail"]

    def chunks():  # no Content-Length: the limit holds for streamed bodies too
        for _ in range(40):
            yield b" " * 65536

    r = c.post("/v1/telemetry", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    text = c.get("/metrics").text
    assert re.search(r'specctl_telemetry_rejected_total\{reason="too_large"\} [1-9]', text)
    assert re.search(r'specctl_telemetry_rejected_total\{reason="invalid"\} [1-9]', text)


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    assert m, f"{name}{labels} not in /metrics"
    return float(m.group(1))


def _labels(**kw: str) -> str:
    """Prometheus exposition of labels: sorted by name, as prometheus_client writes them."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(kw.items())) + "}"


def test_metrics_follow_telemetry(service):
    c = httpx.Client(base_url=service.url, timeout=5, headers=AUTH)
    g = _labels(group=GROUP)
    before = c.get("/metrics").text
    s0 = _metric(before, "specctl_steps_total", g)
    pos2 = _labels(group=GROUP, drafter="draft", position="2")
    t0 = _metric(before, "specctl_draft_position_trials_total", pos2) if f"position_trials_total{pos2}" in before else 0.0
    k0 = _metric(before, "specctl_draft_length_bucket", _labels(group=GROUP, le="2.0"))
    assert c.post("/v1/telemetry", json=_telemetry(source="metrics-agent")).status_code == 202
    text = c.get("/metrics").text
    assert _metric(text, "specctl_steps_total", g) == s0 + 10
    assert _metric(text, "specctl_draft_position_trials_total", pos2) == t0 + 45
    assert _metric(text, "specctl_draft_length_bucket", _labels(group=GROUP, le="2.0")) == k0 + 50  # k=0 20 + k=2 30
    assert 0.0 < _metric(text, "specctl_acceptance_rate", _labels(group=GROUP, drafter="draft", position="1")) < 1.0
    assert _metric(text, "specctl_speculative_step_share", g) > 0
    assert _metric(text, "specctl_step_time_model_samples_total", g) >= 2
    assert _metric(text, "specctl_step_time_policy_ms_total", _labels(group=GROUP, kind="predicted")) >= 60.0
    assert _metric(text, "specctl_telemetry_dropped_windows", g) >= 2  # what the agent reported
    # the agent's own row: an agent without a replica id is its own replica
    assert _metric(text, "specctl_replica_steps_total", _labels(group=GROUP, replica="metrics-agent")) >= 10
    v = httpx.get(f"{service.url}/v1/plan").json()["version"]
    assert re.search(rf'specctl_plan_version\{{group="{re.escape(GROUP)}",instance="[0-9a-f]+"\}} {v}\.0', text)


def test_dashboard_and_explain(service):
    c = httpx.Client(base_url=service.url, timeout=5)
    r = c.get("/", params={"batch": 8, "ctx": 512, "acceptance": 0.7})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert page.count("<svg") >= 5 and "goodput over k: batch 8, ctx 512, acceptance 0.70" in page
    assert not re.search(r'(src|href)="https?://', page)  # works offline: nothing loaded from elsewhere
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        ElementTree.fromstring(svg)  # well-formed
    got = c.get("/v1/explain", params={"batch": 8, "ctx": 512, "acceptance": 0.7}).json()
    plan = parse_plan(c.get("/v1/plan").json())
    want = explain(plan.profile, 8, 512, 0.7, None, plan.max_k, None, None)
    assert got["best_k"] == want["best_k"] and got["curve"] == want["curve"]
    r = c.get("/v1/explain", params={"drafter": "eagle"})
    assert r.status_code == 422 and "drafter 'eagle' is not active" in r.json()["detail"]
    r = c.get("/", params={"acceptance": 1.5})
    assert r.status_code == 422 and "acceptance" in r.json()["detail"]


def test_plan_stream_pushes_each_version(clean_service):
    url = clean_service.url
    with httpx.Client(timeout=httpx.Timeout(5, read=10)) as c, c.stream("GET", f"{url}/v1/plan/stream") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        events = []

        def next_event():
            ev = {}
            for line in lines:
                if not line:
                    if "data" in ev:
                        return ev
                    continue
                if line.startswith(":"):
                    continue
                k, _, v = line.partition(": ")
                ev[k] = v

        first = next_event()
        events.append(first)
        assert first["event"] == "plan" and json.loads(first["data"])["version"] == int(first["id"].rsplit(":", 1)[1])
        httpx.put(f"{url}{OVR}", json={"max_k": 3}, headers=AUTH, timeout=5).raise_for_status()
        second = next_event()
        plan = json.loads(second["data"])
        assert plan["version"] == json.loads(first["data"])["version"] + 1 and plan["max_k"] == 3
    # Resuming with the current id sends no plan until a new version exists.
    with httpx.Client(timeout=httpx.Timeout(5, read=10)) as c, \
            c.stream("GET", f"{url}/v1/plan/stream", headers={"Last-Event-ID": second["id"]}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith(":")
        httpx.put(f"{url}{OVR}", json={"max_k": 4}, headers=AUTH, timeout=5).raise_for_status()
        third = next_event()
        assert json.loads(third["data"])["max_k"] == 4


def test_cli_refuses_a_taken_port_and_bad_input(service, profile_path, tmp_path, capsys):
    def cli(*args):
        rc = main(["control-plane", *args])
        return rc, capsys.readouterr().err.strip()

    rc, err = cli("--profile", str(profile_path), "--port", str(service.port), "--token", TOKEN)
    assert rc == 2
    assert err == (f"specctl control-plane: error: port {service.port} on 127.0.0.1 is already in use; "
                   "choose another with --port (or stop the process that holds it)")
    rc, err = cli("--profile", str(profile_path), "--port", str(free_port()), "--token", "short")
    assert rc == 2 and "token of 5 characters: use at least 16" in err
    rc, err = cli("--profile", str(tmp_path / "missing.yaml"))
    assert rc == 2 and "missing.yaml' does not exist" in err
    rc, err = cli("--profile", str(profile_path), "--policy", "fast")
    assert rc == 2 and "unknown policy 'fast'" in err
    rc, err = cli("--profile", str(profile_path), "--slo-quantile", "0.9")
    assert rc == 2 and "--slo-quantile needs --slo-tpot-ms" in err
    with pytest.raises(SystemExit) as e:
        main(["control-plane", "--profile", str(profile_path), "--port", "70000"])
    assert e.value.code == 2 and "port 70000 must be in 0..65535" in capsys.readouterr().err


def test_curves_stay_within_the_profile_after_an_absurd_window(service):
    """The default batch and context of /v1/explain and the dashboard come from the latest window; a
    valid but absurd one (mean batch 10^10) once made the service allocate terabytes and fail with 500."""
    c = httpx.Client(base_url=service.url, timeout=10)
    absurd = _telemetry(source="absurd-agent", steps=1, spec_steps=0, predicted_steps=0, request_steps=10**10,
                        ctx_tokens=10**12, max_batch=10**10, samples=None)
    assert c.post("/v1/telemetry", json=absurd, headers=AUTH).status_code == 202
    plan = parse_plan(c.get("/v1/plan").json())
    got = c.get("/v1/explain")
    assert got.status_code == 200, got.text
    assert got.json()["batch"] == plan.profile.limits.max_batch and got.json()["ctx"] <= plan.profile.limits.max_ctx
    assert c.get("/").status_code == 200
    c.post("/v1/telemetry", json=_telemetry(source="absurd-agent", seq=2), headers=AUTH).raise_for_status()
