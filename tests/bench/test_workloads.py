"""Workloads: traces, prompt sets, scaling, and clear errors for bad files."""

from __future__ import annotations

import numpy as np
import pytest

from control.bench.workloads import load_workload, poisson, workloads_dir
from control.errors import ConfigError

HAVE = (workloads_dir() / "azure_llm_2023").is_dir()
needs_data = pytest.mark.skipif(not HAVE, reason="shared workloads folder absent (set SPECCTL_WORKLOADS)")


@needs_data
def test_real_traces_have_their_documented_shape():
    conv = load_workload("azure-conv")
    assert conv.n == 19366
    assert conv.rate == pytest.approx(5.53, rel=0.01)
    assert conv.output_tokens.mean() == pytest.approx(211, rel=0.01)
    moon = load_workload("mooncake")
    assert moon.prompt_tokens.mean() == pytest.approx(12035, rel=0.01)
    sb = load_workload("spec-bench", requests=500)
    assert set(np.unique(sb.category)) <= set(range(6)) and len(sb.categories) == 6


def test_time_and_length_scaling_are_explicit():
    w = poisson(1000, 2.0, "lognormal:500:300", "100", seed=1)
    fast = w.with_rate(10.0)
    assert fast.rate == pytest.approx(10.0, rel=1e-9)
    assert fast.notes["time_scale"] == pytest.approx(10.0 / w.rate)
    short = w.scale_lengths(0.5, max_ctx=300)
    assert short.notes["length_scale"] == 0.5
    assert np.all(short.prompt_tokens + short.output_tokens <= 300)
    assert short.notes["clipped_to_max_ctx"] > 0


def _root(tmp_path, rel, text):
    p = tmp_path / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return tmp_path


def test_malformed_trace_line_is_named(tmp_path):
    root = _root(tmp_path, "azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                 "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50,abc,1\n")
    with pytest.raises(ConfigError, match="line 3 is malformed"):
        load_workload("azure-conv", root=root)


def test_wrong_header_and_bad_json_are_rejected(tmp_path):
    root = _root(tmp_path, "azure_llm_2023/AzureLLMInferenceTrace_code.csv", "time,in,out\n1,2,3\n")
    with pytest.raises(ConfigError, match="expected header TIMESTAMP,ContextTokens,GeneratedTokens"):
        load_workload("azure-code", root=root)
    root = _root(tmp_path, "mooncake_fast25/conversation_trace.jsonl", '{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(ConfigError, match="line 1 is not a record"):
        load_workload("mooncake", root=root)
    root = _root(tmp_path, "sharegpt/ShareGPT_V3_filtered_500.json", "{not json")
    with pytest.raises(ConfigError, match="expected a list"):
        load_workload("sharegpt", root=root)


def test_missing_file_says_where_to_point(tmp_path):
    with pytest.raises(ConfigError, match="set SPECCTL_WORKLOADS"):
        load_workload("mooncake", root=tmp_path)


@pytest.mark.parametrize("spec,match", [
    ("", "is empty"),
    ("azure", "unknown workload 'azure'"),
    ("poisson:in=lognormal:5", "write a token count"),
    ("poisson:foo=3", "is not in=DIST"),
    ("poisson:in=uniform:9:3", "1 <= LO <= HI"),
    ("mooncake:x", "takes no options"),
])
def test_bad_workload_specs(spec, match):
    with pytest.raises(ConfigError, match=match):
        load_workload(spec)
