"""The reference engine: continuous batching with per-request speculative decoding.

One iteration (``step``):
1. take new requests and cancellations from other threads; admit waiting requests while a KV slot
   is free and the iteration's token budget allows their prompts;
2. show the policy a ``StepView`` of the decode requests and get its ``Decision``;
3. prefill the admitted requests (target; the default drafter's cache too if the decision says so)
   and sample their first token;
4. run the step kernel (``control/executors/step``) over this engine's parts (``decode.py``): clamp
   the decision, draft for each decode request with k > 0 (its chosen drafter; a draft model first
   catches up on the tokens its cache misses), let a ``Verifier`` policy prune, verify every
   request's last token plus its drafts in one packed target pass, accept (exact match against the
   target's greedy token, or at temperature > 0 against the target's draw with the request's
   position noise); roll back the rejected positions in the target and draft caches, append the
   accepted tokens and the bonus token with the stop rules (EOS, a stop word, max_tokens);
5. report a ``StepOutcome`` to the policy.

With ``EngineConfig.overlap_policy`` the policy runs on a worker thread instead: step 2 takes the
decision it prepared during the step before, and the outcome of step 5 goes to it with the next
step's view (``overlap.py``).

Greedy speculative output equals plain greedy output token for token: acceptance is exact match
against the target's own greedy token, and the target's forward is batch invariant (see
``model.py``), so the target computes bitwise the same logits for a token whether it is verified in
a block of drafts, decoded alone, or packed with any other requests. The same holds for sampled
output: each position's randomness comes from (request seed, position) (``PositionNoise``), so a
seeded request gives the same tokens with or without speculation, at any k, batch and load.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import numpy as np
import torch

from control.errors import ConfigError
from control.executors.base import (
    ExecutorCapabilities,
    FinishReason,
    IterationStats,
    KScope,
    RequestOutput,
    SamplingParams,
    check_prompt,
)
from control.executors.reference.config import EngineConfig
from control.executors.reference.decode import ReferenceStep
from control.executors.reference.drafters import DraftModelDrafter, NgramDrafter, SelfSpec, SelfSpecDrafter
from control.executors.reference.kvpool import KVPool
from control.executors.reference.model import LlamaForCausalLM, Segment
from control.executors.reference.policy_calls import PolicyCalls
from control.executors.reference.requests import UNSEEDED, GenerationResult, Request
from control.executors.reference.sampler import Sampler
from control.executors.reference.sampling import PositionNoise
from control.executors.reference.slots import SlotTable, ViewRows
from control.executors.step.kernel import run_step, step_outcome
from control.executors.step.ngram import lookup_avail, lookup_match
from control.executors.step.stop import StopRules, apply_stop
from control.executors.step.view import build_view
from control.executors.streams import OutputStreams
from control.goodput.granularity import PER_REQUEST, VerifyGranularity
from control.policy.simple import NonePolicy
from control.policy.types import Decision, Policy, StepView

__all__ = ["EngineConfig", "GenerationResult", "PlainDecoding", "ReferenceEngine"]

I64 = np.int64
CLOSE_WAIT_S = 5.0  # close(): how long to wait for a running step before leaving the worker to end alone
PlainDecoding = NonePolicy  # the policy of an engine given none: never speculate, never prefill drafts


def _plain(n: int) -> Decision:
    d = Decision.plain(n)
    d.prefill_draft = False
    return d


class ReferenceEngine:
    """A PyTorch engine for a Llama target and its drafters (see the module docstring).

    ``drafters`` maps names to draft models, to ``SelfSpec(sink, window)`` for self-speculation with
    the target, or to None for n-gram prompt lookup; their order is the drafter index policies see. Thread safety: ``add_request``, ``cancel``, ``has_work`` and
    ``set_policy`` may be called from any thread; ``step`` from one loop thread at a time.
    """

    def __init__(self, target: LlamaForCausalLM, drafters: dict[str, LlamaForCausalLM | SelfSpec | None] | None = None,
                 policy: Policy | None = None, config: EngineConfig | None = None, *, clock=time.perf_counter) -> None:
        cfg = (config or EngineConfig()).validate()
        self.cfg = cfg
        self.target = target
        if cfg.batch_invariant is not None:
            target.batch_invariant = cfg.batch_invariant
        self.device = target.lm_head.weight.device
        tc = target.config
        self.vocab = tc.vocab_size
        self.max_len = cfg.max_len or tc.max_position_embeddings
        self.max_k = cfg.max_k
        self.max_batch = cfg.max_batch
        self.token_budget = cfg.token_budget or max(2048, cfg.max_batch * (cfg.max_k + 1))
        self.eos = cfg.eos_token_id if cfg.eos_token_id is not None else tc.eos_token_id
        self._build_drafters(dict(drafters or {}), cfg, tc)
        st = self.slots = SlotTable(cfg.max_batch, self.max_len)
        # the slot table's arrays, read and written in place by the loop (``slots.py``)
        self.tok, self.n_tok, self.decoding, self.rid = st.tok, st.n_tok, st.decoding, st.rid
        self.k_cap, self.last_drafter, self.category = st.k_cap, st.last_drafter, st.category
        self.max_new, self.generated, self.sampled = st.max_new, st.generated, st.sampled
        self.temperature, self.top_k, self.top_p, self.slot_req = st.temperature, st.top_k, st.top_p, st.req
        self.waiting: deque[Request] = deque()
        self.sampler = Sampler(self.device, st)
        self.policy: Policy = policy or PlainDecoding()
        self.clock = clock
        self._t0 = clock()
        self.step_no = 0
        self.last_stats = IterationStats()
        # The loop's time around the last decode step (see StepOutcome.prev_loop_ms): the step's own
        # time outside its passes, the batch size, and when it ended (None: it left nothing decoding).
        self._loop_book, self._loop_n, self._loop_mark = 0.0, 0, None
        self._loop_prev = (math.nan, 0)
        self._any_category = False
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # inbox, cancellations, live ids, streams
        self._step_lock = threading.Lock()  # one iteration (or an immediate cancellation) at a time
        self._inbox: list[Request] = []
        self._cancels: set[int] = set()
        self._live: set[int] = set()
        self._reqs: dict[int, Request] = {}
        self._streams = OutputStreams()
        self._pending: list[RequestOutput] = []
        self.calls = PolicyCalls(cfg.overlap_policy, lambda: getattr(self.policy, "name", self.policy))

    def _build_drafters(self, drafters: dict[str, LlamaForCausalLM | SelfSpec | None], cfg: EngineConfig, tc) -> None:
        """The KV pool and one drafter object per named drafter (None: n-gram lookup); the default drafter."""
        for name, m in drafters.items():
            if isinstance(m, LlamaForCausalLM) and m.config.vocab_size != self.vocab:
                raise ConfigError(f"drafter '{name}' has vocabulary {m.config.vocab_size}; the target has {self.vocab} "
                                  "(a draft must share the target's tokenizer)")
        self.drafter_names = tuple(drafters)
        dtype = self.target.lm_head.weight.dtype
        self.pool = KVPool(tc, {j: m.config for j, m in enumerate(drafters.values()) if isinstance(m, LlamaForCausalLM)},
                           len(drafters), cfg.max_batch, self.max_len, self.device, dtype)
        self.drafters: list[DraftModelDrafter | SelfSpecDrafter | NgramDrafter] = []
        for j, (name, m) in enumerate(drafters.items()):
            if m is None:
                self.drafters.append(NgramDrafter(name))
            elif isinstance(m, SelfSpec):
                self.drafters.append(SelfSpecDrafter(name, self.target, self.pool.target, m.sink, m.window))
            else:
                self.drafters.append(DraftModelDrafter(name, m, self.pool.drafts[j], self.pool.draft_len[:, j]))
        self.has_state = np.array([d.has_state for d in self.drafters] or [False])
        self._ngram = next((d for d in self.drafters if isinstance(d, NgramDrafter)), None)  # the view's lookup
        if cfg.default_drafter is not None:
            if cfg.default_drafter not in self.drafter_names:
                raise ConfigError(f"default drafter '{cfg.default_drafter}' is not one of this engine's drafters "
                                  f"({', '.join(self.drafter_names) or 'none'})")
            self.default_drafter = self.drafter_names.index(cfg.default_drafter)
        else:
            models = [j for j, d in enumerate(self.drafters) if d.has_state]
            self.default_drafter = models[0] if models else 0

    # -- requests (any thread) -------------------------------------------------------------------------
    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
                    category: int | None = None, stream: bool = False) -> int:
        params = (params or SamplingParams()).validate(self.vocab)
        prompt = check_prompt(prompt_ids, params, self.vocab, self.max_len)
        if category is not None and (isinstance(category, bool) or not isinstance(category, int) or category < 0):
            raise ConfigError(f"category = {category!r}: must be an integer >= 0 (or omitted)")
        with self._lock:
            rid = next(self._ids)
            key = (params.random_seed,) if params.random_seed is not None else (self.cfg.seed, rid, UNSEEDED)
            req = Request(rid, prompt, params, -1 if category is None else category,
                           None if params.greedy else PositionNoise(key))
            if stream:
                self._streams.open(rid)
            self._live.add(rid)
            self._inbox.append(req)
        return rid

    def cancel(self, request_id: int) -> bool:
        with self._lock:
            if request_id not in self._live:
                return False
            self._cancels.add(request_id)
        if self._step_lock.acquire(blocking=False):  # idle: free the KV now; else the running step does
            try:
                self._take_inbox()
                self._apply_cancels()
            finally:
                self._step_lock.release()
        return True

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._live) or bool(self._pending)

    def set_policy(self, policy: Policy) -> None:
        self.policy = policy

    @property
    def verify_granularity(self) -> VerifyGranularity:
        """Per request: each request's verify segment holds exactly its own k + 1 tokens."""
        return PER_REQUEST

    @property
    def capabilities(self) -> ExecutorCapabilities:
        """Per-request k and verification; its drafters; the wall clock."""
        speculates = bool(self.drafter_names) and self.max_k > 0
        return ExecutorCapabilities("reference", KScope.per_request if speculates else KScope.none,
                                    self.verify_granularity, self.drafter_names, self.max_k if speculates else 0)

    @property
    def policy_worker(self):
        """The overlap worker (``overlap.py``), or None without ``EngineConfig.overlap_policy``."""
        return self.calls.worker

    def close(self) -> None:
        """End the overlap worker's thread, if any, after its job in flight, and observe the last
        step's outcome it was holding; the engine must not step after. A step still running after
        ``CLOSE_WAIT_S`` keeps its job: the thread ends after it."""
        worker = self.calls.worker
        if worker is None:
            return
        if self._step_lock.acquire(timeout=CLOSE_WAIT_S):
            try:
                worker.close()
                self.calls.drain()
            finally:
                self._step_lock.release()
        else:
            worker.stop()

    @property
    def policy_errors(self) -> int:
        """Policy calls that raised so far (each logged; the engine kept serving)."""
        return self.calls.errors

    @property
    def last_policy_error(self) -> str | None:
        return self.calls.last_error

    @property
    def free_kv_slots(self) -> int:
        return self.pool.free_tokens()

    @property
    def running(self) -> int:
        return int(self.pool.in_use.sum())

    def stream(self, request_id: int, timeout: float | None = None) -> Iterator[RequestOutput]:
        """The request's outputs until it finishes (added with ``stream=True``; read once)."""
        return self._streams.read(request_id, timeout)

    # -- the loop --------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[GenerationResult]:
        """Add ``prompts``, run until all finish, return their results in order (drives ``step``)."""
        plist = list(params) if isinstance(params, list | tuple) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ConfigError(f"{len(plist)} sampling params for {len(prompts)} prompts")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        res = {i: GenerationResult(i, [], None) for i in ids}
        while any(r.finish_reason is None for r in res.values()):
            for out in self.step():
                r = res.get(out.request_id)
                if r is None:
                    continue
                r.token_ids.extend(out.new_token_ids)
                r.outputs.append(out)
                r.drafted, r.accepted = out.total_drafted, out.total_accepted
                if out.finished:
                    r.finish_reason = out.finish_reason
        return [res[i] for i in ids]

    def step(self) -> list[RequestOutput]:
        """One iteration; returns an output per request that produced tokens or finished."""
        with self._step_lock, torch.inference_mode():
            t0 = self.clock()
            if self._loop_mark is not None:
                self._loop_prev = (self._loop_book + (t0 - self._loop_mark) * 1e3, self._loop_n)
                self._loop_mark = None
            else:
                self._loop_prev = (math.nan, 0)
            policy = self.policy
            self._take_inbox()
            self._apply_cancels()
            outputs, self._pending = self._pending, []
            stats = IterationStats(step=self.step_no)
            admitted = self._admit()
            dec = np.flatnonzero(self.decoding)
            if admitted or dec.size:
                prefill_tokens = int(sum(r.prompt.size for r in admitted))
                view = self._view(dec, prefill_tokens)
                tp = self.clock()
                decision = self.calls.prepared(view, policy, stats) if self.calls.worker is not None else None
                if decision is None:
                    decision = self.calls.call(stats, "decide", policy.decide, view) or _plain(view.n)
                stats.policy_ms += (self.clock() - tp) * 1e3
                if not isinstance(decision, Decision):
                    self.calls.failed(stats, "decide", TypeError(f"decide returned {type(decision).__name__}, not a Decision"))
                    decision = _plain(view.n)
                if admitted:
                    tp = self.clock()
                    outputs += self._prefill(admitted, bool(decision.prefill_draft), int(decision.prefill_drafter))
                    stats.prefill_ms = (self.clock() - tp) * 1e3
                    stats.prefill_requests, stats.prefill_tokens = len(admitted), prefill_tokens
                if dec.size:
                    outputs += self._decode(dec, view, decision, policy, stats)
                self.step_no += 1
            self._take_inbox()
            self._apply_cancels()  # cancellations that arrived during the iteration
            outputs += self._pending
            self._pending = []
            stats.running, stats.waiting = self.running, len(self.waiting)
            stats.free_kv_slots = self.pool.free_tokens()
            stats.finished = sum(o.finished for o in outputs)
            stats.total_ms = (self.clock() - t0) * 1e3
            self.last_stats = stats
            if stats.decode_batch and self.decoding.any():
                self._loop_book = stats.total_ms - stats.prefill_ms - stats.draft_ms - stats.verify_ms
                self._loop_n = stats.decode_batch
                self._loop_mark = self.clock()
            return outputs

    # -- admission and prefill -------------------------------------------------------------------------
    def _take_inbox(self) -> None:
        with self._lock:
            new, self._inbox = self._inbox, []
        for r in new:
            self._reqs[r.rid] = r
            self.waiting.append(r)

    def _apply_cancels(self) -> None:
        with self._lock:
            ids, self._cancels = self._cancels, set()
        for rid in ids:
            req = self._reqs.get(rid)
            if req is None:
                continue
            if req.slot < 0:
                self.waiting.remove(req)
            self._finish(req, FinishReason.cancelled, (), 0, 0, self._pending)

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        budget = self.token_budget - int(self.decoding.sum())
        taken = 0
        while self.waiting and self.pool.free_slots:
            req = self.waiting[0]
            P = int(req.prompt.size)
            if admitted and taken + P > budget:
                break
            self.waiting.popleft()
            self.slots.fill(self.pool.allocate(), req, self.max_k)
            self._any_category |= req.category >= 0
            admitted.append(req)
            taken += P
        return admitted

    def _prefill(self, reqs: list[Request], prefill_draft: bool, drafter: int = -1) -> list[RequestOutput]:
        slots = np.array([r.slot for r in reqs], dtype=I64)
        prompts = [r.prompt for r in reqs]
        lens = np.array([p.size for p in prompts], dtype=I64)
        ids = torch.from_numpy(np.concatenate(prompts)).to(self.device)
        at = torch.from_numpy(np.cumsum(lens) - 1).to(self.device)
        segs = [Segment(int(s), 0, int(n)) for s, n in zip(slots, lens, strict=True)]
        logits = self.target(ids, segs, self.pool.target, logits_at=at)
        self.pool.target_len[slots] = lens
        if not 0 <= drafter < len(self.drafters):  # -1 or out of range: the default
            drafter = self.default_drafter
        d = self.drafters[drafter] if self.drafters else None
        if prefill_draft and isinstance(d, DraftModelDrafter):
            d.prefill(slots, prompts, self.device)
        self.sampler.mask_bad_words(logits, [(r, 0) for r in reqs])
        first = self.sampler.pick(logits, slots)
        outputs: list[RequestOutput] = []
        for r, t in zip(reqs, first, strict=True):
            self._commit(r, np.array([t], dtype=I64), 0, 0, outputs)
        return outputs

    # -- decode ----------------------------------------------------------------------------------------
    def _view(self, dec: np.ndarray, prefill_tokens: int) -> StepView:
        """Step 1: the view of the decoding slots ``dec`` (n,)."""
        return self._build_view(self._view_rows(dec), prefill_tokens)

    def _view_rows(self, dec: np.ndarray) -> ViewRows:
        """The slot arrays a view of ``dec`` (n,) reads, gathered now."""
        return ViewRows(
            slots=dec.astype(I64), n_tok=self.n_tok[dec], k_cap=self.k_cap[dec],
            draft_len=self.pool.draft_len[dec, : self.has_state.size], rid=self.rid[dec],
            remaining=self.max_new[dec] - self.generated[dec], drafter=self.last_drafter[dec],
            category=self.category[dec] if self._any_category else None, free_kv=self.pool.free_tokens(),
            waiting=len(self.waiting), now=self.clock() - self._t0, step=self.step_no,
            ngram_avail=self._ngram_avail(dec),
        )

    def _build_view(self, r: ViewRows, prefill_tokens: int) -> StepView:
        """The view of gathered rows (reads only the engine's constants: any thread may call it)."""
        nt = r.n_tok  # (n,)
        ctx = nt - 1
        kcap = np.clip(np.minimum(r.k_cap, self.max_len - nt), 0, None)  # (n,) the request's cap and room
        lag = np.where(self.has_state[None, :], ctx[:, None] - r.draft_len, 0)  # (n, m)
        return build_view(
            slots=r.slots, request_ids=r.rid, ctx_lens=ctx, remaining=r.remaining, k_cap=kcap, drafter=r.drafter,
            draft_lag=lag.astype(I64), free_kv_slots=r.free_kv,
            token_budget=max(self.token_budget - prefill_tokens, int(r.slots.size)), max_k=self.max_k,
            drafters=self.drafter_names, now=r.now, step=r.step, category=r.category, prefill_tokens=prefill_tokens,
            waiting=r.waiting, ngram_avail=r.ngram_avail,
        )

    def _ngram_avail(self, dec: np.ndarray) -> np.ndarray | None:
        """(n,) tokens the n-gram drafter would propose for each decoding slot at max_k (None: none)."""
        g = self._ngram
        if g is None:
            return None
        return lookup_avail(self.tok, self.n_tok, dec, self.max_k, g.max_n, g.min_n)

    def _lookup_match(self, dec: np.ndarray, view: StepView, accepted: np.ndarray, finished: np.ndarray) -> np.ndarray | None:
        """(n,) ``StepOutcome.ngram_match`` of the step just committed (None: no n-gram drafter)."""
        g = self._ngram
        if g is None or view.ngram_avail is None:
            return None
        committed = accepted + 1  # (n,) tokens each request's step appended, unless it stopped
        if finished.size:
            committed = np.where(np.isin(view.request_ids, finished), 0, committed)
        return lookup_match(self.tok, self.n_tok, dec, committed, view.ngram_avail, g.max_n, g.min_n)

    def _decode(self, dec: np.ndarray, view: StepView, decision: Decision, policy: Policy,
                stats: IterationStats) -> list[RequestOutput]:
        """One decode step, the step kernel's procedure (``control/executors/step``) over this
        engine's parts (``decode.py``): 2-5. clamp, draft, prune, verify and accept; 6. roll back the
        caches and commit with the stop rules; 7. the outcome, observed (or held for the worker)."""
        t_start = self.clock()
        parts = ReferenceStep(self, dec, policy, stats)
        res = run_step(view, decision, parts, str(getattr(policy, "name", policy)))
        accepted, verified = res.verdict.accepted, res.verified
        parts.roll_back(accepted)
        outputs, finished = self._commit_step(dec, parts.reqs, res.drafts.tokens, verified, accepted, res.verdict.bonus)
        finished_ids = np.array(finished, dtype=I64)
        outcome = step_outcome(
            view, res, np.maximum(view.drafter, 0), finished_ids, verify_ms=res.verdict.ms,
            total_ms=(self.clock() - t_start) * 1e3, now=self.clock() - self._t0, step=view.step,
            prev_loop_ms=self._loop_prev[0], prev_loop_requests=self._loop_prev[1],
            ngram_match=self._lookup_match(dec, view, accepted, finished_ids),
        )
        if self.calls.worker is not None and not self.calls.fresh:
            self.calls.hold(policy, outcome)  # observed by the worker during the next step, after it decides
        else:
            tp = self.clock()
            self.calls.call(stats, "observe", policy.observe, outcome)
            stats.policy_ms += (self.clock() - tp) * 1e3
        stats.decode_batch = int(dec.size)
        stats.k = res.plan.k.tolist()
        stats.drafter = res.plan.drafter.tolist()
        stats.drafted, stats.verified = int(res.drafts.count.sum()), int(verified.sum())
        stats.accepted = int(accepted.sum())
        stats.generated = int(sum(len(o.new_token_ids) for o in outputs))
        stats.draft_ms, stats.verify_ms = res.drafts.ms, res.verdict.ms
        return outputs

    def _commit_step(self, dec: np.ndarray, reqs: list[Request], drafts: np.ndarray, verified: np.ndarray,
                     accepted: np.ndarray, bonus: np.ndarray) -> tuple[list[RequestOutput], list[int]]:
        """drafts[:a] + bonus per request (drafts (n, K')), committed with the stop rules; the target
        cache's valid length follows. Returns the outputs and the finished ids."""
        n, kmax = drafts.shape
        new = np.zeros((n, kmax + 1), dtype=I64)  # (n, K' + 1)
        new[:, :kmax] = drafts
        new[np.arange(n), accepted] = bonus
        outputs: list[RequestOutput] = []
        finished: list[int] = []
        for i, r in enumerate(reqs):
            r.steps += 1
            if self._commit(r, new[i, : accepted[i] + 1], int(verified[i]), int(accepted[i]), outputs):
                finished.append(r.rid)
        live = self.decoding[dec]
        self.pool.target_len[dec[live]] = self.n_tok[dec[live]] - 1
        return outputs, finished

    # -- overlap ---------------------------------------------------------------------------------------
    def _next_view(self) -> Callable[[], StepView]:
        """The requests that decode at the next step as known before this step's passes: the decoding
        ones (those that finish in this step drop out at the next), each at least a token further.
        Their slot arrays are gathered now; the view is built by whoever calls the result (the
        overlap worker, off the step loop)."""
        return partial(self._view_ahead, self._view_rows(np.flatnonzero(self.decoding)))

    def _view_ahead(self, rows: ViewRows) -> StepView:
        view = self._build_view(rows, 0)
        view.ctx_lens = view.ctx_lens + 1
        view.remaining = np.maximum(view.remaining - 1, 1)
        view.step = rows.step + 1
        return view

    # -- commit and finish ------------------------------------------------------------------------------
    def _commit(self, r: Request, new: np.ndarray, verified: int, accepted: int, outputs: list[RequestOutput]) -> bool:
        """Append ``new`` tokens with the stop rules; emit the output; returns whether ``r`` finished."""
        p = r.params
        s = r.slot
        eos = self.eos if p.end_id is None else p.end_id
        rules = StopRules(p.max_tokens - r.generated, None if p.ignore_eos else eos, stop_words=p.stop_words)
        nt0 = int(self.n_tok[s])
        toks, reason = apply_stop(new, rules, self.tok[s, nt0 - r.generated: nt0] if p.stop_words else None)
        nt = int(self.n_tok[s])
        m = int(toks.size)
        if m and nt + m <= self.max_len:
            self.tok[s, nt: nt + m] = toks
        self.n_tok[s] = nt + m
        r.generated += m
        self.generated[s] = r.generated
        r.drafted += verified
        r.accepted += accepted
        if reason is None:
            self.decoding[s] = True
            out = RequestOutput(r.rid, tuple(toks.tolist()), False, None, verified, accepted, r.generated,
                                r.drafted, r.accepted)
            outputs.append(out)
            self._emit(out)
            return False
        self._finish(r, reason, tuple(toks.tolist()), verified, accepted, outputs)
        return True

    def _finish(self, r: Request, reason: FinishReason, toks: tuple[int, ...], verified: int, accepted: int,
                outputs: list[RequestOutput]) -> None:
        if r.slot >= 0:
            self.slots.clear(r.slot)
            self.pool.release(r.slot)
            r.slot = -1
        self._reqs.pop(r.rid, None)
        with self._lock:
            self._live.discard(r.rid)
        out = RequestOutput(r.rid, toks, True, reason, verified, accepted, r.generated, r.drafted, r.accepted)
        outputs.append(out)
        self._emit(out)

    def _emit(self, out: RequestOutput) -> None:
        self._streams.emit(out)
