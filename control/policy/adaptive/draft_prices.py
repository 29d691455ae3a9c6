"""Stage: draft prices. How far each draft model's measured passes sit from the profile's price, as a
posterior the drafter exploration draws from: cost uncertainty beside acceptance uncertainty.

One observation per step in which draft model i alone ran passes (``refit.py`` attributes the time),
y = log(measured draft ms / the profile's prediction for those passes). A profile's prices are off
mostly together (another machine, another load, other threads), so each model's error is a common
part and its own, log_scale_i = g + e_i, g ~ Normal(0, SHARED_SD^2), e_i ~ Normal(0, OWN_SD^2)
(SHARED_SD^2 + OWN_SD^2 = PRIOR_SD^2). The other models' means ybar_j over n_j steps give g, then
model i's own steps narrow it:

    w_j = 1 / (OWN_SD^2 + OBS_SD^2 / n_j),   1 / v_g = 1 / SHARED_SD^2 + sum_{j != i} w_j,
    m_g = v_g * sum_{j != i} w_j ybar_j,      prior_i = Normal(m_g, v_g + OWN_SD^2),
    1 / s_i^2 = 1 / (v_g + OWN_SD^2) + n_i / OBS_SD^2,   mu_i = s_i^2 (m_g / (v_g + OWN_SD^2) + sum(y_i) / OBS_SD^2)

A model never run is priced as the measured ones are off (docs/decisions.md, 2026-11-29 (stop 60)).

While the cost refit still prices model i at the profile's price (it has not adopted a fit of its
own), exploration prices i's draft passes and catch-up at exp(draw) times that. A model a stale
profile overprices is then drawn now and then, measured, and its draws move to the measured price;
with exact prices and no width it would never be drawn again, and never measured.
"""

from __future__ import annotations

import math

import numpy as np

PRIOR_SD = 0.3  # log sd of a profile's draft price before any measurement: a profile measured under load
# priced the CPU pair's draft passes 30-60% high relative to the target's (docs/validation.md, stop 35)
OBS_SD = 0.2  # log sd of one step's draft time around its price: the CPU profiles' draft-model MAPE is 12-19%
SHARED_SD = 0.25  # of PRIOR_SD, the part common to every draft model: the AVX2 profile timed under load
# prices the full pair's drafts' per-token work 44% (draft-small) and 30% (draft-tiny) under that
# machine's engine clock, and the stored AVX-512 profile at 28% and 37% of the AVX2 one's
OWN_SD = math.sqrt(PRIOR_SD ** 2 - SHARED_SD ** 2)  # the part each model's error has of its own


class DraftPrices:
    """Per drafter, the posterior of the log error of the profile's draft price (module doc)."""

    def __init__(self, is_model: np.ndarray) -> None:
        self.is_model = np.asarray(is_model, dtype=bool)  # (m,) drafters with passes to price
        m = self.is_model.size
        self.sum_y = np.zeros(m)  # (m,) summed log errors
        self.n = np.zeros(m)  # (m,) observations
        self.fitted = np.zeros(m, dtype=bool)  # (m,) priced by a fit of the cost refit's own, not the profile
        self._post: tuple[np.ndarray, np.ndarray] | None = None  # ``posterior``'s cache until the next observation

    def observe(self, i: int, measured_ms: float, predicted_ms: float) -> None:
        """One step's draft time of model ``i`` against the profile's price of its passes."""
        if measured_ms > 0.0 and predicted_ms > 0.0:
            self.sum_y[i] += math.log(measured_ms / predicted_ms)
            self.n[i] += 1.0
            self._post = None

    def posterior(self, cached: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(m,) mean and (m,) sd of each drafter's log price error (sd 0 for drafters without passes);
        ``cached=False`` neither reads nor writes the cache (a read from another thread)."""
        if self._post is not None and cached:
            return self._post
        n = self.n * self.is_model  # (m,)
        inv_n = 1.0 / np.maximum(n, 1.0)
        w = (n > 0.0) / (OWN_SD ** 2 + OBS_SD ** 2 * inv_n)  # (m,) 0 for a model never measured
        wy = w * self.sum_y * inv_n  # (m,) w_j * ybar_j
        v_g = 1.0 / (1.0 / SHARED_SD ** 2 + w.sum() - w)  # (m,) the common part without model i
        prior_var = v_g + OWN_SD ** 2
        var = 1.0 / (1.0 / prior_var + n / OBS_SD ** 2)  # (m,)
        mean = var * (v_g * (wy.sum() - wy) / prior_var + self.sum_y / OBS_SD ** 2)
        post = mean * self.is_model, np.sqrt(var) * self.is_model
        if cached:
            self._post = post
        return post

    def draws(self, rng: np.random.Generator, samples: int) -> np.ndarray | None:
        """(samples, m) price multipliers of the draft models still at the profile's price, 1
        elsewhere; None when no model is."""
        on = self.is_model & ~self.fitted  # (m,)
        if not on.any():
            return None
        mean, sd = self.posterior()
        z = rng.standard_normal((samples, on.size))  # (S, m)
        return np.where(on, np.exp(mean + sd * z), 1.0)

    def medians(self, cached: bool = True) -> np.ndarray | None:
        """(1, m) the posterior median price multipliers of the draft models still at the profile's
        price, 1 elsewhere (``draws`` at z = 0); None when no model is. ``cached``: as ``posterior``'s."""
        on = self.is_model & ~self.fitted  # (m,)
        if not on.any():
            return None
        mean, _ = self.posterior(cached)
        return np.where(on, np.exp(mean), 1.0)[None, :]
