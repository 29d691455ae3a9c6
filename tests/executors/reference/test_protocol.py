"""The Executor protocol's capability record, and the reference engine's declaration of it."""

from __future__ import annotations

import pytest

from control.errors import ConfigError
from control.executors.base import Executor, ExecutorCapabilities, KScope
from control.executors.reference.engine import EngineConfig, ReferenceEngine
from control.goodput.granularity import PER_REQUEST, padded


def test_the_reference_engine_declares_per_request_k_and_its_drafters(loaded):
    engine = ReferenceEngine(loaded.target, loaded.drafters, None, EngineConfig(max_batch=2, max_k=5))
    assert isinstance(engine, Executor)
    caps = engine.capabilities
    assert caps.name == "reference" and caps.k_scope == KScope.per_request and caps.verify == PER_REQUEST
    assert caps.drafters == tuple(loaded.drafters) and caps.max_k == 5 and caps.request_caps
    assert not caps.virtual_clock and caps.follows_plans and caps.speculates
    plain = ReferenceEngine(loaded.target, {}, None, EngineConfig(max_batch=2)).capabilities
    assert plain.k_scope == KScope.none and plain.max_k == 0 and not plain.speculates
    assert caps.to_dict()["verify"] == "per_request" and caps.to_dict()["k_scope"] == "per_request"


def test_a_static_schedule_does_not_follow_plans():
    caps = ExecutorCapabilities("trtllm", KScope.static, padded(4), ("ngram",), 4, request_caps=False)
    assert caps.speculates and not caps.follows_plans and caps.to_dict()["verify"] == "padded:4"


@pytest.mark.parametrize(("kw", "message"), [
    ({"k_scope": KScope.per_request, "max_k": 0}, "k_scope per_request needs max_k >= 1"),
    ({"k_scope": KScope.none, "max_k": 3}, "k_scope none drafts nothing, so max_k must be 0, got 3"),
    ({"k_scope": KScope.per_batch, "max_k": -1}, "max_k = -1: must be an integer >= 0"),
])
def test_inconsistent_capabilities_are_refused_naming_the_value(kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ExecutorCapabilities("x", verify=PER_REQUEST, **kw)
