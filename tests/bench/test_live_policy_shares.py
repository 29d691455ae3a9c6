"""The live bench's policy breakdown: the step loop's share and the overlap worker's, apart."""

from control.bench.live import TIME_KEYS, _delta, policy_shares
from control.commands.bench import _policy_note


def _stats(**times):
    base = {"busy_ms": 0.0, "decode_steps": 0, "spec_steps": 0, "step_verified": 0, "step_accepted": 0,
            "generated": 0, "completed": 0, "failed": 0, "cancelled": 0, "k_hist": [0] * 3}
    return {**base, **times}


def test_the_worker_time_is_diffed_and_reported_apart_from_the_loop_share():
    before = _stats(busy_ms=1000.0, policy_ms=10.0, policy_wait_ms=1.0, policy_worker_ms=50.0, policy_worker_cpu_ms=40.0)
    after = _stats(busy_ms=3000.0, policy_ms=70.0, policy_wait_ms=5.0, policy_worker_ms=350.0, policy_worker_cpu_ms=300.0)
    d = _delta(after, before)
    assert {"policy_wait_ms", "policy_worker_ms", "policy_worker_cpu_ms"} <= set(TIME_KEYS)
    assert (d["policy_ms"], d["policy_wait_ms"], d["policy_worker_ms"], d["policy_worker_cpu_ms"]) == (60.0, 4.0, 300.0, 260.0)
    shares = policy_shares(d)
    assert shares == {"policy_share": 0.03, "policy_worker_share": 0.15}
    assert _policy_note(shares) == ", policy 3.00% of busy time (off the critical path; worker 15.00%)"


def test_without_overlap_there_is_no_worker_share_and_without_busy_time_no_share():
    d = _delta(_stats(busy_ms=2000.0, policy_ms=200.0), _stats(busy_ms=0.0, policy_ms=0.0))
    assert "policy_worker_ms" not in d
    assert policy_shares(d) == {"policy_share": 0.1}
    assert _policy_note(policy_shares(d)) == ", policy 10.00% of busy time"
    assert policy_shares(_delta(_stats(policy_ms=1.0), _stats(policy_ms=1.0))) == {}
    assert _policy_note({}) == ""
