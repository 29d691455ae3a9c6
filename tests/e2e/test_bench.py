"""``specctl bench`` against the live deployment: policies switched through the override API,
rows in the simulator's specctl.bench/v1 schema, the report tool reads them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from control.bench.report import load_json
from tests.e2e.conftest import TOKEN

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_bench_switches_policies_and_writes_the_bench_schema(deployment, tmp_path):
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    cmd = [sys.executable, "-m", "control", "bench", "--url", f"grpc://{deployment.grpc_url}", "--http-url",
           deployment.http_url, "--control-url", deployment.control_url, "--token", TOKEN, "--requests", "6",
           "--loads", "1.0", "--policies", "none,fixed:2", "--capacity", "20", "--max-tokens", "16",
           "--warmup-requests", "2", "--json", str(out), "--report", str(md)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    # four runs (two warm-ups) on one event loop: no closed loop handed grpc's late events
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    doc = load_json(out)
    rows = {row["policy"]: row for row in doc["results"]}
    assert set(rows) == {"none", "fixed:2"}
    details = {d["policy"]: d for d in doc["details"]}
    assert all(d["completed"] == 6 and d["failed"] == 0 for d in details.values())
    assert rows["none"]["spec_step_share"] == 0 and details["none"]["client_drafted"] == 0
    assert rows["fixed:2"]["spec_step_share"] > 0 and details["fixed:2"]["client_drafted"] > 0
    assert max(i for i, c in enumerate(details["fixed:2"]["k_hist"]) if c) == 2  # k never above the plan's 2
    # Which drafter drafted: every drafting request-step counted once, on one of the pair's drafters.
    mix = details["fixed:2"]["drafter_steps"]
    assert sum(mix.values()) == sum(details["fixed:2"]["k_hist"][1:]) > 0
    assert sum(details["none"]["drafter_steps"].values()) == 0
    assert all(rows[p]["mean_latency_s"] > 0 and rows[p]["goodput_tok_s"] > 0 for p in rows)
    # Where the busy time went: every part measured, the step's parts within its total.
    for d in details.values():
        t = d["time_s"]
        assert set(t) == {"policy", "prefill", "draft", "verify", "deliver"}
        assert t["prefill"] > 0 and t["verify"] > 0 and t["deliver"] > 0
        assert t["policy"] + t["prefill"] + t["draft"] + t["verify"] <= d["busy_s"] * 1.001
    # no speculation: no draft passes (only the clock reads around an empty drafting loop)
    assert details["none"]["time_s"]["draft"] < 0.1 * details["fixed:2"]["time_s"]["draft"]
    assert doc["meta"]["capacity_req_s"] == 20
    assert doc["meta"]["output_lengths"] == "max_tokens exactly (ignore_eos)"  # the workload's lengths, by default
    assert doc["meta"]["warmup"].startswith("2 requests per policy")  # served, unmeasured: no rows of its own
    busiest = max(mix, key=mix.get)
    assert "drafters (% of drafting request-steps)" in md.read_text() and f" {busiest}:" in md.read_text()
    assert "| 1 | fixed:2 |" in md.read_text() and (tmp_path / "bench.latency.png").stat().st_size > 0
    # It cleaned up after itself: no override left behind.
    assert httpx.get(f"{deployment.control_url}/v1/overrides", timeout=5).json().get("policy") is None


def test_bench_refuses_a_wrong_token_in_one_line(deployment, tmp_path):
    cmd = [sys.executable, "-m", "control", "bench", "--url", deployment.grpc_url, "--http-url", deployment.http_url,
           "--control-url", deployment.control_url, "--token", "wrong-token-0123456789", "--requests", "2",
           "--capacity", "5", "--loads", "0.5", "--policies", "none"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "refused the token (401)" in r.stderr
    assert "Traceback" not in r.stderr
