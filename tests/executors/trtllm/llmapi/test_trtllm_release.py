"""What the pinned TensorRT-LLM release (1.2.1) asks of our adapters, on the stand-in that now behaves as it:
the drafter hook survives the executor's CUDA-graph padding, acceptance survives 1.2.x's zeroed perf
totals, and builds and models name the release and refuse another."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import yaml

from control.cli import main
from control.errors import ConfigError
from control.executors.trtllm.drafter_hook import KPlanner, make_drafter, ngram_proposer
from control.executors.trtllm.llmapi import spec_metrics
from control.executors.trtllm.version import PINNED, require_release
from control.plan import compile_plan
from control.policy import build_policy
from tests.conftest import make_profile
from tests.executors.trtllm.llmapi.deploy import ROOT
from tests.executors.trtllm.llmapi.standin_import import standin

MAX_K = 4


def _requests(trtllm, prompts: list[list[int]]):
    from tensorrt_llm._standin import _GenRequest

    return [_GenRequest(i, 100 + i, p, 30, len(p), 0) for i, p in enumerate(prompts)]


def test_the_drafter_hook_survives_the_executors_padding():
    """TensorRT-LLM calls ``pad_draft_tokens_for_cuda_graph`` right after ``prepare_draft_tokens``; with the
    old ``Drafter.__init__(max_concurrency=None)`` the static maximum was None and padding raised TypeError."""
    with standin() as trtllm:
        from types import SimpleNamespace

        planner = KPlanner(build_policy("fixed:3", compile_plan(make_profile(), max_k=MAX_K)), max_k=MAX_K)
        drafter = make_drafter(planner, ngram_proposer(2))
        prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2], [9, 8, 7]]
        reqs = _requests(trtllm, prompts)
        batch = SimpleNamespace(generation_requests=reqs, context_requests=[])
        drafter.prepare_draft_tokens(batch, None)
        before = [list(r.py_draft_tokens) for r in reqs]
        assert [len(d) for d in before] == [3, 3, 0]  # k = 3 where the lookup found a match
        extended = []
        drafter.pad_draft_tokens_for_cuda_graph(batch, SimpleNamespace(extend_capacity_for_tokens=extended.append))
        assert all(len(r.py_draft_tokens) == MAX_K for r in reqs)  # the target verifies max K for everyone
        assert [r.py_draft_tokens[: len(b)] for r, b in zip(reqs, before, strict=True)] == before
        assert extended == reqs  # KV capacity extended for the padding (the sampler rewinds by the padded length)
        assert drafter._static_max_total_draft_tokens == MAX_K and drafter.max_draft_len == MAX_K
        assert planner.totals == {100: [3, 0], 101: [3, 0], 102: [0, 0]}  # what was drafted, before padding


def _run_one(trtllm, checkpoints, max_tokens: int = 24):
    """One greedy request through the stand-in LLM with n-gram speculation; its final RequestOutput."""
    from tensorrt_llm.llmapi import NGramDecodingConfig

    llm = trtllm.LLM(checkpoints / "target", max_batch_size=4,
                     speculative_config=NGramDecodingConfig(max_draft_len=MAX_K, max_matching_ngram_size=2,
                                                            draft_len_schedule={1: MAX_K}))
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]

    async def go():
        out = llm.generate_async(prompt, trtllm.SamplingParams(max_tokens=max_tokens, top_k=1, return_perf_metrics=True),
                                 streaming=True)
        async for o in out:
            last = o
        return last

    try:
        return asyncio.run(go())
    finally:
        llm.shutdown()


@pytest.mark.parametrize("version", ["1.2.1", "1.3.0+standin"])
def test_acceptance_is_read_from_both_perf_shapes(tiny_checkpoints, version):
    """1.2.x returns ``speculative_decoding`` with zero totals (our telemetry dropped such requests);
    ``avg_decoded_tokens_per_iter`` and ``decoding_iter`` still carry what was accepted."""
    with standin(version) as trtllm:
        out = _run_one(trtllm, tiny_checkpoints)
    sd = out.outputs[0].request_perf_metrics.speculative_decoding
    generated = len(out.outputs[0].token_ids)
    accepted = generated - out.decoding_iter  # every iteration gives one target token plus what it accepted
    assert accepted > 0 and out.avg_decoded_tokens_per_iter == pytest.approx(generated / out.decoding_iter)
    m = spec_metrics(out, MAX_K)
    if version == "1.2.1":
        assert (sd.total_draft_tokens, sd.total_accepted_draft_tokens) == (0, 0)
        assert m.source == "per-iteration" and m.accepted == accepted and m.drafted == out.decoding_iter * MAX_K
    else:
        assert sd.total_draft_tokens > 0
        assert m.source == "totals" and (m.drafted, m.accepted) == (sd.total_draft_tokens, sd.total_accepted_draft_tokens)
        assert m.accepted == accepted
    assert spec_metrics(out, 0).source == "totals"  # without a draft length, no per-iteration estimate


def test_the_standin_looks_schedules_up_as_each_release_does(tiny_checkpoints):
    """``{15: 2, 32: 1}``: 1.3 runs k = 2 at batch 1-15; 1.2.1 (lower bounds, key 1 required) refuses it."""
    from pydantic import ValidationError

    with standin("1.3.0+standin") as trtllm:
        import tensorrt_llm.llmapi  # noqa: F401
        from tensorrt_llm._standin import _Schedule

        assert [_Schedule({15: 2, 32: 1}, 2).lookup({15: 2, 32: 1}, b, "1.3") for b in (1, 14, 15, 16, 33)] == [2, 2, 2, 1, 0]
        trtllm.llmapi.NGramDecodingConfig(max_draft_len=2, draft_len_schedule={15: 2, 32: 1})
    with standin("1.2.1") as trtllm:
        import tensorrt_llm.llmapi  # noqa: F401
        from tensorrt_llm._standin import _Schedule

        s = _Schedule({1: 2, 16: 1, 33: 0}, 2)
        assert s.line == "1.2" and [s.lookup(s.schedule, b, s.line) for b in (1, 15, 16, 33)] == [2, 2, 1, 0]
        with pytest.raises(ValidationError, match="batch_size=1"):
            trtllm.llmapi.NGramDecodingConfig(max_draft_len=2, draft_len_schedule={15: 2, 32: 1})
        with pytest.raises(ValidationError, match="extra"):  # strict: an unknown field is refused
            trtllm.llmapi.KvCacheConfig(free_gpu_memory_fraction=0.5, block_reuse=True)
        with pytest.raises(ValidationError, match="acceptance_rate_threshold"):  # 1.3's name, not 1.2.1's
            trtllm.llmapi.NGramDecodingConfig(max_draft_len=2, acceptance_rate_threshold=0.3)


@pytest.mark.parametrize("backend", ["pytorch", "tensorrt"])
def test_build_records_and_prints_the_pinned_release(tmp_path, capsys, backend):
    out = tmp_path / "out"
    rc = main(["build", "--recipe", str(ROOT / "build/recipes/h100-llama3.1-8b-ngram.yaml"), "--backend", backend,
               "--dry-run", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0 and PINNED == "1.2.1"
    assert f"TensorRT-LLM {PINNED}" in printed.splitlines()[0]
    assert yaml.safe_load((out / "specctl.yaml").read_text())["trtllm_version"] == PINNED
    if backend == "pytorch":
        cfg = (out / "triton_repo/llm/config.pbtxt").read_text()
        assert f'key: "trtllm_version" value: {{ string_value: "{PINNED}" }}' in cfg
        assert (out / "llm_api_options.yaml").read_text().startswith(f"# TensorRT-LLM {PINNED} ")


def test_the_model_refuses_another_installed_release():
    with standin("1.3.0+standin"), pytest.raises(ConfigError) as e:
        require_release(PINNED, "the llm model (executor: trtllm, llm_api_options.yaml)")
    msg = str(e.value)
    assert "\n" not in msg and "built for TensorRT-LLM 1.2.1 but 1.3.0+standin is installed" in msg
    assert "tensorrt_llm==1.2.1" in msg
    with standin(PINNED) as trtllm:
        assert require_release(PINNED, "the llm model") is trtllm


def test_padding_counts_in_the_standin_llm(tiny_checkpoints):
    """Through the stand-in LLM's user-provided path, every draft is padded to the hook's static maximum."""
    with standin() as trtllm:
        from tensorrt_llm.llmapi import UserProvidedDecodingConfig

        planner = KPlanner(build_policy("fixed:1", compile_plan(make_profile(), max_k=MAX_K)), max_k=MAX_K)
        drafter = make_drafter(planner, ngram_proposer(2))
        llm = trtllm.LLM(tiny_checkpoints / "target", max_batch_size=2,
                         speculative_config=UserProvidedDecodingConfig(max_draft_len=MAX_K, drafter=drafter))

        async def go():
            res = llm.generate_async([5, 6, 7, 8, 5, 6, 7, 8, 5, 6], trtllm.SamplingParams(max_tokens=12, top_k=1),
                                     streaming=True)
            async for _ in res:
                pass

        try:
            asyncio.run(go())
        finally:
            llm.shutdown()
        hook = llm.engine.policy
    steps = planner._step
    assert steps >= 3 and hook.padded_draft_tokens == steps * MAX_K - planner.totals[1][0]
    assert hook.resources.extended == steps
    assert np.all(planner.last_k <= 1)
