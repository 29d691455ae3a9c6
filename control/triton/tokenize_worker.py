"""Large prompts are tokenised on a thread of their own, off Triton's ``execute()``.

Triton calls a model instance's ``execute()`` for one request after another: a prompt tokenised there
holds up every request behind it (docs/decisions.md, 2026-11-25). ``execute()`` checks a prompt's size, tokenises prompts up to ``INLINE_PROMPT_BYTES``
itself (well under a millisecond) and hands larger ones to ``TokenizeWorker``, whose thread runs
the jobs in arrival order; the tokenizer releases the GIL, so the engine loop keeps stepping meanwhile.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("specctl.triton.tokenize")

INLINE_PROMPT_BYTES = 4096  # text prompts up to this size are tokenised inside execute()


class TokenizeWorker:
    """A FIFO of jobs run on one daemon thread; ``close`` hands the jobs not yet run to ``on_dropped``."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], Callable[[], None]]] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._lock = threading.Lock()  # put and close's drain never interleave: no job is lost
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, job: Callable[[], None], on_dropped: Callable[[], None]) -> None:
        """Run ``job`` on the worker; ``on_dropped`` instead if the worker closes before it runs."""
        with self._lock:
            if not self._closed.is_set():
                self._jobs.put((job, on_dropped))
                return
        on_dropped()

    def close(self, timeout_s: float = 5.0) -> bool:
        """Stop the thread (waiting ``timeout_s`` for a job it is in) and answer the jobs not run;
        whether the thread stopped."""
        self._closed.set()
        self._jobs.put((_nothing, _nothing))  # wakes the thread if it waits for a job
        self._thread.join(timeout_s)
        dropped = []
        with self._lock:
            while not self._jobs.empty():
                dropped.append(self._jobs.get_nowait()[1])
        for on_dropped in dropped:
            on_dropped()
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._closed.is_set():
            job, _ = self._jobs.get()  # close queues a job too: no wait outlasts it
            try:
                job()
            except Exception:  # a job answers its own request; this thread must outlive any one job
                log.exception("llm: a tokenising job failed")


def _nothing() -> None:
    """The job ``close`` queues to wake the thread."""
