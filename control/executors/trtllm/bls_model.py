"""Triton Python model ``specctl_bls``: streaming speculative decoding over TensorRT engines.

Copied by ``specctl build --backend tensorrt`` to ``triton_repo/specctl_bls/1/model.py``. It is a
decoupled BLS model: clients send ``input_ids``, ``max_tokens`` (optional ``end_id``, ``stream``,
``num_draft_tokens``) and receive ``output_ids`` as the tokens are accepted, one response per engine
step with ``stream`` (the default), one response in all without. Every response carries
``step_draft_tokens`` and ``step_accepted_draft_tokens`` (one entry per engine step it covers: the
draft tokens verified, which is the k the controller chose unless the drafter proposed fewer, an
n-gram without a match or a draft that reached ``end_id``, and how many of them the target
accepted); the final one adds ``total_draft_tokens``, ``total_accepted_draft_tokens`` and
``acceptance_rate``.

One background thread runs ``SpecOrchestrator.step`` (control/executors/trtllm/orchestrator.py),
which asks the controller for k per request per step and calls ``tensorrt_llm_draft`` and
``tensorrt_llm`` through BLS, all requests of a step concurrently. The same thread polls each
request's ``is_cancelled()`` every ``cancellation_check_period_ms`` and drops cancelled requests
from the batch. A request the engines fail ends with their error; the others go on. The ``control``
package must be importable in the Python backend (install this repository into the Triton container
with ``pip install``).

This file needs ``triton_python_backend_utils`` and so runs only inside Triton; its logic lives in
the orchestrator, which is tested on its own, and the model is tested through a real Triton server
against stand-in engines (tests/executors/trtllm/bls).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (packaging, linting): the model is unusable there
    pb_utils = None

OUTPUTS = ["output_ids", "sequence_length"]


class TritonEngineClient:
    """``EngineClient`` over Triton BLS: one step's requests to a model are issued together; a request
    the model fails comes back as an exception in its place."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()

    def run(self, model: str, requests: list[dict[str, np.ndarray]]) -> list:
        reqs = [pb_utils.InferenceRequest(model_name=model, requested_output_names=OUTPUTS,
                                          inputs=[pb_utils.Tensor(k, v) for k, v in r.items()]) for r in requests]

        async def gather():
            return await asyncio.gather(*[r.async_exec() for r in reqs], return_exceptions=True)

        out: list = []
        for resp in self._loop.run_until_complete(gather()):
            if isinstance(resp, BaseException):
                out.append(resp if isinstance(resp, Exception) else RuntimeError(repr(resp)))
            elif resp.has_error():
                out.append(RuntimeError(resp.error().message()))
            else:
                out.append({t.name(): t.as_numpy() for t in resp.output_tensors()})
        return out

    def close(self) -> None:
        self._loop.close()


def _scalar(request, name: str, default=None):
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        return default
    a = t.as_numpy().reshape(-1)
    return a[0].item() if a.size else default


def _error(message: str, code: str = "INVALID_ARG"):
    code_value = getattr(pb_utils.TritonError, code, None)
    return pb_utils.TritonError(message) if code_value is None else pb_utils.TritonError(message, code_value)


def _i32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32).reshape(-1)


class _Stream:
    """One request's responses: tokens per step (or held until the end), the end, or its error."""

    def __init__(self, model: TritonPythonModel, rid: int, sender, stream: bool) -> None:
        self.model, self.rid, self.sender, self.stream = model, rid, sender, stream
        self.cancelled = False
        self._drafted = 0
        self._accepted = 0
        self._held: list[np.ndarray] = []
        self._steps_d: list[int] = []
        self._steps_a: list[int] = []

    def _send(self, response=None, final: bool = False) -> None:
        try:
            if final:
                self.model.forget(self.rid)
                if response is None:
                    self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    self.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self.sender.send(response)
        except Exception as e:  # the client went away between the check and the send
            pb_utils.Logger.log_warn(f"specctl_bls: request {self.rid}: could not send a response: {e}")

    def tokens(self, new: np.ndarray, finished: bool) -> None:
        """The orchestrator's ``TokenSink``: called once per step the request took part in."""
        if self.cancelled:  # the client cancelled: no data, only the end of the stream
            if finished:
                self._send(final=True)
            return
        stats = self.model.orch.stats(self.rid)
        drafted, accepted = stats if stats is not None else (self._drafted, self._accepted)
        self._steps_d.append(drafted - self._drafted)  # every call is one step that emitted >= 1 token
        self._steps_a.append(accepted - self._accepted)
        self._drafted, self._accepted = drafted, accepted
        self._held.append(new)
        if not finished and not self.stream:
            return
        tokens = np.concatenate(self._held) if len(self._held) > 1 else self._held[0]
        out = [pb_utils.Tensor("output_ids", tokens.astype(np.int32)),
               pb_utils.Tensor("step_draft_tokens", _i32(self._steps_d)),
               pb_utils.Tensor("step_accepted_draft_tokens", _i32(self._steps_a))]
        self._held, self._steps_d, self._steps_a = [], [], []
        if finished:
            out += [pb_utils.Tensor("total_draft_tokens", _i32([drafted])),
                    pb_utils.Tensor("total_accepted_draft_tokens", _i32([accepted])),
                    pb_utils.Tensor("acceptance_rate",
                                    np.array([accepted / drafted if drafted else 0.0], dtype=np.float32))]
        self._send(pb_utils.InferenceResponse(out), final=finished)

    def error(self, message: str) -> None:
        """The orchestrator's ``ErrorSink``: the engines failed this request."""
        if self.cancelled:
            self._send(final=True)
        else:
            self._send(pb_utils.InferenceResponse(error=_error(message, "INTERNAL")), final=True)


class TritonPythonModel:
    def initialize(self, args):
        from control.executors.trtllm.orchestrator import SpecOrchestrator, plan_for_bls
        from control.plan import load_plan
        from control.policy import build_policy

        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        if not pb_utils.using_decoupled_model_transaction_policy(cfg):
            raise pb_utils.TritonModelException("specctl_bls streams: set model_transaction_policy { decoupled: true }")
        drafter = params.get("drafter", "draft_target")
        plan = plan_for_bls(load_plan(params["plan"]), drafter)
        self.client = TritonEngineClient()
        self.orch = SpecOrchestrator(
            build_policy(plan.policy, plan), self.client, drafter=drafter, drafter_name=plan.default_drafter,
            max_k=int(params.get("max_draft_len", plan.max_k)), max_batch=int(params.get("max_batch", 64)),
            ngram_size=int(params.get("ngram_size", 3)), target_model=params.get("tensorrt_llm_model_name", "tensorrt_llm"),
            draft_model=params.get("tensorrt_llm_draft_model_name") or "tensorrt_llm_draft",
        )
        self._cancel_period_s = int(params.get("cancellation_check_period_ms", 50)) / 1e3
        self._streams: dict[int, _Stream] = {}
        self._streams_lock = threading.Lock()
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="specctl-bls-steps", daemon=True)
        self._thread.start()

    def forget(self, rid: int) -> None:
        with self._streams_lock:
            self._streams.pop(rid, None)

    def _check_cancelled(self) -> None:
        with self._streams_lock:
            streams = list(self._streams.values())
        for s in streams:
            if not s.cancelled and s.sender.is_cancelled():
                s.cancelled = True
                self.orch.cancel(s.rid)  # leaves the batch at the start of the next step

    def _loop(self):
        next_check = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_check:
                self._check_cancelled()
                next_check = now + self._cancel_period_s
            try:
                served = self.orch.step()
            except Exception as e:  # a bug (policy, orchestrator): fail what is in flight, keep serving
                n = self.orch.fail_all(f"specctl_bls step failed: {e}")
                pb_utils.Logger.log_error(f"specctl_bls step failed, {n} request(s) ended with the error: {e}")
                served = 0
            if served == 0:
                self._wake.wait(self._cancel_period_s)
                self._wake.clear()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
                if ids is None:
                    raise ValueError("input_ids is required (INT32 token ids)")
                ids = ids.as_numpy().reshape(-1)
                if ids.size == 0:
                    raise ValueError("input_ids is empty: send at least one prompt token")
                if int(ids.min()) < 0:
                    raise ValueError(f"input_ids holds {int(ids.min())}: token ids are >= 0")
                max_tokens = _scalar(request, "max_tokens")
                if max_tokens is None or int(max_tokens) < 1:
                    raise ValueError(f"max_tokens = {max_tokens!r}: send an integer >= 1")
                if self.orch.active >= self.orch.max_batch:
                    sender.send(pb_utils.InferenceResponse(error=_error(
                        f"specctl_bls has {self.orch.max_batch} requests in flight (max_batch); retry later",
                        "UNAVAILABLE")), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                rid = next(self._ids)
                s = _Stream(self, rid, sender, bool(_scalar(request, "stream", True)))
                with self._streams_lock:
                    self._streams[rid] = s
                try:
                    self.orch.add(rid, ids, int(max_tokens), s.tokens, end_id=_scalar(request, "end_id"),
                                  num_draft_tokens=_scalar(request, "num_draft_tokens"), on_error=s.error)
                except Exception:
                    self.forget(rid)
                    raise
                self._wake.set()
            except Exception as e:
                sender.send(pb_utils.InferenceResponse(error=_error(str(e))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def finalize(self):
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
        self.orch.fail_all("specctl_bls is unloading; send the request again once the model is back")
        self.client.close()
