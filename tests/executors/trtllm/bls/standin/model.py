"""Stand-in for the tensorrtllm backend's ``tensorrt_llm`` / ``tensorrt_llm_draft`` models (test fixture).

A Triton Python model that serves the rendered ``tensorrt_llm`` config unchanged except for
``backend: "python"``: the same input/output names, dtypes and dims (``control/executors/trtllm/
tensors.py``), ``gpt_model_path`` naming the engine directory (here a Hugging Face checkpoint of
the reference Llama), and the backend's semantics for greedy decoding through
``control.executors.trtllm.reference_driver`` (``request_output_len`` tokens after ``input_ids``;
with ``draft_input_ids``, the accepted draft prefix plus the model's own next token, or with the
stand-in parameter ``standin_verify_output: all`` every one of the k + 1 tokens asked for;
``exclude_input_in_output`` defaulting to the config parameter; ``streaming`` refused, as the real
backend refuses it on a model that is not decoupled, which the rendered configs are not).

Not a product: it recomputes the whole sequence on every request (the real engine reuses its KV
cache) and serves requests one at a time.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from control.executors.reference.model import load_pretrained
        from control.executors.trtllm.reference_driver import ReferenceTrtllmModel
        from control.executors.trtllm.tensors import INPUT_NAMES

        torch.set_num_threads(1)  # tiny models; a shared CI machine
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        self.name = cfg["name"]
        if pb_utils.using_decoupled_model_transaction_policy(cfg):
            raise pb_utils.TritonModelException(f"{self.name}: the stand-in serves the rendered, non-decoupled config")
        self.exclude_default = params.get("exclude_input_in_output", "false").lower() == "true"
        model = load_pretrained(params["gpt_model_path"], dtype=torch.float64)
        self.vocab = model.config.vocab_size
        # stand-in only: "all" answers a verify with request_output_len tokens (see reference_driver)
        self.engine = ReferenceTrtllmModel(model, verify_output=params.get("standin_verify_output", "accepted"))
        declared = {i["name"] for i in cfg["input"]}
        self.inputs = sorted(declared & INPUT_NAMES)

    def _one(self, request) -> pb_utils.InferenceResponse:
        req = {}
        for name in self.inputs:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None:
                req[name] = t.as_numpy()
        ids = req.get("input_ids")
        if ids is None:
            raise ValueError("input_ids is required for a decoder-only engine")
        if ids.ndim == 2 and ids.shape[0] != 1:
            raise ValueError(f"one sequence per request (batch dimension 1), got {ids.shape[0]}")
        if bool(np.asarray(req.get("streaming", False)).any()):
            raise ValueError("streaming needs the model deployed decoupled (model_transaction_policy { decoupled: true })")
        for name in ("input_ids", "draft_input_ids"):
            a = req.get(name)
            if a is not None and a.size and (int(a.min()) < 0 or int(a.max()) >= self.vocab):
                bad = int(a.min()) if int(a.min()) < 0 else int(a.max())
                raise ValueError(f"{name} holds token id {bad}, outside the vocabulary 0..{self.vocab - 1}")
        if "exclude_input_in_output" not in req:
            req["exclude_input_in_output"] = np.array([[self.exclude_default]])
        out = self.engine(req)
        return pb_utils.InferenceResponse([pb_utils.Tensor("output_ids", out["output_ids"]),
                                           pb_utils.Tensor("sequence_length", out["sequence_length"])])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as e:  # one bad request fails alone, as in the real backend
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        return responses
