"""The short-context switch-off baseline (control/bench/switchoff.py): the switch-off point is where
speculating at k stops beating no speculation under the cost model, and the policy it names runs k up
to that batch and nothing above it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from control.bench.switchoff import (
    breakeven_batch,
    decode_ctx,
    kv_batch_reach,
    residence_need,
    short_context_switch_off,
)
from control.bench.workloads import Workload, workloads_dir
from control.errors import ConfigError
from control.goodput.acceptance import chain_expected
from control.goodput.stepcost import uniform_step_ms
from control.plan import compile_plan
from control.policy import build_policy
from control.policy.types import StepView
from tests.conftest import make_profile


def _gain(cost, b, ctx, acc, k):
    return chain_expected(acc, k) / uniform_step_ms(cost, b, ctx, k) - 1.0 / uniform_step_ms(cost, b, ctx, 0)


def test_breakeven_is_the_last_batch_where_k_pays():
    prof = make_profile(max_batch=512)
    cost = prof.step_cost(["draft"])
    n = breakeven_batch(cost, 256, 0.7, 3, 512)
    assert n is not None and 1 <= n < 512
    assert _gain(cost, n, 256, 0.7, 3) > 0 >= _gain(cost, n + 1, 256, 0.7, 3)
    # a deeper draft stops paying at a smaller batch; a better draft later
    assert breakeven_batch(cost, 256, 0.7, 5, 512) < n < breakeven_batch(cost, 256, 0.75, 3, 512)


def test_breakeven_edges():
    cost = make_profile().step_cost(["draft"])
    assert breakeven_batch(cost, 256, 0.7, 3, 2) is None  # pays at every batch up to 2
    assert breakeven_batch(cost, 256, 0.01, 3, 64) == 0  # a draft nobody accepts never pays
    with pytest.raises(ConfigError, match="k >= 1"):
        breakeven_batch(cost, 256, 0.7, 0, 64)


def test_baseline_policy_speculates_up_to_n_and_is_off_above():
    prof = make_profile(max_batch=512)
    so = short_context_switch_off(prof, 256, 0.7)
    assert so.k >= 1 and so.max_concurrency is not None and so.max_concurrency < 512
    assert so.spec == f"static-schedule:{so.max_concurrency}={so.k}"
    policy = build_policy(so.spec, compile_plan(prof, max_k=8))
    for n, want in ((1, so.k), (so.max_concurrency, so.k), (so.max_concurrency + 1, 0)):
        view = StepView(slots=np.arange(n), request_ids=np.arange(n), ctx_lens=np.full(n, 256),
                        remaining=np.full(n, 100), k_cap=np.full(n, 8), drafter=np.full(n, -1),
                        draft_lag=np.zeros((n, 2), dtype=np.int64), free_kv_slots=1 << 30, token_budget=1 << 20,
                        max_k=8, drafters=("draft", "ngram"))
        assert np.all(policy.decide(view).k == want), n


def test_baseline_spec_when_it_never_switches_off():
    prof = make_profile(max_batch=4)
    so = short_context_switch_off(prof, 256, 0.7)
    assert so.max_concurrency is None and so.spec == f"fixed:{so.k}"


def test_workload_context_and_kv_reach():
    w = Workload("t", arrival_s=np.array([0.0, 1.0]), prompt_tokens=np.array([100, 1000]),
                 output_tokens=np.array([10, 30]), category=np.array([-1, -1]))
    # steps: 10 at ctx 100..109 and 30 at ctx 1000..1029
    assert decode_ctx(w) == pytest.approx((np.arange(100, 110).sum() + np.arange(1000, 1030).sum()) / 40)
    assert residence_need(w) == pytest.approx((110 * 10 + 1030 * 30) / 40)
    assert kv_batch_reach(make_profile(max_batch=256, kv_tokens=8000), w) == pytest.approx(8000 / residence_need(w))
    assert kv_batch_reach(make_profile(max_batch=4, kv_tokens=8000), w) == 4


@pytest.mark.skipif(not (workloads_dir() / "mooncake_fast25").is_dir() or not (workloads_dir() / "sharegpt").is_dir(),
                    reason="shared workloads folder absent (set SPECCTL_WORKLOADS)")
def test_survey_runs_as_a_script_and_names_the_committed_profile_as_reaching_the_switch_off(tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SPECCTL_WORKLOADS"] = str(workloads_dir())
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "sim_switch_off.py"), "--survey"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    row = [ln for ln in out.stdout.splitlines() if ln.startswith("| h200 | llama-3.1-70b + eagle3-llama-3.1-70b | 8 | fp8 |")]
    assert len(row) == 1 and row[0].rstrip().endswith("| yes | yes |"), out.stdout
    # the 8B pair on the H100 (the bar's profile) never switches off at a short context
    assert any(ln.startswith("| h100 | llama-3.1-8b + llama-3.2-1b | 1 | bf16 |") and "| no | no |" in ln
               for ln in out.stdout.splitlines())
