"""Per-request output queues: what ``Executor.stream`` reads, for executors that keep no queue of their own."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from control.errors import ConfigError
from control.executors.base import RequestOutput


class OutputStreams:
    """One queue per request added with ``stream=True``; the loop thread ``emit``s, any thread reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[int, queue.SimpleQueue] = {}

    def open(self, request_id: int) -> None:
        with self._lock:
            self._queues[request_id] = queue.SimpleQueue()

    def emit(self, out: RequestOutput) -> None:
        with self._lock:
            q = self._queues.get(out.request_id)
        if q is not None:
            q.put(out)

    def read(self, request_id: int, timeout: float | None = None) -> Iterator[RequestOutput]:
        """Yield the request's outputs until it finishes; TimeoutError after ``timeout`` s without one."""
        with self._lock:
            q = self._queues.get(request_id)
        if q is None:
            raise ConfigError(f"request {request_id} has no stream (add it with stream=True; a stream is read once)")
        while True:
            try:
                out = q.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {request_id}: no output within {timeout} s") from None
            yield out
            if out.finished:
                with self._lock:
                    self._queues.pop(request_id, None)
                return
