"""The control plane against hostile input over HTTP: non-finite numbers, lax coercions, content types,
and policies a deployment cannot run. Every bad body gets a 4xx naming the field, and changes nothing."""

from __future__ import annotations

import json

import httpx
import pytest

from control.errors import ConfigError
from control.policy.registry import build_policy
from control.policyspec import MAX_BATCH_LIMIT, check_policy_bounds, parse_policy_spec
from control.service.overrides import Overrides
from tests.service.conftest import AUTH
from tests.service.test_http import _telemetry

OVR = "/v1/overrides"
JSON = {"Content-Type": "application/json"}
# Raw JSON texts Python's parser (and Starlette's) accepts but no field may: non-finite numbers.
NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400")
# Values a lax parser would coerce: bools to ints, strings to numbers and bools, floats to ints.
COERCIBLE = ("true", "false", '"3"', '"yes"', '"1"', "3.0", '"٣"', "[]", "{}", '"NaN"')
OVERRIDE_FIELDS = ("max_k", "slo_tpot_ms", "slo_quantile", "force_off", "policy", "drafters", "default_drafter")
TELEMETRY_FIELDS = ("seq", "plan_version", "window_s", "steps", "spec_steps", "request_steps", "ctx_tokens",
                    "max_batch", "finished", "measured_ms_sum", "predicted_ms_sum", "dropped_windows")


def _valid_for_coercion(field: str, raw: str) -> bool:
    """The few (field, value) pairs that are the right type already, and so not a bad case."""
    strings = {"policy", "default_drafter"}
    floats = {"slo_tpot_ms", "slo_quantile", "window_s", "measured_ms_sum", "predicted_ms_sum"}
    return (field in strings and raw.startswith('"')) or (field == "force_off" and raw in ("true", "false")) \
        or (field in floats and raw == "3.0")


def _override_cases() -> list[tuple[str, str]]:
    cases = [(f, f'{{"{f}": {v}}}') for f in OVERRIDE_FIELDS for v in NON_FINITE + COERCIBLE
             if not _valid_for_coercion(f, v)]
    cases += [("slo_quantile", f'{{"slo_tpot_ms": 5, "slo_quantile": {v}}}') for v in NON_FINITE]
    cases += [("policy", json.dumps({"policy": p})) for p in (
        "fixed:٣", "fixed:３", "static-schedule:maxconc=99999999999999999999", "fixed:" + "9" * 5000,
        "static-schedule:" + ",".join(f"{i}=1" for i in range(1, 200)), "static-schedule:1=٤",
        f"static-schedule:maxconc={MAX_BATCH_LIMIT + 1}", "static-schedule:1=4,99999=1", "x" * 5000)]
    return cases


def _telemetry_cases() -> list[tuple[str, str]]:
    base = _telemetry()
    cases = []
    for f in TELEMETRY_FIELDS:
        for v in NON_FINITE + COERCIBLE:
            if _valid_for_coercion(f, v):
                continue
            doc = json.dumps({**base, f: "@@"}).replace('"@@"', v)
            cases.append((f, doc))
    for v in NON_FINITE:  # inside nested documents too
        cases.append(("verify_ms", json.dumps(base).replace('"verify_ms": [7.0', f'"verify_ms": [{v}')))
        cases.append(("accepted", json.dumps(base).replace('"accepted": 90', f'"accepted": {v}')))
    return cases


def test_the_sweep_covers_the_issue_s_177_control_plane_cases():
    assert len(_override_cases()) + len(_telemetry_cases()) >= 177


@pytest.mark.parametrize("path, cases", [(OVR, _override_cases()), ("/v1/telemetry", _telemetry_cases())],
                         ids=["overrides", "telemetry"])
def test_hostile_bodies_get_422_naming_the_field_and_change_nothing(clean_service, path, cases):
    c = httpx.Client(base_url=clean_service.url, timeout=10, headers={**AUTH, **JSON})
    v0 = c.get("/v1/plan").json()["version"]
    windows0 = c.get("/v1/status").json()["telemetry"]["windows"]
    method = c.put if path == OVR else c.post
    bad = []
    for field, body in cases:
        r = method(path, content=body.encode())
        detail = r.json().get("detail", "") if r.headers.get("content-type", "").startswith("application/json") else ""
        if r.status_code != 422 or field not in detail or "\n" in detail:
            bad.append(f"{body[:80]} -> {r.status_code} {r.text[:160]}")
    assert not bad, f"{len(bad)} of {len(cases)}:\n" + "\n".join(bad[:10])
    assert c.get("/v1/plan").json()["version"] == v0
    assert c.get("/v1/status").json()["telemetry"]["windows"] == windows0
    assert c.get("/healthz").status_code == 200


def test_lax_coercions_are_refused_not_applied(clean_service):
    c = httpx.Client(base_url=clean_service.url, timeout=5, headers=AUTH)
    for body, field in (({"max_k": True}, "max_k"), ({"force_off": "yes"}, "force_off"), ({"max_k": "3"}, "max_k"),
                        ({"max_k": 3.0}, "max_k"), ({"policy": "fixed:٣"}, "policy")):
        r = c.put(OVR, json=body)
        assert r.status_code == 422 and field in r.json()["detail"], (body, r.text)
    assert c.get(OVR).json() == Overrides().model_dump()


def test_a_form_content_type_gets_415_and_json_without_one_is_read(clean_service):
    c = httpx.Client(base_url=clean_service.url, timeout=5, headers=AUTH)
    body = b'{"policy": "fixed:2"}'
    r = c.put(OVR, content=body, headers={"Content-Type": "application/x-www-form-urlencoded"})  # what curl -d sends
    assert r.status_code == 415, r.text
    assert "application/x-www-form-urlencoded" in r.json()["detail"] and "application/json" in r.json()["detail"]
    assert c.get(OVR).json()["policy"] is None
    r = c.put(OVR, content=body, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = c.put(OVR, content=body)  # httpx sends no Content-Type for raw bytes
    assert r.status_code == 200, r.text
    assert c.get(OVR).json()["policy"] == "fixed:2"
    r = c.put(OVR, content=b'{"policy": "fixed:1"}', headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200 and r.json()["overrides"]["policy"] == "fixed:1"


@pytest.mark.parametrize("policy, words", [
    ("static-schedule:maxconc=99999999999999999999", ["maxconc", "1..65536"]),
    ("static-schedule:maxconc=300", ["max_concurrency 300", "max batch 256"]),
    ("static-schedule:1=4,512=1", ["batch size 512", "max batch 256"]),
    ("static-schedule:1=9", ["k = 9", "max_k = 8"]),
    ("fixed:12", ["k = 12", "max_k = 8"]),
    ("fixed:" + "7" * 100, ["fixed needs a draft length", "(106 characters)"]),
    ("fixed:" + "7" * 5000, ["policy", "at most 200 characters"]),
])
def test_policies_beyond_the_deployment_s_bounds_are_refused_whole(clean_service, policy, words):
    c = httpx.Client(base_url=clean_service.url, timeout=5, headers=AUTH)
    v0 = c.get("/v1/plan").json()["version"]
    r = c.put(OVR, json={"policy": policy})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "\n" not in detail and len(detail) < 600
    for w in words:
        assert w in detail, detail
    assert c.get("/v1/plan").json()["version"] == v0 and c.get(OVR).json()["policy"] is None
    r = c.put(OVR, json={"policy": "fixed:12", "max_k": 12})  # in bounds once max_k allows it
    assert r.status_code == 200 and r.json()["plan_version"] == v0 + 1


def test_spec_parsing_is_ascii_and_bounded():
    assert str(parse_policy_spec("static-schedule:maxconc=64")) == "static-schedule:maxconc=64"
    for bad in ("fixed:٣", "fixed:３", "static-schedule:٤=1", "static-schedule:maxconc=٨",
                "static-schedule:maxconc=0", "fixed:0000003", "static-schedule:maxconc=" + "9" * 30):
        with pytest.raises(ConfigError):
            parse_policy_spec(bad)
    check_policy_bounds("static-schedule:1=4,32=1", max_k=4, max_batch=32)
    for spec in ("static-schedule:1=4,33=1", "static-schedule:maxconc=33", "fixed:5", "static-schedule:1=5"):
        with pytest.raises(ConfigError):
            check_policy_bounds(spec, max_k=4, max_batch=32)


def test_the_agent_refuses_a_plan_beyond_its_executor_whole(profile):
    from control.agent import Agent
    from control.plan import compile_plan

    agent = Agent(profile, policy="fixed:2", max_k=8, max_batch=16)
    before = (agent.plan_id, agent.plan.policy)
    plan = compile_plan(profile, version=7, policy="static-schedule:maxconc=64", max_k=8)
    build_policy(plan.policy, plan)  # the plan itself is well formed: only this executor cannot run it
    assert agent.offer_plan(plan, "svc:7") is False
    assert agent.plans_rejected == 1 and "max batch 16" in agent.last_error
    assert (agent.plan_id, agent.plan.policy) == before and agent._pending is None
    ok = compile_plan(profile, version=8, policy="static-schedule:maxconc=16", max_k=8)
    assert agent.offer_plan(ok, "svc:8") is True


def test_plans_with_non_finite_numbers_are_refused_by_the_agent_link():
    from control.agent.link import strict_json

    assert strict_json('{"a": 1.5, "b": [1, 2]}') == {"a": 1.5, "b": [1, 2]}
    for text in ('{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1e400}'):
        with pytest.raises(ValueError):
            strict_json(text)


def test_the_cli_refuses_a_default_policy_beyond_its_bounds_and_a_bad_saved_override(profile_path, tmp_path, capsys):
    from control.cli import main
    from tests.service.conftest import free_port

    def cli(*args):
        rc = main(["control-plane", "--profile", str(profile_path), "--port", str(free_port()), *args])
        return rc, capsys.readouterr().err.strip()

    rc, err = cli("--policy", "static-schedule:maxconc=64", "--max-batch", "32")
    assert rc == 2 and "--policy 'static-schedule:maxconc=64': max_concurrency 64 is above" in err and "\n" not in err
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"schema": "specctl.service-state/v1", "version": 4,
                                 "overrides": {"policy": "static-schedule:1=4,64=1"}}))
    rc, err = cli("--max-batch", "32", "--state", str(state))
    assert rc == 2 and f"state file '{state}': saved override policy" in err and "batch size 64" in err
