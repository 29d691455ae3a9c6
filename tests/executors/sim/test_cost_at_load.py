"""Cost terms that make speculation stop paying at load: batch-expansion verification, host time
per sequence and per token, and the crossover they move (SmartSpec Fig. 1)."""

from __future__ import annotations

import numpy as np
import pytest

from control.bench.acceptance import AcceptanceTable
from control.bench.simrun import SimSetup, crossover_rate, run_policy, workload_at
from control.bench.workloads import poisson
from control.buildsys.catalog import get_model, get_sku
from control.buildsys.roofline import StepTimes, get_framework, roofline_profile, scaled_framework
from control.errors import ConfigError
from control.executors.sim import SimConfig

FIXED_07 = AcceptanceTable({
    "schema": "specctl.acceptance/v1",
    "families": {"chat": {"drafters": {"draft_model": {
        "mean": 0.7, "concentration": 1e6, "decay": 1.0, "source": "test: fixed 0.7"}}}},
})


def test_paper_shapes_are_in_the_catalog():
    # Vicuna-33B v1.3 is LLaMA-1 33B: 32.5B parameters; Vicuna-13B v1.5 is Llama-2-13B: 13.0B
    assert get_model("vicuna-33b").params / 1e9 == pytest.approx(32.5, abs=0.1)
    assert get_model("vicuna-13b").params / 1e9 == pytest.approx(13.0, abs=0.1)
    assert get_model("vicuna-7b").params == get_model("llama-2-7b").params
    # SmartSpec Fig. 11's 70B target: Llama-2-70B, 69.0B parameters, GQA with 8 KV heads
    assert get_model("llama-2-70b").params / 1e9 == pytest.approx(69.0, abs=0.1)
    assert get_model("llama-2-70b").kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2


def test_batch_expansion_reads_the_kv_once_per_verified_token():
    mqa = StepTimes("h100", "llama-2-7b", framework="vllm-mqa")
    exp = StepTimes("h100", "llama-2-7b", framework="vllm")
    # plain decoding is the same either way; verifying 3 tokens costs more with expansion, and the
    # extra grows with context (it is KV reads)
    assert float(exp.target_ms(50, 1000, 1)) == pytest.approx(float(mqa.target_ms(50, 1000, 1)))
    d_short = float(exp.target_ms(50, 128, 3) - mqa.target_ms(50, 128, 3))
    d_long = float(exp.target_ms(50, 2048, 3) - mqa.target_ms(50, 2048, 3))
    assert 0 < d_short < d_long
    # TurboSpec Fig. 2: vLLM, H100, Llama-2-7B, B = 50, k = 2 step 12.6 ms; without expansion the
    # roofline found 9.25 ms (0.73)
    st = StepTimes("h100", "llama-2-7b", framework="vllm", draft="llama-160m")
    assert float(st.target_ms(50, 128, 3) + 2 * st.draft_ms(50, 128)) == pytest.approx(12.6, rel=0.25)


def test_expanded_copies_read_the_kv_at_the_measured_share():
    """Copies after a request's first read its KV at REREAD_SHARE of an HBM read (measured on an H100,
    benchmarks/verify_reread.py), in the roofline, in the profile's cost model and in the simulator."""
    from dataclasses import replace

    from control.buildsys.roofline import REREAD_SHARE, StepTimes

    assert 0.0 < REREAD_SHARE < 1.0
    mqa = StepTimes("h100", "llama-2-7b", framework="vllm-mqa")
    shared = StepTimes("h100", "llama-2-7b", framework="vllm")
    full = StepTimes("h100", "llama-2-7b", framework=replace(get_framework("vllm"), reread_share=1.0))
    extra_full = float(full.target_ms(32, 2048, 4) - mqa.target_ms(32, 2048, 4))
    extra = float(shared.target_ms(32, 2048, 4) - mqa.target_ms(32, 2048, 4))
    assert extra == pytest.approx(REREAD_SHARE * extra_full, rel=0.02)  # KV-bound: the share scales it
    prof = roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework="vllm")
    assert prof.expansion_reread_share == REREAD_SHARE
    assert prof.step_cost().target.reread_share == REREAD_SHARE
    assert SimSetup(prof, poisson(10, 1.0), table=FIXED_07).config(0).reread_share == REREAD_SHARE
    # the share is the SKU's where measured (an H200's HBM is faster, its L2 not), else the H100's
    h200 = roofline_profile("h200", "llama-2-7b", ["llama-160m"], framework="vllm")
    assert h200.expansion_reread_share == get_sku("h200").measured_reread_share > REREAD_SHARE
    # a profile written before the share was recorded keeps charging full reads
    del prof.environment["framework"]["reread_share"]
    assert prof.expansion_reread_share == 1.0 and prof.step_cost().target.reread_share == 1.0


def test_vllm_host_time_lands_in_the_profile_and_the_sim():
    fw = get_framework("vllm")
    prof = roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework="vllm")
    assert prof.models["target"].d_ms_per_request == pytest.approx(fw.host_seq_us / 1000.0)
    assert prof.models["llama-160m"].d_ms_per_request == 0.0  # draft passes prepared on the GPU
    prep = roofline_profile("a100", "llama-2-7b", ["llama-160m"],
                            framework=scaled_framework("vllm", draft_host_prep=True))
    assert prep.models["llama-160m"].d_ms_per_request == pytest.approx(fw.host_seq_us / 1000.0)
    setup = SimSetup(prof, poisson(10, 1.0), table=FIXED_07)
    cfg = setup.config(0)
    assert cfg.verify_expansion and cfg.host_token_ms == pytest.approx(fw.host_token_us / 1000.0)
    trt = SimSetup(roofline_profile("a100", "llama-2-7b", ["llama-160m"]), poisson(10, 1.0), table=FIXED_07)
    assert not trt.config(0).verify_expansion and trt.config(0).host_token_ms == 0.0
    with pytest.raises(ConfigError, match="host_scale"):
        scaled_framework("vllm", -1.0)


def test_a_drafts_host_time_is_paid_per_prompt_in_its_prefill_not_per_token():
    """The profile folds a draft's per-request term into its per-token one for decode passes (one
    token per request); the draft's prefill must still pay it once per prompt."""
    from dataclasses import replace

    w = poisson(1, 1.0, "517", "100", seed=0)
    ttft = {}
    for on in (True, False):
        prof = roofline_profile("a100", "llama-2-7b", ["llama-160m"],
                                framework=scaled_framework("vllm", draft_host_prep=on))
        r = run_policy(SimSetup(prof, w, table=FIXED_07), replace(w), "fixed:3", 0)
        ttft[on] = float(r.first_token_s[0] - r.arrival_s[0])
    assert ttft[True] - ttft[False] == pytest.approx(get_framework("vllm").host_seq_us / 1e6, rel=1e-3)


def _speedup(setup, rate, spec, n=300):
    w = workload_at(setup, rate, n, 0)
    base = run_policy(setup, w, "none", 0)
    res = run_policy(setup, w, spec, 0)
    return float(np.mean(base.finish_s - base.arrival_s) / np.mean(res.finish_s - res.arrival_s))


def test_expansion_makes_long_drafts_stop_paying_at_smartspec_load():
    """SmartSpec Fig. 1 (A100, 7B + 160M, acceptance 0.7, 128/128): k = 5 pays at 4 req/s and stops
    paying past ~12 req/s (here 14; below 1 by 20). With multi-query verification it still pays at 20."""
    base = poisson(300, 1.0, "128", "128", seed=0)
    vllm = SimSetup(roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework="vllm"), base, table=FIXED_07)
    mqa = SimSetup(roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework="vllm-mqa"), base,
                   table=FIXED_07)
    assert _speedup(vllm, 4.0, "fixed:5") > 1.2
    assert _speedup(vllm, 20.0, "fixed:5") < 1.0
    assert _speedup(mqa, 20.0, "fixed:5") > 1.0


def test_crossover_rate_interpolates_and_says_none():
    assert crossover_rate([4, 8, 12], [1.5, 1.2, 0.8]) == pytest.approx(8 + 0.2 / 0.4 * 4)
    assert crossover_rate([4, 8], [1.5, 1.2]) is None
    assert crossover_rate([4, 8], [0.9, 0.8]) == 4.0
    with pytest.raises(ConfigError, match="2 rates for 1 speedups"):
        crossover_rate([4, 8], [1.0])


def _run_on(w, spec: str, host_ms: float):
    from control.executors.sim import AcceptanceProcess, SimConfig, SimEngine
    from control.plan import compile_plan
    from control.policy import build_policy
    from tests.conftest import make_profile

    prof = make_profile()
    proc = AcceptanceProcess(np.full((w.n, 1), 0.7), np.ones(1), np.array([np.nan]), 4, 0)
    cfg = SimConfig(max_batch=64, kv_tokens=1 << 30, max_k=4, host_token_ms=host_ms)
    eng = SimEngine(prof.step_cost(["draft"]), ("draft",), w.arrival_s, w.prompt_tokens, w.output_tokens, proc, cfg)
    return eng.run(build_policy(spec, compile_plan(prof, max_k=4)))


def test_host_time_is_charged_alike_on_the_fast_path_and_step_by_step():
    """`none` jumps over plain steps in closed form; with host time per token it must still equal
    stepping one by one (fixed:0). A request served alone takes exactly its tokens' host time longer."""
    from dataclasses import replace

    w = poisson(200, 30.0, "lognormal:300:200", "lognormal:60:40", seed=5)
    a, b = _run_on(w, "none", 0.05), _run_on(w, "fixed:0", 0.05)
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=1e-9)
    assert a.busy_s == pytest.approx(b.busy_s, rel=1e-9)
    assert a.busy_s > _run_on(w, "none", 0.0).busy_s
    far = replace(w, arrival_s=np.arange(w.n) * 100.0)
    host, plain = _run_on(far, "none", 0.05), _run_on(far, "none", 0.0)
    np.testing.assert_allclose((host.finish_s - host.arrival_s) - (plain.finish_s - plain.arrival_s),
                               0.05e-3 * far.output_tokens, rtol=1e-6)
    with pytest.raises(ConfigError, match="host_token_ms"):
        SimConfig(host_token_ms=-1.0)


def test_host_time_counts_every_generated_token_with_chunked_prefill():
    """Alone, a request costs its tokens' host time more, first token included, chunked or not."""
    from dataclasses import replace

    from control.executors.sim import AcceptanceProcess, SimEngine
    from control.plan import compile_plan
    from control.policy import build_policy
    from tests.conftest import make_profile

    prof = make_profile()
    w = poisson(20, 1.0, "lognormal:3000:1000", "lognormal:40:20", seed=6)
    w = replace(w, arrival_s=np.arange(w.n) * 100.0)

    def run(host_ms):
        proc = AcceptanceProcess(np.full((w.n, 1), 0.7), np.ones(1), np.array([np.nan]), 4, 0)
        cfg = SimConfig(max_batch=8, kv_tokens=1 << 30, token_budget=1024, max_k=4, chunked_prefill=True,
                        host_token_ms=host_ms)
        eng = SimEngine(prof.step_cost(["draft"]), ("draft",), w.arrival_s, w.prompt_tokens, w.output_tokens,
                        proc, cfg)
        return eng.run(build_policy("fixed:2", compile_plan(prof, max_k=4)))

    host, plain = run(0.05), run(0.0)
    np.testing.assert_allclose((host.finish_s - host.arrival_s) - (plain.finish_s - plain.arrival_s),
                               0.05e-3 * w.output_tokens, rtol=1e-6)



def test_the_policy_prices_batch_expansion_as_the_simulator_charges_it(monkeypatch):
    """The cost model a policy plans with (the profile's step cost) predicts every verify pass the
    simulator charges under batch expansion, to rounding: the KV read per verified draft token and
    the expanded sequences' host time. vLLM's host time per generated token (output processing) comes
    after the pass: in the step's total, not in its verify time, which an online refit of the
    target's cost reads. (The policies' cost model has no term for it: it scales with the tokens a
    step yields, so it does not move the best k.)"""
    from control.bench import simrun
    from control.policy import build_policy

    prof = roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework="vllm")
    cost = prof.step_cost()
    assert cost.target.expanded and cost.target.d > 0
    assert not roofline_profile("a100", "llama-2-7b", ["llama-160m"]).step_cost().target.expanded
    setup = SimSetup(prof, poisson(60, 20.0, prompt="uniform:64:900", output="40", seed=3), table=FIXED_07)
    seen = []

    class Recorder:  # the real fixed-k policy, its outcomes kept
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def observe(self, outcome):
            seen.append(outcome)
            self.inner.observe(outcome)

    monkeypatch.setattr(simrun, "make_policy",
                        lambda spec, plan, engine, seed, price=None: Recorder(build_policy(spec, plan, seed=seed)))
    run_policy(setup, setup.workload, "fixed:3", 0)
    steps = [o for o in seen if o.n and o.verified.any()]
    assert len(steps) > 20
    host = setup.host_token_ms
    assert host > 0
    for o in steps:
        assert o.verify_ms == pytest.approx(cost.verify_ms(o.ctx_lens.astype(np.float64), o.verified), rel=1e-9)
        if not o.finished.size:  # every request generated accepted + 1 tokens
            host_ms = o.total_ms - o.draft_ms - o.verify_ms
            assert host_ms == pytest.approx(host * float((o.accepted + 1).sum()), rel=1e-9)
    # the optimiser's marginal slot costs add up to the same pass: plain + slots = verify_ms
    ctx, k = np.array([100.0, 700.0]), np.array([3, 1])
    vb, va = cost.verify_slots(ctx)
    slots = sum(vb[i] + va * j for i in range(2) for j in range(k[i]))
    assert cost.plain_ms(ctx) + slots == pytest.approx(cost.verify_ms(ctx, k), rel=1e-12)


BAD_FRAMEWORK_VALUES = [  # (field, bad value, what the error says is accepted, what reads it later)
    *[("reread_share", bad, r"must be a number in \[0, 1\]", lambda p: p.step_cost()) for bad in ("most", -0.1, 1.5, True)],
    *[("plain_chunk_budget", bad, r"must be an integer >= 0", lambda p: SimSetup(p, poisson(4, 1.0)).config(0))
      for bad in ("512", -1, 1.5, True)],
]


@pytest.mark.parametrize("field,bad,accepted,use", BAD_FRAMEWORK_VALUES)
def test_a_profile_with_a_bad_framework_value_says_which_value_and_what_is_accepted(field, bad, accepted, use, tmp_path):
    """A hand-edited framework value fails where the file is loaded, naming the file, the value and what
    is accepted, and so does a profile edited in memory where the value is read."""
    from control.profile import load_profile

    prof = roofline_profile("h100", "llama-3.1-70b", ["llama-3.2-1b"], tp=4, framework="vllm-0.6")
    prof.environment["framework"][field] = bad
    path = tmp_path / "p.yaml"
    path.write_text(prof.to_yaml())
    with pytest.raises(ConfigError, match=rf"p.yaml.*{field} = .*{accepted}"):
        load_profile(path)
    with pytest.raises(ConfigError, match=rf"{field} = .*{accepted}"):
        use(prof)
