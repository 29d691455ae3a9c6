"""The ``ensemble`` and ``tensorrt_llm_bls`` models: tensorrtllm_backend's request shapes, served by ``llm``.

Clients written for a stock TensorRT-LLM deployment (``end_to_end_grpc_client.py``, the docs' curl
bodies to ``/v2/models/ensemble/generate``) send batched tensors (``[B, 1]``, words ``[B, N]``) to
models named ``ensemble`` or ``tensorrt_llm_bls``. These Python models take those shapes, split the
batch into rows and send each row to ``llm`` as a BLS request (Triton's in-process call, as
upstream's ``tensorrt_llm_bls`` calls ``tensorrt_llm``), so every name reaches the same engine and KV
pool. Responses come back with the batch dimension restored and ``batch_index`` set.

- decoupled (the default): every response of every row is forwarded as it arrives (rows in order);
  the last one carries the final flag;
- not decoupled (``specctl serve --non-decoupled``): one response per request, rows stacked, token
  ids padded with ``pad_id`` (else ``end_id``, else 0) to the longest row.

``text_output`` keeps one string per row (``[1]``, or ``[B]`` stacked), as upstream's clients read
``text_output[0]``; every other output gets the batch dimension (``[1, ...]`` / ``[B, ...]``).

A client that cancels stops receiving at once; its rows run to their end in ``llm`` (this Python
backend has no BLS cancellation), unless it sends a ``stop`` request with the same request id, which
``llm`` applies to every row (``control/triton/stops.py``).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any

import numpy as np

from control.errors import ConfigError
from control.triton.llm_metrics import LlmMetrics
from control.triton.llm_request import check_parameters, request_key

log = logging.getLogger("specctl.triton.forward")

TARGET = "llm"
# How Triton wraps the error a BLS request's model raised: the model's own words follow it.
_BLS_WRAPPER = re.compile(r"^Failed to process the request\(s\) for model '[^']*', message: (?:\w+Exception: )?")
TEXT = "text_output"
MAX_ROWS = 64  # rows in one batched request


def model_message(text: str) -> str:
    """``llm``'s own message from the error of a BLS request to it: without Triton's wrapper
    (``Failed to process the request(s) for model 'llm_0_0', message: ...``) and the Python frames
    after ``At:``, so a client of an alias reads what a client of ``llm`` reads."""
    return _BLS_WRAPPER.sub("", text).split("\nAt:")[0].strip()


class ForwardModel:
    """What the Triton Python model does; ``pb`` is ``triton_python_backend_utils``."""

    def __init__(self, pb, args: dict[str, Any]) -> None:
        self.pb = pb
        config = json.loads(args["model_config"])
        self.name = config.get("name", "ensemble")
        self.decoupled = bool(pb.using_decoupled_model_transaction_policy(config))
        self.inputs = [i["name"] for i in config.get("input", [])]
        self.outputs = [o["name"] for o in config.get("output", []) if o["name"] != "batch_index"]
        self.metrics = LlmMetrics(pb, self.name, outcomes_only=True)  # the requests it refuses itself

    def execute(self, requests) -> None:
        """Start forwarding each request; a refused one gets its error through its response sender
        and counts in ``specctl_requests_total{outcome="rejected"}`` (nothing is raised: see
        ``control.triton.sender``'s ``execute``)."""
        for request in requests:
            try:
                check_parameters(request.parameters())
                rows = self._rows(request)
            except ConfigError as e:
                self.metrics.rejected()
                self._send_error(request.get_response_sender(), str(e), final=True)
                continue
            wanted = [n for n in request.requested_output_names() if n in self.outputs] or self.outputs
            sender = request.get_response_sender()
            run = self._stream if self.decoupled else self._collect
            tid = request_key(request.request_id(), request.parameters())
            threading.Thread(target=self._guard, args=(run, rows, wanted, sender, tid), daemon=True,
                             name=f"{self.name}-forward").start()
        return None

    def finalize(self) -> None:
        pass

    # -- splitting -------------------------------------------------------------------------------------
    def _rows(self, request) -> list[dict[str, np.ndarray]]:
        """Per batch row, the llm model's unbatched inputs (scalars [1], words and ids [N])."""
        arrays: dict[str, np.ndarray] = {}
        for name in self.inputs:
            t = self.pb.get_input_tensor_by_name(request, name)
            if t is not None:
                arrays[name] = t.as_numpy()
        if not arrays:
            raise ConfigError("the request has no inputs: give text_input (or input_ids) and max_tokens")
        sizes = {n: a.shape[0] for n, a in arrays.items()}
        batch = max(sizes.values())
        bad = [n for n, b in sizes.items() if b != batch]
        if bad:
            raise ConfigError(f"{bad[0]} has batch size {sizes[bad[0]]} but other inputs have {batch}: "
                              "every input needs the same first dimension")
        if batch > MAX_ROWS:
            raise ConfigError(f"batch size {batch}: at most {MAX_ROWS} rows per request")
        return [{n: a[b] for n, a in arrays.items()} for b in range(batch)]  # each [1] or [N]

    # -- forwarding ------------------------------------------------------------------------------------
    def _guard(self, run, rows, wanted, sender, tid: str) -> None:
        try:
            run(rows, wanted, sender, tid)
        except Exception as e:  # a bug fails this request only
            log.exception("%s: forwarding failed", self.name)
            self._send_error(sender, f"internal error ({type(e).__name__}) while forwarding to {TARGET}; "
                                     "see the server log", final=True)

    def _request(self, row: dict[str, np.ndarray], wanted: list[str], tid: str):
        """The BLS request for one row, under the client's request id (every row of a request shares
        it, so a ``stop`` request with that id ends them all, as upstream's)."""
        pb = self.pb
        tensors = [pb.Tensor(n, np.ascontiguousarray(a)) for n, a in row.items()]
        return pb.InferenceRequest(model_name=TARGET, inputs=tensors, requested_output_names=wanted, request_id=tid)

    def _stream(self, rows, wanted, sender, tid: str) -> None:
        """Decoupled: forward each response as it comes. Streamed rows go out at once and a flags-only
        response ends the request; otherwise (one response per row) the last response carries the
        final flag, as Triton's HTTP ``generate`` wants exactly one response."""
        iters = [self._request(row, wanted, tid).exec(decoupled=True) for row in rows]
        eager = any(bool(np.asarray(row["stream"]).reshape(-1)[0]) for row in rows if "stream" in row)
        held = None  # (outputs, error) waiting for the next one, so the last can carry the final flag
        for b, responses in enumerate(iters):
            for r in responses:
                if r.has_error():
                    item = (None, model_message(r.error().message()))
                else:
                    outs = self._batched(r, b)
                    if not outs:  # a flags-only final response
                        continue
                    item = (outs, None)
                if held is not None and not self._cancelled(sender):
                    self._emit(sender, held, final=False)
                held = item
                if eager:
                    if not self._cancelled(sender):
                        self._emit(sender, held, final=False)
                    held = None
        if held is not None and not self._cancelled(sender):
            self._emit(sender, held, final=True)
        else:
            self._final(sender)

    def _collect(self, rows, wanted, sender, tid: str) -> None:
        """Not decoupled: one response holding every row, token ids padded to the longest row."""
        per_row = []
        for row in rows:
            r = self._request(row, wanted, tid).exec()
            if r.has_error():
                self._send_error(sender, model_message(r.error().message()), final=True)
                return
            per_row.append({t.name(): t.as_numpy() for t in r.output_tensors()})
        pad = next((int(np.asarray(row[k]).reshape(-1)[0]) for k in ("pad_id", "end_id") if k in rows[0]), 0)
        out = {}
        for name in per_row[0]:
            parts = [np.asarray(p[name]).reshape(-1) for p in per_row]  # each [n_b]
            width = max(p.size for p in parts)
            if name == TEXT:
                out[name] = np.concatenate(parts)  # [B]
            else:
                stacked = np.full((len(parts), width), pad, dtype=parts[0].dtype)  # [B, width]
                for b, p in enumerate(parts):
                    stacked[b, :p.size] = p
                out[name] = stacked
        self._emit(sender, (out, None), final=True)

    def _batched(self, response, b: int) -> dict[str, np.ndarray]:
        # text_output stays [1] (upstream's clients read output[0] as the row's string), the rest [1, ...].
        outs = {t.name(): t.as_numpy() if t.name() == TEXT else t.as_numpy()[None, ...] for t in response.output_tensors()}
        if outs:
            outs["batch_index"] = np.array([[b]], dtype=np.int32)
        return outs

    def _emit(self, sender, item, final: bool) -> None:
        outs, error = item
        if error is not None:
            self._send_error(sender, error, final=final)
            return
        pb = self.pb
        tensors = [pb.Tensor(n, v) for n, v in outs.items()]
        try:
            sender.send(pb.InferenceResponse(output_tensors=tensors),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception:  # the client is gone
            log.info("%s: a client went away", self.name)

    def _final(self, sender) -> None:
        try:
            sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            log.info("%s: a client went away", self.name)

    def _send_error(self, sender, message: str, final: bool) -> None:
        pb = self.pb
        try:
            sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message)),
                        flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception:
            log.info("%s: a client went away", self.name)

    @staticmethod
    def _cancelled(sender) -> bool:
        try:
            return bool(sender.is_cancelled())
        except Exception:
            return True
