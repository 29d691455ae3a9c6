"""The on/off gate with memory.

Speculation is switched off when the batch grows above ``b_off`` and back on only when it falls
below ``b_on < b_off`` (hysteresis), never sooner than ``min_dwell_steps`` after the last switch, so
a batch size oscillating around one threshold causes O(1) transitions, not one per step. Every
``probe_every_steps`` the owner may re-derive the thresholds from the current cost model, context
mix and acceptance (``retune``): that is how the gate notices that conditions changed (contexts
grew long, acceptance rose) without flapping.

While off, the draft prefill is skipped (TurboSpec) and requests accumulate draft lag; whether a
request may draft again is decided per request from its lag (catch-up cost) by the policy.
"""

from __future__ import annotations

import math


class Gate:
    def __init__(self, b_off: int | None, b_on_ratio: float = 0.75, min_dwell_steps: int = 16,
                 probe_every_steps: int = 256) -> None:
        if not (0.0 < b_on_ratio < 1.0):
            raise ValueError(f"b_on_ratio = {b_on_ratio!r}: must be in (0, 1)")
        self.b_on_ratio = b_on_ratio
        self.min_dwell = int(min_dwell_steps)
        self.probe_every = int(probe_every_steps)
        self.on = True
        self.transitions = 0
        self._last_switch = -(10**18)
        self._last_probe = 0
        self.b_off = math.inf
        self.b_on = math.inf
        self.retune(b_off)

    def retune(self, b_off: float | None) -> None:
        """Set the thresholds: off above b_off, on below b_on = b_on_ratio * b_off."""
        self.b_off = math.inf if b_off is None else float(b_off)
        self.b_on = math.inf if b_off is None else max(math.floor(self.b_off * self.b_on_ratio), 1)

    def probe_due(self, step: int) -> bool:
        if step - self._last_probe >= self.probe_every:
            self._last_probe = step
            return True
        return False

    def update(self, batch: int, step: int) -> bool:
        """Advance the gate for a step with ``batch`` decode requests; returns whether it is on."""
        if step - self._last_switch < self.min_dwell:
            return self.on
        if self.on and batch > self.b_off:
            self.on = False
        elif not self.on and batch < self.b_on:
            self.on = True
        else:
            return self.on
        self._last_switch = step
        self.transitions += 1
        return self.on
