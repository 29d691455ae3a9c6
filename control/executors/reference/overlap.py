"""The policy off the engine's critical path: decide step t+1 while step t's passes run.

``PolicyWorker`` owns one thread. During step t the engine hands it the outcome of step t-1 and a
view of the requests that will decode at step t+1 as the engine knows them before step t's passes
(``ReferenceEngine._next_view``: the slot arrays gathered on the engine thread, the view built on
the worker); the thread observes the one and decides the other while the
engine thread drafts and verifies (torch releases the GIL inside its ops). At step t+1 the engine
collects the prepared decision and keeps the rows of the requests that actually decode (requests
that finished in step t drop out; none can join, since a request admitted at step t+1 decodes from
step t+2). So the policy decides with estimates one step stale, as ``control.policy.stale`` models
(``docs/controller-cost.md``, section 4), and every policy call runs on this one thread once the
first step has passed.

Greedy output does not depend on the decision (acceptance is exact match, and the engine clamps
whatever it gets), so the option changes speed only. A policy's ``prune`` still runs on the engine
thread, beside the worker: it must only read the policy's state.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from control.policy.types import Decision, Policy, StepOutcome, StepView


@dataclass
class Prepared:
    """A decision the worker made for a predicted view, with what failed on the way."""

    policy: Policy
    view: StepView | Callable[[], StepView]  # the predicted view (still the callable if building it failed)
    decision: Decision | None
    errors: list[tuple[str, Exception]]  # (policy call, exception), in call order
    busy_s: float  # the worker's wall time on observe + decide (waits for the GIL included)
    cpu_s: float  # the worker thread's CPU time on them

    def decision_for(self, view: StepView) -> Decision | None:
        """The prepared decision's rows for ``view``'s requests (None: a request was not predicted)."""
        d = self.decision
        if d is None:
            return None
        pred = self.view
        if view.n == pred.n and np.array_equal(view.request_ids, pred.request_ids):
            return d
        idx = np.searchsorted(pred.slots, view.slots)  # both ascending (np.flatnonzero of the decoding mask)
        if (idx >= pred.n).any():
            return None
        if not (np.array_equal(pred.slots[idx], view.slots) and np.array_equal(pred.request_ids[idx], view.request_ids)):
            return None
        cut = d.conf_cut
        return dataclasses.replace(d, k=np.asarray(d.k)[idx], drafter=np.asarray(d.drafter)[idx],
                                   conf_cut=None if cut is None else np.asarray(cut)[idx])


def _serve(jobs: queue.SimpleQueue, done: queue.SimpleQueue) -> None:
    """The worker thread: observe the held outcome, then decide the predicted view, until None."""
    while (job := jobs.get()) is not None:
        policy, outcome, view = job
        t0, c0 = time.perf_counter(), time.thread_time()
        errors: list[tuple[str, Exception]] = []
        decision = None
        if outcome is not None:
            try:
                policy.observe(outcome)
            except Exception as e:  # noqa: BLE001 - reported by the engine thread, as on the sequential path
                errors.append(("observe", e))
        try:
            if callable(view):  # the engine's gathered rows: the view is built here, off the step loop
                view = view()
            decision = policy.decide(view)
            if not isinstance(decision, Decision):
                raise TypeError(f"decide returned {type(decision).__name__}, not a Decision")
        except Exception as e:  # noqa: BLE001
            errors.append(("decide", e))
            decision = None
        done.put(Prepared(policy, view, decision, errors, time.perf_counter() - t0, time.thread_time() - c0))


class PolicyWorker:
    """One thread running a policy's observe + decide jobs, one job in flight at a time."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._in_flight = False
        self.busy_ms = 0.0  # the worker's total wall time on policy calls (waits for the GIL included)
        self.cpu_ms = 0.0  # the worker thread's total CPU time on them
        self.wait_ms = 0.0  # the engine thread's total time waiting in collect for a job to finish
        self.jobs = 0
        self.used = 0  # prepared decisions the engine used (counted by the engine)
        self.thread = thread = threading.Thread(target=_serve, args=(self._jobs, self._done), name="policy-worker",
                                                daemon=True)
        thread.start()
        self._finalizer = weakref.finalize(self, self._jobs.put, None)  # the thread ends with its owner

    def submit(self, policy: Policy, outcome: StepOutcome | None, view: StepView | Callable[[], StepView]) -> None:
        """Observe ``outcome`` (if any), then decide ``view`` (or the view it builds, on the worker)."""
        if self._in_flight:
            raise RuntimeError("PolicyWorker.submit: the previous job was not collected")
        self._in_flight = True
        self._jobs.put((policy, outcome, view))

    def collect(self) -> Prepared | None:
        """Wait for the job in flight (None: none is)."""
        if not self._in_flight:
            return None
        t0 = time.perf_counter()
        prep = self._done.get()
        self.wait_ms += (time.perf_counter() - t0) * 1e3
        self._in_flight = False
        self.busy_ms += prep.busy_s * 1e3
        self.cpu_ms += prep.cpu_s * 1e3
        self.jobs += 1
        return prep

    def close(self) -> None:
        """Wait for the job in flight and end the thread."""
        self.collect()
        self.stop()

    def stop(self) -> None:
        """End the thread after the job in flight, without waiting for it (its result is dropped)."""
        self._finalizer()
