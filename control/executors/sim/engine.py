"""The event-clock engine: the reference executor's semantics with step times from a profile.

Scheduling (continuous batching, as TensorRT-LLM's GUARANTEED_NO_EVICT and vLLM):
- requests are admitted first come, first served while a batch slot is free and the KV cache can
  reserve the request's prompt + output tokens (so no request is ever evicted; draft tokens always
  fit inside a request's reservation because k <= remaining - 1);
- without chunked prefill (default) an iteration is either a prefill pass over the admitted prompts
  (up to the token budget; a prompt longer than the budget is prefilled alone) or a decode step for
  every request past its prefill, as vLLM's default scheduler and SmartSpec's simulator do. The
  prefill pass samples each request's first token;
- with chunked prefill every iteration is one mixed pass: the decode step (speculative tokens
  included) first, then prompt chunks filling what is left of the token budget.

A decode step calls the policy exactly as the reference executor does: ``decide(view)``; drafting
(each request stops at k tokens, or after the token whose running confidence product falls below
``conf_cut``: that token is drafted and kept, for ``prune`` to drop);
``prune`` where the policy has it; verification; ``observe(outcome)``. A drafter whose state lags
the target (draft prefill skipped, or steps taken without it) re-prefills the lag in its first draft
pass (the catch-up); a request that decodes without a drafter makes that drafter fall behind by the
tokens it generated. The draft prefill of new prompts runs when the policy's latest decision asks
for it (``Decision.prefill_draft``), for every drafter that keeps state, or with
``SimConfig.prefill_one_drafter`` only for ``Decision.prefill_drafter`` (the first draft model when
it names none), as the reference executor does. An acceptance model that knows how many tokens a
drafter can propose (``ReplayAcceptance.limit``: n-gram lookup may find fewer than k) caps the draft.

Times: T_fwd from the profile's linear models (target: one verify pass over sum ctx and
sum (k + 1) tokens plus any prefill tokens, where an engine that verifies by batch expansion
(``SimConfig.verify_expansion``, vLLM's scorer of 2024) reads each request's KV once per verified
token as well, at ``SimConfig.reread_share`` of a first read's price; drafts: one pass per draft
depth), optionally multiplied by lognormal noise whose spread is the fit's mean absolute error. Acceptance comes from
``AcceptanceProcess``; with a fixed seed the whole run is deterministic.

A run's state is a few small objects (``state.py``: the slot table, the KV ledger, the clock, the
tallies) that ``SimEngine``'s methods advance: ``_admit``, then a ``_prefill_iteration`` or a
``_decode_iteration`` (view, clamp, draft, prune, accept, chunks, step time, commit, observe), then
``_retire``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from control.errors import ConfigError
from control.executors.sim.acceptance import AcceptanceProcess
from control.executors.sim.state import BATCH_BUCKETS, I64, Clock, KvLedger, SlotTable, Tally
from control.executors.step.accept import accepted_run
from control.executors.step.clamp import Clamped
from control.executors.step.kernel import Drafts, StepResult, Verdict, run_step, step_outcome
from control.executors.step.stop import emitted
from control.executors.step.view import build_view
from control.goodput.granularity import PER_REQUEST, VerifyGranularity
from control.goodput.stepcost import DrafterKind, StepCostModel
from control.policy.simple import NonePolicy
from control.policy.types import Decision, StepView
from control.policyspec import DEFAULT_MAX_K

__all__ = ["BATCH_BUCKETS", "MAX_K", "SimConfig", "SimEngine", "SimResult"]

MAX_K = 16  # the largest SimConfig.max_k
NOISE_STREAM = 23  # the step-time noise generator is seeded with (seed, NOISE_STREAM)


@dataclass(frozen=True, slots=True)
class SimConfig:
    max_batch: int = 256
    kv_tokens: int = 1 << 40
    token_budget: int = 8192
    max_k: int = DEFAULT_MAX_K
    chunked_prefill: bool = False
    noise: bool = False
    seed: int = 0
    record_series: bool = True
    verify_expansion: bool = False  # verification by batch expansion: k + 1 KV reads per request
    reread_share: float = 1.0  # under expansion, a copy's KV read as a share of a first read (through L2)
    host_token_ms: float = 0.0  # host time per generated token (output processing), serial with the GPU
    verify: VerifyGranularity = PER_REQUEST  # what the simulated target verifies (padded: K + 1 whatever k)
    prefill_one_drafter: bool = False  # draft prefill for Decision.prefill_drafter only (reference executor)
    default_drafter: int = -1  # the drafter a prefill_drafter of -1 names, as the reference executor's
    # default (-1 here: the first drafter with state)
    # a deployment without speculation (policy ``none``) overlaps the per-token output processing with
    # the pass's GPU time (vLLM 0.6's async output processing, off once a draft model is configured)
    output_async: bool = False
    draft_step_prep_ms: float = 0.0  # host time per drafting request, once per step (the first draft pass)
    # a deployment without speculation (policy ``none``) runs chunked prefill with this token budget
    # (vLLM 0.6 on a long-context model; off once a draft model is configured); 0: as every other run
    plain_chunk_budget: int = 0

    def __post_init__(self) -> None:
        for name in ("max_batch", "kv_tokens", "token_budget"):
            if getattr(self, name) < 1:
                raise ConfigError(f"sim {name} = {getattr(self, name)!r}: must be >= 1")
        if self.plain_chunk_budget < 0:
            raise ConfigError(f"sim plain_chunk_budget = {self.plain_chunk_budget!r}: must be >= 0 (0: none)")
        if not 0 <= self.max_k <= MAX_K:
            raise ConfigError(f"sim max_k = {self.max_k!r}: must be in 0..{MAX_K}")
        for name in ("host_token_ms", "draft_step_prep_ms"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"sim {name} = {v!r}: must be a finite number >= 0")


@dataclass
class SimResult:
    """Per-request times and run totals; everything a report needs and nothing simulator-specific."""

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    steps: int = 0
    decode_steps: int = 0
    spec_steps: int = 0
    busy_s: float = 0.0
    decode_busy_s: float = 0.0
    drafted: int = 0
    verified: int = 0
    accepted: int = 0
    decode_tokens: int = 0
    request_steps: int = 0
    k_hist: np.ndarray = field(default_factory=lambda: np.zeros(MAX_K + 1, dtype=I64))  # request-steps by k
    # decode steps by batch-size bucket (upper edges BATCH_BUCKETS): steps, request-steps, sum of k
    batch_steps: np.ndarray = field(default_factory=lambda: np.zeros(len(BATCH_BUCKETS), dtype=I64))
    batch_requests: np.ndarray = field(default_factory=lambda: np.zeros(len(BATCH_BUCKETS), dtype=I64))
    batch_k: np.ndarray = field(default_factory=lambda: np.zeros(len(BATCH_BUCKETS), dtype=I64))
    series: dict[str, np.ndarray] = field(default_factory=dict)
    policy: str = ""


@dataclass
class _Run:
    """One run's state: what ``SimEngine.run``'s methods read and advance."""

    policy: object
    total: int  # N requests
    res: SimResult
    first: np.ndarray  # (N,) first-token time per request
    finish: np.ndarray  # (N,) finish time per request
    slots: SlotTable
    kv: KvLedger
    clock: Clock
    tally: Tally
    has_prune: bool
    fast_plain: bool  # ``none`` without noise or padding: plain stretches run in closed form
    async_out: bool  # output processing overlaps the pass (SimConfig.output_async under ``none``)
    chunked: bool  # prompts ride in decode steps (SimConfig.chunked_prefill, or plain_chunk_budget under ``none``)
    budget: int  # tokens per pass (SimConfig.token_budget, or plain_chunk_budget under ``none``)
    zeros: np.ndarray  # (S,) shared zeros (never written)
    k_cap: np.ndarray  # (S,) max_k for every slot (StepView.k_cap)
    pmask: np.ndarray | None = None  # (m,) drafters that prefill new prompts (latest decision)
    next: int = 0  # the next request to admit
    done: int = 0  # requests finished
    waiting: int = 0  # requests arrived but not admitted


_NONE = np.zeros(0, dtype=I64)


@dataclass(slots=True)
class _Spec:
    """One decode step's speculation as the run's bookkeeping reads it: the kernel's steps 2-5
    (None: no request decoded) and the tokens each request gains, arrays (n,)."""

    step: StepResult | None = None
    gen_step: np.ndarray = field(default_factory=lambda: _NONE)  # (n,) tokens generated this step (accepted + 1, within remaining)
    ksum: int = 0
    vsum: int = 0

    @classmethod
    def of(cls, step: StepResult, ksum: int, gen_step: np.ndarray) -> _Spec:
        return cls(step, gen_step, ksum, int(step.verified.sum()))

    @property
    def k(self) -> np.ndarray:
        return _NONE if self.step is None else self.step.plan.k

    @property
    def drafter(self) -> np.ndarray:
        return _NONE if self.step is None else self.step.plan.drafter

    @property
    def drafted(self) -> np.ndarray:
        return _NONE if self.step is None else self.step.drafts.count

    @property
    def verified(self) -> np.ndarray:
        return _NONE if self.step is None else self.step.verified

    @property
    def accepted(self) -> np.ndarray:
        return _NONE if self.step is None else self.step.verdict.accepted

    @property
    def t_draft(self) -> float:
        return 0.0 if self.step is None else self.step.drafts.ms


class _SimParts:
    """The simulator's ``StepParts``: drafting draws (or replays) each draft's acceptance run, so
    verifying is taking the run within what the prune left; no tokens exist."""

    default_drafter = 0

    def __init__(self, engine: SimEngine, r: _Run, gen0: np.ndarray) -> None:
        self.engine, self.r, self.gen0 = engine, r, gen0  # gen0 (n,): tokens generated before the step
        self.n_drafters = len(engine.drafters)

    def refused(self, view: StepView, error: Exception) -> None:
        raise error  # a simulated policy that breaks the contract is a bug to see, not to serve around

    def draft(self, view: StepView, plan: Clamped) -> Drafts:
        if not plan.k.any():
            return Drafts(count=np.zeros(view.n, dtype=I64))
        return self.engine._draft(self.r, plan, view.request_ids, view.ctx_lens, self.gen0)

    def prune(self, view: StepView, decision: Decision, drafts: Drafts) -> np.ndarray | None:
        return self.r.policy.prune(view, decision, drafts.count, drafts.confidence) if self.r.has_prune else None

    def verify(self, view: StepView, drafts: Drafts, verified: np.ndarray) -> Verdict:
        if drafts.lead is None:
            return Verdict(np.zeros(view.n, dtype=I64))
        return Verdict(np.minimum(drafts.lead, verified))


class SimEngine:
    """Simulate one workload under one policy (create a fresh engine or call ``run`` per policy)."""

    def __init__(self, cost: StepCostModel, drafters: tuple[str, ...], arrivals: np.ndarray, prompt: np.ndarray,
                 output: np.ndarray, acceptance: AcceptanceProcess, config: SimConfig,
                 category: np.ndarray | None = None, mape: dict | None = None,
                 prefill_costs: tuple | None = None) -> None:
        self.cost = cost
        # per drafter, the draft model's own cost for its prefill passes: a profile folds a draft's
        # per-request term into its per-token one (decode passes carry one token per request), which
        # would bill a prompt's host time once per prompt token
        self._prefill_costs = prefill_costs
        self.drafters = tuple(drafters)
        if len(self.drafters) != len(cost.drafters):
            raise ConfigError(f"{len(self.drafters)} drafter names for {len(cost.drafters)} drafter costs")
        if acceptance.m != len(self.drafters):
            raise ConfigError(f"acceptance process has {acceptance.m} drafters, the executor {len(self.drafters)}")
        self.arr = np.asarray(arrivals, dtype=np.float64)
        self.P = np.asarray(prompt, dtype=I64)
        self.O = np.asarray(output, dtype=I64)
        self.cat = None if category is None else np.asarray(category, dtype=I64)
        self.proc = acceptance
        self.cfg = config
        need = self.P + self.O
        if need.max() > config.kv_tokens:
            i = int(np.argmax(need))
            raise ConfigError(
                f"request {i} needs {int(need[i])} KV tokens (prompt {int(self.P[i])} + output {int(self.O[i])}) but the "
                f"KV cache holds {config.kv_tokens}; clip lengths (--max-ctx) or use a profile with more memory/tp"
            )
        self._stateful = np.array([d.has_passes for d in cost.drafters], dtype=bool)
        self._stateful_i = self._stateful.astype(I64)
        self._any_stateful = bool(self._stateful.any())
        self._limit = getattr(acceptance, "limit", None)  # (rid, pos, d) -> tokens drafter d can propose
        ngrams = [d for d, c in enumerate(cost.drafters) if c.kind == DrafterKind.ngram]
        # the view's n-gram lookup: the first n-gram drafter's, where the acceptance knows what it proposes
        self._ngram = ngrams[0] if ngrams and self._limit is not None else -1
        self._jidx = np.arange(max(config.max_k, 1))
        mape = mape or {}
        self._sigma_t = math.sqrt(math.pi / 2) * mape.get("target", cost.target.mape) / 100.0
        self._sigma_d = [math.sqrt(math.pi / 2) * (d.model.mape if d.model is not None else 0.0) / 100.0
                         for d in cost.drafters]
        self._slots: SlotTable | None = None  # the running run's slots, read by peek

    # -- oracle support ------------------------------------------------------------------------------
    def peek(self, view: StepView) -> np.ndarray:
        """(n, m) accepted-run length each request would realise this step under each drafter."""
        pos = self._slots.gen[view.slots]
        return self.proc.leading_all(view.request_ids, pos)

    def peek_survival(self, view: StepView) -> np.ndarray:
        """(n, m, K) true survival probabilities of each request's draft positions (no outcome)."""
        out = np.empty((view.n, self.proc.m, self.proc.K))
        for d in range(self.proc.m):
            out[:, d, :] = np.cumprod(self.proc.conditional(view.request_ids, d), axis=1)
        return out

    # -- helpers -------------------------------------------------------------------------------------
    def _noisy(self, t_ms: float, sigma: float) -> float:
        if not self.cfg.noise or sigma <= 0 or t_ms <= 0:
            return t_ms
        return t_ms * float(np.exp(self._rng.normal(-0.5 * sigma * sigma, sigma)))

    # -- the loop ------------------------------------------------------------------------------------
    def run(self, policy) -> SimResult:
        r = self._start(policy)
        while r.done < r.total:
            self.iterate(r)
        r.res.k_hist = r.tally.k_hist
        if self.cfg.record_series:
            r.res.series = r.tally.series_arrays()
        return r.res

    # -- one iteration at a time (the Executor adapter, executor.py) --------------------------------
    def begin(self, policy) -> _Run:
        """Start a run that ``iterate`` advances one iteration at a time (``run`` does both)."""
        return self._start(policy)

    def iterate(self, r: _Run) -> None:
        """One pass of ``run``'s loop: admit, then a prefill or a decode iteration (a plain stretch
        under ``none`` runs in closed form up to the next completion or arrival)."""
        self._admit(r)
        r.slots.refresh()
        if not r.chunked and r.slots.pending.size:
            self._prefill_iteration(r)
        elif r.slots.dec.size or r.slots.pending.size:
            self._decode_iteration(r)
        # else: nothing admitted yet (the clock jumps to the next arrival)

    def _start(self, policy) -> _Run:
        cfg = self.cfg
        N = self.arr.shape[0]
        S = cfg.max_batch
        self._rng = np.random.default_rng([cfg.seed, NOISE_STREAM])
        first = np.full(N, np.nan)
        finish = np.full(N, np.nan)
        res = SimResult(self.arr, first, finish, self.P, self.O, policy=getattr(policy, "name", type(policy).__name__))
        plain = isinstance(policy, NonePolicy)  # a deployment without speculation (SimConfig's plain terms)
        chunk = cfg.plain_chunk_budget if plain else 0
        r = _Run(
            policy=policy, total=N, res=res, first=first, finish=finish,
            slots=SlotTable(S, len(self.drafters), self.cat), kv=KvLedger(cfg.kv_tokens), clock=Clock(),
            tally=Tally(max(cfg.max_k, 1), S, cfg.record_series),
            has_prune=callable(getattr(policy, "prune", None)),
            fast_plain=plain and not cfg.noise and not cfg.verify.always,
            async_out=cfg.output_async and plain, chunked=cfg.chunked_prefill or chunk > 0,
            budget=chunk or cfg.token_budget,
            zeros=np.zeros(S, dtype=I64), k_cap=np.full(S, cfg.max_k, dtype=I64),
        )
        self._slots = r.slots
        init = policy.decide(self._empty_view(cfg.max_k, r.budget, cfg.kv_tokens, N))
        r.pmask = self._prefill_mask(init)
        return r

    def _admit(self, r: _Run) -> None:
        """First come, first served while a slot is free and the KV cache can reserve prompt + output."""
        if not r.slots.active.any() and r.next < r.total and self.arr[r.next] > r.clock.now:
            r.clock.now = float(self.arr[r.next])
        while r.next < r.total and self.arr[r.next] <= r.clock.now and r.slots.free:
            need = int(self.P[r.next] + self.O[r.next])
            if not r.kv.fits(need):
                break
            r.slots.admit(r.next)
            r.kv.reserved += need
            r.next += 1
        r.waiting = int(np.searchsorted(self.arr, r.clock.now, side="right")) - r.next

    def _prefill_iteration(self, r: _Run) -> None:
        """One target pass over the oldest pending prompts up to the token budget (at least one prompt);
        samples each prompt's first token."""
        cfg, sl, cost = self.cfg, r.slots, self.cost
        pending = sl.pending
        lens = self.P[sl.rid[pending]] - sl.pref[pending]  # (p,) prompt tokens left
        take = int(np.searchsorted(np.cumsum(lens), r.budget, side="right"))
        take = max(take, 1)
        chosen, clen = pending[:take], lens[:take]
        tok = int(clen.sum())
        t = self._noisy(cost.target.predict(0.0, tok, 1, chosen.size) + cost.overhead_ms, self._sigma_t)
        t += self._serial_output_ms(r, cfg.host_token_ms * chosen.size, t - cost.target.d * chosen.size)  # first tokens
        t += self._draft_prefill_ms(0.0, tok, r.pmask, int(chosen.size))
        r.clock.now += t / 1000.0
        r.res.busy_s += t / 1000.0
        r.res.steps += 1
        r.clock.step += 1
        self._finish_prefill(r, chosen, clen)
        r.kv.used += tok + int(chosen.size)
        self._retire(r, chosen)

    def _decode_iteration(self, r: _Run) -> None:
        """A decode step for every decoding request (with prompt chunks when chunked prefill is on)."""
        sl = r.slots
        dec, rid = sl.dec, sl.rid_dec
        n = dec.size
        ctx = sl.ctx[dec]  # (n,)
        gen0 = sl.gen[dec]  # (n,) tokens generated before this step
        rem = self.O[rid] - gen0  # (n,) tokens still to generate
        if n and r.fast_plain and not sl.pending.size:
            # ``none`` never drafts and learns nothing: jump to the next event in one go.
            self._fast_forward(r, dec, ctx, rem)
            return
        view = self._view(r, dec, rid, ctx, rem, gen0)
        decision: Decision = r.policy.decide(view)
        r.pmask = self._prefill_mask(decision)
        sp = self._speculate(r, view, decision, gen0) if n else _Spec()
        chunks, chunk_len, chunk_prior = self._take_chunks(r, n + sp.vsum)
        ch_tok = int(chunk_len.sum())
        t_verify = self._verify_ms(r, ctx, sp, chunk_prior, ch_tok, chunks.size)
        t_pref_draft = self._chunk_prefill_ms(r, chunks, chunk_len, chunk_prior, ch_tok)
        t_host = self.cfg.host_token_ms * float(sp.gen_step.sum()) if n else 0.0  # output processing, after the pass
        t_host = self._serial_output_ms(r, t_host, t_verify - self.cost.target.d * (n + chunks.size))
        t_total = sp.t_draft + t_verify + t_host + t_pref_draft
        r.clock.now += t_total / 1000.0
        r.res.busy_s += t_total / 1000.0
        r.res.steps += 1
        r.clock.step += 1
        finished = self._commit_decode(r, dec, rid, sp, sp.t_draft + t_verify + t_host) if n else r.zeros[:0]
        if ch_tok:
            self._commit_chunks(r, chunks, chunk_len)
        if n:
            self._observe(r, view, sp, finished, t_verify, t_total, ch_tok, chunk_prior, self._lookup_match(view, gen0, sp))
        retire = dec if finished.size else r.zeros[:0]
        if ch_tok:
            retire = np.concatenate([retire, chunks])
        self._retire(r, retire)

    @staticmethod
    def _serial_output_ms(r: _Run, host_ms: float, gpu_ms: float) -> float:
        """The output processing a pass adds: all of it, or with async output processing what the
        pass's GPU time does not hide."""
        return max(host_ms - gpu_ms, 0.0) if r.async_out else host_ms

    # -- pieces of a decode step ----------------------------------------------------------------------
    def _view(self, r: _Run, dec, rid, ctx, rem, gen0) -> StepView:
        """Step 1: the view of the decoding slots ``dec`` (n,) (``gen0`` (n,): tokens each generated so far)."""
        cfg, sl = self.cfg, r.slots
        n = dec.size
        pending = sl.pending
        pend_tokens = int((self.P[sl.rid[pending]] - sl.pref[pending]).sum()) if pending.size else 0
        return build_view(
            slots=dec, request_ids=rid, ctx_lens=ctx, remaining=rem, k_cap=r.k_cap[:n], drafter=sl.last[dec],
            draft_lag=sl.lag[dec] if self.drafters else None, free_kv_slots=r.kv.free,
            token_budget=r.budget, max_k=cfg.max_k, drafters=self.drafters, now=r.clock.now,
            step=r.clock.step, category=sl.cat_dec, prefill_tokens=min(pend_tokens, max(r.budget - n, 0)),
            waiting=r.waiting, verify=cfg.verify, ngram_avail=self._ngram_avail(rid, gen0),
        )

    def _ngram_avail(self, rid: np.ndarray, gen0: np.ndarray) -> np.ndarray | None:
        """(n,) what the n-gram drafter proposes at max_k for each request, as recorded (None: unknown)."""
        if self._ngram < 0 or not rid.size:
            return None
        return np.minimum(self._limit(rid, gen0, self._ngram), self.cfg.max_k)

    def _lookup_match(self, view: StepView, gen0: np.ndarray, sp: _Spec) -> np.ndarray | None:
        """(n,) ``StepOutcome.ngram_match``: the recorded lookup's matching prefix at each request's
        position, within the tokens the step committed (-1: no proposal, or the request stopped early)."""
        avail = view.ngram_avail
        if avail is None or self._ngram < 0:
            return None
        lead = self.proc.leading_all(view.request_ids, gen0)[:, self._ngram]  # (n,)
        scored = (avail > 0) & (sp.gen_step == sp.accepted + 1)  # (n,) bool
        return np.where(scored, np.minimum(np.minimum(lead, avail), sp.gen_step), -1)

    def _speculate(self, r: _Run, view: StepView, decision: Decision, gen0: np.ndarray) -> _Spec:
        """Steps 2-5 of the step kernel for the n decoding requests, over the simulator's parts."""
        res = run_step(view, decision, _SimParts(self, r, gen0), str(getattr(r.policy, "name", r.policy)))
        k = res.plan.k
        ksum = int(k.sum())
        if ksum:
            r.res.spec_steps += 1
        kc = r.tally.kc
        r.tally.k_hist += np.bincount(k, minlength=kc + 1)[: kc + 1]
        return _Spec.of(res, ksum, emitted(res.verdict.accepted, view.remaining))

    def _draft(self, r: _Run, plan: Clamped, rid, ctx, gen0) -> Drafts:
        """Step 3: draft every request with k > 0, one group per drafter; ``lead`` is each request's
        accepted run, drawn (or replayed) as it drafts."""
        k, dr = plan.k, plan.drafter
        n = k.size
        spec = k > 0
        dts = Drafts(count=np.zeros(n, dtype=I64), lead=np.zeros(n, dtype=I64))
        if len(self.drafters) == 1:
            groups = (0,)
        else:
            ds = dr[spec]
            groups = (int(ds[0]),) if (ds == ds[0]).all() else tuple(int(x) for x in np.unique(ds))
        for d in groups:
            sel = np.flatnonzero(spec) if len(groups) == 1 else np.flatnonzero(spec & (dr == d))
            self._draft_group(r, dts, d, sel, k[sel], plan.conf_cut, rid, ctx, gen0)
        return dts

    def _draft_group(self, r: _Run, sp: Drafts, d: int, sel, k_asked, cut, rid, ctx, gen0) -> None:
        """Drafter d drafts for the requests ``sel`` (indices into the step's n requests)."""
        ks = k_asked
        if self._limit is not None:
            ks = np.minimum(ks, self._limit(rid[sel], gen0[sel], d))
        kmx = int(ks.max())
        acc_d, conf_d = self.proc.draw(rid[sel], gen0[sel], d, kmx)  # (g, kmx) each
        if conf_d is not None and cut is not None:
            run = np.cumprod(conf_d, axis=1)
            ok = accepted_run(run >= cut[sel][:, None])
            # drafting stops after the token whose running confidence fell below the cut; that token
            # is drafted already (its pass is paid) and stays, for ``prune`` to drop if verifying it
            # does not pay
            dsel = psel = np.minimum(ks, ok + 1)
        else:
            dsel, psel = ks, ks
        sp.count[sel] = dsel
        sp.lead[sel] = accepted_run(acc_d)
        if conf_d is not None:
            if sp.confidence is None:
                sp.confidence = np.full((sp.count.size, max(self.cfg.max_k, 1)), np.nan)
            sp.confidence[sel, :kmx] = np.where(self._jidx[:kmx][None, :] < dsel[:, None], conf_d, np.nan)
        lag = r.slots.lag[r.slots.dec[sel], d]
        # a lookup that finds nothing still pays for looking
        td, fc, fb, fp = self._draft_cost(d, ctx[sel], psel if self._stateful[d] else k_asked, lag)
        sp.ms += self._noisy(td, self._sigma_d[d])
        if self._stateful[d]:  # the first draft pass is prepared on the host for every drafting request
            sp.ms += self.cfg.draft_step_prep_ms * sel.size
        sp.ctx_tokens += fc
        sp.batched_tokens += fb
        sp.passes += fp

    def _take_chunks(self, r: _Run, decode_tokens: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Chunked prefill: (slots, chunk lengths, prompt tokens they already prefilled) of the pending
        prompts filling what the decode step leaves of the token budget; empty otherwise."""
        sl = r.slots
        pending = sl.pending
        none = np.zeros(0, dtype=I64)
        if not (r.chunked and pending.size):
            return none, none, 0
        left = r.budget - decode_tokens
        if not (left > 0 or sl.dec.size == 0):
            return none, none, 0
        lens = self.P[sl.rid[pending]] - sl.pref[pending]  # (p,) prompt tokens left
        cs = np.cumsum(lens)
        left = max(left, 1)
        take = int(np.searchsorted(cs, left, side="left")) + 1
        take = min(take, pending.size)
        slots = pending[:take]
        chunk_len = lens[:take].copy()
        over = int(cs[take - 1] - left)
        if over > 0:
            chunk_len[-1] -= over
        return slots, chunk_len, int(sl.pref[slots].sum())

    def _verify_ms(self, r: _Run, ctx: np.ndarray, sp: _Spec, chunk_prior: int, ch_tok: int, chunks: int) -> float:
        """The target pass: verification of n + sum k tokens (padded: K + 1 per request) plus chunks."""
        cfg = self.cfg
        n = ctx.size
        v_ctx = float(ctx.sum()) + chunk_prior
        v_seqs = n + chunks
        if cfg.verify_expansion and sp.vsum:
            # each verified token is its own sequence over the request's KV up to its position
            v_ctx += cfg.reread_share * float((sp.verified * ctx).sum() + (sp.verified * (sp.verified + 1)).sum() / 2)
            v_seqs += sp.vsum
        v_tok = n + sp.vsum if cfg.verify.per_request else int(cfg.verify.verified_tokens(sp.k).sum())
        t_verify = self.cost.target.predict(v_ctx, float(v_tok + ch_tok), 1, v_seqs) + self.cost.overhead_ms
        return self._noisy(t_verify, self._sigma_t)

    def _chunk_prefill_ms(self, r: _Run, chunks, chunk_len, chunk_prior: int, ch_tok: int) -> float:
        """The drafts' prefill of this pass's prompt chunks, plus the first token of prompts it completes."""
        if not ch_tok:
            return 0.0
        t = self._draft_prefill_ms(float(chunk_prior), ch_tok, r.pmask, int(chunks.size))
        if self.cfg.host_token_ms:
            done_now = int((r.slots.pref[chunks] + chunk_len >= self.P[r.slots.rid[chunks]]).sum())
            t += self.cfg.host_token_ms * done_now
        return t

    def _commit_decode(self, r: _Run, dec, rid, sp: _Spec, decode_ms: float) -> np.ndarray:
        """Advance the decoding requests by their accepted tokens + 1; returns the finished request ids."""
        res, sl = r.res, r.slots
        n = dec.size
        res.decode_steps += 1
        res.decode_busy_s += decode_ms / 1000.0
        sl.gen[dec] += sp.gen_step
        sl.ctx[dec] += sp.gen_step
        r.kv.used += int(sp.gen_step.sum())
        if self._any_stateful:
            sl.lag[dec] += sp.gen_step[:, None] * self._stateful_i[None, :]
        if sp.ksum:
            spec = sp.k > 0
            sl.lag[dec[spec], sp.drafter[spec]] = 0
            sl.last[dec[spec]] = sp.drafter[spec]
        bb = r.tally.bucket_of[n]
        res.batch_steps[bb] += 1
        res.batch_requests[bb] += n
        res.batch_k[bb] += sp.ksum
        res.drafted += int(sp.drafted.sum())
        res.verified += sp.vsum
        res.accepted += int(sp.accepted.sum())
        res.decode_tokens += int(sp.gen_step.sum())
        res.request_steps += n
        return rid[sl.gen[dec] >= self.O[rid]]

    def _commit_chunks(self, r: _Run, chunks, chunk_len) -> None:
        """Advance the chunked prompts; a prompt whose last chunk ran starts decoding with its first token."""
        sl = r.slots
        m = len(self.drafters)
        full = sl.pref[chunks] + chunk_len >= self.P[sl.rid[chunks]]
        sl.pref[chunks] += chunk_len
        sl.ctx[chunks] += chunk_len
        r.kv.used += int(chunk_len.sum())
        if m:
            sl.lag[chunks, :m] += chunk_len[:, None] * (self._stateful & ~r.pmask)[None, :]
        fin = chunks[full]
        if fin.size:
            sl.gen[fin] = 1
            sl.ctx[fin] += 1
            if m:
                sl.lag[fin, :m] += (self._stateful & ~r.pmask)[None, :]
            r.kv.used += fin.size
            sl.begin_decoding(fin)
            r.first[sl.rid[fin]] = r.clock.now

    def _observe(self, r: _Run, view: StepView, sp: _Spec, finished, t_verify: float, t_total: float,
                 ch_tok: int, chunk_prior: int, ngram_match: np.ndarray | None) -> None:
        """Step 7: the outcome the policy observes (every request reports the drafter decided)."""
        outcome = step_outcome(view, sp.step, sp.drafter, finished, verify_ms=t_verify, total_ms=t_total,
                               now=r.clock.now, step=r.clock.step, prefill_tokens=ch_tok, prefill_ctx_tokens=chunk_prior,
                               ngram_match=ngram_match)
        r.policy.observe(outcome)
        r.tally.add_series(r.clock.now, view.n, sp.ksum, int(sp.accepted.sum()), sp.vsum)

    # -- pieces of the loop ---------------------------------------------------------------------------
    def _empty_view(self, K, budget, kv_tokens, waiting) -> StepView:
        """The view of an empty batch the policy decides on before the first step."""
        z = np.zeros(0, dtype=I64)
        return build_view(slots=z, request_ids=z, ctx_lens=z, remaining=z, drafters=self.drafters, max_k=K,
                          token_budget=budget, free_kv_slots=kv_tokens, now=0.0, step=0, waiting=waiting)

    def _prefill_mask(self, decision: Decision) -> np.ndarray:
        """(m,) the drafters whose state this iteration's prompts prefill."""
        if not decision.prefill_draft:
            return np.zeros(self._stateful.shape, dtype=bool)
        if not self.cfg.prefill_one_drafter:
            return self._stateful
        d = int(decision.prefill_drafter)
        if d < 0:
            d = self.cfg.default_drafter
        if not (0 <= d < self._stateful.size and self._stateful[d]):
            d = int(np.argmax(self._stateful)) if self._any_stateful else -1
        out = np.zeros(self._stateful.shape, dtype=bool)
        if d >= 0:
            out[d] = True
        return out

    def _draft_prefill_ms(self, prior: float, tokens: int, mask: np.ndarray, seqs: int = 1) -> float:
        """The prefill pass of each draft in ``mask`` over ``tokens`` prompt tokens of ``seqs`` sequences."""
        if not mask.any() or tokens <= 0:
            return 0.0
        t = 0.0
        for i, d in enumerate(self.cost.drafters):
            if mask[i]:
                ctx = d.draft_ctx(np.array([prior]))[0] if d.kind.value == "self_spec" else prior
                model = self._prefill_costs[i] if self._prefill_costs and self._prefill_costs[i] else d.model
                t += self._noisy(model.predict(ctx, tokens, 1, seqs), self._sigma_d[i])
        return t

    def _finish_prefill(self, r: _Run, chosen: np.ndarray, clen: np.ndarray) -> None:
        sl = r.slots
        sl.pref[chosen] += clen
        sl.gen[chosen] = 1
        sl.ctx[chosen] = sl.pref[chosen] + 1
        if len(self.drafters):
            # a draft that never saw the prompt lags by the whole context (StepView.draft_lag)
            sl.lag[chosen, : len(self.drafters)] = sl.ctx[chosen][:, None] * (self._stateful & ~r.pmask)[None, :]
        sl.begin_decoding(chosen)
        r.first[sl.rid[chosen]] = r.clock.now

    def _draft_cost(self, d: int, ctx: np.ndarray, passes: np.ndarray, lag: np.ndarray):
        """(ms, ctx tokens, batched tokens, passes) of drafter d running ``passes`` passes per request
        (DrafterCost.draft_ms in closed form, plus the catch-up of each drafting request's lag)."""
        dc = self.cost.drafters[d]
        pmax = int(passes.max())
        if pmax <= 0:
            return 0.0, 0, 0, 0
        if not dc.has_passes:
            return dc.const_ms, 0, 0, 0
        dctx = dc.draft_ctx(ctx) if dc.kind.value == "self_spec" else ctx
        c_tok = float((passes * dctx).sum() + (passes * (passes - 1)).sum() / 2)
        seq_passes = int(passes.sum())  # one token per request per pass
        caught_up = int(lag[passes > 0].sum())
        mdl = dc.model
        # the draft's per-request term d is paid per request per pass (folded into b: once per pass's token)
        b_tok = seq_passes + dc.catch_up_share * caught_up  # a caught-up token pays no per-request term
        ms = mdl.a * c_tok + mdl.b * b_tok + mdl.c * pmax + mdl.d * seq_passes + dc.const_ms
        return ms, int(c_tok), seq_passes + caught_up, pmax

    def _fast_forward(self, r: _Run, dec: np.ndarray, ctx: np.ndarray, rem: np.ndarray) -> None:
        """Plain decode steps until the next completion or arrival, in closed form (same times and
        tokens as stepping one by one: every request gains one token per step)."""
        n = dec.size
        tgt = self.cost.target
        now = r.clock.now
        horizon = int(rem.min())
        s_idx = np.arange(horizon, dtype=np.float64)  # (horizon,) steps ahead
        c0 = float(ctx.sum())
        t_gpu = tgt.a * (c0 + s_idx * n) + tgt.b * n + tgt.c + self.cost.overhead_ms  # (horizon,)
        t_out = self.cfg.host_token_ms * n
        t_out = np.maximum(t_out - t_gpu, 0.0) if r.async_out else t_out
        t_ms = t_gpu + tgt.d * n + t_out
        ends = now + np.cumsum(t_ms) / 1000.0  # (horizon,) clock at the end of each step
        j = horizon
        if r.next < self.arr.shape[0] and self.arr[r.next] > now:
            # stop after the step during which the next request arrives (it is admitted before the next step);
            # a request already waiting is blocked on a slot or KV, which only a completion frees
            j = min(horizon, int(np.searchsorted(ends, self.arr[r.next], side="left")) + 1)
        j = max(j, 1)
        busy = float(t_ms[:j].sum()) / 1000.0
        r.clock.now = float(ends[j - 1])
        r.slots.gen[dec] += j
        r.slots.ctx[dec] += j
        r.kv.used += j * n
        if self._any_stateful:
            r.slots.lag[dec] += j * self._stateful_i[None, :]
        res = r.res
        res.steps += j
        res.decode_steps += j
        res.busy_s += busy
        res.decode_busy_s += busy
        res.decode_tokens += j * n
        res.request_steps += j * n
        r.tally.k_hist[0] += j * n
        bb = int(np.searchsorted(BATCH_BUCKETS, n, side="left"))
        res.batch_steps[bb] += j
        res.batch_requests[bb] += j * n
        r.tally.add_series(r.clock.now, n, 0, 0, 0)
        self._retire(r, dec)
        r.clock.step += j

    def _retire(self, r: _Run, slots: np.ndarray) -> None:
        """Free the slots of finished requests and their KV; stamp their finish time."""
        if slots.size == 0:
            return
        fs, fr = r.slots.release(slots, self.O)
        if not fs.size:
            return
        r.finish[fr] = r.clock.now
        r.kv.reserved -= int((self.P[fr] + self.O[fr]).sum())
        r.kv.used -= int(r.slots.ctx[fs].sum())
        r.done += int(fs.size)
