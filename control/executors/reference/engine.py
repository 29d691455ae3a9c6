"""The reference engine: continuous batching with per-request speculative decoding.

One iteration (``step``):
1. take new requests and cancellations from other threads; admit waiting requests while a KV slot
   is free and the iteration's token budget allows their prompts;
2. show the policy a ``StepView`` of the decode requests and get its ``Decision``;
3. prefill the admitted requests (target; the default drafter's cache too if the decision says so)
   and sample their first token;
4. draft for each decode request with k > 0 (its chosen drafter; a draft model first catches up on
   the tokens its cache misses), let a ``Verifier`` policy prune, verify every request's last token
   plus its drafts in one packed target pass, accept (exact match against the target's greedy token,
   or at temperature > 0 against the target's draw with the request's position noise), roll back the rejected positions in the target and draft caches, append the
   accepted tokens and the bonus token, and stop requests on EOS, a stop word or max_tokens;
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
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

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
)
from control.executors.reference.drafters import (
    DraftModelDrafter,
    DraftRows,
    NgramDrafter,
    SelfSpec,
    SelfSpecDrafter,
)
from control.executors.reference.kvpool import KVPool
from control.executors.reference.model import LlamaForCausalLM, Segment
from control.executors.reference.overlap import PolicyWorker
from control.executors.reference.sampling import (
    PositionNoise,
    banned_tokens,
    filtered_probs,
    stop_hit,
    verify_coupled,
    verify_greedy,
)
from control.goodput.granularity import PER_REQUEST, VerifyGranularity
from control.policy.types import Decision, Policy, StepOutcome, StepView
from control.policyspec import MAX_K_LIMIT

I64 = np.int64
UNSEEDED = 0x5EED  # third part of an unseeded request's noise key, so it never equals a seeded one's
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """Limits of one engine instance.

    max_batch: KV slots = the most requests decoding at once. max_len: positions per request
    (prompt + generated; default: the target's max_position_embeddings). max_k: the longest draft.
    token_budget: tokens one iteration may compute (prompts admitted + verified tokens). default
    drafter: the one whose cache is prefilled with the prompt (default: the first draft model).
    batch_invariant: False trades the bitwise lossless guarantee for speed at tiny batches (model.py).
    overlap_policy: decide step t+1 on a worker thread while step t's passes run, from estimates one
    step stale (``overlap.py``); the step loop then pays only the hand-over. Greedy output is the same.
    """

    max_batch: int = 32
    max_len: int | None = None
    max_k: int = 8
    token_budget: int | None = None
    default_drafter: str | None = None
    eos_token_id: int | None = None
    seed: int = 0
    batch_invariant: bool | None = None  # set the target's batch invariance (None: leave the model's setting)
    overlap_policy: bool = False

    def validate(self) -> EngineConfig:
        if not (isinstance(self.max_batch, int) and self.max_batch >= 1):
            raise ConfigError(f"max_batch = {self.max_batch!r}: must be an integer >= 1")
        if self.max_len is not None and not (isinstance(self.max_len, int) and self.max_len >= 2):
            raise ConfigError(f"max_len = {self.max_len!r}: must be an integer >= 2")
        if not (isinstance(self.max_k, int) and 0 <= self.max_k <= MAX_K_LIMIT):
            raise ConfigError(f"max_k = {self.max_k!r}: must be an integer in 0..{MAX_K_LIMIT}")
        if self.token_budget is not None and not (isinstance(self.token_budget, int) and self.token_budget >= 1):
            raise ConfigError(f"token_budget = {self.token_budget!r}: must be an integer >= 1")
        if not isinstance(self.overlap_policy, bool):
            raise ConfigError(f"overlap_policy = {self.overlap_policy!r}: must be True or False")
        return self


def _plain(n: int) -> Decision:
    d = Decision.plain(n)
    d.prefill_draft = False
    return d


class PlainDecoding:
    """The policy an engine uses when given none: never speculate, never prefill drafts."""

    name = "none"

    def decide(self, view: StepView) -> Decision:
        return _plain(view.n)

    def observe(self, outcome: StepOutcome) -> None:
        pass


@dataclass(slots=True, eq=False)
class _Request:
    rid: int
    prompt: np.ndarray
    params: SamplingParams
    category: int
    noise: PositionNoise | None  # None: greedy
    slot: int = -1
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0


@dataclass
class GenerationResult:
    """A finished request, as ``ReferenceEngine.generate`` returns it."""

    request_id: int
    token_ids: list[int]
    finish_reason: FinishReason | None
    drafted: int = 0
    accepted: int = 0
    outputs: list[RequestOutput] = field(default_factory=list, repr=False)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass
class _Drafted:
    """One step's drafts: tokens [n, k_max] (-1 past each request's count), counts [n], confidences
    [n, K] (None: no drafter reported any), and the draft passes' cost features."""

    drafts: np.ndarray
    count: np.ndarray
    conf: np.ndarray | None = None
    passes: int = 0
    ctx_tokens: int = 0
    batched: int = 0
    ms: float = 0.0


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
        S = cfg.max_batch
        self.tok = np.zeros((S, self.max_len), dtype=I64)
        self.n_tok = np.zeros(S, dtype=I64)
        self.decoding = np.zeros(S, dtype=bool)
        self.rid = np.full(S, -1, dtype=I64)
        self.k_cap = np.zeros(S, dtype=I64)
        self.last_drafter = np.full(S, -1, dtype=I64)
        self.category = np.full(S, -1, dtype=I64)
        self.max_new = np.zeros(S, dtype=I64)
        self.generated = np.zeros(S, dtype=I64)
        self.sampled = np.zeros(S, dtype=bool)
        self.temperature = np.ones(S, dtype=np.float32)
        self.top_k = np.zeros(S, dtype=I64)
        self.top_p = np.ones(S, dtype=np.float32)
        self.slot_req: list[_Request | None] = [None] * S
        self.waiting: deque[_Request] = deque()
        self.policy: Policy = policy or PlainDecoding()
        self.clock = clock
        self._t0 = clock()
        self.step_no = 0
        self.last_stats = IterationStats()
        # The loop's time around the last decode step (see StepOutcome.prev_loop_ms): the step's own
        # time outside its passes, the batch size, and when it ended (None: it left nothing decoding).
        self._loop_book, self._loop_n, self._loop_mark = 0.0, 0, None
        self._loop_prev = (math.nan, 0)
        self.policy_errors = 0
        self.last_policy_error: str | None = None
        self._any_category = False
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # inbox, cancellations, live ids, streams
        self._step_lock = threading.Lock()  # one iteration (or an immediate cancellation) at a time
        self._inbox: list[_Request] = []
        self._cancels: set[int] = set()
        self._live: set[int] = set()
        self._reqs: dict[int, _Request] = {}
        self._streams: dict[int, queue.SimpleQueue] = {}
        self._pending: list[RequestOutput] = []
        # overlap_policy: the worker, and the last outcome with the policy it belongs to, held for the next job
        self.policy_worker = PolicyWorker() if cfg.overlap_policy else None
        self._held: tuple[Policy, StepOutcome] | None = None

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
        prompt = self._check_prompt(prompt_ids, params)
        if category is not None and (isinstance(category, bool) or not isinstance(category, int) or category < 0):
            raise ConfigError(f"category = {category!r}: must be an integer >= 0 (or omitted)")
        with self._lock:
            rid = next(self._ids)
            key = (params.random_seed,) if params.random_seed is not None else (self.cfg.seed, rid, UNSEEDED)
            req = _Request(rid, prompt, params, -1 if category is None else category,
                           None if params.greedy else PositionNoise(key))
            if stream:
                self._streams[rid] = queue.SimpleQueue()
            self._live.add(rid)
            self._inbox.append(req)
        return rid

    def _check_prompt(self, prompt_ids, params: SamplingParams) -> np.ndarray:
        try:
            prompt = np.asarray(list(prompt_ids))
        except TypeError:
            raise ConfigError(f"prompt must be a sequence of token ids, got {type(prompt_ids).__name__}") from None
        if prompt.size == 0:
            raise ConfigError("prompt is empty; give at least one token id")
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise ConfigError(f"prompt must be a flat sequence of integer token ids (got dtype {prompt.dtype}, shape {prompt.shape})")
        bad = prompt[(prompt < 0) | (prompt >= self.vocab)]
        if bad.size:
            raise ConfigError(f"prompt token id {int(bad[0])} is outside the vocabulary [0, {self.vocab})")
        P = int(prompt.size)
        if P + params.max_tokens > self.max_len:
            raise ConfigError(
                f"prompt of {P} tokens + max_tokens {params.max_tokens} exceeds the engine's max sequence length "
                f"{self.max_len}; shorten the prompt or lower max_tokens (at most {max(self.max_len - P, 0)} here)"
            )
        return prompt.astype(I64)

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
    def free_kv_slots(self) -> int:
        return self.pool.free_tokens()

    @property
    def running(self) -> int:
        return int(self.pool.in_use.sum())

    def stream(self, request_id: int, timeout: float | None = None) -> Iterator[RequestOutput]:
        with self._lock:
            q = self._streams.get(request_id)
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
                    self._streams.pop(request_id, None)
                return

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
                decision = self._prepared(view, policy, stats) if self.policy_worker is not None else None
                if decision is None:
                    decision = self._policy_call(stats, "decide", policy.decide, view) or _plain(view.n)
                stats.policy_ms += (self.clock() - tp) * 1e3
                if not isinstance(decision, Decision):
                    self._policy_failed(stats, "decide", TypeError(f"decide returned {type(decision).__name__}, not a Decision"))
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

    def _admit(self) -> list[_Request]:
        admitted: list[_Request] = []
        budget = self.token_budget - int(self.decoding.sum())
        taken = 0
        while self.waiting and self.pool.free_slots:
            req = self.waiting[0]
            P = int(req.prompt.size)
            if admitted and taken + P > budget:
                break
            self.waiting.popleft()
            s = self.pool.allocate()
            req.slot = s
            self.slot_req[s] = req
            self.tok[s, :P] = req.prompt
            self.n_tok[s] = P
            self.rid[s] = req.rid
            p = req.params
            cap = self.max_k if p.num_draft_tokens is None else min(p.num_draft_tokens, self.max_k)
            self.k_cap[s] = cap
            self.last_drafter[s] = -1
            self.category[s] = req.category
            self._any_category |= req.category >= 0
            self.max_new[s] = p.max_tokens
            self.generated[s] = 0
            self.sampled[s] = not p.greedy
            self.temperature[s] = p.temperature if not p.greedy else 1.0
            self.top_k[s] = p.top_k
            self.top_p[s] = p.top_p
            admitted.append(req)
            taken += P
        return admitted

    def _prefill(self, reqs: list[_Request], prefill_draft: bool, drafter: int = -1) -> list[RequestOutput]:
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
        self._mask_bad_words(logits, [(r, 0) for r in reqs])
        first = self._pick(logits, slots)
        outputs: list[RequestOutput] = []
        for r, t in zip(reqs, first, strict=True):
            self._commit(r, np.array([t], dtype=I64), 0, 0, outputs)
        return outputs

    def _pick(self, logits: torch.Tensor, slots: np.ndarray) -> np.ndarray:
        """One token per row: greedy, or sampled with the row's request's parameters."""
        out = logits.argmax(dim=-1).cpu().numpy().astype(I64)
        samp = np.flatnonzero(self.sampled[slots])
        if samp.size:
            s = slots[samp]
            p = self._probs(logits[torch.from_numpy(samp).to(self.device)], s)
            for j, row in enumerate(samp):
                out[row] = self.slot_req[int(s[j])].noise.sample(p[j], int(self.n_tok[s[j]]))
        return out

    def _probs(self, logits: torch.Tensor, slots: np.ndarray) -> np.ndarray:
        p = filtered_probs(logits.float().cpu(), torch.from_numpy(self.temperature[slots]),
                           torch.from_numpy(self.top_k[slots]), torch.from_numpy(self.top_p[slots]))
        return p.double().numpy()

    def _mask_bad_words(self, logits: torch.Tensor, rows: list[tuple[_Request, int]], drafts: np.ndarray | None = None,
                        first_row: np.ndarray | None = None, rows_per: np.ndarray | None = None) -> None:
        """Set -inf on tokens that would complete a bad word. ``rows``: (request, index in batch)."""
        for r, i in rows:
            words = r.params.bad_words
            if not words:
                continue
            s, nt = r.slot, int(self.n_tok[r.slot])
            if drafts is None:
                ban = banned_tokens(self.tok[s, :nt], words)
                if ban:
                    logits[i, ban] = float("-inf")
                continue
            base = int(first_row[i])
            n_rows = int(rows_per[i])
            ctx = np.concatenate([self.tok[s, :nt], drafts[i, : n_rows - 1]])
            for j in range(n_rows):
                ban = banned_tokens(ctx[: nt + j], words)
                if ban:
                    logits[base + j, ban] = float("-inf")

    # -- decode ----------------------------------------------------------------------------------------
    def _view(self, dec: np.ndarray, prefill_tokens: int) -> StepView:
        nt = self.n_tok[dec]
        ctx = nt - 1
        kcap = np.clip(np.minimum(self.k_cap[dec], self.max_len - nt), 0, None)
        lag = np.where(self.has_state[None, :], ctx[:, None] - self.pool.draft_len[dec, : self.has_state.size], 0)
        n = int(dec.size)
        return StepView(
            slots=dec.astype(I64), request_ids=self.rid[dec], ctx_lens=ctx, remaining=self.max_new[dec] - self.generated[dec],
            k_cap=kcap, drafter=self.last_drafter[dec], draft_lag=lag.astype(I64),
            free_kv_slots=self.pool.free_tokens(), token_budget=max(self.token_budget - prefill_tokens, n),
            max_k=self.max_k, drafters=self.drafter_names, now=self.clock() - self._t0, step=self.step_no,
            category=self.category[dec] if self._any_category else None, prefill_tokens=prefill_tokens,
            waiting=len(self.waiting),
        )

    def _clamp(self, view: StepView, decision: Decision, policy: Policy) -> tuple[np.ndarray, np.ndarray]:
        """The decision's k and drafter, made safe: within each request's caps and the token budget."""
        n = view.n
        k = np.asarray(decision.k, dtype=I64).reshape(-1)
        d = np.asarray(decision.drafter, dtype=I64).reshape(-1)
        if k.shape[0] != n or d.shape[0] != n:
            raise ValueError(f"policy '{getattr(policy, 'name', policy)}' returned {k.shape[0]} draft lengths and "
                             f"{d.shape[0]} drafters for a step of {n} requests")
        if decision.conf_cut is not None and np.asarray(decision.conf_cut).reshape(-1).shape[0] != n:
            raise ValueError(f"policy '{getattr(policy, 'name', policy)}' returned "
                             f"{np.asarray(decision.conf_cut).reshape(-1).shape[0]} confidence cuts for {n} requests")
        if not self.drafters:
            return np.zeros(n, dtype=I64), np.zeros(n, dtype=I64)
        cap = np.clip(np.minimum(view.k_cap, view.remaining - 1), 0, self.max_k)
        k = np.clip(k, 0, cap)
        d = np.where((d >= 0) & (d < len(self.drafters)), d, self.default_drafter)
        over = int(n + k.sum() - view.token_budget)
        while over > 0 and k.any():  # a policy that ignored the budget: shorten the longest drafts
            k[int(np.argmax(k))] -= 1
            over -= 1
        return k, d

    def _decode(self, dec: np.ndarray, view: StepView, decision: Decision, policy: Policy,
                stats: IterationStats) -> list[RequestOutput]:
        """One decode step: 1. clamp the decision; 2. draft; 3. prune (confidence cuts); 4. verify in
        one target pass; 5. accept and roll back the caches; 6. commit tokens and stop rules; 7. observe."""
        t_start = self.clock()
        n = int(dec.size)
        try:
            k, d = self._clamp(view, decision, policy)
        except (ValueError, TypeError) as e:
            self._policy_failed(stats, "decide", e)
            decision = _plain(n)
            k, d = self._clamp(view, decision, policy)
        cut = None if decision.conf_cut is None else np.asarray(decision.conf_cut, dtype=np.float64).reshape(-1)
        if self.policy_worker is not None:  # decide step t+1 while this step's passes run
            tp = self.clock()
            self._launch(policy)
            stats.policy_ms += (self.clock() - tp) * 1e3
        dr = self._draft(dec, k, d, cut)
        verified = dr.count
        prune = getattr(policy, "prune", None)
        if prune is not None and dr.count.any():
            tp = self.clock()
            v = self._policy_call(stats, "prune", prune, view, decision, dr.count, dr.conf)
            stats.policy_ms += (self.clock() - tp) * 1e3
            v = dr.count if v is None else np.asarray(v, dtype=I64).reshape(-1)
            verified = np.clip(v, 0, dr.count) if v.shape[0] == n else dr.count
        reqs = [self.slot_req[int(s)] for s in dec]
        accepted, bonus, verify_ms = self._verify(dec, reqs, dr.drafts, verified)
        outputs, finished = self._accept(dec, reqs, dr.drafts, verified, accepted, bonus)
        outcome = StepOutcome(
            slots=view.slots, request_ids=view.request_ids, drafter=np.where(k > 0, d, np.maximum(view.drafter, 0)),
            ctx_lens=view.ctx_lens, drafted=dr.count, verified=verified, accepted=accepted, confidence=dr.conf,
            category=view.category, draft_ms=dr.ms, verify_ms=verify_ms, total_ms=(self.clock() - t_start) * 1e3,
            draft_passes=dr.passes, draft_ctx_tokens=dr.ctx_tokens, draft_batched_tokens=dr.batched,
            finished=np.array(finished, dtype=I64), now=self.clock() - self._t0,
            step=view.step, prev_loop_ms=self._loop_prev[0], prev_loop_requests=self._loop_prev[1],
        )
        if self.policy_worker is not None:
            self._held = (policy, outcome)  # observed by the worker during the next step, after it decides
        else:
            tp = self.clock()
            self._policy_call(stats, "observe", policy.observe, outcome)
            stats.policy_ms += (self.clock() - tp) * 1e3
        stats.decode_batch = n
        stats.k = k.tolist()
        stats.drafted, stats.verified = int(dr.count.sum()), int(verified.sum())
        stats.accepted = int(accepted.sum())
        stats.generated = int(sum(len(o.new_token_ids) for o in outputs))
        stats.draft_ms, stats.verify_ms = dr.ms, verify_ms
        return outputs

    def _draft(self, dec: np.ndarray, k: np.ndarray, d: np.ndarray, cut: np.ndarray | None) -> _Drafted:
        """Each drafter proposes for the requests it serves this step (k > 0)."""
        n = int(dec.size)
        out = _Drafted(np.full((n, int(k.max(initial=0))), -1, dtype=I64), np.zeros(n, dtype=I64))
        t_d = self.clock()
        for j in np.unique(d[k > 0]):
            sel = np.flatnonzero((k > 0) & (d == j))
            slots = dec[sel]
            rows = DraftRows(slots, k[sel], None if cut is None else cut[sel], self.tok, self.n_tok,
                             self.sampled[slots], self.temperature[slots], self.top_k[slots], self.top_p[slots],
                             [self.slot_req[int(s)].noise for s in slots])
            res = self.drafters[int(j)].propose(rows, self.device)
            w = res.drafts.shape[1]
            out.drafts[sel, :w] = res.drafts
            out.count[sel] = res.count
            if res.confidence is not None:
                if out.conf is None:
                    out.conf = np.full((n, max(self.max_k, 1)), np.nan)
                out.conf[sel, :w] = res.confidence
            out.passes += res.passes
            out.ctx_tokens += res.ctx_tokens
            out.batched += res.batched_tokens
            self.last_drafter[slots] = j
        out.ms = (self.clock() - t_d) * 1e3
        return out

    def _verify(self, dec: np.ndarray, reqs: list[_Request], drafts: np.ndarray,
                verified: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """Each request's last token and its verified drafts, packed into one target pass; greedy
        requests accept the longest matching prefix, sampled ones by coupled rejection sampling.
        Returns (accepted [n], bonus token [n], verify ms)."""
        t_v = self.clock()
        n, kmax = drafts.shape
        nt = self.n_tok[dec]
        width = kmax + 1
        tokmat = np.empty((n, width), dtype=I64)  # [n, K + 1]: last token, then the drafts
        tokmat[:, 0] = self.tok[dec, nt - 1]
        tokmat[:, 1:] = drafts
        rows_per = verified + 1
        valid = np.arange(width)[None, :] < rows_per[:, None]  # [n, K + 1]
        ids = torch.from_numpy(tokmat[valid]).to(self.device)
        segs = [Segment(int(s), int(t) - 1, int(r)) for s, t, r in zip(dec, nt, rows_per, strict=True)]
        logits = self.target(ids, segs, self.pool.target)
        verify_ms = (self.clock() - t_v) * 1e3
        first_row = np.cumsum(rows_per) - rows_per
        if any(r.params.bad_words for r in reqs):
            self._mask_bad_words(logits, [(r, i) for i, r in enumerate(reqs) if r.params.bad_words], drafts, first_row,
                                 rows_per)
        am = np.full((n, width), -1, dtype=I64)  # [n, K + 1]: the target's greedy token at each row
        am[valid] = logits.argmax(dim=-1).cpu().numpy()
        accepted, bonus = verify_greedy(drafts, verified, am)
        for i in np.flatnonzero(self.sampled[dec]):
            rows = torch.arange(int(first_row[i]), int(first_row[i] + rows_per[i]))
            p = self._probs(logits[rows.to(self.device)], np.full(rows.shape[0], dec[i]))
            v = int(verified[i])
            accepted[i], bonus[i] = verify_coupled(p, drafts[i, :v], reqs[i].noise, int(nt[i]))
        return accepted, bonus, verify_ms

    def _accept(self, dec: np.ndarray, reqs: list[_Request], drafts: np.ndarray, verified: np.ndarray,
                accepted: np.ndarray, bonus: np.ndarray) -> tuple[list[RequestOutput], list[int]]:
        """drafts[:a] + bonus per request: roll the rejected positions back in the target and draft
        caches, then commit the tokens (stop rules, outputs). Returns the outputs and the finished ids."""
        n, kmax = drafts.shape
        nt = self.n_tok[dec]
        new = np.zeros((n, kmax + 1), dtype=I64)
        new[:, :kmax] = drafts
        new[np.arange(n), accepted] = bonus
        for j in range(len(self.drafters)):
            if self.has_state[j]:
                col = self.pool.draft_len[:, j]
                col[dec] = np.minimum(col[dec], nt + accepted)
        outputs: list[RequestOutput] = []
        finished: list[int] = []
        for i, r in enumerate(reqs):
            r.steps += 1
            if self._commit(r, new[i, : accepted[i] + 1], int(verified[i]), int(accepted[i]), outputs):
                finished.append(r.rid)
        live = self.decoding[dec]
        self.pool.target_len[dec[live]] = self.n_tok[dec[live]] - 1
        return outputs, finished

    # -- policy calls --------------------------------------------------------------------------------
    def _prepared(self, view: StepView, policy: Policy, stats: IterationStats) -> Decision | None:
        """overlap_policy: the decision the worker prepared for this step, cut to ``view``'s requests
        (None: none was prepared for this policy and these requests; the caller decides now)."""
        prep = self.policy_worker.collect()
        if prep is None:
            return None
        for what, e in prep.errors:
            self._policy_failed(stats, what, e)
        if prep.policy is not policy:  # set_policy since: the new policy decides afresh
            return None
        decision = prep.decision_for(view)
        self.policy_worker.used += decision is not None
        return decision

    def _launch(self, policy: Policy) -> None:
        """overlap_policy: hand the worker the last outcome and the next step's predicted view."""
        self.policy_worker.collect()  # a job left from a step without decoding (its decision is stale)
        held, self._held = self._held, None
        outcome = held[1] if held is not None and held[0] is policy else None  # a replaced policy's: dropped
        self.policy_worker.submit(policy, outcome, self._next_view())

    def _next_view(self) -> StepView:
        """The requests that decode at the next step as known before this step's passes: the decoding
        ones (those that finish in this step drop out at the next), each at least a token further."""
        view = self._view(np.flatnonzero(self.decoding), 0)
        view.ctx_lens = view.ctx_lens + 1
        view.remaining = np.maximum(view.remaining - 1, 1)
        view.step = self.step_no + 1
        return view

    def _policy_call(self, stats: IterationStats, what: str, fn, *args):
        """Call the policy; a policy that raises must not take the requests down with it: the step
        falls back to plain decoding (None) and the error is logged and kept in the stats."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - any policy bug; the engine keeps serving
            self._policy_failed(stats, what, e)
            return None

    def _policy_failed(self, stats: IterationStats, what: str, e: Exception) -> None:
        stats.policy_error = self.last_policy_error = f"{what}: {type(e).__name__}: {e}"
        self.policy_errors += 1
        if self.policy_errors == 1 or self.policy_errors % 1000 == 0:
            log.error("policy '%s' failed in %s (%d failures so far); the engine keeps serving (%s)",
                      getattr(self.policy, "name", self.policy), what, self.policy_errors,
                      {"decide": "this step without speculation", "prune": "verifying every drafted token",
                       "observe": "the policy misses this step's outcome"}[what], exc_info=e)

    # -- commit and finish ------------------------------------------------------------------------------
    def _commit(self, r: _Request, new: np.ndarray, verified: int, accepted: int, outputs: list[RequestOutput]) -> bool:
        """Append ``new`` tokens with the stop rules; emit the output; returns whether ``r`` finished."""
        p = r.params
        s = r.slot
        room = p.max_tokens - r.generated
        toks = new[:room]
        reason = FinishReason.length if toks.size == room else None
        eos = self.eos if p.end_id is None else p.end_id
        if eos is not None and not p.ignore_eos:
            hit = np.flatnonzero(toks == eos)
            if hit.size:
                toks = toks[: hit[0]]
                reason = FinishReason.stop
        if p.stop_words:
            nt0 = int(self.n_tok[s])
            buf = np.concatenate([self.tok[s, nt0 - r.generated: nt0], toks])
            for j in range(toks.size):
                if stop_hit(buf[: r.generated + j + 1], p.stop_words):
                    toks = toks[: j + 1]
                    reason = FinishReason.stop
                    break
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

    def _finish(self, r: _Request, reason: FinishReason, toks: tuple[int, ...], verified: int, accepted: int,
                outputs: list[RequestOutput]) -> None:
        if r.slot >= 0:
            s = r.slot
            self.decoding[s] = False
            self.slot_req[s] = None
            self.rid[s] = -1
            self.pool.release(s)
            r.slot = -1
        self._reqs.pop(r.rid, None)
        with self._lock:
            self._live.discard(r.rid)
        out = RequestOutput(r.rid, toks, True, reason, verified, accepted, r.generated, r.drafted, r.accepted)
        outputs.append(out)
        self._emit(out)

    def _emit(self, out: RequestOutput) -> None:
        q = self._streams.get(out.request_id)
        if q is not None:
            q.put(out)
