"""Stop requests: a request with ``stop`` true ends the request in flight with the same request id.

This is tensorrtllm_backend's ``stop`` input: the stop request is answered at once with one empty
final response (an id that matches nothing is not an error: that request may have finished), and the
request it names ends with its final response as a cancelled one would. The front end ends a request
this way when its HTTP client goes away, rather than by cancelling the gRPC stream, because Triton
2.51's gRPC frontend can crash on a stream cancelled while responses are in flight
(docs/decisions.md, 2026-11-28).

``Stops`` is the bookkeeping between Triton's ``execute`` thread, the tokenising thread and the engine
loop; each method may be called from any of them:

1. ``request(tid)`` (a stop arrived): a request with that id still waiting to be tokenised is marked,
   anything else is queued for the loop.
2. ``due()`` (the loop, before a step): the queued ids; the loop ends the live requests that carry them.
3. ``expect(tid)`` / ``arrived(tid)`` (a large prompt tokenised on its own thread): the request is
   known by its id before it is registered, so a stop sent meanwhile is not lost: ``arrived`` says
   whether one came, and the request then ends without running.
"""

from __future__ import annotations

import threading
from collections import deque


class Stops:
    """Stop requests by Triton request id (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[str] = deque()  # ids to end, for the loop
        self._tokenizing: dict[str, bool] = {}  # id -> stopped, for requests not registered yet

    def request(self, tid: str) -> None:
        with self._lock:
            if tid in self._tokenizing:
                self._tokenizing[tid] = True
            else:
                self._queue.append(tid)

    def due(self) -> list[str]:
        if not self._queue:  # the loop's common case: no lock, no allocation beyond the empty list
            return []
        with self._lock:
            out = list(self._queue)
            self._queue.clear()
        return out

    def expect(self, tid: str) -> None:
        if tid:
            with self._lock:
                self._tokenizing[tid] = False

    def arrived(self, tid: str) -> bool:
        """The request ``tid`` is being registered: whether a stop came for it while it waited."""
        if not tid:
            return False
        with self._lock:
            return self._tokenizing.pop(tid, False)
