"""Triton Python model ``specctl_bls``: streaming speculative decoding over TensorRT engines.

Copied by ``specctl build --backend tensorrt`` to ``triton_repo/specctl_bls/1/model.py``. It is a
decoupled BLS model: clients send ``input_ids``, ``max_tokens`` (optional ``end_id``, ``stream``,
``num_draft_tokens``) and receive ``output_ids`` as the tokens are accepted, then a final response
with ``total_draft_tokens``, ``total_accepted_draft_tokens`` and ``acceptance_rate``. One background
thread runs ``SpecOrchestrator.step`` (control/executors/trtllm/orchestrator.py), which asks the
controller for k per request per step and calls ``tensorrt_llm_draft`` and ``tensorrt_llm`` through
BLS, all requests of a step concurrently. The ``control`` package must be importable in the
Python backend (install this repository into the Triton container with ``pip install``).

This file needs ``triton_python_backend_utils`` and so runs only inside Triton; its logic lives in
the orchestrator, which is tested on its own.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (packaging, linting): the model is unusable there
    pb_utils = None

OUTPUTS = ["output_ids", "sequence_length"]


class TritonEngineClient:
    """``EngineClient`` over Triton BLS: one step's requests to a model are issued together."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()

    def run(self, model: str, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        reqs = [pb_utils.InferenceRequest(model_name=model, requested_output_names=OUTPUTS,
                                          inputs=[pb_utils.Tensor(k, v) for k, v in r.items()]) for r in requests]

        async def gather():
            return await asyncio.gather(*[r.async_exec() for r in reqs])

        out = []
        for resp in self._loop.run_until_complete(gather()):
            if resp.has_error():
                raise pb_utils.TritonModelException(f"{model}: {resp.error().message()}")
            out.append({t.name(): t.as_numpy() for t in resp.output_tensors()})
        return out


def _scalar(request, name: str, default=None):
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        return default
    a = t.as_numpy().reshape(-1)
    return a[0].item() if a.size else default


class TritonPythonModel:
    def initialize(self, args):
        from control.executors.trtllm.orchestrator import SpecOrchestrator
        from control.plan import load_plan
        from control.policy import build_policy

        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        if not pb_utils.using_decoupled_model_transaction_policy(cfg):
            raise pb_utils.TritonModelException("specctl_bls streams: set model_transaction_policy { decoupled: true }")
        plan = load_plan(params["plan"])
        drafter = params.get("drafter", "draft_target")
        self.orch = SpecOrchestrator(
            build_policy(plan.policy, plan), TritonEngineClient(), drafter=drafter,
            max_k=int(params.get("max_draft_len", plan.max_k)), max_batch=int(params.get("max_batch", 64)),
            ngram_size=int(params.get("ngram_size", 3)), target_model=params.get("tensorrt_llm_model_name", "tensorrt_llm"),
            draft_model=params.get("tensorrt_llm_draft_model_name") or "tensorrt_llm_draft",
        )
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="specctl-bls-steps", daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            try:
                served = self.orch.step()
            except Exception as e:  # an engine error is logged and the step retried; the model stays up
                pb_utils.Logger.log_error(f"specctl_bls step failed: {e}")
                served = 0
            if served == 0:
                self._wake.wait(0.05)
                self._wake.clear()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
                if ids is None:
                    raise ValueError("input_ids is required (INT32 token ids)")
                max_tokens = _scalar(request, "max_tokens")
                if max_tokens is None or int(max_tokens) < 1:
                    raise ValueError(f"max_tokens = {max_tokens!r}: send an integer >= 1")
                rid = next(self._ids)
                self.orch.add(rid, ids.as_numpy().reshape(-1), int(max_tokens), self._sink(rid, sender,
                              bool(_scalar(request, "stream", True))), end_id=_scalar(request, "end_id"),
                              num_draft_tokens=_scalar(request, "num_draft_tokens"))
                self._wake.set()
            except Exception as e:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _sink(self, rid, sender, stream: bool):
        held: list[np.ndarray] = []

        def send(new: np.ndarray, finished: bool) -> None:
            if stream and new.size and not finished:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("output_ids", new.astype(np.int32))]))
                return
            held.append(new)
            if not finished:
                return
            stats = self.orch.stats(rid)
            drafted, accepted = stats if stats is not None else (0, 0)
            tokens = new if stream else np.concatenate(held) if held else np.zeros(0, dtype=np.int64)
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("output_ids", tokens.astype(np.int32)),
                pb_utils.Tensor("total_draft_tokens", np.array([drafted], dtype=np.int32)),
                pb_utils.Tensor("total_accepted_draft_tokens", np.array([accepted], dtype=np.int32)),
                pb_utils.Tensor("acceptance_rate", np.array([accepted / drafted if drafted else 0.0], dtype=np.float32)),
            ]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        return send

    def finalize(self):
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
