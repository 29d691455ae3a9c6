"""The BLS orchestrator through the Executor protocol: greedy output, caps, cancel, per-request errors."""

from __future__ import annotations

import pytest

from control.errors import ConfigError
from control.executors.base import Executor, FinishReason, KScope, SamplingParams
from control.executors.trtllm.bls_executor import BlsExecutor
from control.executors.trtllm.granularity import BLS_GRANULARITY
from control.executors.trtllm.orchestrator import SpecOrchestrator
from control.executors.trtllm.reference_driver import ReferenceEngineClient, ReferenceTrtllmModel
from control.plan import compile_plan
from control.policy import build_policy
from tests.conftest import make_profile
from tests.executors.trtllm.bls.engines import greedy

PROMPTS = [[5, 9, 3, 17], [40, 41, 42], [7, 7, 8, 9, 10]]


@pytest.fixture(scope="module")
def bls(target):
    client = ReferenceEngineClient({"tensorrt_llm": ReferenceTrtllmModel(target)})
    policy = build_policy("fixed:3", compile_plan(make_profile(), max_k=4))
    return BlsExecutor(SpecOrchestrator(policy, client, drafter="ngram", max_k=4))


def _drain(ex) -> dict[int, list]:
    outs: dict[int, list] = {}
    while ex.has_work():
        for o in ex.step():
            outs.setdefault(o.request_id, []).append(o)
    return outs


def test_greedy_output_through_the_protocol_equals_plain_decoding(bls, target):
    assert isinstance(bls, Executor)
    caps = bls.capabilities
    assert caps.k_scope == KScope.per_request and caps.verify == BLS_GRANULARITY and caps.drafters == ("ngram",)
    assert caps.max_k == 4 and caps.request_caps and not caps.virtual_clock
    ids = [bls.add_request(p, SamplingParams(max_tokens=12), stream=(i == 0)) for i, p in enumerate(PROMPTS)]
    ids.append(bls.add_request(PROMPTS[0], SamplingParams(max_tokens=12, num_draft_tokens=0)))
    outs = _drain(bls)
    for rid, prompt in zip(ids, [*PROMPTS, PROMPTS[0]], strict=True):
        toks = [t for o in outs[rid] for t in o.new_token_ids]
        assert toks == greedy(target, prompt, 12)
        final = outs[rid][-1]
        assert final.finished and final.finish_reason == FinishReason.length and final.num_generated == 12
        assert 0 <= final.total_accepted <= final.total_drafted
        assert sum(o.drafted for o in outs[rid]) == final.total_drafted
    assert outs[ids[-1]][-1].total_drafted == 0  # num_draft_tokens 0: never drafted
    assert sum(len(o.new_token_ids) for o in bls.stream(ids[0], timeout=1)) == 12


def test_cancel_and_a_failing_request_end_alone(bls, target):
    keep = bls.add_request(PROMPTS[1], SamplingParams(max_tokens=10))
    gone = bls.add_request(PROMPTS[2], SamplingParams(max_tokens=200))
    bad = bls.add_request([3, 4, 100_000], SamplingParams(max_tokens=10))  # outside the vocabulary
    first = bls.step()
    assert bls.cancel(gone) and not bls.cancel(12345)
    outs = _drain(bls)
    for o in reversed(first):
        outs.setdefault(o.request_id, []).insert(0, o)
    assert outs[gone][-1].finish_reason == FinishReason.cancelled and outs[gone][-1].num_generated < 200
    assert outs[bad][-1].finish_reason == FinishReason.error and outs[bad][-1].error.startswith("tensorrt_llm: ")
    assert [t for o in outs[keep] for t in o.new_token_ids] == greedy(target, PROMPTS[1], 10)


@pytest.mark.parametrize(("params", "message"), [
    (SamplingParams(temperature=0.7), "temperature = 0.7: the BLS orchestrator decodes greedily"),
    (SamplingParams(stop_words=((5,),)), "stop_words / bad_words"),
    (SamplingParams(num_draft_tokens=9), "num_draft_tokens 9 must be in 0..4"),
])
def test_what_the_bls_cannot_do_is_refused_naming_the_value(bls, params, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        bls.add_request([5, 6], params)
    assert not bls.has_work()
