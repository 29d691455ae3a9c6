"""The stand-in ``tensorrt_llm`` model, called directly through Triton with the rendered config's
tensors: the tensorrtllm backend's request semantics the BLS relies on."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from control.executors.trtllm.tensors import generate_request, output_tokens, verify_request
from tests.executors.trtllm.bls.engines import greedy

PROMPT = np.array([5, 9, 3, 17, 22])


def _infer(url: str, model: str, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    dt = {np.dtype(np.int32): "INT32", np.dtype(bool): "BOOL"}
    ins = []
    for name, a in req.items():
        t = grpcclient.InferInput(name, list(a.shape), dt[a.dtype])
        t.set_data_from_numpy(a)
        ins.append(t)
    c = grpcclient.InferenceServerClient(url)
    try:
        r = c.infer(model, ins)
        return {n: r.as_numpy(n) for n in ("output_ids", "sequence_length")}
    finally:
        c.close()


def test_generate_and_verify_keep_the_backend_semantics(triton, target):
    url = triton.grpc_url
    plain = output_tokens(_infer(url, "tensorrt_llm", generate_request(PROMPT, 6)))
    assert plain.tolist() == greedy(target, PROMPT.tolist(), 6)
    good = _infer(url, "tensorrt_llm", verify_request(PROMPT, plain[:4]))
    assert good["output_ids"].shape == (1, 1, 5) and good["sequence_length"].tolist() == [[5]]
    assert output_tokens(good).tolist() == plain[:5].tolist()  # all drafts accepted plus the bonus token
    bad = plain[:4].copy()
    bad[1] = (bad[1] + 1) % 96
    assert output_tokens(_infer(url, "tensorrt_llm", verify_request(PROMPT, bad))).tolist() == plain[:2].tolist()
    # exclude_input_in_output defaults to the config's parameter (true), as in the backend
    req = generate_request(PROMPT, 2)
    del req["exclude_input_in_output"]
    assert output_tokens(_infer(url, "tensorrt_llm", req)).tolist() == plain[:2].tolist()
    req["exclude_input_in_output"] = np.array([[False]])
    assert output_tokens(_infer(url, "tensorrt_llm", req)).tolist() == PROMPT.tolist() + plain[:2].tolist()


def test_streaming_on_the_non_decoupled_model_is_refused(triton):
    req = generate_request(PROMPT, 2)
    req["streaming"] = np.array([[True]])
    with pytest.raises(InferenceServerException, match="streaming needs the model deployed decoupled"):
        _infer(triton.grpc_url, "tensorrt_llm_draft", req)


def test_the_full_verify_stand_in_answers_k_plus_1_tokens(triton, target):
    """tensorrt_llm_all decodes on after a rejected draft until request_output_len = k + 1."""
    plain = greedy(target, PROMPT.tolist(), 5)
    bad = np.array(plain[:4])
    bad[1] = (bad[1] + 1) % 96
    out = _infer(triton.grpc_url, "tensorrt_llm_all", verify_request(PROMPT, bad))
    assert out["sequence_length"].tolist() == [[5]] and output_tokens(out).tolist() == plain
    short = _infer(triton.grpc_url, "tensorrt_llm", verify_request(PROMPT, bad))
    assert output_tokens(short).tolist() == plain[:2]
