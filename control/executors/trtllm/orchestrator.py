"""The per-step speculative loop our BLS model runs over TensorRT engines, in plain Python.

Each ``step()`` serves every active request once:

1. the controller decides k per request (``policy.decide(StepView)``); the step kernel
   (``control/executors/step``, which runs steps 2-3 over ``_BlsParts``) clamps it by its one rule:
   the request's ``num_draft_tokens``, what it may still generate, the token budget;
2. drafting: requests with k > 0 get k draft tokens, from the draft engine (one ``tensorrt_llm_draft``
   request each: the whole sequence in, k tokens out) or from n-gram prompt lookup in process;
3. verification: one ``tensorrt_llm`` request per active request (the sequence plus its drafts as
   ``draft_input_ids``, ``request_output_len`` = k + 1); the target's answer is the truth, so output
   is identical to non-speculative greedy decoding whatever the drafts were. Every token it returns
   is output: the accepted prefix plus one (what the stand-in engines answer by default) or all
   k + 1 (an engine that goes on decoding to ``request_output_len``, as the stock BLS expects);
4. new tokens stream to the request's sink at once; the controller observes the outcome.

A request whose draft or verify call fails (the engine answered it with an error) ends with that
error (``on_error``) and leaves the batch; the other requests of the step go on. Nothing is retried:
a failure that repeats would otherwise hold its request, and its client, forever.

The stock tensorrtllm BLS does this for one request without streaming and a fixed k
(``tensorrt_llm_bls/1/lib/decode.py`` ``_spec_generate``); here many requests share each step, k is
the controller's per request per step, and tokens stream. Engines batch the concurrent requests of a
step in flight (``EngineClient.run`` issues them together).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from control.errors import ConfigError, SpecctlError
from control.executors.step.clamp import Clamped
from control.executors.step.kernel import Drafts, Verdict, run_step, step_outcome
from control.executors.step.ngram import lookup_score, ngram_available, ngram_propose
from control.executors.step.stop import StopRules, apply_stop
from control.executors.step.view import build_view
from control.executors.trtllm.granularity import BLS_GRANULARITY
from control.executors.trtllm.tensors import generate_request, output_tokens, verified_tokens, verify_request
from control.plan import Plan, parse_plan
from control.policy.types import I64, Decision, Policy, StepView
from control.policyspec import DEFAULT_MAX_K

# The BLS's drafting methods and the profile drafter kind each one is costed as.
DRAFTER_KINDS = {"draft_target": "draft_model", "ngram": "ngram"}


def plan_for_bls(plan: Plan, drafter: str) -> Plan:
    """``plan`` narrowed to the one drafter a BLS deployment runs: its default drafter, which must be
    of ``drafter``'s kind. A policy built from it sees the same drafter name the orchestrator reports
    in every ``StepView`` and ``StepOutcome``, so it learns that drafter's acceptance (and never
    assigns a drafter the deployment does not have)."""
    name = plan.default_drafter
    kind = plan.profile.drafter(name).kind
    kind = getattr(kind, "value", kind)
    if DRAFTER_KINDS.get(drafter) != kind:
        raise ConfigError(f"the plan's drafter '{name}' is a {kind} drafter; this BLS drafts with {drafter} "
                          f"(a {DRAFTER_KINDS.get(drafter)} drafter): compile the plan for this deployment")
    if list(plan.drafters) == [name]:
        return plan
    return parse_plan({**plan.to_dict(), "drafters": [name]}, where=f"plan v{plan.version} for {drafter}")


class EngineClient(Protocol):
    """Runs independent requests against one tensorrtllm model; responses in request order, with an
    exception in the place of each request the engine failed (the call raises only when it could not
    run at all)."""

    def run(self, model: str, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray] | Exception]: ...


TokenSink = Callable[[np.ndarray, bool], None]  # (new tokens, finished)
ErrorSink = Callable[[str], None]  # the request failed with this message; no call follows


@dataclass
class _Req:
    rid: int
    slot: int
    seq: np.ndarray  # prompt + generated, int64
    prompt_len: int
    max_tokens: int
    end_id: int | None
    k_cap: int
    sink: TokenSink
    on_error: ErrorSink | None = None
    drafted_total: int = 0
    accepted_total: int = 0
    cancelled: bool = False

    @property
    def generated(self) -> int:
        return self.seq.size - self.prompt_len


@dataclass
class StepRecord:
    """What one step did, per request (for telemetry and tests)."""

    step: int
    request_ids: np.ndarray
    k_decided: np.ndarray
    drafted: np.ndarray
    accepted: np.ndarray
    emitted: np.ndarray


class _BlsParts:
    """The BLS's ``StepParts``: drafts from the draft engine or n-gram lookup, verification by one
    target engine request per request (whose answer is the target's own tokens). Requests an engine
    fails land in ``failed`` (index -> message) and leave the step."""

    n_drafters = 1  # the deployment's one drafter
    default_drafter = 0

    def __init__(self, orch: SpecOrchestrator, reqs: list[_Req], t0: float) -> None:
        self.orch, self.reqs, self.t0 = orch, reqs, t0  # t0: the step's start (draft_ms counts from it)
        self.failed: dict[int, str] = {}
        self.drafts: list[np.ndarray] = []
        self.new: list[np.ndarray | None] = [None] * len(reqs)  # the target's tokens per request

    def refused(self, view: StepView, error: Exception) -> None:
        raise error

    def draft(self, view: StepView, plan: Clamped) -> Drafts:
        self.drafts = self.orch._draft(self.reqs, plan.k, self.failed)
        count = np.fromiter((d.size for d in self.drafts), I64, len(self.reqs))  # (n,)
        return Drafts(count, ms=(time.perf_counter() - self.t0) * 1e3)

    def prune(self, view: StepView, decision: Decision, drafts: Drafts) -> None:
        return None  # the BLS verifies every drafted token

    def verify(self, view: StepView, drafts: Drafts, verified: np.ndarray) -> Verdict:
        t1 = time.perf_counter()
        o = self.orch
        answers = o._verify(self.reqs, self.drafts, self.failed)
        ms = (time.perf_counter() - t1) * 1e3
        accepted = np.zeros(len(self.reqs), dtype=I64)  # (n,)
        for i, (r, d, ans) in enumerate(zip(self.reqs, self.drafts, answers, strict=True)):
            if i in self.failed:
                continue
            try:
                self.new[i], accepted[i] = verified_tokens(ans, d)
            except SpecctlError as e:
                self.failed[i] = f"{o.target_model}: request {r.rid}: {e}"
        return Verdict(accepted, ms=ms)


@dataclass
class SpecOrchestrator:
    policy: Policy
    client: EngineClient
    drafter: str = "draft_target"  # draft_target | ngram
    drafter_name: str | None = None  # the plan's name for it (plan_for_bls(...).default_drafter); default: drafter
    max_k: int = DEFAULT_MAX_K
    max_batch: int = 64
    ngram_size: int = 3
    target_model: str = "tensorrt_llm"
    draft_model: str = "tensorrt_llm_draft"
    token_budget: int = 8192
    record: bool = False
    history: list[StepRecord] = field(default_factory=list)

    # each request reaches the target engine with exactly its own k drafts (``verify_request``)
    verify_granularity = BLS_GRANULARITY

    def __post_init__(self) -> None:
        if self.drafter not in ("draft_target", "ngram"):
            raise ConfigError(f"drafter '{self.drafter}': the BLS orchestrator drafts with draft_target or ngram")
        self._lock = threading.RLock()  # sinks may call stats() while a request finishes
        self._active: dict[int, _Req] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._step = 0
        self._drafters = (self.drafter_name or self.drafter,)

    # -- requests ----------------------------------------------------------------------------------
    def add(self, rid: int, prompt, max_tokens: int, sink: TokenSink, *, end_id: int | None = None,
            num_draft_tokens: int | None = None, on_error: ErrorSink | None = None) -> None:
        """Queue a request; it joins the next step. ``on_error`` receives the message if an engine
        fails it (without one, ``step`` raises the failure after finishing the step's other work)."""
        prompt = np.asarray(prompt, dtype=np.int64).reshape(-1)
        if prompt.size == 0:
            raise SpecctlError("input_ids is empty; send at least one prompt token")
        if max_tokens < 1:
            raise SpecctlError(f"max_tokens {max_tokens} must be >= 1")
        cap = self.max_k if num_draft_tokens is None else int(num_draft_tokens)
        if not 0 <= cap <= self.max_k:
            raise SpecctlError(f"num_draft_tokens {cap} must be in 0..{self.max_k} (the engine's max_draft_len)")
        with self._lock:
            if rid in self._active:
                raise SpecctlError(f"request id {rid} is already in flight")
            if len(self._active) >= self.max_batch:
                raise SpecctlError(f"{self.max_batch} requests already in flight (max_batch); retry later")
            slot = self._free_slots.pop() if self._free_slots else self._next_slot
            if slot == self._next_slot:
                self._next_slot += 1
            self._active[rid] = _Req(rid, slot, prompt.copy(), prompt.size, int(max_tokens), end_id, cap, sink,
                                     on_error)

    def cancel(self, rid: int) -> bool:
        with self._lock:
            r = self._active.get(rid)
            if r is not None:
                r.cancelled = True
            return r is not None

    def fail_all(self, message: str) -> int:
        """End every active request with ``message`` (the loop cannot go on: unload, a bug); returns
        how many there were."""
        with self._lock:
            reqs = list(self._active.values())
        unreported = self._fail([(r, message) for r in reqs])
        if unreported:
            self._raise_unreported(unreported)
        return len(reqs)

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._active)

    def stats(self, rid: int) -> tuple[int, int] | None:
        with self._lock:
            r = self._active.get(rid)
            return None if r is None else (r.drafted_total, r.accepted_total)

    # -- the loop ------------------------------------------------------------------------------------
    def step(self) -> int:
        """One iteration over every active request; returns how many were served."""
        with self._lock:
            for rid in [rid for rid, r in self._active.items() if r.cancelled]:
                self._finish(self._active[rid], emit=np.zeros(0, dtype=I64))
            reqs = list(self._active.values())
        n = len(reqs)
        if n == 0:
            return 0
        t0 = time.perf_counter()
        view = build_view(
            slots=np.fromiter((r.slot for r in reqs), I64, n), request_ids=np.fromiter((r.rid for r in reqs), I64, n),
            ctx_lens=np.fromiter((r.seq.size for r in reqs), I64, n),
            remaining=np.fromiter((r.max_tokens - r.generated for r in reqs), I64, n),
            k_cap=np.fromiter((r.k_cap for r in reqs), I64, n), drafter=np.zeros(n, dtype=I64),
            drafters=self._drafters, max_k=self.max_k, token_budget=self.token_budget, step=self._step,
            now=time.monotonic(), verify=self.verify_granularity, ngram_avail=self._ngram_avail(reqs),
        )
        parts = _BlsParts(self, reqs, t0)
        res = run_step(view, self.policy.decide(view), parts, str(getattr(self.policy, "name", self.policy)))
        drafted = res.drafts.count  # (n,) a request an engine failed drafted nothing the target judged
        drafted[sorted(parts.failed)] = 0
        res.verified = drafted
        emitted, finished = self._deliver(reqs, parts, res.verdict.accepted)
        failed = parts.failed  # now with the requests whose tokens could not be delivered
        unreported = self._fail([(reqs[i], msg) for i, msg in sorted(failed.items())])
        left = [r.rid for r, _ in finished] + [reqs[i].rid for i in sorted(failed)]
        self.policy.observe(step_outcome(view, res, np.zeros(n, dtype=I64), np.array(left, dtype=I64),
                                         verify_ms=res.verdict.ms, total_ms=(time.perf_counter() - t0) * 1e3,
                                         now=time.monotonic(), step=self._step,
                                         ngram_match=self._lookup_match(reqs, view, set(left))))
        if self.record:
            self.history.append(StepRecord(self._step, view.request_ids, res.plan.k, drafted, res.verdict.accepted,
                                           emitted))
        self._step += 1
        if unreported:
            self._raise_unreported(unreported)
        return n

    def _deliver(self, reqs: list[_Req], parts: _BlsParts, accepted: np.ndarray,
                 ) -> tuple[np.ndarray, list[tuple[_Req, np.ndarray]]]:
        """Step 6: commit each verified request's tokens with the stop rules and stream them (a
        finished request's go with its end); returns (tokens emitted (n,), finished requests)."""
        emitted = np.zeros(len(reqs), dtype=I64)
        finished: list[tuple[_Req, np.ndarray]] = []
        for i, r in enumerate(reqs):
            if i in parts.failed:
                continue
            new, done = self._commit(r, parts.drafts[i], parts.new[i], int(accepted[i]))
            emitted[i] = new.size
            if done:
                finished.append((r, new))
                continue
            try:
                r.sink(new, False)
            except Exception as e:  # its client is gone or broken: end it, keep the others going
                parts.failed[i] = f"could not deliver tokens: {e}"
        with self._lock:
            for r, new in finished:
                self._finish(r, emit=new)
        return emitted, finished

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        for _ in range(max_steps):
            if self.step() == 0:
                return
        raise SpecctlError(f"requests still active after {max_steps} steps")

    # -- internals -----------------------------------------------------------------------------------
    def _verify(self, reqs: list[_Req], drafts: list[np.ndarray], failed: dict[int, str]) -> list:
        """One target request per request not failed yet; the answers (None where it failed)."""
        live = [i for i in range(len(reqs)) if i not in failed]
        answers: list = [None] * len(reqs)
        asks = [verify_request(reqs[i].seq, drafts[i], reqs[i].end_id) for i in live]
        for i, ans in zip(live, self._call(self.target_model, asks), strict=True):
            if isinstance(ans, Exception):
                failed[i] = f"{self.target_model}: {ans}"
            else:
                answers[i] = ans
        return answers

    @staticmethod
    def _commit(r: _Req, draft: np.ndarray, new: np.ndarray, accepted: int) -> tuple[np.ndarray, bool]:
        """Append what the target returned (accepted + 1 .. k + 1 of its tokens) with the stop rules:
        cut at max_tokens and after end_id (kept); returns (new tokens, whether the request is done)."""
        new, reason = apply_stop(new, StopRules(r.max_tokens - r.generated, r.end_id, emit_end=True))
        r.seq = np.concatenate([r.seq, new])
        r.drafted_total += int(draft.size)
        r.accepted_total += accepted
        return new, reason is not None

    def _call(self, model: str, requests: list[dict[str, np.ndarray]]) -> list:
        if not requests:
            return []
        try:
            answers = self.client.run(model, requests)
        except Exception as e:  # the whole call failed: every request in it did
            return [e] * len(requests)
        if len(answers) != len(requests):
            err = SpecctlError(f"{model} answered {len(answers)} of {len(requests)} requests")
            return [err] * len(requests)
        return answers

    def _lookup_match(self, reqs: list[_Req], view, left: set[int]) -> np.ndarray | None:
        """(n,) ``StepOutcome.ngram_match`` of the step just delivered: each request's lookup at the
        step's start against the tokens appended since (-1: no proposal, or the request left)."""
        avail = view.ngram_avail
        if avail is None:
            return None
        out = np.full(len(reqs), -1, dtype=I64)  # (n,)
        for i, r in enumerate(reqs):
            cut = int(view.ctx_lens[i])
            if avail[i] > 0 and r.rid not in left and r.seq.size > cut:
                out[i] = lookup_score(r.seq, cut, int(avail[i]), self.ngram_size)
        return out

    def _ngram_avail(self, reqs: list[_Req]) -> np.ndarray | None:
        """(n,) tokens the n-gram lookup proposes for each request at max_k (None: a draft model drafts)."""
        if self.drafter != "ngram":
            return None
        return np.fromiter((ngram_available(r.seq, self.max_k, self.ngram_size) for r in reqs), I64, len(reqs))

    def _draft(self, reqs: list[_Req], k: np.ndarray, failed: dict[int, str]) -> list[np.ndarray]:
        empty = np.zeros(0, dtype=I64)
        drafts = [empty] * len(reqs)
        idx = np.flatnonzero(k > 0)
        if idx.size == 0:
            return drafts
        if self.drafter == "ngram":
            for i in idx:
                drafts[i] = ngram_propose(reqs[i].seq, int(k[i]), self.ngram_size)
            return drafts
        asks = [generate_request(reqs[i].seq, int(k[i]), reqs[i].end_id) for i in idx]
        for i, ans in zip(idx, self._call(self.draft_model, asks), strict=True):
            try:
                if isinstance(ans, Exception):
                    raise ans
                drafts[i] = output_tokens(ans)[: int(k[i])]
            except Exception as e:
                failed[int(i)] = f"{self.draft_model}: {e}"
        return drafts

    def _fail(self, failures: list[tuple[_Req, str]]) -> list[tuple[int, str]]:
        """Remove failed requests and tell their owners; returns those with no ``on_error``."""
        unreported = []
        with self._lock:
            for r, msg in failures:
                if self._active.pop(r.rid, None) is None:
                    continue
                self._free_slots.append(r.slot)
                if r.on_error is None:
                    unreported.append((r.rid, msg))
                    continue
                try:
                    r.on_error(msg)
                except Exception as e:  # one owner's failure must not stop the others' reports
                    unreported.append((r.rid, f"{msg} (and its error sink failed: {e})"))
        return unreported

    @staticmethod
    def _raise_unreported(unreported: list[tuple[int, str]]) -> None:
        more = f" (and {len(unreported) - 1} more)" if len(unreported) > 1 else ""
        raise SpecctlError(f"request {unreported[0][0]} failed: {unreported[0][1]}{more}")

    def _finish(self, r: _Req, emit: np.ndarray) -> None:
        try:
            r.sink(emit, True)  # still active here, so the sink can read stats(rid)
        finally:
            self._active.pop(r.rid, None)
            self._free_slots.append(r.slot)
