"""The LLM API adapter and the drafter hook: their plain-Python parts, and the import guard."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

from control.errors import ConfigError, MissingDependencyError, SpecctlError
from control.executors.trtllm.drafter_hook import KPlanner, make_drafter, ngram_proposer
from control.executors.trtllm.llmapi import LlmApiExecutor, llm_kwargs, sampling_kwargs, spec_metrics
from control.plan import compile_plan, schedule_lookup
from control.policy import build_policy
from tests.conftest import make_profile

HAVE_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None


@pytest.mark.skipif(HAVE_TRTLLM, reason="TensorRT-LLM is installed: the guard does not apply")
def test_adapters_say_what_is_missing():
    with pytest.raises(MissingDependencyError, match="needs TensorRT-LLM.*docs/gpu.md"):
        LlmApiExecutor("some/model", {"max_batch_size": 4})
    with pytest.raises(MissingDependencyError, match="drafter hook needs TensorRT-LLM"):
        make_drafter(KPlanner(build_policy("fixed:2", compile_plan(make_profile(), max_k=4)), 4), ngram_proposer())


class Recorder:
    """Stands in for TensorRT-LLM's config classes (which cannot be installed here): records the call."""

    def __init__(self, name):
        self.name = name

    def __call__(self, **kw):
        return (self.name, kw)


def test_llm_kwargs_maps_options_to_trtllm_classes():
    opts = {"tensor_parallel_size": 2, "max_batch_size": 32, "kv_cache_config": {"free_gpu_memory_fraction": 0.9},
            "cuda_graph_config": {"enable_padding": True, "batch_sizes": [1, 2, 4]},
            "speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 3, "speculative_model": "d",
                                   "draft_len_schedule": {4: 3, 8: 1}}}
    kw = llm_kwargs(opts, Recorder)
    assert kw["tensor_parallel_size"] == 2 and kw["max_batch_size"] == 32
    assert kw["kv_cache_config"] == ("KvCacheConfig", {"free_gpu_memory_fraction": 0.9})
    assert kw["cuda_graph_config"][0] == "CudaGraphConfig"
    assert kw["speculative_config"] == ("DraftTargetDecodingConfig",
                                        {"max_draft_len": 3, "speculative_model": "d", "draft_len_schedule": {4: 3, 8: 1}})
    hooked = llm_kwargs(opts, Recorder, drafter="ours")
    assert hooked["speculative_config"] == ("UserProvidedDecodingConfig", {"max_draft_len": 3, "drafter": "ours"})
    with pytest.raises(ConfigError, match="decoding_type = 'Medusa'"):
        llm_kwargs({"speculative_config": {"decoding_type": "Medusa", "max_draft_len": 2}}, Recorder)
    assert opts["speculative_config"]["decoding_type"] == "Draft_Target"  # the caller's mapping is untouched


def test_sampling_kwargs_validate_with_one_line_errors():
    # Greedy goes as top_k=1 (TensorRT-LLM's SamplingParams._greedy_decoding), whatever top_k/top_p say.
    kw = sampling_kwargs(16, temperature=0.0, top_k=0, top_p=1.0, seed=3, end_id=2)
    assert kw == {"max_tokens": 16, "return_perf_metrics": True, "top_k": 1, "seed": 3, "end_id": 2}
    kw = sampling_kwargs(16, temperature=0.7, top_k=0, top_p=1.0)
    assert kw == {"max_tokens": 16, "return_perf_metrics": True, "temperature": 0.7}  # top_k 0 / top_p 1 = off
    kw = sampling_kwargs(16, temperature=0.7, top_k=5, top_p=0.9, stop=["ab"], bad=["c d"])
    assert (kw["top_k"], kw["top_p"], kw["stop"], kw["bad"]) == (5, 0.9, ["ab"], ["c d"])
    assert kw["include_stop_str_in_output"] is True  # stop words stay in the output, as on the reference path
    for bad, match in [({"max_tokens": 0}, "max_tokens = 0"), ({"max_tokens": 4, "temperature": -1}, "temperature"),
                       ({"max_tokens": 4, "top_p": 0.0}, "top_p = 0.0"), ({"max_tokens": 4, "top_k": -2}, "top_k"),
                       ({"max_tokens": 4, "seed": -1}, "random_seed"), ({"max_tokens": "8"}, "max_tokens = '8'"),
                       ({"max_tokens": 4, "stop": "ab"}, "stop = 'ab'"), ({"max_tokens": 4, "bad": [""]}, "bad")]:
        with pytest.raises(SpecctlError, match=match):
            sampling_kwargs(**bad)


def test_spec_metrics_from_request_output():
    sd = SimpleNamespace(acceptance_rate=0.5, total_accepted_draft_tokens=6, total_draft_tokens=12)
    out = SimpleNamespace(outputs=[SimpleNamespace(request_perf_metrics=SimpleNamespace(speculative_decoding=sd))])
    m = spec_metrics(out)
    assert (m.drafted, m.accepted, m.acceptance_rate) == (12, 6, 0.5)
    assert spec_metrics(SimpleNamespace(outputs=[SimpleNamespace(request_perf_metrics=None)])) is None


def test_kplanner_follows_the_schedule_and_reuses_slots():
    plan = compile_plan(make_profile(), max_k=4)
    sched = {2: 4, 5: 2, 9: 1}
    planner = KPlanner(build_policy("static-schedule:2=4,5=2,9=1", plan), max_k=4)
    for n in (1, 3, 6, 12):
        rids = list(range(100, 100 + n))
        k = planner.plan(rids, np.full(n, 64), np.full(n, 50))
        assert (k == schedule_lookup(sched, n)).all(), (n, k)
    # Requests that left give their slots back: 12 live requests never need more than 12 slots.
    assert max(planner._slot.values()) < 12
    k = planner.plan([7, 8], [10, 10], [1, 50], k_cap=[4, 1])
    assert k.tolist() == [0, 1]  # remaining - 1 and num_draft_tokens cap k


def test_kplanner_feeds_acceptance_back_to_the_policy():
    plan = compile_plan(make_profile(), max_k=8)
    planner = KPlanner(build_policy("hf-heuristic", plan), max_k=8)
    rids = [1, 2]
    k0 = planner.plan(rids, [32, 32], [100, 100])
    planner.drafted(rids, k0)
    planner.accepted(rids, [k0[0], 0], [40, 40])  # request 1 accepted all, request 2 nothing
    k1 = planner.plan(rids, [40, 40], [90, 90])
    assert k1[0] == min(k0[0] + 2, 8) and k1[1] == k0[1] - 1


def test_ngram_proposer_hook():
    prop = ngram_proposer(2)
    assert prop(np.array([4, 5, 6, 4, 5]), 2).tolist() == [6, 4]
