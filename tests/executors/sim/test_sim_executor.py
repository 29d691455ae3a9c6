"""The simulator behind the Executor protocol: the same run as ``SimEngine.run``, step by step."""

from __future__ import annotations

import re

import numpy as np
import pytest

from control.errors import ConfigError
from control.executors.base import Executor, FinishReason, KScope, SamplingParams
from control.executors.sim import AcceptanceProcess, SimConfig, SimEngine
from control.executors.sim.executor import SimExecutor, synthetic_tokens
from control.plan import compile_plan
from control.policy import build_policy
from tests.conftest import make_profile

I64 = np.int64
N = 12
MAX_K = 4


def _parts(n=N, rate=0.7, **cfg):
    prof = make_profile()
    proc = AcceptanceProcess(np.full((n, 1), rate), np.ones(1), np.array([np.nan]), MAX_K, seed=5)
    lim = dict(max_batch=4, kv_tokens=1 << 20, token_budget=512, max_k=MAX_K, seed=5)
    lim.update(cfg)
    return prof, prof.step_cost(["draft"]), proc, SimConfig(**lim)


def _lengths(n=N):
    rng = np.random.default_rng(1)
    return rng.integers(8, 40, n), rng.integers(5, 30, n)  # (n,) prompt, (n,) output


def _policy(spec="none"):
    return build_policy(spec, compile_plan(make_profile(), max_k=MAX_K))


def _drain(ex, stats: list | None = None) -> dict[int, list]:
    outs: dict[int, list] = {}
    while ex.has_work():
        for o in ex.step():
            outs.setdefault(o.request_id, []).append(o)
        if stats is not None:
            stats.append(ex.last_stats)
    return outs


@pytest.mark.parametrize("spec", ["fixed:3", "none", "adaptive"])
def test_stepping_the_executor_is_the_engines_run(spec):
    prof, cost, proc, cfg = _parts()
    prompt_len, out_len = _lengths()
    plan = compile_plan(prof, max_k=MAX_K)
    want = SimEngine(cost, ("draft",), np.zeros(N), prompt_len, out_len, proc, cfg).run(build_policy(spec, plan))
    ex = SimExecutor(cost, ("draft",), proc, cfg, capacity=N, policy=build_policy(spec, plan))
    assert isinstance(ex, Executor)
    ids = [ex.add_request(list(range(1, int(p) + 1)), SamplingParams(max_tokens=int(o))) for p, o in zip(prompt_len, out_len, strict=True)]
    assert ids == list(range(N))
    stats: list = []
    outs = _drain(ex, stats)
    assert all(len(st.drafter) == len(st.k) for st in stats)  # one drafter per request-step, beside its k
    assert sum(sum(st.k) for st in stats) == want.drafted and {d for st in stats for d in st.drafter} <= {0}
    assert ex.now == pytest.approx(float(np.nanmax(want.finish_s)), rel=1e-12)
    last = [outs[i][-1] for i in ids]
    assert all(o.finished and o.finish_reason == FinishReason.length for o in last)
    for i in ids:
        toks = [t for o in outs[i] for t in o.new_token_ids]
        assert toks == list(synthetic_tokens(i, 0, int(out_len[i]), ex.vocab)) and last[i].num_generated == out_len[i]
    assert sum(o.total_drafted for o in last) == want.verified
    assert sum(o.total_accepted for o in last) == want.accepted
    assert sum(o.drafted for i in ids for o in outs[i]) == want.verified  # per-step deltas add up
    if spec == "fixed:3":
        assert want.accepted > 0


def test_capabilities_and_virtual_clock():
    _, cost, proc, cfg = _parts()
    ex = SimExecutor(cost, ("draft",), proc, cfg, capacity=N, policy=_policy())
    caps = ex.capabilities
    assert caps.virtual_clock and caps.k_scope == KScope.per_request and caps.drafters == ("draft",)
    assert caps.max_k == MAX_K and caps.verify == cfg.verify and not caps.request_caps
    ex.add_request([1, 2, 3], SamplingParams(max_tokens=4))
    _drain(ex)
    t = ex.now
    assert t > 0 and ex.last_stats.total_ms > 0
    rid = ex.add_request([1, 2, 3], SamplingParams(max_tokens=4))  # arrives at the clock's time
    assert rid == 1 and ex.engine.arr[1] == t


def test_cancel_ends_a_request_and_frees_its_kv():
    _, cost, proc, cfg = _parts()
    ex = SimExecutor(cost, ("draft",), proc, cfg, capacity=N, policy=_policy("fixed:2"))
    a = ex.add_request([5] * 10, SamplingParams(max_tokens=200))
    b = ex.add_request([5] * 10, SamplingParams(max_tokens=6), stream=True)
    for _ in range(3):
        ex.step()
    assert ex.cancel(a) and not ex.cancel(a) and not ex.cancel(99)
    outs = _drain(ex)
    final = outs[a][-1]
    assert final.finished and final.finish_reason == FinishReason.cancelled and final.new_token_ids == ()
    assert final.num_generated < 200
    assert ex.free_kv_slots == cfg.kv_tokens and ex._run.kv.reserved == 0
    streamed = list(ex.stream(b, timeout=1))
    assert streamed[-1].finished and sum(len(o.new_token_ids) for o in streamed) == 6


@pytest.mark.parametrize(("prompt", "params", "message"), [
    ([], None, "prompt is empty"),
    ([1, 40000], None, "prompt token id 40000 is outside the vocabulary [0, 32000)"),
    ([1], SamplingParams(max_tokens=0), "max_tokens = 0"),
    ([1] * 100, SamplingParams(max_tokens=100), "exceeds the engine's max sequence length 150; shorten the prompt "
     "or lower max_tokens (at most 50 here)"),
    ([1] * 150, SamplingParams(max_tokens=10), "shorten the prompt to at most 140 tokens"),  # no max_tokens fits
    ([1] * 200, SamplingParams(max_tokens=150), "shorten the prompt and lower max_tokens below 150"),
])
def test_bad_requests_are_refused_naming_the_value(prompt, params, message):
    _, cost, proc, cfg = _parts(kv_tokens=150)
    ex = SimExecutor(cost, ("draft",), proc, cfg, capacity=N, policy=_policy())
    with pytest.raises(ConfigError, match=re.escape(message)):
        ex.add_request(prompt, params)
    assert not ex.has_work()


def test_the_run_holds_capacity_requests():
    _, cost, proc, cfg = _parts(n=2)
    with pytest.raises(ConfigError, match="capacity = 3: must be 1..2"):
        SimExecutor(cost, ("draft",), proc, cfg, capacity=3, policy=_policy())
    ex = SimExecutor(cost, ("draft",), proc, cfg, capacity=2, policy=_policy())
    ex.add_request([1], SamplingParams(max_tokens=2))
    ex.add_request([1], SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match="holds 2 requests"):
        ex.add_request([1], SamplingParams(max_tokens=2))
