"""The ``llm`` Triton model: one engine loop per model instance, the controller (agent) inside it.

``triton_repo/llm/1/model.py`` is a thin shim that hands Triton's calls to ``load_model``, which
returns ``LlmModel``. The model hosts any executor of the ``Executor`` protocol
(``control/executors/base.py``): its ``executor`` parameter names a builder (``control/triton/hosts.py``:
``reference`` what ``specctl serve`` renders, ``trtllm`` what ``specctl build --backend pytorch``
renders, ``sim`` the simulator on a virtual clock), which returns the executor with its agent and
tokenizer (``Hosted``). The model never asks which data plane it holds: it reads the executor's
``capabilities`` (whether plans reach it, for the policy requests are checked against) and adds the
host's ``describe()`` to its stats. ``LlmModel``:

- ``initialize`` reads the model parameters (``config.pbtxt``): the executor and what it needs, the
  profile, the policy, the control-plane URL and the file holding its token, limits; it builds the
  executor and the agent (which serves on its default plan until the service answers) and starts the
  loop thread.
- ``execute`` (decoupled) validates each request, registers it with the executor and returns at
  once; a bad request gets a Triton error naming the value and what is accepted, and nobody else is
  affected. A text prompt over 4 KiB is tokenised on a thread of its own (``tokenize_worker.py``),
  without the GIL, so it holds up neither the requests behind it nor the engine loop.
- The loop thread steps the executor whenever it has work and sleeps on a condition otherwise. Each
  step's new tokens go out through that request's response sender (text detokenised incrementally,
  never splitting a multi-byte character); a request whose client cancelled or went away is cancelled
  in the executor before a step, which frees its KV slot at once: before each step a fixed number of
  the running and of the queued requests are asked in turn (``CancelWatch``), so the loop's own work
  per step does not grow with the queue; an error in one request, one step or the loop's own work
  (asking about cancellation, delivering) never takes the loop down.
  A request the executor fails alone (``FinishReason.error``) gets an error response with its reason.
- Errors are errors: a refused request gets its error through its response sender and counts in
  ``specctl_requests_total{outcome="rejected"}`` (nothing is raised out of ``execute``: see
  ``sender.py``); a step that fails answers every request in it with an error
  response carrying the final flag and counts them in ``specctl_requests_total{outcome="failed"}``.
  Triton's own counter cannot see those: the Python backend reports a decoupled request's outcome
  when ``execute`` returns (``python_be.cc``, ``PbMetricReporter``), before any token is made.
  ``control/triton/faults.py`` can inject such a failure for the tests.
- Stopping: Triton cannot unload a decoupled model while a request's response sender is open, and
  its Python stub ignores SIGTERM, so requests in flight would hold the model until tritonserver's exit
  timeout. The deployment (``deploy.py``) therefore writes the ``drain_file`` first: the loop, which
  looks for it every ``DRAIN_POLL_S``, ends every request with an error response saying the server is
  stopping, refuses new ones, and writes ``<drain_file>.<instance>`` to say it has; then Triton stops.
- A request with ``stop`` true ends the request in flight with the same request id before the next
  step (``stops.py``): that request's final response carries what it has (counted as cancelled, and
  as stopped); the stop request is answered at once with one empty final response.
- A request with ``stats`` true gets the instance's counters (KV slots in use, requests, the plan the
  agent follows, the last step's k, whether the engine loop is alive and how long since it last
  stepped or woke idle) as JSON in ``text_output``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from control.agent.wire import K_BUCKETS
from control.errors import ConfigError
from control.executors.base import FinishReason, RequestOutput
from control.triton.cancel_watch import CancelWatch
from control.triton.faults import (
    DELIVER_FAULT_ENV,
    STEP_FAULT_ENV,
    failing_deliver,
    failing_step,
    fault_prefix,
)
from control.triton.hosts import build_hosted
from control.triton.llm_request import STOPPING, GenerateRequest, Limits
from control.triton.sender import (
    Counters,
    Detokenizer,
    Live,
    ResponseSender,
)

log = logging.getLogger("specctl.triton.llm")
SHUTDOWN_JOIN_S = 5.0  # the engine loop's time to stop at finalize: under deploy.EXIT_TIMEOUT_S, so a loop
# that does not stop is logged with its phase before tritonserver gives up on the unload
IDLE_WAIT_S = 0.5  # how often an idle loop wakes (and marks its progress) without a request arriving
DRAIN_POLL_S = 0.2  # how often the loop looks for the deployment's drain file (a stat call)


def load_model(pb, args: dict[str, Any]) -> LlmModel:
    """The llm model for this config (``args`` as Triton passes them to ``initialize``)."""
    return LlmModel(pb, args)


class LlmModel(ResponseSender):
    """What the Triton Python model does; ``pb`` is ``triton_python_backend_utils``."""

    def __init__(self, pb, args: dict[str, Any]) -> None:
        p = self._read_config(pb, args)
        self.hosted = h = build_hosted(p, self.instance)
        self.engine = h.executor
        self.agent = h.agent
        self._encode, self._encode_words, self._decode = h.encode, h.encode_words, h.decode
        self._encode_large = h.encode_large
        bounds = {} if h.max_prompt_bytes is None else {"max_prompt_bytes": h.max_prompt_bytes}
        self.limits = Limits(max_tokens=p.max_tokens, default_max_tokens=min(p.default_max_tokens, p.max_tokens),
                             vocab_size=h.vocab_size, **bounds)
        self.counters = Counters()
        self.live: dict[int, Live] = {}
        self._cond = threading.Condition()
        # Held across add_request + registration and across each step's delivery, so a step never
        # delivers output for a request whose sender is not registered yet.
        self._reg = threading.Lock()
        self._stop = False
        self._last_k: list[int] = []
        self._k_hist = np.zeros(K_BUCKETS, dtype=np.int64)  # request-steps by k
        self._drafter_names = tuple(self.engine.capabilities.drafters)
        self._drafter_steps = np.zeros(len(self._drafter_names), dtype=np.int64)  # drafting request-steps by drafter
        self._watch = CancelWatch()
        self._progress_at = time.monotonic()  # the loop's last step or idle wake-up
        self._phase = "idle"  # what the loop is doing now (``stats``' loop.phase; finalize names it)
        self._drain_path = Path(p.drain_file) if p.drain_file else None
        self._draining = False  # set once, under ``_reg``: every request ended, new ones refused
        self._drain_checked = 0.0  # monotonic time of the last look for the drain file
        prefix = fault_prefix(STEP_FAULT_ENV)
        self._step = failing_step(self.engine.step, self.live, prefix) if prefix else self.engine.step
        prefix = fault_prefix(DELIVER_FAULT_ENV)
        self._deliver_one = failing_deliver(self._deliver, self.live, prefix) if prefix else self._deliver
        self._thread = threading.Thread(target=self._loop, name=f"{self.instance}-engine", daemon=True)
        self._thread.start()
        if self.agent is not None:
            self.agent.start()

    # -- Triton entry points ---------------------------------------------------------------------------

    def finalize(self) -> None:
        t_start = time.monotonic()
        self._close_tokenizer()
        t0 = time.monotonic()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(SHUTDOWN_JOIN_S)
        if self._thread.is_alive():
            log.warning("llm %s: the engine loop did not stop within %.0f s (phase: %s, %d live requests)",
                        self.instance, SHUTDOWN_JOIN_S, self._phase, len(self.live))
        for live in list(self.live.values()):
            self._send_error(live.sender, f"{STOPPING}; retry it")  # (what a drain would have said; 503 at the front end)
        self.live.clear()
        t1 = time.monotonic()
        try:
            self.hosted.close()
        except Exception as e:
            log.warning("llm %s: closing the executor: %s", self.instance, e)
        t2 = time.monotonic()
        if self.agent is not None:
            self.agent.stop()
        log.warning("llm %s: finalized (tokenizer %.2f s, engine loop %.2f s, executor %.2f s, agent %.2f s)",
                    self.instance, t0 - t_start, t1 - t0, t2 - t1, time.monotonic() - t2)

    # -- requests --------------------------------------------------------------------------------------
    def _submit(self, req: GenerateRequest, sender, tid: str = "") -> None:
        with self._reg:
            if self._draining:
                raise ConfigError(f"{STOPPING}; retry this request once it is back, or on another replica")
            if self._stops.arrived(tid):  # stopped while its prompt was tokenised: it ends without running
                self._ended_by_stop(sender)
                return
            rid = self.engine.add_request(req.prompt_ids, req.params)  # ConfigError: nothing is queued
            self.live[rid] = Live(rid, sender, req.stream, Detokenizer(self._decode), time.monotonic(), req,
                                  tid=tid, arrival_ns=time.time_ns())
            self._watch.add(rid)
            self.counters.requests += 1
        with self._cond:
            self._cond.notify()

    def _ended_by_stop(self, sender) -> None:
        c = self.counters
        c.requests += 1
        c.cancelled += 1
        c.stopped += 1
        self.metrics.cancelled(tokens=0, drafted=0, accepted=0)
        try:
            sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            c.send_errors += 1

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def current_policy(self) -> str:
        """The policy requests are checked against: the plan the agent runs where plans reach the
        executor; where they change nothing (a static schedule), the newest plan received."""
        if self.agent is None:
            return "none"
        return (self.agent.plan if self.engine.capabilities.follows_plans else self._newest_plan()).policy

    def _newest_plan(self):
        pending = getattr(self.agent, "_pending", None)  # applied at the agent's next decide
        return pending.plan if pending is not None else self.agent.plan

    # -- the engine loop (its own thread) --------------------------------------------------------------
    def _loop(self) -> None:
        engine = self.engine
        while True:
            self._check_drain()
            with self._cond:
                if self._stop:
                    return
                if not engine.has_work():
                    self._progress_at = time.monotonic()
                    self._phase = "idle"
                    self._cond.wait(IDLE_WAIT_S)
                    continue
            try:
                self._iterate()
            except Exception as e:  # the loop's own bookkeeping failed: its requests get the reason, never a hang
                with self._reg:
                    self._step_failed(e)
            self._progress_at = time.monotonic()

    def _iterate(self) -> None:
        """Ask about cancellations, run one step, deliver its outputs."""
        self._phase = "asking about cancellations"
        self._reap_cancelled()
        self._phase = "step"
        try:
            outs = self._step()
        except Exception as e:  # a failed step fails the requests in it, never the loop
            with self._reg:
                self._step_failed(e)
            return
        st = self.engine.last_stats
        c = self.counters
        c.totals.add(st)
        c.generated += st.generated
        if st.decode_batch:
            k = np.asarray(st.k, dtype=np.int64)
            self._k_hist += np.bincount(np.clip(k, 0, K_BUCKETS - 1), minlength=K_BUCKETS)
            self._count_drafters(k, st.drafter)
        self._last_k = list(st.k)
        t, tc = time.perf_counter(), time.thread_time()
        self._phase = "delivering"
        with self._reg:
            for out in outs:
                try:
                    self._deliver_one(out)
                except Exception as e:  # this request alone: it gets the reason, the rest of the step goes out
                    self._deliver_failed(out, e)
        c.deliver_ms += (time.perf_counter() - t) * 1e3
        c.deliver_cpu_ms += (time.thread_time() - tc) * 1e3
        self._watch.ran(out.request_id for out in outs if not out.finished)

    def _check_drain(self) -> None:
        """At most every ``DRAIN_POLL_S``: once the drain file exists, end every request in flight with
        an error response (each one's final response frees its sender, so Triton can unload the model),
        refuse new ones and acknowledge (module doc)."""
        if self._drain_path is None or self._draining:
            return
        now = time.monotonic()
        if now - self._drain_checked < DRAIN_POLL_S:
            return
        self._drain_checked = now
        if not self._drain_path.exists():
            return
        self._phase = "draining"
        with self._reg:
            self._draining = True
            ended = list(self.live.values())
            for live in ended:
                self._drop(live.rid)
                self.counters.failed += 1
                self.metrics.failed()
                self._send_error(live.sender, f"{STOPPING}: this request ended after {live.generated} tokens; retry it")
        ack = self._drain_path.with_name(f"{self._drain_path.name}.{self.instance.replace(' ', '-')}")
        try:
            ack.write_text(f"{len(ended)}\n")
        except OSError as e:
            log.warning("llm %s: cannot acknowledge the drain at %s: %s", self.instance, ack, e)
        log.warning("llm %s: drained: %d requests in flight ended", self.instance, len(ended))

    def _count_drafters(self, k: np.ndarray, drafter: list[int]) -> None:
        """Add the step's drafting request-steps (k > 0) to their drafters' counts."""
        m = self._drafter_steps.size
        if not m or len(drafter) != k.size:  # an executor that does not report its drafters
            return
        d = np.asarray(drafter, dtype=np.int64)[k > 0]  # (drafting,)
        self._drafter_steps += np.bincount(d[(d >= 0) & (d < m)], minlength=m)

    def _reap_cancelled(self) -> None:
        """Cancel the requests a stop request named, and those whose client cancelled or went away
        among those due to be asked."""
        for tid in self._stops.due():
            with self._reg:  # execute() registers requests meanwhile
                named = [(rid, live) for rid, live in self.live.items() if live.tid == tid]
            for rid, live in named:
                self._stopped(rid, live)
        for rid in self._watch.due(self.live):
            live = self.live.get(rid)
            if live is None:
                continue
            try:
                gone = live.sender.is_cancelled()
            except Exception:
                gone = True
            if gone:
                self._cancel(rid, live)

    def _cancel(self, rid: int, live: Live) -> None:
        self._drop(rid)
        self.counters.cancelled += 1
        self.metrics.cancelled(tokens=live.generated, drafted=live.drafted, accepted=live.accepted)
        try:
            live.sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            self.counters.send_errors += 1

    def _stopped(self, rid: int, live: Live) -> None:
        """A stop request ended ``rid``: its client is still there, so its final response carries what
        it has (the text not yet sent when streaming, the whole answer so far otherwise), as
        TensorRT-LLM answers a cancelled request."""
        self._drop(rid)
        c = self.counters
        c.cancelled += 1
        c.stopped += 1
        self.metrics.cancelled(tokens=live.generated, drafted=live.drafted, accepted=live.accepted)
        rest = live.detok.push((), final=True)
        try:
            if live.stream:
                self._send(live.sender, self._outputs(live, rest, []), final=True)
            else:
                self._send(live.sender, self._outputs(live, "".join(live.text) + rest, live.ids), final=True)
        except Exception:
            c.send_errors += 1

    def _drop(self, rid: int) -> None:
        """Forget request ``rid`` here and in the executor (between steps: its KV slot is freed now);
        a failed cancel is logged, and the caller still sends the request its final response."""
        self.live.pop(rid, None)
        try:
            self.engine.cancel(rid)
        except Exception as e:
            log.exception("llm %s: cancelling request %d in the executor", self.instance, rid)
            self.counters.last_error = f"cancel: {type(e).__name__}: {e}"

    def _deliver(self, out: RequestOutput) -> None:
        live = self.live.get(out.request_id)
        if live is None:  # cancelled meanwhile
            return
        live.drafted, live.accepted = out.total_drafted, out.total_accepted
        if out.finish_reason == FinishReason.cancelled:
            self.live.pop(out.request_id, None)
            return
        if out.finish_reason == FinishReason.error:
            self._request_failed(live, out.error or "the engine failed while running this request; retry it")
            return
        live.generated += len(out.new_token_ids)
        if out.new_token_ids and not live.first_token_ns:
            live.first_token_ns, live.first_token_s = time.time_ns(), time.monotonic()
        delta = live.detok.push(out.new_token_ids, final=out.finished)
        try:
            if live.stream:
                if out.new_token_ids or out.finished:
                    self._send(live.sender, self._outputs(live, delta, list(out.new_token_ids)), final=out.finished)
            else:
                live.text.append(delta)
                live.ids.extend(out.new_token_ids)
                if out.finished:
                    self._send(live.sender, self._outputs(live, "".join(live.text), live.ids), final=True)
        except Exception as e:  # the client went away: free its KV now
            self.counters.send_errors += 1
            self.counters.last_error = f"send: {type(e).__name__}: {e}"
            if not out.finished:
                self._cancel(out.request_id, live)
            self.live.pop(out.request_id, None)
            return
        if out.finished:
            self.live.pop(out.request_id, None)
            self.counters.completed += 1
            self.counters.drafted += out.total_drafted
            self.counters.accepted += out.total_accepted
            now = time.monotonic()
            self.metrics.finished(latency_s=now - live.started,
                                  ttft_s=(live.first_token_s or now) - live.started, tokens=out.num_generated,
                                  drafted=out.total_drafted, accepted=out.total_accepted)

    def _deliver_failed(self, out: RequestOutput, e: Exception) -> None:
        """Delivering ``out`` raised (not a send: those are handled in ``_deliver``): the request ends
        with the reason, in the executor too, so it neither hangs nor holds its KV slot."""
        live = self.live.get(out.request_id)
        log.exception("llm %s: delivering request %d's output", self.instance, out.request_id)
        if live is None:
            return
        if not out.finished:
            self.engine.cancel(out.request_id)
        self._request_failed(live, f"the server failed while answering this request ({type(e).__name__}: {e}); "
                                   "retry it")

    def _request_failed(self, live: Live, message: str) -> None:
        """The executor failed this request alone: it gets the reason, the rest go on."""
        self.live.pop(live.rid, None)
        c = self.counters
        c.failed += 1
        c.last_error = message
        self.metrics.failed()
        log.warning("llm %s: request failed in the executor: %s", self.instance, message)
        self._send_error(live.sender, message)

    def _step_failed(self, e: Exception) -> None:
        log.exception("llm: engine step failed")
        self.counters.step_errors += 1
        self.counters.last_error = f"step: {type(e).__name__}: {e}"
        for rid, live in list(self.live.items()):
            self.live.pop(rid, None)
            try:
                self.engine.cancel(rid)
            except Exception:  # the request is answered all the same
                log.exception("llm %s: cancelling request %d after a failed step", self.instance, rid)
            self.counters.failed += 1
            self.metrics.failed()
            self._send_error(live.sender, f"the engine failed while running this request ({type(e).__name__}: {e}); "
                                          "retry it")

    # -- stats -----------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The instance's counters, the executor's capabilities and its host's own fields."""
        e = self.engine
        c = self.counters
        t = c.totals
        doc = {
            "instance": self.instance, "executor": self.params.executor,
            "capabilities": e.capabilities.to_dict(), "active_requests": len(self.live),
            "waiting": e.last_stats.waiting,
            "requests": c.requests, "rejected": c.rejected, "completed": c.completed, "cancelled": c.cancelled,
            "stopped": c.stopped,
            "failed": c.failed, "steps": t.steps, "step_errors": c.step_errors, "send_errors": c.send_errors,
            "drafted": c.drafted, "accepted": c.accepted, "last_k": self._last_k, "last_error": c.last_error,
            "busy_ms": round(t.sums.total_ms, 3), "policy_ms": round(t.sums.policy_ms, 3),
            "prefill_ms": round(t.sums.prefill_ms, 3), "draft_ms": round(t.sums.draft_ms, 3),
            "verify_ms": round(t.sums.verify_ms, 3), "deliver_ms": round(c.deliver_ms, 3),
            "deliver_cpu_ms": round(c.deliver_cpu_ms, 3),
            "decode_steps": t.decode_steps, "spec_steps": t.spec_steps,
            "step_verified": t.sums.verified, "step_accepted": t.sums.accepted, "generated": c.generated,
            "k_hist": self._k_hist.tolist(),
            "drafter_steps": dict(zip(self._drafter_names, self._drafter_steps.tolist(), strict=True)),
            "policy": self.current_policy(),
            # a loop that is not alive, or whose last step or idle wake-up is long past, serves nobody
            "loop": {"alive": self._thread.is_alive(),
                     "since_progress_s": round(time.monotonic() - self._progress_at, 3), "phase": self._phase},
            **self.hosted.describe(),
        }
        if self.agent is not None:
            doc["agent"] = self.agent.stats().to_dict()
            doc["plan_version"] = self.agent.plan.version
            # The newest plan the agent has received: it is applied at the next step, so an idle
            # instance shows here what its next request will run under.
            newest = self._newest_plan()
            doc["plan_received"] = {"policy": newest.policy, "version": newest.version, "max_k": newest.max_k}
        return doc
