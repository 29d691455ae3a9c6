"""Which in-flight requests the engine loop asks about cancellation before a step.

Asking a Triton response sender ``is_cancelled()`` is a round trip to the server process (tens of
microseconds): asking every request in flight before every step would make the loop's own work
per step grow with the queue (docs/decisions.md, 2026-11-24). ``CancelWatch`` asks a fixed number per step instead: ``running_per_step`` of the requests
that ran in the last step, in turn (a cancelled one stops costing compute within
batch / running_per_step steps), and ``queued_per_step`` of the others, in turn (a queued request
costs nothing until admitted; when admitted it becomes a running one). A request whose client went
away is also caught when a send to it fails, as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable

RUNNING_PER_STEP = 8
QUEUED_PER_STEP = 8


class CancelWatch:
    """Round-robin choice of the requests to ask about cancellation, a fixed number per step.

    ``add`` may be called from another thread than ``due`` (a deque's append and popleft are atomic).
    """

    def __init__(self, running_per_step: int = RUNNING_PER_STEP, queued_per_step: int = QUEUED_PER_STEP) -> None:
        if running_per_step < 1 or queued_per_step < 1:
            raise ValueError(f"running_per_step = {running_per_step}, queued_per_step = {queued_per_step}: "
                             "both must be >= 1")
        self.running_per_step = running_per_step
        self.queued_per_step = queued_per_step
        self._ring: deque[int] = deque()  # every request added, in turn; finished ones dropped when met
        self._running: list[int] = []
        self._running_set: set[int] = set()
        self._turn = 0

    def add(self, request_id: int) -> None:
        self._ring.append(request_id)

    def ran(self, request_ids: Iterable[int]) -> None:
        """The requests the last step produced output for (the running ones)."""
        self._running = list(request_ids)
        self._running_set = set(self._running)

    def due(self, live: Container[int]) -> list[int]:
        """The request ids to ask before this step (each still in ``live``)."""
        out: list[int] = []
        running = self._running
        if running:
            take = min(self.running_per_step, len(running))
            start = self._turn % len(running)
            for i in range(take):
                rid = running[(start + i) % len(running)]
                if rid in live:
                    out.append(rid)
            self._turn = start + take
        seen = self._running_set
        ring = self._ring
        asked = 0
        # every pop either asks a queued request, skips a running one, or drops a finished one:
        # bounded by the running set and the queued budget, plus finished ids dropped once each
        for _ in range(len(ring)):
            if asked >= self.queued_per_step:
                break
            rid = ring.popleft()
            if rid not in live:
                continue
            ring.append(rid)
            if rid in seen:
                continue
            out.append(rid)
            asked += 1
        return out
