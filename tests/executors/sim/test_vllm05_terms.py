"""vLLM as SmartSpec ran it (framework ``vllm-0.5``): every draft pass prepared on the host, which is
what puts SmartSpec Fig. 1's crossovers where the paper has them."""

from __future__ import annotations

import numpy as np
import pytest

from control.bench.simrun import SimSetup, run_policy, workload_at
from control.bench.workloads import poisson
from control.buildsys.roofline import get_framework, roofline_profile
from tests.executors.sim.test_vllm06_terms import FIXED_07 as FIG1  # SmartSpec Fig. 1 fixes acceptance at 0.7


def test_vllm05_is_vllm_with_every_draft_pass_prepared_on_the_host():
    fw, later = get_framework("vllm-0.5"), get_framework("vllm")
    assert fw.draft_host_prep and not later.draft_host_prep
    assert (fw.verify_expansion, fw.host_seq_us, fw.host_token_us, fw.async_output) == (
        later.verify_expansion, later.host_seq_us, later.host_token_us, later.async_output)
    prof = roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework="vllm-0.5")
    assert prof.models["llama-160m"].d_ms_per_request == pytest.approx(fw.host_seq_us / 1000.0)
    assert roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework="vllm").models["llama-160m"].d_ms_per_request == 0.0


def test_k5_stops_paying_by_12_req_s_only_when_every_draft_pass_is_host_prepared():
    """SmartSpec Fig. 1: k = 5 stops paying at about 12 req/s. On ``vllm`` it still pays 1.1x there;
    with the host preparation of each of its five draft passes it does not."""
    base = poisson(400, 1.0, "128", "128", seed=0)

    def speedup(fw: str) -> float:
        setup = SimSetup(roofline_profile("a100", "llama-2-7b", ["llama-160m"], framework=fw), base, max_k=8,
                         table=FIG1, max_batch=256)
        w = workload_at(setup, 12.0, base.n, 0)
        a, b = run_policy(setup, w, "none", 0), run_policy(setup, w, "fixed:5", 0)
        return float(np.mean(a.finish_s - a.arrival_s) / np.mean(b.finish_s - b.arrival_s))

    assert speedup("vllm") > 1.0
    assert speedup("vllm-0.5") < 1.0


def test_adaptive_whose_drafts_catch_up_keeps_up_with_fixed_k1_when_draft_passes_are_host_prepared():
    """``adaptive`` leaves a new request's draft to catch up on its prompt in its first pass instead of
    prefilling it. Under ``vllm-0.5`` the draft's per-token price carries its 35 us of host
    preparation per sequence; charged once per caught-up token as well, it made a ShareGPT prompt's
    catch-up cost about 40 times its compute, and adaptive 1.13x fixed k = 1's latency here (0.99
    priced right; SmartSpec Fig. 11 (b)'s pair and lengths, TurboSpec Table 3's acceptance)."""
    prof = roofline_profile("a100", "vicuna-7b", ["llama-160m"], framework="vllm-0.5")
    base = poisson(300, 1.0, "lognormal:303:349", "lognormal:307:206", seed=0)
    setup = SimSetup(prof, base, max_k=8, table=FIG1, max_batch=256, acceptance_overrides={"llama-160m": 0.62})
    w = workload_at(setup, 6.0, base.n, 0)
    lat = {p: float(np.mean((r := run_policy(setup, w, p, 0)).finish_s - r.arrival_s)) for p in ("fixed:1", "adaptive")}
    assert lat["adaptive"] <= 1.0 * lat["fixed:1"], lat
