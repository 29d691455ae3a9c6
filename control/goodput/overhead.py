"""The engine loop's own cost per decode step, outside the forward passes: an online fit.

A step costs more than its draft and verify passes: the policy's decision, the executor's
bookkeeping per request (acceptance, KV roll-back, detokenisation), and, in a server, handing each
request's new tokens to its client before the next step starts. The profile times forward passes
only, so none of this is in it. Most of it is paid per request per step, which is exactly what a
longer draft saves: without it the cost model undervalues the steps that longer drafts save
(docs/decisions.md, 2026-11-23).

``LoopOverhead`` fits overhead_ms = per_step + per_request * n by weighted least squares with
exponential forgetting, on plain floats (it runs every step). The policy adds ``per_step`` to the
cost model's step overhead and ``per_request`` to the target's per-request term.
"""

from __future__ import annotations

import math

from control.errors import ConfigError


class LoopOverhead:
    """Online fit of a step's loop overhead (ms) as ``per_step + per_request * n``.

    Observations above ``clip_ms`` are clipped: a step that waited on another thread (a plan being
    compiled, a garbage collection) says little about the next one. ``prior_weight`` observations
    of zero overhead at batch ``prior_n`` anchor the fit until real ones arrive.
    """

    __slots__ = ("lam", "clip_ms", "n_obs", "_s1", "_sn", "_snn", "_sy", "_sny")

    def __init__(self, *, forgetting: float = 0.99, clip_ms: float = 50.0, prior_weight: float = 2.0,
                 prior_n: float = 4.0) -> None:
        if not (0.0 < forgetting <= 1.0):
            raise ConfigError(f"forgetting = {forgetting!r}: must be in (0, 1]")
        if not (clip_ms > 0 and math.isfinite(clip_ms)):
            raise ConfigError(f"clip_ms = {clip_ms!r}: must be a finite number > 0")
        self.lam = float(forgetting)
        self.clip_ms = float(clip_ms)
        self.n_obs = 0
        w, n = float(prior_weight), float(prior_n)
        self._s1, self._sn, self._snn, self._sy, self._sny = w, w * n, w * n * n, 0.0, 0.0

    def update(self, overhead_ms: float, requests: int) -> None:
        """Add one step's overhead; a non-finite or negative value (not measured) is ignored."""
        if not (overhead_ms >= 0.0 and math.isfinite(overhead_ms)) or requests < 1:
            return
        y = min(float(overhead_ms), self.clip_ms)
        n = float(requests)
        lam = self.lam
        self._s1 = lam * self._s1 + 1.0
        self._sn = lam * self._sn + n
        self._snn = lam * self._snn + n * n
        self._sy = lam * self._sy + y
        self._sny = lam * self._sny + n * y
        self.n_obs += 1

    def fit(self) -> tuple[float, float]:
        """(per_step_ms, per_request_ms), both >= 0. A batch size that never varied gives all of it
        to the per-request term at that size (what a longer draft saves there)."""
        s1, sn, snn, sy, sny = self._s1, self._sn, self._snn, self._sy, self._sny
        det = s1 * snn - sn * sn
        if det > 1e-9 * s1 * snn:
            slope = (s1 * sny - sn * sy) / det
            icpt = (sy - slope * sn) / s1
            if slope >= 0.0 and icpt >= 0.0:
                return icpt, slope
            if slope < 0.0:  # overhead that falls with the batch: a per-step constant
                return max(sy / s1, 0.0), 0.0
        # intercept clipped at 0 (or no spread in n): through the origin
        return 0.0, max(sny / snn, 0.0) if snn > 0 else 0.0
