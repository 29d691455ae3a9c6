"""Turning logits into tokens: greedy, filtered sampling, and speculative verification.

- ``filtered_probs``: temperature, top-k and top-p (nucleus) per row, vectorised over rows.
- ``verify_greedy``: exact-match acceptance of every request's draft in one vectorised pass.
- ``verify_rejection``: the speculative-sampling acceptance rule (Leviathan et al., Chen et al.):
  accept draft token d with probability min(1, p(d) / q(d)); on the first rejection sample from
  norm(max(0, p - q)); after k acceptances sample the bonus token from p. The output is distributed
  exactly as sampling from the target's p, whatever the draft distribution q. A deterministic
  proposal (n-gram lookup) is the point mass q = onehot(d).
- ``PositionNoise`` / ``verify_coupled``: what the engine samples with. A sampled request's
  randomness is Gumbel noise drawn from (request key, token position): the token at a position is
  argmax(log p + g), an exact draw from p that depends on nothing but the key, the position and p.
  A sampled draft uses the same noise over its own q, and verification keeps the drafts equal to the
  target's draw at each position plus the target's draw after them. The output is therefore the
  very tokens plain sampling gives, whatever k, batch or load: a seeded request is reproducible
  with speculation on, as greedy output is lossless.
- ``banned_tokens`` / ``stop_hit``: bad words and stop words as token-id sequences.
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


def sample_index(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from the (unnormalised, non-negative) distribution ``p`` by inverse CDF."""
    c = np.cumsum(p, dtype=np.float64)
    total = c[-1]
    if not total > 0:
        return int(np.argmax(p))
    i = int(np.searchsorted(c, rng.random() * total, side="right"))
    return min(i, p.shape[0] - 1)


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


def verify_coupled(p: np.ndarray, drafts: np.ndarray, noise: PositionNoise, position: int) -> tuple[int, int]:
    """Verification against the target's own draws for one sampled request.

    p: (v + 1, V) target probabilities after the prefix and after each of the v draft tokens;
    drafts: (v,); ``position``: the index of the first new token. Returns (accepted, next token):
    the drafts that equal the target's draw at their position, and the target's draw after them.
    """
    v = drafts.shape[0]
    for j in range(v + 1):
        t = noise.sample(p[j], position + j)
        if j == v or t != int(drafts[j]):
            return j, t
    raise AssertionError("unreachable: the loop returns at j == v")


def verify_greedy(drafts: np.ndarray, verified: np.ndarray, target_argmax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Greedy exact-match verification for a batch.

    drafts: (n, K) draft tokens; verified: (n,) how many of each row were sent to the target;
    target_argmax: (n, K + 1) the target's greedy token after the prefix and each draft token.
    Returns (accepted (n,), bonus (n,)): the longest prefix of drafts equal to the target's tokens,
    and the target's token right after it.
    """
    n, K = drafts.shape
    pos = np.arange(K)[None, :]
    match = (drafts == target_argmax[:, :K]) & (pos < verified[:, None])
    accepted = np.cumprod(match, axis=1).sum(axis=1).astype(np.int64)
    bonus = target_argmax[np.arange(n), accepted]
    return accepted, bonus


def verify_rejection(p: np.ndarray, drafts: np.ndarray, q: np.ndarray | None, rng: np.random.Generator) -> tuple[int, int]:
    """Speculative sampling for one request.

    p: (v + 1, V) target probabilities after the prefix and after each of the v draft tokens;
    drafts: (v,) the draft tokens; q: (v, V) the distributions they were sampled from, or None for
    a deterministic proposal. Returns (accepted, next token).
    """
    v = drafts.shape[0]
    for j in range(v):
        d = int(drafts[j])
        pj = float(p[j, d])
        qj = 1.0 if q is None else float(q[j, d])
        if rng.random() * qj < pj:  # accept with probability min(1, p/q)
            continue
        if q is None:
            resid = p[j].astype(np.float64, copy=True)
            resid[d] = 0.0
        else:
            resid = np.maximum(p[j].astype(np.float64) - q[j], 0.0)
        if not resid.sum() > 0:  # p <= q everywhere only when p == q, where rejection has probability 0
            resid = p[j]
        return j, sample_index(resid, rng)
    return v, sample_index(p[v], rng)


def banned_tokens(context: np.ndarray, bad_words: tuple[tuple[int, ...], ...]) -> list[int]:
    """Tokens that would complete a bad word after ``context`` (a single-token word is always banned)."""
    out = []
    n = context.shape[0]
    for w in bad_words:
        m = len(w) - 1
        if m == 0 or (m <= n and tuple(context[n - m:].tolist()) == w[:-1]):
            out.append(w[-1])
    return out


def stop_hit(generated: np.ndarray, stop_words: tuple[tuple[int, ...], ...]) -> bool:
    """Whether the generated tokens end with one of the stop words."""
    n = generated.shape[0]
    for w in stop_words:
        m = len(w)
        if m <= n and generated[n - 1] == w[-1] and tuple(generated[n - m:].tolist()) == w:
            return True
    return False
