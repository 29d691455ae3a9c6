"""Capacity = the highest Poisson rate whose queue stays bounded; rows measure past the ramp-up."""

from __future__ import annotations

import numpy as np

from control.bench.simrun import (
    SERIES_WINDOWS,
    SimSetup,
    measure_capacity,
    poisson_probe,
    result_row,
    run_policy,
    saturated_throughput,
    steady_window,
)
from control.bench.workloads import poisson
from tests.conftest import make_profile


def _thirds(setup, rate, n):
    res = run_policy(setup, poisson_probe(setup.workload, rate, n, 1), "none", 1)
    lat = res.finish_s - res.arrival_s
    return [float(x.mean()) for x in np.array_split(lat, 3)]


def test_capacity_is_where_the_queue_stops_being_bounded():
    setup = SimSetup(make_profile(), poisson(2000, 1.0, "lognormal:400:300", "lognormal:150:100", seed=3))
    cap = measure_capacity(setup, requests=3000)
    # the old measure (everyone at t = 0, full prefill batches) overstates what arrivals sustain
    assert cap < 0.97 * saturated_throughput(setup)
    # below capacity the latency is stationary over a run three times the probe's length ...
    a = _thirds(setup, 0.9 * cap, 9000)
    assert a[2] < 1.15 * a[1], a
    # ... above it, it keeps growing
    b = _thirds(setup, 1.15 * cap, 9000)
    assert b[2] > 1.3 * b[1] and b[1] > 1.3 * b[0], b


def test_rows_measure_the_window_after_the_ramp_up():
    setup = SimSetup(make_profile(), poisson(1000, 1.0, "lognormal:400:300", "lognormal:150:100", seed=3))
    w = poisson_probe(setup.workload, 5.0, 1000, 0)
    res = run_policy(setup, w, "fixed:3", 0)
    row = result_row(setup, res, 0.5, 0, None)
    t0, t1 = steady_window(res.arrival_s)
    inside = res.arrival_s >= t0
    assert row["extra"]["requests"] == 1000 and row["extra"]["completed"] == int(inside.sum()) < 1000
    assert row["mean_latency_s"] == round(float((res.finish_s - res.arrival_s)[inside].mean()), 6) or \
        abs(row["mean_latency_s"] - float((res.finish_s - res.arrival_s)[inside].mean())) < 1e-6
    assert row["goodput_tok_s"] == float(res.output_tokens.sum()) / res.busy_s or \
        abs(row["goodput_tok_s"] / (float(res.output_tokens.sum()) / res.busy_s) - 1) < 1e-6
    wins = row["extra"]["windows"]
    assert len(wins) == SERIES_WINDOWS and sum(x["requests"] for x in wins) == 1000
    assert row["extra"]["measured_window_s"][1] == round(t1, 3)
