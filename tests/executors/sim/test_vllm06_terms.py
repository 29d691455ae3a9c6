"""vLLM 0.6's terms as TurboSpec ran it (framework ``vllm-0.6``): async output processing for a
deployment without speculation only, and the host preparation of each step's first draft pass."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from control.bench.acceptance import AcceptanceTable
from control.bench.simrun import SimSetup, run_policy
from control.bench.workloads import poisson
from control.buildsys.roofline import get_framework, roofline_profile
from control.errors import ConfigError
from control.executors.sim import AcceptanceProcess, SimConfig, SimEngine
from control.plan import compile_plan
from control.policy import build_policy
from tests.conftest import make_profile

FIXED_07 = AcceptanceTable({
    "schema": "specctl.acceptance/v1",
    "families": {"chat": {"drafters": {"draft_model": {
        "mean": 0.7, "concentration": 1e6, "decay": 1.0, "source": "test: fixed 0.7"}}}},
})


def test_vllm06_is_vllm_plus_its_two_host_terms_and_carries_them_into_the_sim():
    fw, old = get_framework("vllm-0.6"), get_framework("vllm")
    assert fw.async_output and fw.draft_step_host_prep and not (old.async_output or old.draft_step_host_prep)
    assert (fw.verify_expansion, fw.host_seq_us, fw.host_token_us) == (old.verify_expansion, old.host_seq_us,
                                                                       old.host_token_us)
    prof = roofline_profile("h100", "llama-3.1-70b", ["llama-3.2-1b"], tp=4, framework="vllm-0.6")
    assert prof.verifies_by_expansion
    assert prof.models["target"].d_ms_per_request == pytest.approx(fw.host_seq_us / 1000.0)
    assert prof.models["llama-3.2-1b"].d_ms_per_request == 0.0  # only the first pass of a step: in the sim
    cfg = SimSetup(prof, poisson(10, 1.0), table=FIXED_07).config(0)
    assert cfg.output_async and cfg.draft_step_prep_ms == pytest.approx(fw.host_seq_us / 1000.0)
    assert cfg.host_token_ms == pytest.approx(fw.host_token_us / 1000.0)
    old = SimSetup(roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework="vllm"), poisson(10, 1.0),
                   table=FIXED_07).config(0)
    assert not old.output_async and old.draft_step_prep_ms == 0.0  # mid-2024 vLLM keeps its terms
    with pytest.raises(ConfigError, match="draft_step_prep_ms"):
        SimConfig(draft_step_prep_ms=-0.1)


def _alone(spec: str, **cfg_kw):
    """One request at a time (arrivals 100 s apart) on the test profile under ``spec``."""
    prof = make_profile()
    w = poisson(12, 1.0, "lognormal:300:100", "lognormal:60:30", seed=4)
    w = replace(w, arrival_s=np.arange(w.n) * 100.0)
    proc = AcceptanceProcess(np.full((w.n, 1), 0.7), np.ones(1), np.array([np.nan]), 4, 0)
    cfg = SimConfig(max_batch=8, kv_tokens=1 << 30, max_k=4, **cfg_kw)
    eng = SimEngine(prof.step_cost(["draft"]), ("draft",), w.arrival_s, w.prompt_tokens, w.output_tokens, proc, cfg)
    return w, eng.run(build_policy(spec, compile_plan(prof, max_k=4)))


def test_the_first_draft_pass_is_prepared_once_per_speculative_step_per_request():
    """Alone, a request pays the preparation once per step that drafts for it, whatever k is (the
    later passes advance on the GPU): k = 3 pays it as often as it has speculative steps, not 3x."""
    for k in (1, 3):
        _, plain = _alone(f"fixed:{k}")
        _, prep = _alone(f"fixed:{k}", draft_step_prep_ms=0.5)
        assert prep.spec_steps == plain.spec_steps > 0
        assert prep.busy_s - plain.busy_s == pytest.approx(0.5e-3 * plain.spec_steps, rel=1e-9)
    _, none_plain = _alone("none")
    _, none_prep = _alone("none", draft_step_prep_ms=0.5)
    assert none_prep.busy_s == pytest.approx(none_plain.busy_s, rel=1e-12)  # no draft, no preparation


def test_async_output_hides_output_processing_only_without_speculation():
    """Under ``none`` output processing shorter than the pass costs nothing; longer, only its excess
    over the pass. A speculating deployment (fixed k, k = 0 included) pays all of it."""
    _, base = _alone("none")
    _, small = _alone("none", host_token_ms=0.05, output_async=True)
    np.testing.assert_allclose(small.finish_s, base.finish_s, rtol=0, atol=1e-9)
    _, serial = _alone("none", host_token_ms=0.05)
    assert serial.busy_s > base.busy_s
    w, big = _alone("none", host_token_ms=100.0, output_async=True)
    lat = big.finish_s - big.arrival_s
    # every token's output processing (0.1 s) dominates its pass: the request takes about its tokens' host time
    assert np.all(lat >= 0.0999 * w.output_tokens) and np.all(lat <= 0.101 * w.output_tokens)
    _, spec_async = _alone("fixed:0", host_token_ms=0.05, output_async=True)
    _, spec_serial = _alone("fixed:0", host_token_ms=0.05)
    np.testing.assert_allclose(spec_async.finish_s, spec_serial.finish_s, rtol=1e-12)


def test_vllm06_terms_make_k1_stop_paying_at_the_70b_knee_not_at_low_load():
    """Llama-3.1-70B (TP 4) + Llama-3.2-1B, TurboSpec's ShareGPT lengths and acceptance 0.78 (the
    paper: k = 1 1.46x at QPS 1, 0.68x at QPS 16). On `vllm` k = 1 still pays about 1.2x at QPS 16
    (300 requests); with vLLM 0.6's terms (Org hides its output processing, k = 1 pays it and the
    draft's preparation) it loses there, and still pays over 1.3x at QPS 4."""
    table = AcceptanceTable({
        "schema": "specctl.acceptance/v1",
        "families": {"chat": {"drafters": {"draft_model": {
            "mean": 0.78, "concentration": 1e6, "decay": 1.0, "source": "TurboSpec Table 3"}}}},
    })
    base = poisson(300, 1.0, "lognormal:227:264", "lognormal:227:208", seed=0)

    def speedup(fw, rate):
        prof = roofline_profile("h100", "llama-3.1-70b", ["llama-3.2-1b"], tp=4, framework=fw)
        setup = SimSetup(prof, base, table=table, max_batch=256)
        w = replace(base, arrival_s=base.arrival_s / rate)
        a, b = run_policy(setup, w, "none", 0), run_policy(setup, w, "fixed:1", 0)
        return float(np.mean(a.finish_s - a.arrival_s) / np.mean(b.finish_s - b.arrival_s))

    assert speedup("vllm", 16.0) > 1.1
    assert speedup("vllm-0.6", 16.0) < 1.0
    assert speedup("vllm-0.6", 4.0) > 1.3


def test_only_a_plain_deployment_of_a_long_context_model_runs_chunked_prefill():
    """vLLM 0.6 turns chunked prefill on (512-token budget) for a model of more than 32K tokens of
    context unless a speculative model is configured: Org on Llama-3.1-70B mixes prompt chunks into its
    decode steps, every speculative configuration (and Org on a 2K-context Vicuna) prefills in
    iterations of its own."""
    long = roofline_profile("h100", "llama-3.1-70b", ["llama-3.2-1b"], tp=4, framework="vllm-0.6")
    short = roofline_profile("h100", "vicuna-33b", ["llama-160m"], tp=2, framework="vllm-0.6")
    assert long.environment["framework"]["plain_chunk_budget"] == 512
    assert short.environment["framework"]["plain_chunk_budget"] == 0
    mid = roofline_profile("h100", "llama-3.1-70b", ["llama-3.2-1b"], tp=4, framework="vllm")
    assert mid.environment["framework"]["plain_chunk_budget"] == 0
    w = poisson(60, 4.0, "lognormal:517:10", "lognormal:135:18", seed=1)
    setup = SimSetup(long, w, table=FIXED_07, max_batch=256)
    cfg = setup.config(0)
    assert cfg.plain_chunk_budget == 512 and not cfg.chunked_prefill and cfg.token_budget > 512
    org, k1 = run_policy(setup, w, "none", 0), run_policy(setup, w, "fixed:1", 0)
    short_org = run_policy(SimSetup(short, w, table=FIXED_07, max_batch=256), w, "none", 0)
    # iterations that are not decode steps: chunked, only those with nothing decoding (an idle engine's
    # first prompt); unchunked, about one prefill iteration per arrival
    assert org.steps - org.decode_steps <= 0.1 * w.n
    assert k1.steps - k1.decode_steps >= 0.5 * w.n
    assert short_org.steps - short_org.decode_steps >= 0.5 * w.n
    with pytest.raises(ConfigError, match="plain_chunk_budget"):
        SimConfig(plain_chunk_budget=-1)

