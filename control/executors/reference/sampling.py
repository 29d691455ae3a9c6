"""Turning logits into tokens: filtered sampling, per-position noise, bad words.

- ``filtered_probs``: temperature, top-k and top-p (nucleus) per row, vectorised over rows.
- ``PositionNoise``: what the engine samples with. A sampled request's randomness is Gumbel noise
  drawn from (request key, token position): the token at a position is argmax(log p + g), an exact
  draw from p that depends on nothing but the key, the position and p. A sampled draft uses the same
  noise over its own q, and verification (``step/accept.py`` ``accept_coupled``) keeps the drafts
  equal to the target's draw at each position plus the target's draw after them. The output is
  therefore the very tokens plain sampling gives, whatever k, batch or load: a seeded request is
  reproducible with speculation on, as greedy output is lossless.
- ``banned_tokens``: bad words as token-id sequences.

Acceptance (greedy, coupled, rejection sampling) and the stop rules are the step kernel's
(``control/executors/step/``), shared by every data plane.
"""

from __future__ import annotations

import numpy as np
import torch


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor) -> torch.Tensor:
    """Probabilities (R, V) after temperature, top-k (0 = off) and top-p (1 = off), per row."""
    x = logits.float() / temperature[:, None].clamp_min(1e-6)
    need_k = bool((top_k > 0).any())
    need_p = bool((top_p < 1.0).any())
    if need_k or need_p:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        V = x.shape[-1]
        drop = torch.zeros_like(sorted_x, dtype=torch.bool)
        if need_k:
            k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))
            drop |= torch.arange(V)[None, :] >= k[:, None]
        if need_p:
            p = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
            before = torch.cumsum(p, dim=-1) - p  # mass strictly before each token
            drop |= before >= top_p[:, None]
        drop[:, 0] = False  # always keep the most likely token
        x = x.scatter(-1, order, sorted_x.masked_fill(drop, float("-inf")))
    return torch.softmax(x, dim=-1)


class PositionNoise:
    """A sampled request's randomness: Gumbel noise per token position, from (key, position) alone."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[int, ...]) -> None:
        self.key = tuple(int(x) for x in key)

    def gumbel(self, position: int, vocab: int) -> np.ndarray:
        """(vocab,) standard Gumbel noise for the token at ``position``."""
        return np.random.default_rng([*self.key, int(position)]).gumbel(size=vocab)

    def sample(self, p: np.ndarray, position: int) -> int:
        """The token at ``position`` under distribution ``p`` (V,): argmax(log p + g), a draw from p."""
        with np.errstate(divide="ignore"):
            score = np.log(p) + self.gumbel(position, p.shape[0])
        if not np.isfinite(score).any():
            return int(np.argmax(p))
        return int(np.argmax(score))


def banned_tokens(context: np.ndarray, bad_words: tuple[tuple[int, ...], ...]) -> list[int]:
    """Tokens that would complete a bad word after ``context`` (a single-token word is always banned)."""
    out = []
    n = context.shape[0]
    for w in bad_words:
        m = len(w) - 1
        if m == 0 or (m <= n and tuple(context[n - m:].tolist()) == w[:-1]):
            out.append(w[-1])
    return out
