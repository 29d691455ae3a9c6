"""Plans: validation, round-trips, and TensorRT-LLM draft_len_schedule rules."""

import json

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from control.errors import ConfigError
from control.plan import (
    SLO,
    AcceptanceState,
    compile_plan,
    compress_schedule,
    k_by_batch,
    parse_plan,
    schedule_lookup,
    trtllm_schedule,
    validate_trtllm_schedule,
)
from control.profile import parse_profile
from tests.conftest import make_profile


def _check_rules(sched: dict[int, int]) -> int:
    """TensorRT-LLM's rules (llm_args.py DecodingBaseConfig.validate_draft_len_schedule_and_sort)."""
    assert sched, "empty schedule"
    max_draft_len = sched[min(sched)]
    assert all(isinstance(b, int) and b >= 1 for b in sched)
    assert all(0 <= k <= max_draft_len for k in sched.values())
    validate_trtllm_schedule(sched, max_draft_len)
    return max_draft_len


@settings(max_examples=30, deadline=None)
@given(
    ta=st.floats(1e-7, 1e-4), tb=st.floats(1e-3, 0.1), tc=st.floats(1.0, 20.0),
    da=st.floats(1e-8, 1e-5), db=st.floats(1e-4, 0.02), dc=st.floats(0.1, 3.0),
    acc=st.floats(0.05, 0.95), ctx=st.sampled_from([128, 1024, 8192, 65536]),
    max_k=st.integers(1, 10), one_model=st.booleans(), max_batch=st.sampled_from([8, 64, 256, 512]),
)
def test_every_compiled_schedule_passes_the_rules(ta, tb, tc, da, db, dc, acc, ctx, max_k, one_model, max_batch):
    profile = make_profile(target=(ta, tb, tc), draft=(da, db, dc), max_batch=max_batch)
    plan = compile_plan(profile, max_k=max_k)
    sched = trtllm_schedule(plan, ctx=ctx, acc=acc, one_model=one_model)
    want = k_by_batch(profile.step_cost(["draft"]), ctx, acc, max_k, max_batch)
    if not sched:
        assert not one_model
        return
    m = _check_rules(sched)
    assert m <= max_k
    looked = np.array([schedule_lookup(sched, b) for b in range(1, max_batch + 1)])
    target = np.maximum(want, 1) if one_model else want
    first_end = int(np.flatnonzero(np.diff(np.append(target, -1)) != 0)[0])  # last index of the first run
    if one_model:
        assert looked.min() >= 1 and max(sched) == max_batch  # never k = 0 (TensorRT-LLM PR #16888)
    else:
        # where the optimiser wants no speculation, the schedule gives none (k can grow back with batch
        # at long context, so this is checked point by point), except in the first segment, which
        # TensorRT-LLM forces to max_draft_len
        assert (looked[first_end + 1:][want[first_end + 1:] == 0] == 0).all()
    # elsewhere the schedule follows the optimiser, capped at max_draft_len
    differ = np.flatnonzero(looked != np.minimum(target, m))
    assert differ.size == 0 or differ.max() <= first_end


def test_schedule_lookup_semantics_match_tensorrt_llm():
    # {4: 4, 8: 2, 32: 1}: batch 1-4 -> 4, 5-8 -> 2, 9-32 -> 1, 33+ -> 0 (speculative/utils.py)
    s = {4: 4, 8: 2, 32: 1}
    assert [schedule_lookup(s, b) for b in (1, 4, 5, 8, 9, 32, 33, 1000)] == [4, 4, 2, 2, 1, 1, 0, 0]
    assert compress_schedule(np.array([4, 4, 4, 4, 2, 2, 2, 2] + [1] * 24 + [0] * 10)) == s
    assert compress_schedule(np.array([3, 3, 0, 0, 2, 0])) == {2: 3, 4: 0, 5: 2}
    assert compress_schedule(np.zeros(5, dtype=int)) == {}


@pytest.mark.parametrize("bad, match", [
    ({}, "empty"),
    ({0: 3}, "key 0"),
    ({1: 3, 4: -1}, ">= 0"),
    ({1: 3, 4: 5}, "exceeds max_draft_len"),
    ({2: 2, 4: 1}, "smallest key"),
])
def test_schedule_validation_names_the_broken_rule(bad, match):
    with pytest.raises(ConfigError, match=match):
        validate_trtllm_schedule(bad, 3)


def test_plan_round_trips_through_json_and_yaml(profile):
    plan = compile_plan(profile, version=7, policy="fixed:3", max_k=6, slo=SLO(tpot_ms=30, quantile=0.9),
                        acceptance=AcceptanceState(rate={"draft": 0.8}, per_position={"draft": [0.9, 0.8, 0.7]}))
    for text in (plan.to_json(), plan.to_yaml()):
        again = parse_plan(text)
        assert again == plan
    assert json.loads(plan.to_json())["schema"] == "specctl.plan/v1"
    assert plan.lookup_k(1, 512) == plan.table.lookup(1, 512, 0.8)


def test_plan_table_agrees_with_optimiser_and_buckets_round_up(profile):
    plan = compile_plan(profile, max_k=8)
    cost = profile.step_cost(["draft"])
    for b, s, a in ((1, 128, 0.7), (12, 1024, 0.5), (100, 3000, 0.9)):
        bb = min(x for x in plan.table.batch if x >= b)
        cc = min(x for x in plan.table.ctx if x >= s)
        aa = max(x for x in plan.table.acceptance if x <= a + 1e-9)
        assert plan.table.lookup(b, s, a) == int(k_by_batch(cost, cc, aa, 8, bb)[bb - 1])


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(schema="specctl.plan/v0"), "schema"),
    (lambda d: d.update(policy="bogus"), "unknown policy 'bogus'"),
    (lambda d: d.update(max_k=99), "max_k"),
    (lambda d: d.update(drafters=["nope"]), "drafter 'nope'"),
    (lambda d: d["slo"].update(tpot_ms=-1), "tpot_ms"),
    (lambda d: d["acceptance"].update(rate={"draft": 1.5}), r"\[0, 1\)"),
])
def test_bad_plans_fail_with_the_value_named(profile, mutate, match):
    d = compile_plan(profile).to_dict()
    mutate(d)
    with pytest.raises(ConfigError, match=match):
        parse_plan(d)


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["models"]["target"].update(a_ms_per_ctx_token=-1.0), "a_ms_per_ctx_token"),
    (lambda d: d["models"]["target"].update(c_ms=float("nan")), "c_ms"),
    (lambda d: d.update(source="hand"), "source"),
    (lambda d: d["drafters"].append({"name": "x", "kind": "draft_model", "model": "missing"}), "missing"),
    (lambda d: d["drafters"].append({"name": "draft", "kind": "ngram"}), "unique"),
    (lambda d: d.update(acceptance={"draft": 1.0}), r"\[0, 1\)"),
    (lambda d: d["models"].pop("target"), "target"),
])
def test_bad_profiles_fail_with_the_value_named(profile, mutate, match):
    d = yaml.safe_load(profile.to_yaml())
    mutate(d)
    with pytest.raises(ConfigError, match=match):
        parse_profile(d)
