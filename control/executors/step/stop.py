"""Step 6, the stop rules: which of a step's new tokens a request keeps, and why it finished.

In order: ``max_tokens`` (the request keeps at most its room and finishes with ``length`` when it
fills it), the end token (the reference executor drops it, as vLLM does; the BLS passes the target
engine's tokens on as they are, end token included) and the stop words (kept, the request finishes
with ``stop`` right after one). ``emitted`` is the length rule for a batch that carries no tokens
(the simulator).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from control.executors.base import FinishReason


@dataclass(frozen=True, slots=True)
class StopRules:
    """One request's stop rules for this step."""

    room: int  # tokens the request may still generate (max_tokens - generated)
    end_id: int | None = None  # None: no end token (or ignore_eos)
    emit_end: bool = False  # the end token is part of the output
    stop_words: tuple[tuple[int, ...], ...] = ()


def apply_stop(new: np.ndarray, rules: StopRules, generated: np.ndarray | None = None,
               ) -> tuple[np.ndarray, FinishReason | None]:
    """(kept tokens, finish reason or None) of ``new`` (m,): the step's accepted drafts and bonus
    token. ``generated`` (g,): the request's output before this step (needed for stop words)."""
    toks = new[: rules.room]
    reason = FinishReason.length if toks.size == rules.room else None
    if rules.end_id is not None:
        hit = np.flatnonzero(toks == rules.end_id)
        if hit.size:
            toks = toks[: hit[0] + 1] if rules.emit_end else toks[: hit[0]]
            reason = FinishReason.stop
    if rules.stop_words:
        g = 0 if generated is None else generated.shape[0]
        buf = toks if generated is None else np.concatenate([generated, toks])  # (g + m,)
        for j in range(toks.size):
            if stop_hit(buf[: g + j + 1], rules.stop_words):
                return toks[: j + 1], FinishReason.stop
    return toks, reason


def stop_hit(generated: np.ndarray, stop_words: tuple[tuple[int, ...], ...]) -> bool:
    """Whether the generated tokens (g,) end with one of the stop words."""
    n = generated.shape[0]
    for w in stop_words:
        m = len(w)
        if m <= n and generated[n - 1] == w[-1] and tuple(generated[n - m:].tolist()) == w:
            return True
    return False


def emitted(accepted: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """(n,) tokens each request gains: its accepted drafts plus the bonus token, within ``remaining`` (n,)."""
    return np.minimum(accepted + 1, remaining)
