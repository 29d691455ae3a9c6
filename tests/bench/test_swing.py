"""Time-varying traces (control/bench/swing.py): the rate and acceptance swing per segment, and the
per-segment table picks the best static configuration in hindsight in each segment."""

from __future__ import annotations

import numpy as np
import pytest

from control.bench.swing import alternate_phases, drifting_rates, segment_latency, segment_table, swing_rate
from control.bench.workloads import poisson
from control.errors import ConfigError
from control.executors.sim import SimResult


def test_each_segment_runs_at_its_level_and_keeps_the_trace():
    base = poisson(4000, 2.0, "lognormal:200:100", "64", seed=1)
    sw = swing_rate(base, [1.0, 4.0], 200.0)
    w = sw.workload
    assert np.array_equal(w.prompt_tokens, base.prompt_tokens) and np.array_equal(w.output_tokens, base.output_tokens)
    assert (np.diff(w.arrival_s) >= 0).all() and (np.diff(sw.segment) >= 0).all()
    counts = np.bincount(sw.segment)
    for s in range(sw.segments - 1):  # the last segment is cut short by the end of the trace
        assert counts[s] / 200.0 == pytest.approx(sw.level(s), rel=0.15)
    assert sw.level(0) == 1.0 and sw.level(1) == 4.0 and sw.level(2) == 1.0


def test_acceptance_drifts_with_the_segment():
    base = poisson(3000, 2.0, "128", "64", seed=2)
    sw = swing_rate(base, [2.0], 150.0)
    rates = drifting_rates(np.zeros((base.n, 2)), sw, [0.9, 0.3], concentration=8.0)
    assert rates.shape == (base.n, 2) and (rates[:, 0] == rates[:, 1]).all()
    even = sw.segment % 2 == 0
    assert rates[even, 0].mean() == pytest.approx(0.9, abs=0.03)
    assert rates[~even, 0].mean() == pytest.approx(0.3, abs=0.03)


def _result(arrival, latency):
    arrival = np.asarray(arrival, dtype=np.float64)
    fin = arrival + np.asarray(latency, dtype=np.float64)
    n = arrival.size
    return SimResult(arrival, arrival, fin, np.ones(n, dtype=np.int64), np.ones(n, dtype=np.int64))


def test_segment_table_takes_the_best_static_per_segment_and_over_the_trace():
    base = poisson(400, 2.0, "128", "64", seed=3)
    sw = swing_rate(base, [1.0, 3.0], 50.0)
    seg = sw.segment
    t = sw.workload.arrival_s
    runs = {"none": _result(t, np.where(seg % 2 == 0, 2.0, 1.0)),  # best at high load
            "fixed:3": _result(t, np.where(seg % 2 == 0, 1.0, 3.0)),  # best at low load
            "adaptive": _result(t, np.where(seg % 2 == 0, 1.0, 1.0))}
    rows = segment_table(runs, sw, "adaptive", ["none", "fixed:3"])
    per = {r["segment"]: r for r in rows}
    assert per[0]["best_static"] == "fixed:3" and per[1]["best_static"] == "none"
    assert all(r["ratio"] == pytest.approx(1.0) for r in rows if r["segment"] != "all")
    whole = per["all"]
    assert whole["ratio"] < 1.0 and whole["best_static"] in ("none", "fixed:3")
    assert segment_latency(runs["none"], sw)[0] == pytest.approx(2.0)
    # switching per segment to the best static there: 1.0 s everywhere, below the best single one
    assert whole["switching_s"] == pytest.approx(1.0) and whole["switching_ratio"] < 1.0
    assert whole["switching_ratio"] == pytest.approx(1.0 / whole["best_static_s"])


def test_segment_table_names_each_segments_acceptance_when_it_drifts():
    base = poisson(300, 2.0, "128", "64", seed=5)
    sw = swing_rate(base, [1.0, 3.0], 40.0)
    t = sw.workload.arrival_s
    runs = {"none": _result(t, np.ones(base.n)), "adaptive": _result(t, np.ones(base.n))}
    rows = segment_table(runs, sw, "adaptive", ["none"], acceptance=[0.35, 0.35, 0.9, 0.9])
    per = {r["segment"]: r for r in rows}
    assert [per[s]["acceptance"] for s in range(4)] == [0.35, 0.35, 0.9, 0.9]
    assert [per[s]["rate_req_s"] for s in range(4)] == [1.0, 3.0, 1.0, 3.0]
    assert per["all"]["acceptance"] is None
    assert all(r["acceptance"] is None for r in segment_table(runs, sw, "adaptive", ["none"]))


def test_bad_inputs_name_the_value():
    base = poisson(50, 2.0, "128", "64", seed=4)
    with pytest.raises(ConfigError, match="swing rates"):
        swing_rate(base, [1.0, -2.0], 10.0)
    with pytest.raises(ConfigError, match="segment length"):
        swing_rate(base, [1.0], 0.0)
    sw = swing_rate(base, [1.0], 10.0)
    with pytest.raises(ConfigError, match="acceptance means"):
        drifting_rates(np.zeros((base.n, 1)), sw, [1.2], 8.0)


def test_alternating_phases_take_each_segments_requests_in_order_from_its_workload_at_its_rate():
    short = poisson(3000, 2.0, "100", "50", seed=6)
    long = poisson(3000, 1.0, "8000", "300", seed=7)
    sw = alternate_phases([short, long], [3.0, 0.5], 100.0, 1200)
    w = sw.workload
    assert w.n == 1200 and (np.diff(w.arrival_s) > 0).all() and (np.diff(sw.segment) >= 0).all()
    assert sw.segments > 4 and (np.floor(w.arrival_s / 100.0) == sw.segment).all()
    even = sw.segment % 2 == 0
    assert (w.prompt_tokens[even] == 100).all() and (w.prompt_tokens[~even] == 8000).all()
    assert (w.output_tokens[~even] == 300).all()
    counts = np.bincount(sw.segment)
    for s in range(sw.segments - 1):  # the last segment is cut short by the request count
        assert counts[s] / 100.0 == pytest.approx(sw.level(s), rel=0.3), (s, counts[s])
    assert sw.level(0) == 3.0 and sw.level(1) == 0.5
    # each phase's requests follow one another: the long phase's come from the start of its workload
    assert int((~even).sum()) < long.n and w.notes["phase_rates_req_s"] == [3.0, 0.5]


def test_alternating_phases_refuse_what_they_cannot_build():
    a, b = poisson(50, 2.0, "128", "64", seed=8), poisson(50, 2.0, "900", "64", seed=9)
    with pytest.raises(ConfigError, match="at least two"):
        alternate_phases([a], [1.0], 10.0, 10)
    with pytest.raises(ConfigError, match="one finite rate"):
        alternate_phases([a, b], [1.0], 10.0, 10)
    with pytest.raises(ConfigError, match="ran out of requests"):
        alternate_phases([a, b], [1.0, 1.0], 10.0, 200)
    with pytest.raises(ConfigError, match="no arrival in"):
        alternate_phases([a, b], [1e-9, 1e-9], 1.0, 10)


@pytest.mark.parametrize("pair,sku", [("a100-7b", "a100/llama-2-7b+llama-160m"),
                                      ("h100-8b", "h100/llama-3.1-8b+llama-3.2-1b")])
def test_adaptive_swing_script_prints_per_segment_rows(tmp_path, pair, sku):
    """benchmarks/adaptive_swing.py runs as documented on a small Poisson trace, on the --pair's
    profile, and writes its rows with each segment's acceptance level."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, str(root / "benchmarks" / "adaptive_swing.py"), "--workload",
                        "poisson:in=128,out=32", "--capacity", "4.0", "--levels", "0.3,0.9", "--segment-s", "20",
                        "--requests", "120", "--acceptance-levels", "0.9,0.3", "--static", "none,fixed:2",
                        "--policies", "adaptive", "--pair", pair, "--seeds", "2", "--json", str(tmp_path / "swing.json")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads((tmp_path / "swing.json").read_text())
    rows, by_seed = out["adaptive"], out["adaptive_by_seed"]
    # each seed draws its own acceptance outcomes and per-request rates on the same arrivals
    assert out["seeds"] == 2 and by_seed[0] == rows[-1] and by_seed[0]["policy"] != by_seed[1]["policy"]
    mean = (by_seed[0]["ratio"] + by_seed[1]["ratio"]) / 2
    assert f"({mean:.3f} over 2 seeds, per seed {by_seed[0]['ratio']:.3f} / {by_seed[1]['ratio']:.3f}" in p.stdout
    assert rows[-1]["segment"] == "all" and rows[-1]["requests"] == 120
    assert {r["best_static"] for r in rows} <= {"none", "fixed:2"}
    assert "adaptive / best static" in p.stdout and "bar (adaptive" in p.stdout
    assert p.stdout.startswith(f"profile {sku};")
    assert [r["acceptance"] for r in rows[:2]] == [0.9, 0.3] and rows[-1]["switching_ratio"] <= 1.0


def test_adaptive_swing_script_alternates_phases(tmp_path):
    """``--phase`` twice: each workload arrives in every other segment at its level of its own capacity."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, str(root / "benchmarks" / "adaptive_swing.py"), "--phase", "poisson:in=128,out=32",
           "--phase", "poisson:in=4000,out=32", "--capacity", "8.0,2.0", "--levels", "0.5", "--segment-s", "20",
           "--requests", "160", "--static", "none,fixed:2", "--policies", "adaptive", "--pair", "h100-8b",
           "--json", str(tmp_path / "swing.json")]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads((tmp_path / "swing.json").read_text())
    rows = out["adaptive"]
    assert out["capacity_req_s"] == [8.0, 2.0] and rows[-1]["requests"] == 160
    assert [r["rate_req_s"] for r in rows[:2]] == [4.0, 1.0]
    bad = subprocess.run(cmd[:-2] + ["--capacity", "8.0"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "one --capacity per phase" in bad.stderr
