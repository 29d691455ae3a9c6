"""Forward-pass cost model T_fwd = a * N_ctx + b * N_batched + c (TurboSpec eq. 3, SmartSpec eq. 7),
plus an optional d * N_req.

N_ctx is the number of KV tokens read in the pass (sum of the context lengths), N_batched the
number of tokens computed in the pass, N_req the number of requests in it. A target that verifies by
batch expansion (``expanded``: vLLM's scorer of 2024) turns each verified draft token into a sequence
of its own over its request's KV, so verifying k tokens of a request with context s adds
sum_{j=1..k} (a' (s + j) + d), with a' = a x ``reread_share`` (the copies read KV that the request's
first sequence has just brought into L2); ``control.goodput.stepcost`` charges it as the simulator
does. Times are in milliseconds. The per-request term is for executors whose pass time grows with
the requests rather than their tokens: the reference executor on a GPU runs attention and the cache writes once per
request per layer from Python, and there a pass of the 8B target costs 5-6 ms per request
whether it verifies 1 token or 8 (``docs/gpu.md``). Fitted for targets only, where verification
varies the tokens per request; for a draft pass (one token per request) d and b cannot be told
apart, and d is folded into b. ``fit_linear_cost`` fits (a, b, c)
by non-negative least squares; ``RecursiveCost`` refits online with exponential forgetting so a
drifting system (thermal throttling, a new context mix) does not leave the model stale.

Observations that aggregate several passes (a draft model's k passes in one step) fit the same
model with features (sum N_ctx, sum N_batched, passes): the cost is linear in (a, b, c) either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from control.errors import ConfigError


@dataclass(frozen=True, slots=True)
class LinearCost:
    """Coefficients of T_fwd in ms, with the fit's quality (R^2, mean absolute % error, residual std)."""

    a: float  # ms per context token read
    b: float  # ms per batched token computed
    c: float  # ms per forward pass
    r2: float = 1.0
    mape: float = 0.0
    resid_std_ms: float = 0.0
    d: float = 0.0  # ms per request in the pass
    expanded: bool = False  # verification by batch expansion: each verified draft token is a sequence
    reread_share: float = 1.0  # under expansion, a copy's KV read as a share of a first read (a' = a x this)

    def __post_init__(self) -> None:
        for name in ("a", "b", "c", "resid_std_ms", "d"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"cost coefficient {name} = {v!r}: must be a finite number >= 0")
        if not (isinstance(self.reread_share, int | float) and 0.0 <= self.reread_share <= 1.0):
            raise ConfigError(f"reread_share = {self.reread_share!r}: must be a number in [0, 1]")

    @property
    def a_reread(self) -> float:
        """ms per KV token an expanded sequence reads (batch expansion's copies after the first)."""
        return self.a * self.reread_share

    def predict(self, n_ctx, n_batched, passes=1, requests=None):
        """Vectorised: time in ms of ``passes`` passes reading ``n_ctx`` and computing ``n_batched`` tokens
        for ``requests`` requests (summed over the passes; needed only when d > 0)."""
        t = self.a * n_ctx + self.b * n_batched + self.c * passes
        if self.d:
            if requests is None:
                raise ValueError("this cost model has a per-request term (d > 0): predict() needs requests=")
            t = t + self.d * requests
        return t

    def scaled(self, factor: float) -> LinearCost:
        return LinearCost(self.a * factor, self.b * factor, self.c * factor, self.r2, self.mape, self.resid_std_ms * factor,
                          self.d * factor, self.expanded, self.reread_share)

    def per_token_draft(self) -> LinearCost:
        """This model for one-token passes (a draft model's): d folded into b."""
        if not self.d:
            return self
        return LinearCost(self.a, self.b + self.d, self.c, self.r2, self.mape, self.resid_std_ms)


def fit_linear_cost(n_ctx, n_batched, t_ms, passes=None, requests=None) -> LinearCost:
    """Fit (a, b, c) >= 0, and d >= 0 when ``requests`` is given, by non-negative least squares;
    report R^2, MAPE and residual std.

    Columns are scaled before the solve so coefficients that differ by orders of magnitude (a is
    often 1e-6 ms per token, c several ms) are recovered equally well.
    """
    n_ctx = np.asarray(n_ctx, dtype=np.float64).ravel()
    n_batched = np.asarray(n_batched, dtype=np.float64).ravel()
    t = np.asarray(t_ms, dtype=np.float64).ravel()
    p = np.ones_like(t) if passes is None else np.asarray(passes, dtype=np.float64).ravel()
    if not (n_ctx.shape == n_batched.shape == t.shape == p.shape):
        raise ConfigError(
            f"fit_linear_cost: arrays differ in length (n_ctx {n_ctx.size}, n_batched {n_batched.size}, t_ms {t.size})"
        )
    cols = [n_ctx, n_batched, p]
    if requests is not None:
        r = np.asarray(requests, dtype=np.float64).ravel()
        if r.shape != t.shape:
            raise ConfigError(f"fit_linear_cost: requests has {r.size} entries, t_ms {t.size}")
        cols.append(r)
    if t.size < len(cols):
        raise ConfigError(f"fit_linear_cost: {t.size} timing point(s); need at least {len(cols)} to fit "
                          + ("a, b and c" if len(cols) == 3 else "a, b, c and d"))
    if not (np.all(np.isfinite(t)) and np.all(t >= 0)):
        raise ConfigError("fit_linear_cost: timings must be finite and >= 0 ms")
    from scipy.optimize import nnls

    X = np.stack(cols, axis=1)
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    coef_scaled, _ = nnls(X / scale, t)
    coef = coef_scaled / scale
    pred = X @ coef
    resid = t - pred
    ss_res = float(resid @ resid)
    ss_tot = float(((t - t.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    nz = t > 0
    mape = float(np.mean(np.abs(resid[nz]) / t[nz]) * 100.0) if nz.any() else 0.0
    dof = max(t.size - len(cols), 1)
    return LinearCost(
        a=float(coef[0]),
        b=float(coef[1]),
        c=float(coef[2]),
        r2=float(r2),
        mape=mape,
        resid_std_ms=float(math.sqrt(ss_res / dof)),
        d=float(coef[3]) if len(cols) == 4 else 0.0,
    )


def fit_target_cost(n_ctx, n_batched, t_ms, requests, keep: float = 0.5) -> LinearCost:
    """A target's cost: the three-term fit, or the fit with the per-request term d when that leaves at
    most ``keep`` of the three-term fit's squared error. Noise alone always lowers the error a little
    with a fourth column; where the pass time does not grow per request (the full CPU pair on a CPU: d came
    out at 0.013 ms, against b = 0.58 ms per token, at the same R^2) the three-term model stays."""
    three = fit_linear_cost(n_ctx, n_batched, t_ms)
    t = np.asarray(t_ms, dtype=np.float64).ravel()
    if t.size < 5:
        return three
    four = fit_linear_cost(n_ctx, n_batched, t_ms, requests=requests)
    sse3 = three.resid_std_ms ** 2 * max(t.size - 3, 1)
    sse4 = four.resid_std_ms ** 2 * max(t.size - 4, 1)
    return four if four.d > 0 and sse4 <= keep * sse3 else three


def fit_draft_cost(n_ctx, n_batched, t_ms, passes, request_passes) -> LinearCost:
    """A draft model's cost from steps timed as the engine drafts: (a, b, c) fitted on the steps whose
    passes carry one token per request (what decoding drafts), then the price of a token caught up in
    a first pass (a draft that missed the prompt or plain steps) from the steps that catch up: their
    time beyond that fit's prediction for the same step without the catch-up, per caught-up token
    (least squares through the origin, at most the fit's b). It returns b = that price and d = the
    rest of the fit's b, per request and pass (the host work around each request's token), so the
    profile's b + d is what a drafted token costs and b alone what a caught-up one does
    (``DrafterCost.catch_up_ms``). Without catch-up steps, the three-term fit of all of them."""
    x = np.asarray(n_ctx, dtype=np.float64).ravel()
    tok = np.asarray(n_batched, dtype=np.float64).ravel()
    t = np.asarray(t_ms, dtype=np.float64).ravel()
    p = np.asarray(passes, dtype=np.float64).ravel()
    rp = np.asarray(request_passes, dtype=np.float64).ravel()
    caught = tok - rp  # tokens beyond one per request and pass
    plain = caught <= 0
    fit = fit_linear_cost(x[plain], tok[plain], t[plain], passes=p[plain])
    if plain.all() or fit.b <= 0:
        return fit
    extra = t[~plain] - fit.predict(x[~plain], rp[~plain], p[~plain])  # (m,) beyond the step without catch-up
    per_token = float(np.clip((extra * caught[~plain]).sum() / (caught[~plain] ** 2).sum(), 0.0, fit.b))
    return replace(fit, b=per_token, d=fit.b - per_token)


class RecursiveCost:
    """Online refit of (a, b, c) by recursive least squares with a forgetting factor.

    ``forgetting`` in (0, 1]: 1 never forgets; 0.99 gives an effective memory of about 100
    observations. Features are normalised by fixed scales taken from the prior so the update is
    well conditioned. Reported coefficients are clipped at zero (a negative cost is never used).
    The 3x3 update runs on plain floats: it sits on the per-step path, where numpy's per-call
    overhead would dominate. A prior with a per-request term keeps it fixed: the refit explains what
    remains of each observation after d * requests.
    """

    def __init__(self, prior: LinearCost, *, forgetting: float = 0.995, prior_weight: float = 10.0,
                 ctx_scale: float = 1e4, batched_scale: float = 1e2) -> None:
        if not (0.0 < forgetting <= 1.0):
            raise ConfigError(f"forgetting = {forgetting!r}: must be in (0, 1]")
        self.lam = float(forgetting)
        self._scale = (float(ctx_scale), float(batched_scale), 1.0)
        self.theta = [prior.a * self._scale[0], prior.b * self._scale[1], prior.c]
        # Prior covariance: a prior worth ``prior_weight`` observations of the typical magnitude.
        v = max(max(abs(x) for x in self.theta), 1.0) ** 2 / max(prior_weight, 1e-9)
        self.P = [[v, 0.0, 0.0], [0.0, v, 0.0], [0.0, 0.0, v]]
        self.n = 0
        self._sq_err = 0.0
        self._abs_pct = 0.0
        self._prior = prior
        self._prior_theta = tuple(self.theta)
        self._prior_sq_err = 0.0  # the prior model's one-step error on the same observations (same weights)

    def update(self, n_ctx: float, n_batched: float, t_ms: float, passes: float = 1.0,
               requests: float | None = None) -> float:
        """Add one observation; returns the prediction error (measured - predicted) before the update.
        ``requests`` (the requests in the pass) is needed only when the prior has a per-request term."""
        x = (n_ctx / self._scale[0], n_batched / self._scale[1], float(passes))
        measured = float(t_ms)
        if self._prior.d:
            if requests is None:
                raise ValueError("this cost model has a per-request term (d > 0): update() needs requests=")
            t_ms = measured - self._prior.d * requests
        (th0, th1, th2), lam = self.theta, self.lam
        x0, x1, x2 = x
        y = float(t_ms)
        err = y - (x0 * th0 + x1 * th1 + x2 * th2)
        p0 = self._prior_theta
        err0 = y - (x0 * p0[0] + x1 * p0[1] + x2 * p0[2])
        # unrolled 3x3 algebra (the same operations in the same order as the matrix form)
        (p00, p01, p02), (p10, p11, p12), (p20, p21, p22) = self.P
        q0 = p00 * x0 + p01 * x1 + p02 * x2
        q1 = p10 * x0 + p11 * x1 + p12 * x2
        q2 = p20 * x0 + p21 * x1 + p22 * x2
        denom = lam + x0 * q0 + x1 * q1 + x2 * q2
        g0, g1, g2 = q0 / denom, q1 / denom, q2 / denom
        self.theta = [th0 + g0 * err, th1 + g1 * err, th2 + g2 * err]
        # P <- (P - g Px^T) / lam, kept symmetric and bounded under long runs with little excitation
        n00 = (p00 - g0 * q0) / lam
        n11 = (p11 - g1 * q1) / lam
        n22 = (p22 - g2 * q2) / lam
        n01 = 0.5 * ((p01 - g0 * q1) / lam + (p10 - g1 * q0) / lam)
        n02 = 0.5 * ((p02 - g0 * q2) / lam + (p20 - g2 * q0) / lam)
        n12 = 0.5 * ((p12 - g1 * q2) / lam + (p21 - g2 * q1) / lam)
        tr = n00 + n11 + n22
        if tr > 1e12:
            f = 1e12 / tr
            n00, n11, n22, n01, n02, n12 = n00 * f, n11 * f, n22 * f, n01 * f, n02 * f, n12 * f
        self.P = [[n00, n01, n02], [n01, n11, n12], [n02, n12, n22]]
        self.n += 1
        w = lam
        self._sq_err = w * self._sq_err + (1 - w) * err * err if self.n > 1 else err * err
        self._prior_sq_err = w * self._prior_sq_err + (1 - w) * err0 * err0 if self.n > 1 else err0 * err0
        if measured > 0:
            pct = abs(err) / measured * 100.0
            self._abs_pct = w * self._abs_pct + (1 - w) * pct if self.n > 1 else pct
        return err

    def improves_on_prior(self, min_obs: int = 32, margin: float = 0.8) -> bool:
        """Whether the online fit has predicted the recent observations clearly better than the prior.

        Both errors are one-step-ahead (each observation is predicted before it updates the fit), with
        the same forgetting, so this is an out-of-sample comparison. On a machine whose step times
        jitter around an accurate profile, the refit chases noise and predicts no better: the prior is
        kept (and the policy's decisions stay reproducible). When the system drifts (throttling, a
        different load, a profile from another machine) the prior's error grows and the refit wins.
        """
        return self.n >= min_obs and self._sq_err < margin * margin * self._prior_sq_err

    @property
    def cost(self) -> LinearCost:
        a, b, c = (max(self.theta[i] / self._scale[i], 0.0) for i in range(3))
        return LinearCost(
            a=float(a), b=float(b), c=float(c),
            r2=self._prior.r2, mape=float(self._abs_pct) if self.n else self._prior.mape,
            resid_std_ms=float(math.sqrt(self._sq_err)) if self.n else self._prior.resid_std_ms,
            d=self._prior.d, expanded=self._prior.expanded, reread_share=self._prior.reread_share,
        )
