"""The llm model's request parsing and incremental detokenisation, without a server."""

from __future__ import annotations

import numpy as np
import pytest

from control.errors import ConfigError
from control.triton.llm_request import GenerateRequest, Limits, StatsRequest, StopRequest, parse_request
from control.triton.sender import Detokenizer


def _parse(**tensors):
    arrays = {k: (v if isinstance(v, np.ndarray) else np.array([v], dtype=object if isinstance(v, str | bytes) else None))
              for k, v in tensors.items()}
    return parse_request(arrays, limits=Limits(max_tokens=100, default_max_tokens=7),
                         encode=lambda s: [ord(c) % 50 for c in s], encode_words=lambda s: [ord(c) % 50 for c in s],
                         deployment_policy="adaptive")


def test_tensorrtllm_backend_names_map_to_sampling_params():
    r = _parse(text_input=b"abc", max_tokens=np.array([12], dtype=np.int32), temperature=np.array([0.5], dtype=np.float32),
               top_k=np.array([4], dtype=np.int32), top_p=np.array([0.9], dtype=np.float32),
               random_seed=np.array([2**40], dtype=np.uint64), stop_words=np.array([b"ab", b""], dtype=object),
               num_draft_tokens=np.array([2], dtype=np.int32), stream=np.array([True]))
    assert isinstance(r, GenerateRequest) and r.stream
    p = r.params
    assert (p.max_tokens, p.top_k, p.random_seed, p.num_draft_tokens) == (12, 4, 2**40, 2)
    assert p.temperature == pytest.approx(0.5) and p.top_p == pytest.approx(0.9)
    assert p.stop_words == ((ord("a") % 50, ord("b") % 50),)
    assert r.prompt_ids == [ord(c) % 50 for c in "abc"]


def test_defaults_policy_none_and_stats():
    r = _parse(text_input="x")
    assert r.params.max_tokens == 7 and not r.stream and r.params.num_draft_tokens is None
    assert _parse(text_input="x", policy="none").params.num_draft_tokens == 0
    assert _parse(text_input="x", policy="adaptive").params.num_draft_tokens is None
    assert isinstance(_parse(stats=np.array([True])), StatsRequest)
    assert _parse(input_ids=np.array([3, 4, 5], dtype=np.int32)).prompt_ids == [3, 4, 5]


def test_stop_true_is_a_stop_request_whatever_else_the_request_holds():
    assert isinstance(_parse(stop=np.array([True])), StopRequest)  # nothing else needed: no prompt
    assert isinstance(_parse(stop=np.array([True]), text_input="x", stats=np.array([True])), StopRequest)
    assert isinstance(_parse(stop=np.array([False]), text_input="x"), GenerateRequest)  # false: an ordinary request
    with pytest.raises(ConfigError, match=r"stop must hold exactly one value \(got shape \[2\]\)"):
        _parse(stop=np.array([True, True]))
    with pytest.raises(ConfigError, match="stop = 2: must be true or false"):
        _parse(stop=np.array([2], dtype=np.int32))


@pytest.mark.parametrize(("tensors", "message"), [
    ({}, "text_input is missing"),
    ({"text_input": ""}, "text_input is empty"),
    ({"text_input": "x", "max_tokens": np.array([101], dtype=np.int32)}, "max_tokens = 101: must be 1..100"),
    ({"text_input": "x", "max_tokens": np.array([1, 2], dtype=np.int32)}, "exactly one value"),
    ({"text_input": "x", "temperature": np.array([np.nan], dtype=np.float32)}, "finite"),
    ({"text_input": "x", "policy": "fixed:3"}, "PUT /v1/overrides"),
    ({"text_input": "x", "policy": "nope"}, "nope"),
    ({"input_ids": np.array([1.5])}, "integer token ids"),
    ({"text_input": "x", "stream": np.array([7], dtype=np.int32)}, "stream = 7"),
])
def test_bad_requests_name_the_value(tensors, message):
    with pytest.raises(ConfigError, match=None) as e:
        _parse(**tensors)
    assert message in str(e.value)


def test_incremental_detokenisation_never_splits_a_character(quick_engines):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(quick_engines / "target" / "tokenizer.json"))
    text = "naïve café — 日本語 ✓ done"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(ids) > len(text) // 2  # a small byte-level vocabulary: characters span several tokens
    d = Detokenizer(lambda t: tok.decode(t, skip_special_tokens=True))
    deltas = [d.push([i], final=(j == len(ids) - 1)) for j, i in enumerate(ids)]
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in x for x in deltas)
    assert sum(1 for x in deltas if x) > 5  # it streamed, not one piece at the end
