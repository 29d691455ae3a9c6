"""What upstream's client does to stop a request: a request with ``stop`` true and the same request
id, sent on the request's own stream."""

from __future__ import annotations

import queue
import time

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def stream_then_stop(url: str, model: str, inputs, stop, rid: str, after: int = 3) -> list:
    """Upstream's client: send a request on a stream, after ``after`` responses send ``stop`` with its
    id on the same stream, then close the stream, which waits for every response."""
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put(error or result))
    client.async_stream_infer(model, inputs, request_id=rid)
    results = [got.get(timeout=60) for _ in range(after)]
    client.async_stream_infer(model, stop, request_id=rid)
    t0 = time.monotonic()
    client.stop_stream()  # no cancellation: returns once the server has ended the stream
    took = time.monotonic() - t0
    client.close()
    results += [got.get_nowait() for _ in range(got.qsize())]
    assert not [r for r in results if isinstance(r, InferenceServerException)], results
    assert took < 5, f"the stream took {took:.1f} s to end after the stop request"
    return results
