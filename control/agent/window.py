"""One window of an agent's telemetry: numpy accumulators filled on the engine thread, turned into
a ``specctl.telemetry/v1`` document (``control.agent.wire``) on the network thread."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from control.agent.wire import K_BUCKETS, MAX_MS, TELEMETRY_SCHEMA
from control.policy.types import StepOutcome, stopped_short

# Initial buffer sizes of a window (request-steps, steps); Agent sizes later windows from the last one's use.
REQUEST_CAPACITY = 4096
STEP_CAPACITY = 1024


def _segment_sums(x: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Sums of consecutive segments of ``x`` with lengths ``lens`` (empty segments sum to 0)."""
    cs = np.concatenate([[0], np.cumsum(x)])
    ends = np.cumsum(lens)
    return cs[ends] - cs[ends - lens]


@dataclass(slots=True, frozen=True)
class _Rows:
    """A window's request-step columns (each [request_steps]); ``d``: the drafter, clipped to the window's."""

    k: np.ndarray
    d: np.ndarray
    drafted: np.ndarray
    verified: np.ndarray
    accepted: np.ndarray
    ctx: np.ndarray
    spec: np.ndarray


class TelemetryWindow:
    """Telemetry of one window of steps.

    The engine thread only copies each step's arrays into preallocated buffers (a handful of slice
    assignments, no per-step reductions); after ``Agent`` closes the window, the network thread turns
    the buffers into the ``specctl.telemetry/v1`` document (``to_payload``): per drafter and draft
    position the chain's trials and acceptances, the k histogram, per-step sums for a random sample
    of steps, all vectorised over the whole window.
    """

    # Per request-step rows and per-step columns of the buffers.
    REQ_ROWS, STEP_COLS = 6, 9
    R_K, R_DRAFTER, R_DRAFTED, R_VERIFIED, R_ACCEPTED, R_CTX = range(REQ_ROWS)
    S_N, S_VERIFY, S_DRAFT, S_TOTAL, S_PRED, S_PASSES, S_DCTX, S_DBATCH, S_FINISHED = range(STEP_COLS)

    def __init__(self, drafters: tuple[str, ...], max_samples: int, started: float, rng: random.Random,
                 capacity: int = REQUEST_CAPACITY, step_capacity: int = STEP_CAPACITY) -> None:
        self.drafters = drafters
        self.m = max(len(drafters), 1)
        self.max_samples = max_samples
        self.started = started
        self.closed_at = started
        self.rng = rng
        self.req = np.zeros((self.REQ_ROWS, max(capacity, 1)), dtype=np.int64)  # (REQ_ROWS, capacity)
        self.step_rows = np.zeros((max(step_capacity, 1), self.STEP_COLS))  # (step_capacity, STEP_COLS)
        self.pos = 0  # request-steps filled
        self.steps = 0
        self._decided = -1  # n of the decision waiting for its outcome
        # Acceptance reported per request (observe_positions): per drafter the position trials and
        # acceptances, and (request-steps, drafted, verified, accepted); requests finished.
        self.extra_pos = np.zeros((2, self.m, K_BUCKETS - 1), dtype=np.int64)
        self.extra_tok = np.zeros((4, self.m), dtype=np.int64)
        self.extra_finished = 0

    @property
    def has_data(self) -> bool:
        return self.steps > 0 or self.extra_finished > 0

    def on_positions(self, drafter: int, steps: int, drafted: int, accepted: int, trials, acc) -> None:
        d = min(max(int(drafter), 0), self.m - 1)
        n = min(len(trials), K_BUCKETS - 1)
        self.extra_pos[0, d, :n] += np.asarray(trials[:n], dtype=np.int64)
        self.extra_pos[1, d, :n] += np.asarray(acc[:n], dtype=np.int64)
        self.extra_tok[:, d] += (steps, drafted, drafted, accepted)
        self.extra_finished += 1

    def _grow(self, n: int) -> None:
        need = self.pos + n
        if need > self.req.shape[1]:
            grown = np.zeros((self.REQ_ROWS, max(need, 2 * self.req.shape[1])), dtype=np.int64)
            grown[:, : self.pos] = self.req[:, : self.pos]
            self.req = grown

    # -- engine thread -----------------------------------------------------------------------------
    def on_decide(self, k: np.ndarray) -> None:
        n = k.shape[0]
        self._grow(n)
        self.req[self.R_K, self.pos: self.pos + n] = k
        self._decided = n

    def on_outcome(self, o: StepOutcome, predicted_ms: float) -> None:
        n = o.n
        p = self.pos
        r = self.req
        if self._decided != n:  # no matching decision (an executor that skipped decide): k = drafted
            self._grow(n)
            r = self.req
            r[self.R_K, p: p + n] = o.drafted
        self._decided = -1
        e = p + n
        r[self.R_DRAFTER, p:e] = o.drafter
        r[self.R_DRAFTED, p:e] = o.drafted
        r[self.R_VERIFIED, p:e] = o.verified
        r[self.R_ACCEPTED, p:e] = o.accepted
        r[self.R_CTX, p:e] = o.ctx_lens
        self.pos = e
        s = self.steps
        if s == self.step_rows.shape[0]:
            self.step_rows = np.concatenate([self.step_rows, np.zeros_like(self.step_rows)])
        self.step_rows[s] = (n, o.verify_ms, o.draft_ms, o.total_ms, predicted_ms, o.draft_passes, o.draft_ctx_tokens,
                             o.draft_batched_tokens, o.finished.shape[0])
        self.steps = s + 1

    # -- network thread ----------------------------------------------------------------------------
    def to_payload(self, *, source: str, seq: int, plan_version: int, plan_id: str, dropped_windows: int,
                   dropped_steps: int, known: set[str] | None = None,
                   short_rejects: set[str] | None = None) -> dict[str, Any]:
        """The ``specctl.telemetry/v1`` document for this window.

        ``short_rejects``: drafters that stop short of the k asked only when they have nothing more
        to propose (no confidence cut: an n-gram lookup without a longer match). A draft that stops
        short with everything drafted accepted (``stopped_short``) counts a rejection at the next
        position, as the adaptive policy counts it (``AdaptivePolicy._tried``); counting only what
        was drafted gives such a drafter the rates of its long matches.

        ``known``: drafter names the service knows (the plan's profile); others are left out of the
        per-drafter statistics, so one unknown drafter does not get the whole window refused.
        """
        rows = self._clean_rows()
        S = self.step_rows[: self.steps]
        n_step = S[:, self.S_N].astype(np.int64)
        spec_per_step = _segment_sums(rows.spec, n_step)
        times = S[:, [self.S_VERIFY, self.S_DRAFT, self.S_TOTAL]]
        ok_time = np.all(np.isfinite(times) & (times >= 0) & (times <= MAX_MS), axis=1)  # corrupt timings stay out
        total = np.where(ok_time, S[:, self.S_TOTAL], 0.0)
        pred = S[:, self.S_PRED]
        has_pred = np.isfinite(pred) & (pred >= 0) & (pred <= MAX_MS)
        drafters, remap = self._drafter_stats(rows, known, short_rejects)
        doc: dict[str, Any] = {
            "schema": TELEMETRY_SCHEMA, "source": source, "seq": seq, "plan_version": plan_version, "plan_id": plan_id,
            "window_s": max(self.closed_at - self.started, 1e-6), "steps": self.steps,
            "spec_steps": int((spec_per_step > 0).sum()), "request_steps": self.pos, "ctx_tokens": int(rows.ctx.sum()),
            "max_batch": int(n_step.max(initial=0)),
            "finished": int(S[:, self.S_FINISHED].sum()) + self.extra_finished,
            "k_hist": np.bincount(np.clip(rows.k, 0, K_BUCKETS - 1), minlength=K_BUCKETS).tolist(),
            "measured_ms_sum": float(total.sum()), "predicted_steps": int(has_pred.sum()),
            "predicted_ms_sum": float(pred[has_pred].sum()), "predicted_measured_ms_sum": float(total[has_pred].sum()),
            "drafters": drafters, "dropped_windows": dropped_windows, "dropped_steps": dropped_steps,
        }
        samples = self._samples(rows, S, n_step, ok_time, has_pred, spec_per_step, remap)
        if samples is not None:
            doc["samples"] = samples
        return doc

    def _clean_rows(self) -> _Rows:
        """The window's request-step columns, clipped to what can be true (accepted <= verified <= drafted)."""
        top = K_BUCKETS - 1
        k, drafter, drafted, verified, accepted, ctx = self.req[:, : self.pos]
        drafted = np.maximum(drafted, 0)
        verified = np.clip(np.minimum(verified, drafted), 0, top)
        accepted = np.clip(np.minimum(accepted, verified), 0, top)
        return _Rows(k, np.clip(drafter, 0, self.m - 1), drafted, verified, accepted, ctx, drafted > 0)

    def _drafter_stats(self, r: _Rows, known: set[str] | None,
                       short_rejects: set[str] | None) -> tuple[list[dict[str, Any]], dict[int, int]]:
        """Per-drafter counts and chain trials per position; ``remap``: window drafter -> index in the list."""
        m, top = self.m, K_BUCKETS - 1
        # Chain trials per (drafter, position): requests whose chain evaluated more than j positions.
        size = m * K_BUCKETS
        base = r.d * K_BUCKETS
        tried_len = np.where(r.spec, np.minimum(r.accepted + 1, r.verified), 0)
        if short_rejects:
            rejects = np.array([name in short_rejects for name in self.drafters] or [False])
            short = rejects[r.d] & stopped_short(np.clip(r.k, 0, top), r.drafted, r.verified, r.accepted)
            tried_len = np.where(short, np.minimum(r.verified + 1, top), tried_len)
        tried = np.bincount(base + tried_len, minlength=size).reshape(m, K_BUCKETS)  # [m, K_BUCKETS]
        acc = np.bincount(base + np.where(r.spec, r.accepted, 0), minlength=size).reshape(m, K_BUCKETS)
        trials = tried[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:] + self.extra_pos[0]  # [m, K_BUCKETS - 1]
        acc_pos = acc[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:] + self.extra_pos[1]
        tok = np.stack([np.bincount(r.d, weights=w, minlength=m) for w in (
            r.spec, r.drafted * r.spec, r.verified * r.spec, r.accepted * r.spec)]).astype(np.int64)  # [4, m]
        tok += self.extra_tok
        drafters, remap = [], {}
        for i, name in enumerate(self.drafters):
            if (tok[1, i] == 0 and not trials[i].any()) or (known is not None and name not in known):
                continue
            last = int(np.flatnonzero(trials[i])[-1]) + 1 if trials[i].any() else 0
            remap[i] = len(drafters)
            drafters.append({
                "name": name, "requests": int(tok[0, i]), "drafted": int(tok[1, i]), "verified": int(tok[2, i]),
                "accepted": int(tok[3, i]), "position_trials": trials[i, :last].tolist(),
                "position_accepted": acc_pos[i, :last].tolist(),
            })
        return drafters, remap

    def _samples(self, r: _Rows, S: np.ndarray, n_step: np.ndarray, ok_time: np.ndarray, has_pred: np.ndarray,
                 spec_per_step: np.ndarray, remap: dict[int, int]) -> dict[str, list] | None:
        """A uniform random sample of the steps with sound timings, with the cost model's features."""
        idx = np.flatnonzero(ok_time)
        if idx.size > self.max_samples:
            idx = np.sort(np.asarray(self.rng.sample(range(idx.size), self.max_samples)))
            idx = np.flatnonzero(ok_time)[idx]
        if not idx.size:
            return None
        lens = n_step[idx]
        first = np.cumsum(n_step)[idx] - lens
        rows = np.repeat(first - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))  # their request-steps

        def per_step(x: np.ndarray) -> np.ndarray:
            return _segment_sums(x[rows], lens)

        spec_d = {j: per_step(r.spec & (r.d == j)) for j in remap}
        n_spec = spec_per_step[idx]
        used = np.full(idx.size, -1, dtype=np.int64)
        for j, out in remap.items():
            used[(n_spec > 0) & (spec_d[j] == n_spec)] = out
        s = S[idx]
        return {
            "batch": lens.tolist(), "ctx_tokens": per_step(r.ctx).tolist(),
            "verify_tokens": (per_step(r.verified * r.spec) + lens).tolist(),
            "verify_ms": s[:, self.S_VERIFY].tolist(), "draft_ms": s[:, self.S_DRAFT].tolist(),
            "total_ms": s[:, self.S_TOTAL].tolist(),
            "predicted_ms": [v if has else None for v, has in zip(s[:, self.S_PRED].tolist(), has_pred[idx].tolist(),
                                                                 strict=True)],
            "draft_passes": s[:, self.S_PASSES].astype(np.int64).tolist(),
            "draft_ctx_tokens": s[:, self.S_DCTX].astype(np.int64).tolist(),
            "draft_batched_tokens": s[:, self.S_DBATCH].astype(np.int64).tolist(),
            "drafter": used.tolist(), "drafted": per_step(r.drafted).tolist(),
            "accepted": per_step(r.accepted * r.spec).tolist(),
        }
