"""What the service learns from telemetry: acceptance per drafter and position, and the cost model.

- ``AcceptanceTracker``: per drafter and draft position, trials and acceptances from every agent,
  decayed with a half-life in wall-clock time (so the estimate follows a changing workload, however
  many agents post). Rates are shrunk to the drafter's pooled rate (positions) and to the profile's
  prior (the pool), each worth a few pseudo-trials.
- ``CostRefit``: a windowed non-negative least-squares refit of each model's T = a*N_ctx +
  b*N_batched + c*passes from the step samples, regularised toward the profile's coefficients.
  The regularisation keeps directions the live load does not excite (a steady batch size says
  nothing about how cost grows with batch) at the profiled values, and a sliding window (not
  recursive least squares with forgetting) cannot wind up during long steady periods. Nested
  candidates (the profile; its slopes with a refitted constant; the full refit) each replace the
  simpler one only when they predict held-out samples clearly better (2-fold cross-validation).
  A draft model's fit is of its drafted-token price (the per-request term ``d`` folded into ``b``);
  the tokens a lagging draft caught up are priced without ``d``, and the refreshed profile writes the
  fit with the profile's ``d`` unfolded again, so the policies keep pricing catch-up apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from control.agent.wire import TelemetryBatch
from control.goodput.acceptance import DEFAULT_ACCEPTANCE
from control.goodput.cost import LinearCost
from control.goodput.stepcost import DrafterKind
from control.policyspec import MAX_K_LIMIT
from control.profile import CostCoeffs, Profile

RATE_MIN, RATE_MAX = 0.001, 0.995
CV_MARGIN = 0.64  # a refit replaces the profile when its held-out squared error is below this share (0.8 in RMS)


class AcceptanceTracker:
    def __init__(self, profile: Profile, *, halflife_s: float = 60.0, prior_trials: float = 20.0) -> None:
        self.names = tuple(profile.drafter_names)
        self.index = {n: i for i, n in enumerate(self.names)}
        m, K = len(self.names), MAX_K_LIMIT
        self.prior = np.array([profile.acceptance.get(n, DEFAULT_ACCEPTANCE) for n in self.names])
        self.prior_trials = float(prior_trials)
        self.halflife_s = float(halflife_s)
        self.trials = np.zeros((m, K))
        self.succ = np.zeros((m, K))
        self._t_last: float | None = None

    def decay_to(self, now: float) -> None:
        if self._t_last is not None and now > self._t_last:
            f = 0.5 ** ((now - self._t_last) / self.halflife_s)
            self.trials *= f
            self.succ *= f
        self._t_last = now if self._t_last is None else max(self._t_last, now)

    def add(self, batch: TelemetryBatch, now: float) -> None:
        self.decay_to(now)
        for d in batch.drafters:
            i = self.index[d.name]
            n = len(d.position_trials)
            self.trials[i, :n] += d.position_trials
            self.succ[i, :n] += d.position_accepted

    def live_trials(self, name: str) -> float:
        return float(self.trials[self.index[name]].sum())

    def pooled(self, name: str) -> float:
        i = self.index[name]
        r = (self.succ[i].sum() + self.prior[i] * self.prior_trials) / (self.trials[i].sum() + self.prior_trials)
        return float(np.clip(r, RATE_MIN, RATE_MAX))

    def positions(self, name: str, k: int = MAX_K_LIMIT) -> np.ndarray:
        """Conditional acceptance per position 1..k, each shrunk to the drafter's pooled rate."""
        i = self.index[name]
        pooled = self.pooled(name)
        r = (self.succ[i, :k] + pooled * self.prior_trials) / (self.trials[i, :k] + self.prior_trials)
        return np.clip(r, RATE_MIN, RATE_MAX)

    def position_trials(self, name: str) -> np.ndarray:
        return self.trials[self.index[name]]


def fit_with_prior(X: np.ndarray, y: np.ndarray, prior: np.ndarray, prior_weight: float) -> np.ndarray:
    """argmin ||X c - y||^2 + w * ||S (c - prior)||^2 subject to c >= 0, S = the column scales.

    Columns are scaled by their largest magnitude (over the data and 1) so coefficients that differ
    by orders of magnitude are fitted equally well, and the prior counts as ``w`` observations at
    the scale of the largest feature values.
    """
    scale = np.maximum(np.abs(X).max(axis=0) if X.size else np.ones(X.shape[1]), 1.0)
    Xs = X / scale
    sw = math.sqrt(max(prior_weight, 0.0))
    A = np.vstack([Xs, sw * np.eye(X.shape[1])])
    b = np.concatenate([y, sw * prior * scale])
    coef, _ = nnls(A, b)
    return coef / scale


class _Window:
    """A ring buffer of (n_ctx, n_batched, passes, t_ms) observations for one model."""

    def __init__(self, size: int) -> None:
        self.buf = np.zeros((size, 4))
        self.n = 0
        self.i = 0

    def add(self, rows: np.ndarray) -> None:
        size = self.buf.shape[0]
        rows = rows[-size:]
        k = rows.shape[0]
        end = self.i + k
        if end <= size:
            self.buf[self.i:end] = rows
        else:
            first = size - self.i
            self.buf[self.i:] = rows[:first]
            self.buf[: k - first] = rows[first:]
        self.i = end % size
        self.n = min(self.n + k, size)

    def data(self) -> np.ndarray:
        return self.buf[: self.n]


@dataclass(slots=True)
class ModelError:
    """Predicted vs measured step time for a set of samples, under the model in force before them."""

    count: int = 0
    predicted_ms: float = 0.0
    measured_ms: float = 0.0
    abs_pct: float = 0.0


class CostRefit:
    """Windowed, prior-regularised NNLS refit of every model in the profile (see the module docstring)."""

    def __init__(self, profile: Profile, *, window: int = 2048, min_samples: int = 32, prior_weight: float = 1.0) -> None:
        self.base = profile
        self.min_samples = int(min_samples)
        self.prior_weight = float(prior_weight)
        self.windows = {key: _Window(window) for key in profile.models}
        # Which model a drafter's draft time refits, and the constant to subtract (self-speculation runs
        # the target with a capped KV: its draft passes are not the target's cost, so they are not used).
        self._draft_model: dict[str, tuple[str, float]] = {}
        for d in profile.drafters:
            if d.kind in (DrafterKind.draft_model, DrafterKind.eagle) and d.model and d.model != "target":
                self._draft_model[d.name] = (d.model, d.cost_ms)
        # a draft model's per-request term folded into its token price, as the policies price its passes
        drafts = {key for key, _ in self._draft_model.values()}
        # ms a caught-up token costs less than a drafted one (the per-request term of those passes)
        self._seq_ms = {key: profile.models[key].d_ms_per_request for key in drafts}
        self._base: dict[str, CostCoeffs] = {
            key: CostCoeffs.from_cost(c.to_cost().per_token_draft()) if key in drafts else c
            for key, c in profile.models.items()}
        self.coeffs: dict[str, CostCoeffs] = dict(self._base)
        self.samples_seen = 0
        self.refitted: set[str] = set()  # models whose refit replaced the profile's coefficients

    def samples_in(self, key: str) -> int:
        return self.windows[key].n

    def predict_total(self, batch: TelemetryBatch) -> tuple[np.ndarray, np.ndarray]:
        """(predicted, measured) total step ms for the batch's samples the current model can predict."""
        s = batch.samples
        if s is None or s.n == 0:
            return np.zeros(0), np.zeros(0)
        t = self.coeffs["target"]
        pred = (t.a_ms_per_ctx_token * np.asarray(s.ctx_tokens, dtype=np.float64)
                + t.b_ms_per_batched_token * np.asarray(s.verify_tokens, dtype=np.float64)
                + t.d_ms_per_request * np.asarray(s.batch, dtype=np.float64)
                + t.c_ms + self.base.overhead_ms)
        drafted = np.asarray(s.drafted) > 0  # [n]
        caught = _caught_up(s)  # [n]
        which = np.asarray(s.drafter, dtype=np.int64)  # [n] drafter index; -1: several in one step
        ok = ~(drafted & (which < 0))  # several drafters in one step: no single model to predict with
        for di, d in enumerate(batch.drafters):  # vectorised per drafter (one window has few)
            sel = drafted & (which == di)
            if not sel.any():
                continue
            entry = self.base.drafter(d.name)
            if entry.kind == DrafterKind.ngram:
                pred[sel] += entry.cost_ms
            elif entry.name in self._draft_model:
                key = self._draft_model[entry.name][0]
                m = self.coeffs[key]
                pred[sel] += (m.a_ms_per_ctx_token * np.asarray(s.draft_ctx_tokens, dtype=np.float64)[sel]
                              + m.b_ms_per_batched_token * np.asarray(s.draft_batched_tokens, dtype=np.float64)[sel]
                              - self._seq_ms[key] * caught[sel]
                              + m.c_ms * np.asarray(s.draft_passes, dtype=np.float64)[sel] + entry.cost_ms)
            else:
                ok[sel] = False  # self-speculation: the draft side's cost is not a model of its own
        return pred[ok], np.asarray(s.total_ms, dtype=np.float64)[ok]

    def add(self, batch: TelemetryBatch) -> ModelError:
        """Score the current model on the batch's samples, then add them to the windows."""
        err = ModelError()
        s = batch.samples
        if s is None or s.n == 0:
            return err
        pred, meas = self.predict_total(batch)
        keep = meas > 0
        if keep.any():
            err = ModelError(int(keep.sum()), float(pred[keep].sum()), float(meas[keep].sum()),
                             float((np.abs(pred[keep] - meas[keep]) / meas[keep]).sum() * 100.0))
        self.samples_seen += s.n
        vms = np.asarray(s.verify_ms, dtype=np.float64)
        sel = vms > 0
        if sel.any():
            # the refit explains what the profile's per-request term (if any) leaves; it keeps that term
            vms = vms - self.base.models["target"].d_ms_per_request * np.asarray(s.batch, dtype=np.float64)
            rows = np.stack([np.asarray(s.ctx_tokens, dtype=np.float64), np.asarray(s.verify_tokens, dtype=np.float64),
                             np.ones(s.n), vms], axis=1)[sel]
            self.windows["target"].add(rows)
        names = [d.name for d in batch.drafters]
        dms = np.asarray(s.draft_ms, dtype=np.float64)
        passes = np.asarray(s.draft_passes, dtype=np.float64)
        drafter = np.asarray(s.drafter)
        caught = _caught_up(s)  # (n,)
        for di, name in enumerate(names):
            if name not in self._draft_model:
                continue
            key, const = self._draft_model[name]
            sel = (drafter == di) & (passes > 0) & (dms > 0)
            if sel.any():
                # the fit is of the drafted-token price: a caught-up token's missing d is added back
                y = np.maximum(dms - const, 0.0) + self._seq_ms[key] * caught
                rows = np.stack([np.asarray(s.draft_ctx_tokens, dtype=np.float64), np.asarray(s.draft_batched_tokens, dtype=np.float64),
                                 passes, y], axis=1)[sel]
                self.windows[key].add(rows)
        return err

    def refit(self) -> dict[str, CostCoeffs]:
        """Refit every model with enough samples; returns the coefficients now in force."""
        for key, w in self.windows.items():
            if w.n < self.min_samples:
                continue
            d = w.data()
            X, y = d[:, :3], d[:, 3]
            base = self._base[key]
            prior = np.array([base.a_ms_per_ctx_token, base.b_ms_per_batched_token, base.c_ms])
            fit = self._select(X, y, prior)
            if fit is None:
                self.coeffs[key] = base  # the profile still predicts these steps as well as a refit would
                self.refitted.discard(key)
                continue
            coef = fit(X, y)
            pred = X @ coef
            resid = y - pred
            ss_res = float(resid @ resid)
            ss_tot = float(((y - y.mean()) ** 2).sum())
            r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else base.r2
            nz = y > 0
            mape = float(np.mean(np.abs(resid[nz]) / y[nz]) * 100.0) if nz.any() else 0.0
            cost = LinearCost(float(coef[0]), float(coef[1]), float(coef[2]), min(float(r2), 1.0), mape,
                              math.sqrt(ss_res / max(y.size - 3, 1)),
                              base.d_ms_per_request if key == "target" else 0.0)  # a draft's refit b absorbs its d
            self.coeffs[key] = CostCoeffs.from_cost(cost)
            self.refitted.add(key)
        return self.coeffs

    def _select(self, X: np.ndarray, y: np.ndarray, prior: np.ndarray):
        """The refit to use for a window, or None to keep the profile (2-fold cross-validation).

        In-sample, a fit always beats the prior. Held out, on a machine whose step times jitter
        around an accurate profile with a narrow batch mix, a full refit trades coefficients along
        directions the load barely excites (a CPU run fitted the target's per-context cost at 2x the
        profile's, and a draft model's per-token cost at a quarter, at R^2 0.14; after a four-load
        live benchmark, draft-tiny's per-token cost at a third, at R^2 -0.08) and predicts no
        better, while the policies it feeds draft deeper for costs that are not real. So the
        candidates are nested: the profile; its slopes with the per-pass constant refitted (a level
        shift, which any steady load identifies); and the full refit. Each replaces the simpler one
        only when its held-out squared error is below ``CV_MARGIN`` of that one's.
        """
        n = y.size
        odd = np.arange(n) % 2 == 1  # interleaved folds: both see the whole window's time span

        def level(Xf, yf):
            x3 = Xf[:, 2]
            c = float(x3 @ (yf - Xf[:, :2] @ prior[:2])) / max(float(x3 @ x3), 1e-12)
            return np.array([prior[0], prior[1], max(c, 0.0)])

        def full(Xf, yf):
            return fit_with_prior(Xf, yf, prior, self.prior_weight)

        def held_out(fit) -> float:
            err = 0.0
            for test in (odd, ~odd):
                r = y[test] - X[test] @ fit(X[~test], y[~test])
                err += float(r @ r)
            return err

        r0 = y - X @ prior
        best, best_err = None, float(r0 @ r0)
        for fit in (level, full):
            err = held_out(fit)
            if err < CV_MARGIN * best_err:
                best, best_err = fit, err
        return best

    def profile(self) -> Profile:
        """The base profile with the refitted coefficients (and a note of how many samples they saw)."""
        env = dict(self.base.environment)
        env["online_refit"] = {key: self.windows[key].n for key in self.windows if key in self.refitted}
        if not env["online_refit"]:
            return self.base
        # a model not refitted keeps the profile's own coefficients (a draft's per-request term unfolded)
        models = {key: self._unfolded(key) if key in self.refitted else c for key, c in self.base.models.items()}
        return self.base.model_copy(update={"models": models, "environment": env})

    def _unfolded(self, key: str) -> CostCoeffs:
        """The refit of ``key`` as a profile writes it: a draft model's profiled per-request term taken
        back out of its fitted token price (``per_token_draft`` folds it in again)."""
        c = self.coeffs[key]
        seq = min(self._seq_ms.get(key, 0.0), c.b_ms_per_batched_token)
        if seq <= 0.0:
            return c
        return c.model_copy(update={"b_ms_per_batched_token": c.b_ms_per_batched_token - seq, "d_ms_per_request": seq})


def _caught_up(s) -> np.ndarray:
    """Per sampled step, the draft tokens computed beyond one per drafted token (a lagging draft's
    catch-up): passes carry each request's newest token, so the rest were caught up."""
    return np.maximum(np.asarray(s.draft_batched_tokens, dtype=np.float64) - np.asarray(s.drafted, dtype=np.float64), 0.0)
