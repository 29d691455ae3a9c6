"""The ``llm`` Triton model on TensorRT-LLM's LLM API (``executor: trtllm``, ``specctl build --backend pytorch``).

Same request and response contract as the reference path (``control/triton/llm_model.py``): the
tensors are parsed and validated by ``control.triton.llm_request.parse_request`` and checked against
the model's vocabulary and ``max_seq_len`` with the reference engine's messages, so a client sees the
same one-line errors on either data plane. What differs is the loop:

- ``initialize`` reads the config's parameters (``llm_api_options``, ``model``, ``plan``,
  ``control``, ``trtllm_version``), then needs TensorRT-LLM of the release the build recorded
  (``trtllm_version``; empty: the pinned 1.2.1): without it, or with another release installed, the
  model fails to load with one line saying what it found and what it needs. It builds the agent from the build's plan (its profile, policy and K) and
  ``LlmApiExecutor`` (``control/executors/trtllm/llmapi.py``), and starts one asyncio event loop in a
  thread of its own (one per model instance).
- ``execute`` validates each request on Triton's thread (a bad one gets its error at once) and hands
  it to the loop, which calls ``generate_async(..., streaming=True)`` and sends one response per
  delta through the request's sender, the last with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``
  (``stream: false``: one response at the end). An error in one request (TensorRT-LLM refusing it
  or failing it mid-stream, a client gone) ends that request only.
- A watcher on the loop polls ``is_cancelled()`` of every request in flight every
  ``cancel_check_ms`` (default 50, as specctl_bls): a cancelled request is aborted in TensorRT-LLM at once
  (``RequestOutput.abort``), its stream ends with an empty final response, and its task stops.

How k is controlled (``choose_control``; reported by a ``stats`` request):

- ``drafter-hook``: n-gram deployments on one GPU. ``speculative_config`` becomes
  ``UserProvidedDecodingConfig`` with our drafter (``control/executors/trtllm/drafter_hook.py``):
  every iteration TensorRT-LLM asks it for drafts, and it asks the agent for k per request, so the
  plan the control plane pushes (per batch size, per request, with ``num_draft_tokens`` caps) takes
  effect at the next iteration, and the agent observes every iteration's acceptance and time.
- ``static-schedule``: everything else. TensorRT-LLM fixes ``speculative_config`` once the LLM is
  built; the plan reaches it as the ``draft_len_schedule`` (batch size -> k) compiled at build
  time. That is the only knob for one-model EAGLE3 and MTP, whose drafting runs inside the target's
  forward pass; draft-target keeps TensorRT-LLM's own draft model and the schedule, because no
  in-process draft-model proposer exists for the hook yet. Per-request acceptance
  (``request_perf_metrics.speculative_decoding``; where 1.2.x returns those totals zeroed, the
  estimate from ``avg_decoded_tokens_per_iter``, see ``spec_metrics``) feeds the agent's telemetry
  when each request ends (``Agent.observe_positions``), so the control plane sees acceptance; the plans it pushes
  change nothing in TensorRT-LLM until the deployment is rebuilt, and ``num_draft_tokens`` cannot
  be applied (counted as ``uncapped`` in the stats).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from control.errors import ConfigError
from control.triton.llm_request import (
    GenerateRequest,
    Limits,
)
from control.triton.sender import Detokenizer, LiveRequest, RequestCounters, ResponseSender

log = logging.getLogger("specctl.triton.llmapi")

# decoding_type values whose drafts the hook produces in process (control/executors/trtllm/drafter_hook.py).
HOOK_METHODS = ("NGram",)
WHY_STATIC = {
    "Draft_Target": "no in-process draft-model proposer exists for the drafter hook yet, so TensorRT-LLM's own "
                    "draft model runs the draft_len_schedule compiled from the plan",
    "Eagle3": "EAGLE3 drafts inside TensorRT-LLM (one-model: in the target's forward pass); its "
              "speculative_config, with the compiled draft_len_schedule, is fixed once the LLM is built",
    "MTP": "MTP drafts inside the target's forward pass; its speculative_config, with the compiled "
           "draft_len_schedule, is fixed once the LLM is built",
}
SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"


@dataclass(frozen=True)
class KControl:
    """How the plan's k reaches TensorRT-LLM in this deployment."""

    mode: str  # "drafter-hook" | "static-schedule" | "none"
    method: str | None  # speculative_config.decoding_type
    reason: str


def choose_control(requested: str, options: Mapping[str, Any], env: Mapping[str, str] | None = None) -> KControl:
    """``drafter-hook`` where the method and the parallelism allow it, else the static schedule."""
    env = os.environ if env is None else env
    sc = options.get("speculative_config")
    if not sc:
        return KControl("none", None, "the options have no speculative_config: TensorRT-LLM decodes without "
                                      "speculation")
    method = sc.get("decoding_type")
    if requested != "drafter-hook":
        return KControl("static-schedule", method, "the deployment asks for the static draft_len_schedule "
                                                   "compiled from the plan at build time")
    if method not in HOOK_METHODS:
        return KControl("static-schedule", method, WHY_STATIC.get(method, f"the drafter hook cannot draft for "
                                                                          f"decoding_type {method!r}"))
    gpus = int(options.get("tensor_parallel_size", 1) or 1) * int(options.get("pipeline_parallel_size", 1) or 1)
    if gpus != 1:
        return KControl("static-schedule", method, f"the drafter hook needs one GPU (this deployment has {gpus}): "
                                                   "with more, TensorRT-LLM runs it in worker processes the agent "
                                                   "cannot reach")
    if env.get(SINGLE_PROCESS_ENV, "1") != "1":
        return KControl("static-schedule", method, f"{SINGLE_PROCESS_ENV}={env[SINGLE_PROCESS_ENV]} puts "
                                                   "TensorRT-LLM's executor in a worker process the agent cannot reach")
    return KControl("drafter-hook", method, "the agent chooses k per request per iteration through "
                                            "UserProvidedDecodingConfig")


def llmapi_sampling(req: GenerateRequest) -> dict[str, Any]:
    """A validated request -> ``sampling_kwargs`` arguments (TensorRT-LLM's SamplingParams)."""
    p = req.params
    return {"max_tokens": p.max_tokens, "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
            "seed": p.random_seed, "end_id": p.end_id, "stop": list(req.stop_texts), "bad": list(req.bad_texts)}


def check_request(req: GenerateRequest, vocab: int | None, max_len: int | None) -> None:
    """What the reference engine checks in ``add_request``, with its messages (ConfigError)."""
    req.params.validate(vocab)
    prompt = np.asarray(req.prompt_ids)
    if prompt.size == 0:
        raise ConfigError("prompt is empty; give at least one token id")
    if vocab is not None:
        bad = prompt[(prompt < 0) | (prompt >= vocab)]
        if bad.size:
            raise ConfigError(f"prompt token id {int(bad[0])} is outside the vocabulary [0, {vocab})")
    P = int(prompt.size)
    if max_len is not None and P + req.params.max_tokens > max_len:
        raise ConfigError(
            f"prompt of {P} tokens + max_tokens {req.params.max_tokens} exceeds the engine's max sequence length "
            f"{max_len}; shorten the prompt or lower max_tokens (at most {max(max_len - P, 0)} here)"
        )


@dataclass(eq=False)
class _Live(LiveRequest):
    """One request in flight on the loop."""

    req: GenerateRequest
    detok: Detokenizer
    handle: Any = None  # LlmApiStream once submitted
    task: asyncio.Task | None = None
    cancelled: bool = False
    ended: bool = False


@dataclass
class _Counters(RequestCounters):
    aborted: int = 0  # requests aborted in TensorRT-LLM (cancelled by their client, or it went away)
    uncapped: int = 0  # requests with num_draft_tokens the static schedule cannot apply
    metrics_to_agent: int = 0


class LlmApiModel(ResponseSender):
    """The Triton Python model for ``executor: trtllm``; ``pb`` is ``triton_python_backend_utils``."""

    def __init__(self, pb, args: dict[str, Any]) -> None:
        from control.executors.trtllm.llmapi import load_options

        p = self._read_config(pb, args)
        opts = load_options(p.llm_api_options)
        self.model_path = p.model or str(opts.get("model") or "")
        if not self.model_path:
            raise ConfigError("llm model parameter model is empty and the LLM API options name no model; set it to "
                              "the target checkpoint (`specctl build` renders it)")
        self.control = choose_control(p.control, opts)
        plan = None
        if p.plan:
            from control.plan import load_plan

            plan = load_plan(p.plan)
        from control.executors.trtllm.version import PINNED, require_release

        self.trtllm_version = p.trtllm_version or PINNED
        require_release(self.trtllm_version, f"the llm model (executor: trtllm, {Path(p.llm_api_options).name})")

        sc = opts.get("speculative_config") or {}
        self.max_k = int(sc.get("max_draft_len", 0) or 0)
        if plan is None and self.control.mode == "drafter-hook":
            self.control = KControl("static-schedule", self.control.method, "no plan parameter: the drafter hook has "
                                    "no controller to ask, so the options' draft_len_schedule applies")
        self.agent = None
        self.planner = None
        self.drafter_name = plan.default_drafter if plan is not None else ""
        if plan is not None and self.control.mode != "none":
            from control.agent import Agent

            if self.control.mode == "drafter-hook":
                self.max_k = min(self.max_k, plan.max_k)
            self.agent = Agent(plan.profile, url=p.control_url or None, policy=plan.policy,
                               drafters=(plan.default_drafter,), max_k=min(self.max_k, plan.max_k), slo=plan.slo,
                               token=p.read_token(),
                               source=f"triton-{self.instance}".replace(" ", "-")[:128])
        drafter = None
        if self.control.mode == "drafter-hook":
            from control.executors.trtllm.drafter_hook import KPlanner, make_drafter, ngram_proposer

            os.environ.setdefault(SINGLE_PROCESS_ENV, "1")  # before the LLM is built: the hook runs in this process
            self.planner = KPlanner(self.agent, self.max_k, drafter_name=self.drafter_name,
                                    token_budget=int(opts.get("max_num_tokens", 8192) or 8192))
            drafter = make_drafter(self.planner, ngram_proposer(int(sc.get("max_matching_ngram_size", 3) or 3)))
        log.warning("llm %s: TensorRT-LLM LLM API, k control %s (%s)", self.instance, self.control.mode,
                    self.control.reason)

        from control.executors.trtllm.llmapi import LlmApiExecutor

        self.executor = LlmApiExecutor(self.model_path, opts, drafter=drafter, version=self.trtllm_version)
        ex = self.executor
        self.vocab = ex.vocab_size
        self.max_len = ex.max_seq_len
        self._encode = ex.encode
        self._encode_words = lambda s: ex.encode(s, add_special_tokens=False)
        self._decode = ex.decode
        self.limits = Limits(max_tokens=p.max_tokens, default_max_tokens=min(p.default_max_tokens, p.max_tokens))
        self.counters = _Counters()
        self.live: dict[int, _Live] = {}
        self._next_rid = 0
        self._rid_lock = threading.Lock()
        self._cancel_check_s = p.cancel_check_ms / 1e3
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, name=f"{self.instance}-llmapi", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self.agent is not None:
            self.agent.start()

    # -- the event loop (its own thread) -----------------------------------------------------------
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._watcher = self._loop.create_task(self._watch())
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    async def _watch(self) -> None:
        """Abort requests whose client cancelled or went away, every ``cancel_check_ms``."""
        while True:
            await asyncio.sleep(self._cancel_check_s)
            for lv in list(self.live.values()):
                if lv.ended or lv.cancelled:
                    continue
                try:
                    gone = lv.sender.is_cancelled()
                except Exception:
                    gone = True
                if gone:
                    self._cancel(lv)

    def _cancel(self, lv: _Live) -> None:
        lv.cancelled = True
        self._abort(lv)
        self.counters.cancelled += 1
        try:
            lv.sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:
            self.counters.send_errors += 1
        lv.ended = True
        if lv.task is not None:
            lv.task.cancel()

    async def _serve(self, lv: _Live) -> None:
        c = self.counters
        lv.task = asyncio.current_task()
        self.live[lv.rid] = lv
        c.requests += 1
        cap = lv.req.params.num_draft_tokens
        try:
            try:
                lv.handle = self.executor.start(lv.req.prompt_ids, **llmapi_sampling(lv.req))
            except Exception as e:  # TensorRT-LLM refused this request: it alone fails
                c.failed += 1
                c.last_error = f"submit: {type(e).__name__}: {e}"
                self._send_error(lv.sender, f"TensorRT-LLM refused the request: {e}")
                lv.ended = True
                return
            if cap is not None:
                if self.planner is not None:
                    self.planner.set_cap(lv.handle.request_id, cap)
                elif self.control.mode == "static-schedule":
                    c.uncapped += 1
            async for new, done in lv.handle.deltas():
                if lv.ended:
                    return
                self._deliver(lv, new, done)
            if not lv.ended:  # the stream stopped without a final update
                raise RuntimeError("TensorRT-LLM ended the stream without a final response")
        except asyncio.CancelledError:  # _cancel or shutdown: the response is already sent
            pass
        except Exception as e:  # the engine failed this request mid-stream: it alone fails
            c.failed += 1
            c.last_error = f"stream: {type(e).__name__}: {e}"
            log.warning("llm %s: request failed in TensorRT-LLM: %s", self.instance, c.last_error)
            if not lv.ended:
                lv.ended = True
                self._abort(lv)
                self._send_error(lv.sender, f"the engine failed while running this request ({type(e).__name__}: {e}); "
                                            "retry it")
        finally:
            self.live.pop(lv.rid, None)
            if self.planner is not None and lv.handle is not None:
                self.planner.forget(lv.handle.request_id)
            # Break the cycle _Live -> task -> this frame -> _Live: Triton frees a request's response
            # factory when its sender is released, and will not unload the model while any is left.
            lv.task = None
            lv.sender = None

    def _abort(self, lv: _Live) -> None:
        if lv.handle is not None:
            self.counters.aborted += 1
            with contextlib.suppress(Exception):  # already finished inside TensorRT-LLM
                lv.handle.abort()

    def _deliver(self, lv: _Live, new: list[int], done: bool) -> None:
        m = lv.handle.metrics
        if self.planner is not None:  # the hook counted what it drafted and what the target accepted
            lv.drafted, lv.accepted = self.planner.totals.get(lv.handle.request_id, (0, 0))
        elif m is not None:
            lv.drafted, lv.accepted = m.drafted, m.accepted
        delta = lv.detok.push(new, final=done)
        try:
            if lv.req.stream:
                if new or done:
                    self._send(lv.sender, self._outputs(lv, delta, new), final=done)
            else:
                lv.text.append(delta)
                lv.ids.extend(new)
                if done:
                    self._send(lv.sender, self._outputs(lv, "".join(lv.text), lv.ids), final=True)
        except Exception as e:  # the client went away: free the request in TensorRT-LLM now
            c = self.counters
            c.send_errors += 1
            c.last_error = f"send: {type(e).__name__}: {e}"
            lv.ended = True
            if not done:
                self._abort(lv)
            return
        if done:
            lv.ended = True
            self._finished(lv)

    def _finished(self, lv: _Live) -> None:
        c = self.counters
        c.completed += 1
        c.drafted += lv.drafted
        c.accepted += lv.accepted
        c.generated += lv.handle.sent
        if self.agent is None or self.control.mode != "static-schedule" or lv.drafted <= 0:
            return  # with the hook the agent saw every iteration already
        from control.executors.trtllm.llmapi import chain_positions

        steps = max(lv.handle.sent - 1 - lv.accepted, 1)  # the first token comes from the prefill
        trials, acc = chain_positions(lv.drafted, lv.accepted, steps, self.max_k)
        self.agent.observe_positions(self.drafter_name, trials[0] if trials else 0, lv.drafted, lv.accepted,
                                     trials, acc)
        c.metrics_to_agent += 1

    # -- Triton entry points ---------------------------------------------------------------------------
    def _submit(self, parsed, sender) -> None:
        check_request(parsed, self.vocab, self.max_len)
        with self._rid_lock:
            rid = self._next_rid
            self._next_rid += 1
        lv = _Live(rid, sender, parsed, Detokenizer(self._decode))
        asyncio.run_coroutine_threadsafe(self._serve(lv), self._loop)

    def finalize(self) -> None:
        t0 = time.monotonic()
        self._close_tokenizer()
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        except Exception as e:
            log.warning("llm %s: shutting the request loop down: %s", self.instance, e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        try:
            self.executor.shutdown()
        except Exception as e:
            log.warning("llm %s: TensorRT-LLM shutdown: %s", self.instance, e)
        if self.agent is not None:
            self.agent.stop()
        log.warning("llm %s: finalized in %.2f s", self.instance, time.monotonic() - t0)

    async def _shutdown(self) -> None:
        self._watcher.cancel()
        for lv in list(self.live.values()):
            if not lv.ended:
                lv.ended = True
                self._abort(lv)
                self._send_error(lv.sender, "the server is shutting down")
            if lv.task is not None:
                lv.task.cancel()
        self.live.clear()

    # -- responses -------------------------------------------------------------------------------------
    def current_policy(self) -> str:
        """The policy requests are checked against: with the hook, the plan the agent runs; with the
        static schedule (where plans change nothing in TensorRT-LLM), the newest plan received."""
        if self.agent is None:
            return "none"
        return (self.agent.plan if self.planner is not None else self._newest_plan()).policy

    def _newest_plan(self):
        pending = getattr(self.agent, "_pending", None)  # applied at the agent's next decide
        return pending.plan if pending is not None else self.agent.plan

    # -- stats -----------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        c = self.counters
        doc: dict[str, Any] = {
            "instance": self.instance, "executor": "trtllm", "model": Path(self.model_path).name,
            "k_control": self.control.mode, "k_control_reason": self.control.reason, "method": self.control.method,
            "max_k": self.max_k, "active_requests": len(self.live),
            "requests": c.requests, "rejected": c.rejected, "completed": c.completed, "cancelled": c.cancelled,
            "failed": c.failed, "send_errors": c.send_errors, "aborted": c.aborted, "drafted": c.drafted,
            "accepted": c.accepted, "generated": c.generated, "uncapped": c.uncapped, "metrics_to_agent": c.metrics_to_agent,
            "last_error": c.last_error, "policy": self.current_policy(),
        }
        if self.planner is not None:
            doc["hook"] = {"iterations": self.planner._step, "last_k": self.planner.last_k.tolist(),
                           "capped_requests": len(self.planner.caps)}
        if self.agent is not None:
            doc["agent"] = self.agent.stats().to_dict()
            doc["plan_version"] = self.agent.plan.version
            newest = self._newest_plan()
            doc["plan_received"] = {"policy": newest.policy, "version": newest.version, "max_k": newest.max_k}
        return doc

