"""A synthetic engine loop for driving the agent the way an executor does (tests only).

Closed-loop continuous batching: ``batch`` requests decode concurrently; a finished request is
replaced at once by a new one (new id, same slot). Each step builds a ``StepView``, calls
``decide``, draws each request's accepted draft length from a chain with per-drafter acceptance
``alpha`` (the true rates, unknown to the controller), produces measured times from a "true" cost
model with noise, and calls ``observe``. A request fails if the controller gives it an invalid draft
length or if it does not get exactly its requested number of tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from control.goodput.stepcost import StepCostModel
from control.policy.types import Decision, StepOutcome, StepView


@dataclass
class EngineStats:
    steps: int = 0
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    decide_s: list[float] = field(default_factory=list)
    k_by_step: list[float] = field(default_factory=list)
    k_max_by_step: list[int] = field(default_factory=list)
    t_by_step: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class SyntheticEngine:
    def __init__(self, policy, true_cost: StepCostModel, *, batch: int = 16, drafters=("draft", "ngram"),
                 alpha=None, max_k: int = 8, ctx_range=(256, 2048), gen_range=(16, 128), noise: float = 0.03,
                 step_sleep_s: float = 0.0, seed: int = 0) -> None:
        self.policy = policy
        self.cost = true_cost
        self.drafters = tuple(drafters)
        self.alpha = np.array([(alpha or {}).get(d, 0.7) for d in self.drafters])
        self.max_k = max_k
        self.rng = np.random.default_rng(seed)
        self.ctx_range, self.gen_range = ctx_range, gen_range
        self.noise = noise
        self.sleep = step_sleep_s
        self.n = batch
        self.slots = np.arange(batch, dtype=np.int64)
        self.rid = np.arange(batch, dtype=np.int64)
        self.next_id = batch
        self.ctx = self.rng.integers(*ctx_range, size=batch)
        self.want = self.rng.integers(*gen_range, size=batch)
        self.got = np.zeros(batch, dtype=np.int64)
        self.stats = EngineStats()
        self.t0 = time.monotonic()

    def view(self) -> StepView:
        return StepView.build(slots=self.slots, request_ids=self.rid, ctx_lens=self.ctx, remaining=self.want - self.got,
                              drafters=self.drafters, max_k=self.max_k, free_kv_slots=1 << 20, token_budget=1 << 20,
                              now=time.monotonic() - self.t0, step=self.stats.steps)

    def step(self) -> Decision:
        view = self.view()
        t = time.perf_counter()
        d = self.policy.decide(view)
        self.stats.decide_s.append(time.perf_counter() - t)
        n = self.n
        k = np.asarray(d.k, dtype=np.int64)
        bad = np.zeros(n, dtype=bool)
        if k.shape != (n,) or np.asarray(d.drafter).shape != (n,):
            self.stats.errors.append(f"step {self.stats.steps}: decision shapes {k.shape}, {np.shape(d.drafter)} for {n} requests")
            k, bad = np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
        drafter = np.clip(np.asarray(d.drafter, dtype=np.int64), 0, len(self.drafters) - 1) if not bad.any() else np.zeros(n, dtype=np.int64)
        bad |= (k < 0) | (k > np.minimum(self.max_k, view.remaining - 1).clip(min=0))
        k = np.clip(k, 0, self.max_k)
        # Chain acceptance: the first rejection ends the accepted run.
        u = self.rng.random((n, max(self.max_k, 1)))
        hit = u < self.alpha[drafter][:, None]
        run = np.cumprod(hit, axis=1).sum(axis=1)
        accepted = np.minimum(run, k)
        verified = k.copy()
        gen = np.minimum(accepted + 1, view.remaining)
        # Measured times: the true cost model with multiplicative noise.
        ctx = self.ctx.astype(np.float64)
        verify_ms = float(self.cost.verify_ms(ctx, k)) * (1 + self.noise * self.rng.standard_normal())
        total_true = self.cost.step_ms(ctx, k, drafter)
        draft_ms = max(total_true - float(self.cost.verify_ms(ctx, k)) - self.cost.overhead_ms, 0.0) * (1 + self.noise * self.rng.standard_normal())
        passes = ctx_tok = bat_tok = 0
        used = np.unique(drafter[k > 0])
        if used.size == 1:
            ctx_tok, bat_tok, passes = self.cost.drafters[int(used[0])].features(ctx[k > 0], k[k > 0])
        self.got += gen
        self.ctx += gen
        self.stats.tokens += int(gen.sum())
        done = self.got >= self.want
        if bad.any():
            self.stats.failed += int(bad.sum())
            self.stats.errors.append(f"step {self.stats.steps}: invalid k {k[bad].tolist()}")
        out = StepOutcome(slots=self.slots.copy(), request_ids=self.rid.copy(), drafter=drafter, ctx_lens=self.ctx.copy(),
                          drafted=k, verified=verified, accepted=accepted, draft_ms=max(draft_ms, 0.0),
                          verify_ms=max(verify_ms, 0.0), total_ms=max(verify_ms, 0.0) + max(draft_ms, 0.0) + self.cost.overhead_ms,
                          draft_passes=int(passes), draft_ctx_tokens=int(ctx_tok), draft_batched_tokens=int(bat_tok),
                          finished=self.rid[done].copy(), step=self.stats.steps)
        self.policy.observe(out)
        self.stats.steps += 1
        self.stats.k_by_step.append(float(k.mean()))
        self.stats.k_max_by_step.append(int(k.max()))
        self.stats.t_by_step.append(time.monotonic())
        if done.any():
            over = self.got[done] != self.want[done]
            self.stats.failed += int(over.sum())
            self.stats.completed += int((~over).sum())
            m = int(done.sum())
            self.rid[done] = np.arange(self.next_id, self.next_id + m)
            self.next_id += m
            self.ctx[done] = self.rng.integers(*self.ctx_range, size=m)
            self.want[done] = self.rng.integers(*self.gen_range, size=m)
            self.got[done] = 0
        if self.sleep:
            time.sleep(self.sleep)
        return d

    def run_for(self, seconds: float) -> EngineStats:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.step()
        return self.stats


class EngineThread:
    """Runs ``engine.step()`` in a loop on its own thread (the engine thread) until stopped."""

    def __init__(self, engine: SyntheticEngine) -> None:
        self.engine = engine
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.engine.step()
        except BaseException as e:  # surfaced by stop()
            self.error = e

    def __enter__(self) -> EngineThread:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> EngineStats:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the engine thread is stuck"
        if self.error is not None:
            raise self.error
        return self.engine.stats
