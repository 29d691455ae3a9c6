"""gRPC streaming and HTTP clients for ``specctl_bls``, as a user writes them with tritonclient."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient


@dataclass
class Generation:
    """What one request got back: tokens per response, per-step draft/accepted counts, final totals."""

    chunks: list[list[int]] = field(default_factory=list)
    step_drafted: list[int] = field(default_factory=list)
    step_accepted: list[int] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    final: bool = False

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.chunks for t in c]

    def add(self, outputs: dict[str, np.ndarray], final: bool) -> None:
        self.chunks.append(outputs["output_ids"].reshape(-1).tolist())
        self.step_drafted += outputs["step_draft_tokens"].reshape(-1).tolist()
        self.step_accepted += outputs["step_accepted_draft_tokens"].reshape(-1).tolist()
        for k in ("total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate"):
            if k in outputs:
                self.totals[k] = outputs[k].reshape(-1)[0].item()
        self.final = self.final or final


def inputs(prompt, max_tokens, *, stream: bool | None = None, end_id: int | None = None,
           num_draft_tokens: int | None = None, ids_dtype: str = "INT32") -> list[grpcclient.InferInput]:
    np_dtype = {"INT32": np.int32, "INT64": np.int64, "FP32": np.float32}[ids_dtype]
    ids = np.asarray(prompt, dtype=np_dtype).reshape(-1)
    out = [grpcclient.InferInput("input_ids", list(ids.shape), ids_dtype)]
    out[0].set_data_from_numpy(ids)
    for name, value, dt, npdt in (("max_tokens", max_tokens, "INT32", np.int32), ("stream", stream, "BOOL", bool),
                                  ("end_id", end_id, "INT32", np.int32),
                                  ("num_draft_tokens", num_draft_tokens, "INT32", np.int32)):
        if value is not None:
            t = grpcclient.InferInput(name, [1], dt)
            t.set_data_from_numpy(np.array([value], dtype=npdt))
            out.append(t)
    return out


OUTPUT_NAMES = ("output_ids", "step_draft_tokens", "step_accepted_draft_tokens", "total_draft_tokens",
                "total_accepted_draft_tokens", "acceptance_rate")


class Stream:
    """One gRPC bidirectional stream carrying many requests at once, told apart by request id.

    The stream reports an error response without its request id, so a request that may fail gets a
    stream of its own.
    """

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.results: dict[str, Generation] = {}
        self.done: queue.Queue[str] = queue.Queue()
        self.errors: list[str] = []
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result, error) -> None:
        if error is not None:
            self.errors.append(str(error))
            self.done.put("")
            return
        resp = result.get_response()
        final = resp.parameters["triton_final_response"].bool_param
        gen = self.results[resp.id]
        if resp.outputs:
            gen.add({name: result.as_numpy(name) for name in OUTPUT_NAMES if result.as_numpy(name) is not None}, final)
        elif final:
            gen.final = True
        if final:
            self.done.put(resp.id)

    def send(self, model: str, rid: str, prompt, max_tokens: int, **kw) -> Generation:
        gen = self.results[rid] = Generation()
        self.client.async_stream_infer(model, inputs(prompt, max_tokens, **kw), request_id=rid,
                                       enable_empty_final_response=True)
        return gen

    def wait(self, n: int, timeout: float = 60.0) -> None:
        """Wait until ``n`` requests ended (final response or error)."""
        for _ in range(n):
            self.done.get(timeout=timeout)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def generate(url: str, model: str, prompt, max_tokens: int, timeout: float = 60.0, **kw) -> Generation:
    """One request on a stream of its own; an error response ends up in ``Generation.error``."""
    s = Stream(url)
    try:
        gen = s.send(model, "r", prompt, max_tokens, **kw)
        s.wait(1, timeout)
        if s.errors:
            gen.error = s.errors[0]
        return gen
    finally:
        s.close()


def http_post(url: str, body: dict, timeout: float = 60.0) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
