"""A non-decoupled deployment (`specctl serve --non-decoupled`): plain tritonclient ``infer()`` works on
``llm`` and on the tensorrtllm_backend names, over gRPC and HTTP, with the same greedy output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from control.triton.deploy import Deployment, DeploymentConfig
from tests.e2e.prompts import PROMPTS

pytestmark = pytest.mark.e2e

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def sync_deployment(quick_engines, tmp_path_factory):
    cfg = DeploymentConfig(engine_dir=Path(quick_engines), run_dir=tmp_path_factory.mktemp("sync-run"), http_port=0,
                           grpc_port=0, metrics_port=0, control_port=0, service=False, decoupled=False, max_batch=8)
    dep = Deployment(cfg).start()
    yield dep
    dep.stop()


def _inputs(mod, arrays: dict[str, np.ndarray]):
    out = []
    for name, a in arrays.items():
        t = mod.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
        t.set_data_from_numpy(a)
        out.append(t)
    return out


def _unbatched(prompt: str, **extra) -> dict[str, np.ndarray]:
    return {"text_input": np.array([prompt.encode()], dtype=object),
            "max_tokens": np.array([MAX_TOKENS], dtype=np.int32), **extra}


def test_plain_infer_on_llm_and_aliases(sync_deployment, reference):
    dep = sync_deployment
    prompts = [PROMPTS[0], PROMPTS[3]]
    want = reference(prompts, MAX_TOKENS)
    g = grpcclient.InferenceServerClient(dep.grpc_url)
    h = httpclient.InferenceServerClient(dep.http_url.removeprefix("http://"))
    for prompt, ids in zip(prompts, want, strict=True):
        r = g.infer("llm", _inputs(grpcclient, _unbatched(prompt)))
        assert r.as_numpy("output_ids").tolist() == ids
        r = h.infer("llm", _inputs(httpclient, _unbatched(prompt)))
        assert r.as_numpy("output_ids").tolist() == ids
    # Upstream's batched shapes: two rows in one request, token ids padded with pad_id.
    batched = {"text_input": np.array([[p.encode()] for p in prompts], dtype=object),
               "max_tokens": np.full((2, 1), MAX_TOKENS, dtype=np.int32),
               "pad_id": np.full((2, 1), 7, dtype=np.int32)}
    for model in ("ensemble", "tensorrt_llm_bls"):
        r = g.infer(model, _inputs(grpcclient, batched))
        ids = r.as_numpy("output_ids")  # [2, width]
        for b, row in enumerate(want):
            assert ids[b, :len(row)].tolist() == row and set(ids[b, len(row):].tolist()) <= {7}
        assert r.as_numpy("text_output").shape == (2,)
        assert r.as_numpy("total_draft_tokens").shape == (2, 1)


def test_stream_is_refused_by_name(sync_deployment):
    g = grpcclient.InferenceServerClient(sync_deployment.grpc_url)
    with pytest.raises(InferenceServerException, match="stream = true"):
        g.infer("llm", _inputs(grpcclient, _unbatched(PROMPTS[1], stream=np.array([True]))))
    r = g.infer("llm", _inputs(grpcclient, _unbatched(PROMPTS[1])))  # still serving
    assert r.as_numpy("output_ids").size == MAX_TOKENS
