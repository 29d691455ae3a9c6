"""The llm request contract without a server: upstream's shapes and extra inputs, strict limits."""

from __future__ import annotations

import numpy as np
import pytest

from control.errors import ConfigError
from control.triton.llm_request import INPUTS, Limits, check_parameters, parse_request


def _parse(limits: Limits | None = None, **tensors):
    return parse_request(tensors, limits=limits or Limits(max_tokens=100, max_prompt_bytes=64, vocab_size=50),
                         encode=lambda s: [ord(c) % 50 for c in s], encode_words=lambda s: [ord(c) % 50 for c in s],
                         deployment_policy="adaptive")


def _t(v, dtype=None):
    return np.array(v, dtype=dtype)


def test_batched_shapes_parse_like_unbatched():
    flat = _parse(text_input=_t([b"abc"], object), max_tokens=_t([9], np.int32), stop_words=_t([b"b", b"c"], object))
    batched = _parse(text_input=_t([[b"abc"]], object), max_tokens=_t([[9]], np.int32),
                     stop_words=_t([[b"b", b"c"]], object))
    assert flat == batched and flat.params.max_tokens == 9 and len(flat.params.stop_words) == 2


def test_upstream_defaults_are_accepted_and_exclude_input_is_honoured():
    base = {"text_input": _t([b"abc"], object), "beam_width": _t([1], np.int32), "pad_id": _t([2], np.int32),
            "num_return_sequences": _t([1], np.int32), "repetition_penalty": _t([1.0], np.float32),
            "return_log_probs": _t([False]), "return_perf_metrics": _t([True])}
    r = _parse(**base, exclude_input_in_output=_t([False]))
    assert r.include_input and r.prompt_text == "abc" and r.perf_metrics
    assert not _parse(**base, exclude_input_in_output=_t([True])).include_input
    assert not _parse(**base).include_input  # absent: our default, the prompt is not repeated
    assert not _parse(**base, exclude_input_in_output=_t([False]), stream=_t([True])).include_input


@pytest.mark.parametrize(("name", "value", "message"), [
    ("beam_width", _t([2], np.int32), "beam_width = 2: only 1"),
    ("num_return_sequences", _t([0], np.int32), "num_return_sequences = 0"),
    ("presence_penalty", _t([0.5], np.float32), "presence_penalty = 0.5"),
    ("return_context_logits", _t([True]), "return_context_logits = True"),
    ("min_tokens", _t([3], np.int32), "min_tokens = 3"),
    ("pad_id", _t([-1], np.int32), "pad_id = -1"),
    ("policy", _t([("fixed:" + "9" * 5000).encode()], object), "policy is 5006 characters long"),
    ("text_input", _t([b"x" * 65], object), "text_input is 65 bytes: at most 64"),
])
def test_refused_inputs_name_the_field(name, value, message):
    tensors = {"text_input": _t([b"abc"], object), name: value}
    with pytest.raises(ConfigError) as e:
        _parse(**tensors)
    assert message in str(e.value) and "ValueError" not in str(e.value)


def test_input_ids_must_be_in_the_vocabulary():
    assert _parse(input_ids=_t([[1, 49]], np.int32)).prompt_ids == [1, 49]
    with pytest.raises(ConfigError, match=r"input_ids\[1\] = 50: token ids must be 0..49"):
        _parse(input_ids=_t([1, 50], np.int64))


def test_unknown_parameters_are_refused_with_the_accepted_names():
    check_parameters('{"triton_enable_empty_final_response": true, "priority": 1}')
    with pytest.raises(ConfigError) as e:
        check_parameters('{"max_tokns": 3}')
    assert "unknown field 'max_tokns'" in str(e.value) and all(n in str(e.value) for n in INPUTS)


def test_the_llm_template_declares_every_input_with_its_dtype():
    import re

    from control.triton.repo import TEMPLATES

    text = (TEMPLATES / "llm" / "config.pbtxt.in").read_text()
    declared = dict(re.findall(r'name: "(\w+)" data_type: TYPE_(\w+)', text.split("output [")[0]))
    assert {n: ("BYTES" if t == "STRING" else t) for n, t in declared.items()} == INPUTS


def test_aliases_render_with_a_batch_dimension(tmp_path):
    from control.triton.repo import ALIAS_MAX_BATCH, render_llm_repo

    repo = render_llm_repo(tmp_path / "r", engine_dir=tmp_path, profile=None, decoupled=False)
    for name in ("ensemble", "tensorrt_llm_bls"):
        cfg = (repo / name / "config.pbtxt").read_text()
        assert f'name: "{name}"' in cfg and f"max_batch_size: {ALIAS_MAX_BATCH}" in cfg
        assert 'name: "batch_index"' in cfg and "decoupled: false" in cfg and "control_token" not in cfg
    assert "decoupled: false" in (repo / "llm" / "config.pbtxt").read_text()


def test_an_alias_passes_on_llm_s_own_message():
    from control.triton.forward_model import model_message

    raw = ("Failed to process the request(s) for model 'llm_0_0', message: TritonModelException: bad_words: a word "
           "of 5000 characters; at most 1024\n\nAt:\n  llm(23): execute\n")
    assert model_message(raw) == "bad_words: a word of 5000 characters; at most 1024"
    assert model_message("max_tokens = 0: must be >= 1") == "max_tokens = 0: must be >= 1"
