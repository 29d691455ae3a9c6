"""``specctl bench --workload FILE --qps``: your own trace, absolute rates, against the live deployment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from control.bench.report import load_json
from tests.e2e.conftest import TOKEN

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _bench(dep, workload: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "control", "bench", "--url", f"grpc://{dep.grpc_url}", "--http-url", dep.http_url,
           "--control-url", dep.control_url, "--token", TOKEN, "--requests", "5", "--policies", "none",
           "--capacity", "10", "--max-tokens", "12", "--warmup-requests", "0", "--workload", str(workload),
           "--json", str(out), *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)


def test_bench_replays_a_workload_file_at_absolute_qps(deployment, tmp_path):
    trace = tmp_path / "mine.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 0.1 * i, "input_tokens": 20 + 5 * i, "output_tokens": 8 + i}) + "\n"
                             for i in range(5)))
    out = tmp_path / "b.json"
    r = _bench(deployment, trace, out, "--qps", "2,5")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = load_json(out)
    assert sorted(row["load"] for row in doc["results"]) == [0.2, 0.5]  # 2 and 5 req/s of capacity 10
    assert doc["meta"]["qps"] == "2,5" and all(d["completed"] == 5 and d["failed"] == 0 for d in doc["details"])


def test_bench_names_the_bad_row_of_a_workload_file(deployment, tmp_path):
    trace = tmp_path / "bad.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n0.5,ten,5\n")
    r = _bench(deployment, trace, tmp_path / "b.json", "--loads", "0.5")
    assert r.returncode != 0 and "line 3: input_tokens = 'ten'" in r.stderr and "Traceback" not in r.stderr
