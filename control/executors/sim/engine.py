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
token as well; drafts: one pass per draft depth), optionally multiplied
by lognormal noise whose spread is the fit's mean absolute error. Acceptance comes from
``AcceptanceProcess``; with a fixed seed the whole run is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from control.errors import ConfigError
from control.executors.sim.acceptance import AcceptanceProcess
from control.goodput.granularity import PER_REQUEST, VerifyGranularity
from control.goodput.stepcost import StepCostModel
from control.policy.simple import NonePolicy
from control.policy.types import Decision, StepOutcome, StepView

I64 = np.int64
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1 << 30)


@dataclass(frozen=True, slots=True)
class SimConfig:
    max_batch: int = 256
    kv_tokens: int = 1 << 40
    token_budget: int = 8192
    max_k: int = 8
    chunked_prefill: bool = False
    noise: bool = False
    seed: int = 0
    record_series: bool = True
    verify_expansion: bool = False  # verification by batch expansion: k + 1 KV reads per request
    host_token_ms: float = 0.0  # host time per generated token (output processing), serial with the GPU
    verify: VerifyGranularity = PER_REQUEST  # what the simulated target verifies (padded: K + 1 whatever k)
    prefill_one_drafter: bool = False  # draft prefill for Decision.prefill_drafter only (reference executor)

    def __post_init__(self) -> None:
        for name in ("max_batch", "kv_tokens", "token_budget"):
            if getattr(self, name) < 1:
                raise ConfigError(f"sim {name} = {getattr(self, name)!r}: must be >= 1")
        if not 0 <= self.max_k <= 16:
            raise ConfigError(f"sim max_k = {self.max_k!r}: must be in 0..16")
        if not (math.isfinite(self.host_token_ms) and self.host_token_ms >= 0):
            raise ConfigError(f"sim host_token_ms = {self.host_token_ms!r}: must be a finite number >= 0")


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
    k_hist: np.ndarray = field(default_factory=lambda: np.zeros(17, dtype=I64))
    # decode steps by batch-size bucket (upper edges BATCH_BUCKETS): steps, request-steps, sum of k
    batch_steps: np.ndarray = field(default_factory=lambda: np.zeros(len(BATCH_BUCKETS), dtype=I64))
    batch_requests: np.ndarray = field(default_factory=lambda: np.zeros(len(BATCH_BUCKETS), dtype=I64))
    batch_k: np.ndarray = field(default_factory=lambda: np.zeros(len(BATCH_BUCKETS), dtype=I64))
    series: dict[str, np.ndarray] = field(default_factory=dict)
    policy: str = ""


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
        self._jidx = np.arange(max(config.max_k, 1))
        mape = mape or {}
        self._sigma_t = math.sqrt(math.pi / 2) * mape.get("target", cost.target.mape) / 100.0
        self._sigma_d = [math.sqrt(math.pi / 2) * (d.model.mape if d.model is not None else 0.0) / 100.0
                         for d in cost.drafters]
        self._slot_s = None  # set during run, used by peek

    # -- oracle support ------------------------------------------------------------------------------
    def peek(self, view: StepView) -> np.ndarray:
        """(n, m) accepted-run length each request would realise this step under each drafter."""
        pos = self._slot_gen[view.slots]
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
        cfg = self.cfg
        N = self.arr.shape[0]
        S = cfg.max_batch
        m = len(self.drafters)
        K = cfg.max_k
        Kc = max(K, 1)
        cost = self.cost
        tgt = cost.target
        self._rng = np.random.default_rng([cfg.seed, 23])
        has_prune = callable(getattr(policy, "prune", None))
        ff_plain = isinstance(policy, NonePolicy) and not cfg.noise and not cfg.verify.always
        zeros_n = np.zeros(S, dtype=I64)
        ones_n = np.ones(S, dtype=I64)

        s_rid = np.full(S, -1, dtype=I64)
        s_ctx = np.zeros(S, dtype=I64)
        s_gen = np.zeros(S, dtype=I64)
        s_pref = np.zeros(S, dtype=I64)
        s_seq = np.zeros(S, dtype=I64)
        s_lag = np.zeros((S, max(m, 1)), dtype=I64)
        s_last = np.full(S, -1, dtype=I64)
        active = np.zeros(S, dtype=bool)
        decoding = np.zeros(S, dtype=bool)
        self._slot_gen = s_gen
        self._rid_ref = s_rid
        free = list(range(S - 1, -1, -1))
        kv_reserved = 0
        kv_used = 0
        nxt = 0
        seq = 0
        done = 0
        now = 0.0
        first = np.full(N, np.nan)
        finish = np.full(N, np.nan)
        res = SimResult(self.arr, first, finish, self.P, self.O, policy=getattr(policy, "name", type(policy).__name__))
        k_hist = np.zeros(Kc + 1, dtype=I64)
        ser_t, ser_n, ser_k, ser_acc, ser_ver = [], [], [], [], []
        bucket_of = np.searchsorted(BATCH_BUCKETS, np.arange(S + 1), side="left")
        b_steps, b_req, b_k = res.batch_steps, res.batch_requests, res.batch_k
        drafters = self.drafters
        kcap_full = np.full(S, K, dtype=I64)
        cat = self.cat
        O, P = self.O, self.P  # noqa: E741 - output and prompt lengths
        step = 0

        init = policy.decide(self._empty_view(K, cfg, now, 0, N - nxt))
        pmask = self._prefill_mask(init)
        dirty = True  # batch membership changed: recompute the index arrays
        pending = dec = rid_all = cat_dec = zeros_n[:0]

        while done < N:
            # -- admission ---------------------------------------------------------------------------
            if not active.any() and nxt < N and self.arr[nxt] > now:
                now = float(self.arr[nxt])
            while nxt < N and self.arr[nxt] <= now and free:
                need = int(P[nxt] + O[nxt])
                if kv_reserved + need > cfg.kv_tokens:
                    break
                s = free.pop()
                s_rid[s], s_ctx[s], s_gen[s], s_pref[s], s_seq[s], s_last[s] = nxt, 0, 0, 0, seq, -1
                s_lag[s] = 0
                active[s] = True
                kv_reserved += need
                seq += 1
                nxt += 1
                dirty = True
            waiting = int(np.searchsorted(self.arr, now, side="right")) - nxt
            if dirty:
                pending = np.flatnonzero(active & ~decoding)
                if pending.size > 1:
                    pending = pending[np.argsort(s_seq[pending], kind="stable")]
                dec = np.flatnonzero(decoding)
                rid_all = s_rid[dec]
                cat_dec = None if cat is None else cat[rid_all]
                dirty = False
            n = dec.size

            if not cfg.chunked_prefill and pending.size:
                # -- prefill iteration ---------------------------------------------------------------
                lens = P[s_rid[pending]] - s_pref[pending]
                take = int(np.searchsorted(np.cumsum(lens), cfg.token_budget, side="right"))
                take = max(take, 1)
                chosen, clen = pending[:take], lens[:take]
                tok = int(clen.sum())
                t = self._noisy(tgt.predict(0.0, tok, 1, chosen.size) + cost.overhead_ms, self._sigma_t)
                t += cfg.host_token_ms * chosen.size  # each prompt's first token
                t += self._draft_prefill_ms(0.0, tok, pmask, int(chosen.size))
                now += t / 1000.0
                res.busy_s += t / 1000.0
                res.steps += 1
                step += 1
                self._finish_prefill(chosen, clen, pmask, s_pref, s_gen, s_ctx, s_lag, decoding, first, now)
                kv_used += tok + int(chosen.size)
                dirty = True
                done, kv_reserved, kv_used = self._retire(chosen, s_rid, s_gen, s_ctx, active, decoding, free, finish,
                                                          now, done, kv_reserved, kv_used)
                continue

            if n == 0 and pending.size == 0:
                continue  # nothing admitted yet (the clock jumps to the next arrival)

            # -- decode step (with prefill chunks when chunked) --------------------------------------
            rid = rid_all
            ctx = s_ctx[dec]
            gen0 = s_gen[dec]
            rem = O[rid] - gen0
            if n and ff_plain and not pending.size:
                # ``none`` never drafts and learns nothing: jump to the next event in one go.
                dirty = True
                now, done, kv_reserved, kv_used, step = self._fast_forward(
                    dec, rid, ctx, rem, now, nxt, s_gen, s_ctx, s_lag, s_rid, active, decoding, free, finish, done,
                    kv_reserved, kv_used, step, res, k_hist, (ser_t, ser_n, ser_k, ser_acc, ser_ver))
                continue
            pend_tokens = int((P[s_rid[pending]] - s_pref[pending]).sum()) if pending.size else 0
            view = StepView(
                slots=dec, request_ids=rid, ctx_lens=ctx, remaining=rem, k_cap=kcap_full[:n],
                drafter=s_last[dec], draft_lag=s_lag[dec] if m else np.zeros((n, 1), dtype=I64),
                free_kv_slots=int(cfg.kv_tokens - kv_used), token_budget=cfg.token_budget, max_k=K,
                drafters=drafters, now=now, step=step,
                category=cat_dec,
                prefill_tokens=min(pend_tokens, max(cfg.token_budget - n, 0)), waiting=waiting, verify=cfg.verify,
            )
            decision: Decision = policy.decide(view)
            pmask = self._prefill_mask(decision)
            t_draft = 0.0
            draft_passes = draft_ctx_tok = draft_b_tok = 0
            conf_full = None
            if n:
                k = np.minimum(np.asarray(decision.k, dtype=I64), rem - 1)
                np.clip(k, 0, K, out=k)
                ksum = int(k.sum())
                if ksum > min(cfg.token_budget - n, cfg.kv_tokens - kv_used):
                    k = self._fit_budget(k, n, cfg.token_budget, cfg.kv_tokens - kv_used)
                    ksum = int(k.sum())
                dr = np.asarray(decision.drafter, dtype=I64)
                if m > 1:
                    dr = np.clip(dr, 0, m - 1)
                else:
                    dr = zeros_n[:n]
                if ksum:
                    spec = k > 0
                    drafted = np.zeros(n, dtype=I64)
                    lead = np.zeros(n, dtype=I64)
                    cut = decision.conf_cut
                    if m == 1:
                        groups = (0,)
                    else:
                        ds = dr[spec]
                        groups = (int(ds[0]),) if (ds == ds[0]).all() else tuple(int(x) for x in np.unique(ds))
                    for d in groups:
                        sel = np.flatnonzero(spec) if len(groups) == 1 else np.flatnonzero(spec & (dr == d))
                        ks = k[sel]
                        k_asked = ks
                        if self._limit is not None:
                            ks = np.minimum(ks, self._limit(rid[sel], gen0[sel], d))
                        kmx = int(ks.max())
                        acc_d, conf_d = self.proc.draw(rid[sel], gen0[sel], d, kmx)
                        if conf_d is not None and cut is not None:
                            run = np.cumprod(conf_d, axis=1)
                            ok = np.cumprod(run >= np.asarray(cut, dtype=np.float64)[sel][:, None], axis=1).sum(axis=1)
                            # drafting stops after the token whose running confidence fell below the
                            # cut; that token is drafted already (its pass is paid) and stays, for
                            # ``prune`` to drop if verifying it does not pay
                            dsel = psel = np.minimum(ks, ok + 1)
                        else:
                            dsel, psel = ks, ks
                        drafted[sel] = dsel
                        lead[sel] = np.cumprod(acc_d, axis=1).sum(axis=1)
                        if conf_d is not None:
                            if conf_full is None:
                                conf_full = np.full((n, Kc), np.nan)
                            conf_full[sel, :kmx] = np.where(self._jidx[:kmx][None, :] < dsel[:, None], conf_d, np.nan)
                        lag = s_lag[dec[sel], d]
                        # a lookup that finds nothing still pays for looking
                        td, fc, fb, fp = self._draft_cost(d, ctx[sel], psel if self._stateful[d] else k_asked, lag)
                        t_draft += self._noisy(td, self._sigma_d[d])
                        draft_ctx_tok += fc
                        draft_b_tok += fb
                        draft_passes += fp
                    verified = drafted
                    if has_prune:
                        pv = policy.prune(view, decision, drafted, conf_full)
                        verified = np.clip(np.asarray(pv, dtype=I64), 0, drafted)
                    accepted = np.minimum(lead, verified)
                    res.spec_steps += 1
                    gen_step = np.minimum(accepted + 1, rem)
                    vsum = int(verified.sum())
                else:
                    drafted = verified = accepted = zeros_n[:n]
                    gen_step = ones_n[:n]
                    vsum = 0
                k_hist += np.bincount(k, minlength=Kc + 1)[: Kc + 1]
            else:
                k = drafted = verified = accepted = gen_step = zeros_n[:0]
                dr = zeros_n[:0]
                ksum = vsum = 0
            # prefill chunks (chunked mode) share the verify pass
            chunk_slots = np.zeros(0, dtype=I64)
            chunk_len = np.zeros(0, dtype=I64)
            chunk_prior = 0
            if cfg.chunked_prefill and pending.size:
                left = cfg.token_budget - (n + vsum)
                if left > 0 or n == 0:
                    lens = P[s_rid[pending]] - s_pref[pending]
                    cs = np.cumsum(lens)
                    left = max(left, 1)
                    take = int(np.searchsorted(cs, left, side="left")) + 1
                    take = min(take, pending.size)
                    chunk_slots = pending[:take]
                    chunk_len = lens[:take].copy()
                    over = int(cs[take - 1] - left)
                    if over > 0:
                        chunk_len[-1] -= over
                    chunk_prior = int(s_pref[chunk_slots].sum())
            ch_tok = int(chunk_len.sum())
            v_ctx = float(ctx.sum()) + chunk_prior
            v_seqs = n + chunk_slots.size
            if cfg.verify_expansion and vsum:
                # each verified token is its own sequence over the request's KV up to its position
                v_ctx += float((verified * ctx).sum() + (verified * (verified + 1)).sum() / 2)
                v_seqs += vsum
            v_tok = n + vsum if cfg.verify.per_request else int(cfg.verify.verified_tokens(k).sum())
            t_verify = tgt.predict(v_ctx, float(v_tok + ch_tok), 1, v_seqs) + cost.overhead_ms
            if n:
                t_verify += cfg.host_token_ms * float(gen_step.sum())
            t_verify = self._noisy(t_verify, self._sigma_t)
            t_pref_draft = (self._draft_prefill_ms(float(chunk_prior), ch_tok, pmask, int(chunk_slots.size))
                            if ch_tok else 0.0)
            if ch_tok and cfg.host_token_ms:
                # prompts whose last chunk is in this pass emit their first token
                done_now = int((s_pref[chunk_slots] + chunk_len >= P[s_rid[chunk_slots]]).sum())
                t_pref_draft += cfg.host_token_ms * done_now
            t_total = t_draft + t_verify + t_pref_draft
            now += t_total / 1000.0
            res.busy_s += t_total / 1000.0
            res.steps += 1
            step += 1
            finished = np.zeros(0, dtype=I64)
            if n:
                res.decode_steps += 1
                res.decode_busy_s += (t_draft + t_verify) / 1000.0
                s_gen[dec] += gen_step
                s_ctx[dec] += gen_step
                kv_used += int(gen_step.sum())
                if self._any_stateful:
                    s_lag[dec] += gen_step[:, None] * self._stateful_i[None, :]
                if ksum:
                    spec = k > 0
                    s_lag[dec[spec], dr[spec]] = 0
                    s_last[dec[spec]] = dr[spec]
                bb = bucket_of[n]
                b_steps[bb] += 1
                b_req[bb] += n
                b_k[bb] += ksum
                res.drafted += int(drafted.sum())
                res.verified += vsum
                res.accepted += int(accepted.sum())
                res.decode_tokens += int(gen_step.sum())
                res.request_steps += n
                finished = rid[s_gen[dec] >= O[rid]]
            if ch_tok:
                full = s_pref[chunk_slots] + chunk_len >= P[s_rid[chunk_slots]]
                s_pref[chunk_slots] += chunk_len
                s_ctx[chunk_slots] += chunk_len
                kv_used += ch_tok
                if m:
                    s_lag[chunk_slots, :m] += chunk_len[:, None] * (self._stateful & ~pmask)[None, :]
                fin = chunk_slots[full]
                if fin.size:
                    dirty = True
                    s_gen[fin] = 1
                    s_ctx[fin] += 1
                    if m:
                        s_lag[fin, :m] += (self._stateful & ~pmask)[None, :]
                    kv_used += fin.size
                    decoding[fin] = True
                    first[s_rid[fin]] = now
            if n:
                outcome = StepOutcome(
                    slots=dec, request_ids=rid, drafter=dr, ctx_lens=ctx, drafted=drafted, verified=verified,
                    accepted=accepted, confidence=conf_full, category=cat_dec,
                    draft_ms=t_draft, verify_ms=t_verify, total_ms=t_total, draft_passes=draft_passes,
                    draft_ctx_tokens=draft_ctx_tok, draft_batched_tokens=draft_b_tok, finished=finished,
                    now=now, step=step, prefill_tokens=ch_tok, prefill_ctx_tokens=chunk_prior,
                )
                policy.observe(outcome)
                if cfg.record_series:
                    ser_t.append(now)
                    ser_n.append(n)
                    ser_k.append(ksum)
                    ser_acc.append(int(accepted.sum()))
                    ser_ver.append(vsum)
            retire = dec if finished.size else zeros_n[:0]
            if ch_tok:
                retire = np.concatenate([retire, chunk_slots])
            if retire.size:
                dirty = True
            done, kv_reserved, kv_used = self._retire(retire, s_rid, s_gen, s_ctx, active, decoding, free, finish,
                                                      now, done, kv_reserved, kv_used)
        res.k_hist = k_hist
        if cfg.record_series:
            res.series = {"t_s": np.array(ser_t), "batch": np.array(ser_n, dtype=I64), "k_sum": np.array(ser_k, dtype=I64),
                          "accepted": np.array(ser_acc, dtype=I64), "verified": np.array(ser_ver, dtype=I64)}
        return res

    # -- pieces of the loop ---------------------------------------------------------------------------
    def _empty_view(self, K, cfg, now, step, waiting) -> StepView:
        z = np.zeros(0, dtype=I64)
        return StepView(slots=z, request_ids=z, ctx_lens=z, remaining=z, k_cap=z, drafter=z,
                        draft_lag=np.zeros((0, max(len(self.drafters), 1)), dtype=I64), free_kv_slots=cfg.kv_tokens,
                        token_budget=cfg.token_budget, max_k=K, drafters=self.drafters, now=now, step=step,
                        waiting=waiting)

    def _prefill_mask(self, decision: Decision) -> np.ndarray:
        """(m,) the drafters whose state this iteration's prompts prefill."""
        if not decision.prefill_draft:
            return np.zeros(self._stateful.shape, dtype=bool)
        if not self.cfg.prefill_one_drafter:
            return self._stateful
        d = int(decision.prefill_drafter)
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

    def _finish_prefill(self, chosen, clen, pmask, s_pref, s_gen, s_ctx, s_lag, decoding, first, now) -> None:
        s_pref[chosen] += clen
        s_gen[chosen] = 1
        s_ctx[chosen] = s_pref[chosen] + 1
        if len(self.drafters):
            # a draft that never saw the prompt lags by the whole context (StepView.draft_lag)
            s_lag[chosen, : len(self.drafters)] = s_ctx[chosen][:, None] * (self._stateful & ~pmask)[None, :]
        decoding[chosen] = True
        first[self._slot_rid_of(chosen)] = now

    def _slot_rid_of(self, slots):
        return self._rid_ref[slots]

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
        b_tok = int(passes.sum() + lag[passes > 0].sum())
        mdl = dc.model
        seq_passes = float(passes.sum())  # the draft's per-request term d is paid per request per pass
        return (mdl.a * c_tok + mdl.b * b_tok + mdl.c * pmax + mdl.d * seq_passes + dc.const_ms, int(c_tok), b_tok,
                pmax)

    def _fast_forward(self, dec, rid, ctx, rem, now, nxt, s_gen, s_ctx, s_lag, s_rid, active, decoding, free, finish,
                      done, kv_reserved, kv_used, step, res, k_hist, ser):
        """Plain decode steps until the next completion or arrival, in closed form (same times and
        tokens as stepping one by one: every request gains one token per step)."""
        n = dec.size
        tgt = self.cost.target
        horizon = int(rem.min())
        s_idx = np.arange(horizon, dtype=np.float64)
        c0 = float(ctx.sum())
        t_ms = tgt.a * (c0 + s_idx * n) + (tgt.b + tgt.d + self.cfg.host_token_ms) * n + tgt.c + self.cost.overhead_ms
        ends = now + np.cumsum(t_ms) / 1000.0
        j = horizon
        if nxt < self.arr.shape[0] and self.arr[nxt] > now:
            # stop after the step during which the next request arrives (it is admitted before the next step);
            # a request already waiting is blocked on a slot or KV, which only a completion frees
            j = min(horizon, int(np.searchsorted(ends, self.arr[nxt], side="left")) + 1)
        j = max(j, 1)
        busy = float(t_ms[:j].sum()) / 1000.0
        now = float(ends[j - 1])
        s_gen[dec] += j
        s_ctx[dec] += j
        kv_used += j * n
        if self._any_stateful:
            s_lag[dec] += j * self._stateful_i[None, :]
        res.steps += j
        res.decode_steps += j
        res.busy_s += busy
        res.decode_busy_s += busy
        res.decode_tokens += j * n
        res.request_steps += j * n
        k_hist[0] += j * n
        bb = int(np.searchsorted(BATCH_BUCKETS, n, side="left"))
        res.batch_steps[bb] += j
        res.batch_requests[bb] += j * n
        if self.cfg.record_series:
            ser[0].append(now)
            ser[1].append(n)
            ser[2].append(0)
            ser[3].append(0)
            ser[4].append(0)
        return (now, *self._retire(dec, s_rid, s_gen, s_ctx, active, decoding, free, finish, now, done, kv_reserved,
                                   kv_used), step + j)

    @staticmethod
    def _fit_budget(k: np.ndarray, n: int, budget: int, free_kv: int) -> np.ndarray:
        """Trim the longest drafts until n + sum k fits the token budget and sum k the free KV."""
        limit = min(budget - n, free_kv)
        total = int(k.sum())
        if total <= limit:
            return k
        k = k.copy()
        limit = max(limit, 0)
        while int(k.sum()) > limit:
            top = int(k.max())
            k[k == top] -= 1
            if int(k.sum()) < limit:
                break
        return np.maximum(k, 0)

    def _retire(self, slots, s_rid, s_gen, s_ctx, active, decoding, free, finish, now, done, kv_reserved, kv_used):
        if slots.size == 0:
            return done, kv_reserved, kv_used
        rid = s_rid[slots]
        fin = s_gen[slots] >= self.O[rid]
        fin &= decoding[slots]
        if not fin.any():
            return done, kv_reserved, kv_used
        fs = slots[fin]
        fr = rid[fin]
        finish[fr] = now
        kv_reserved -= int((self.P[fr] + self.O[fr]).sum())
        kv_used -= int(s_ctx[fs].sum())
        active[fs] = False
        decoding[fs] = False
        s_rid[fs] = -1
        free.extend(int(x) for x in fs)
        return done + int(fs.size), kv_reserved, kv_used
