"""Drafters: what proposes the tokens the target verifies.

- ``DraftModelDrafter``: a smaller Llama with its own KV cache. Its first pass per step re-prefills
  the tokens its cache is missing (the catch-up: after the target accepted every draft token the
  draft has not seen its last draft token nor the bonus token, TurboSpec 5.1; after speculation was
  off it is behind by everything since) together with the request's last token, then one pass per
  further draft token over the requests still drafting. A request stops at its k or once the
  running product of its draft confidences falls below its cut (SpecServe's adaptive drafting;
  the token that crossed the cut is kept, the verifier may prune it).
- ``SelfSpecDrafter``: the target itself with a StreamingLLM KV budget (MagicDec): each draft
  pass attends to the first ``sink`` and the last ``window`` positions only, so at long context it
  reads far less KV than the target's pass. It writes into the target's own cache beyond the
  request's valid length, rows the verify pass then recomputes, so it never lags.
- ``NgramDrafter``: prompt lookup (``step/ngram.py``, the one every data plane uses): the longest
  suffix (n = 3, then 2, then 1 tokens) of the context that occurred earlier in the prompt or the
  output proposes the tokens that followed its latest earlier occurrence. Stateless, no confidences.

Both fill a ``DraftResult``; the engine owns tokens, slots and the draft caches' valid lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from control.executors.reference.model import KVCache, LlamaForCausalLM, Segment
from control.executors.reference.sampling import filtered_probs
from control.executors.step.ngram import ngram_propose

I64 = np.int64


@dataclass(frozen=True, slots=True)
class SelfSpec:
    """Marks a self-speculation drafter in an engine's drafter map (the model is the target)."""

    sink: int
    window: int

    def __post_init__(self) -> None:
        if self.sink < 0 or self.window < 1:
            raise ValueError(f"self-speculation needs sink >= 0 and window >= 1 (got sink={self.sink}, window={self.window})")


@dataclass(slots=True)
class DraftRows:
    """The requests one drafter drafts for in a step (arrays of length n, in the engine's order)."""

    slots: np.ndarray
    k: np.ndarray  # tokens to draft, >= 1
    conf_cut: np.ndarray | None  # stop once the running confidence product < cut
    tokens: np.ndarray  # engine token buffer (slots, max_len): prompt + generated
    n_tok: np.ndarray  # tokens per slot in the buffer
    sampled: np.ndarray  # bool per row: temperature > 0
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    noise: list  # PositionNoise per row (None for greedy rows)


@dataclass(slots=True)
class DraftResult:
    drafts: np.ndarray  # (n, kmax) token ids, -1 past each row's count
    count: np.ndarray  # (n,) tokens drafted
    confidence: np.ndarray | None  # (n, kmax) probability the drafter gave its token, NaN past count
    q: list | None  # per row: (count, V) draft distributions of sampled rows (None: greedy or point mass)
    passes: int = 0
    ctx_tokens: int = 0
    batched_tokens: int = 0


class DraftModelDrafter:
    kind = "draft_model"
    has_state = True
    has_confidence = True

    def __init__(self, name: str, model: LlamaForCausalLM, cache: KVCache, lengths: np.ndarray) -> None:
        self.name = name
        self.model = model
        self.cache = cache
        self.lengths = lengths  # valid tokens in this drafter's cache per slot (owned by the KV pool)

    def prefill(self, slots: np.ndarray, prompts: list[np.ndarray], device) -> int:
        """Prefill prompts into the draft cache; returns tokens processed."""
        segs = [Segment(int(s), 0, int(p.shape[0])) for s, p in zip(slots, prompts, strict=True)]
        ids = torch.from_numpy(np.concatenate(prompts)).to(device)
        self.model(ids, segs, self.cache, logits_at=torch.zeros(0, dtype=torch.long, device=device))
        self.lengths[slots] = [p.shape[0] for p in prompts]
        return int(ids.shape[0])

    def propose(self, rows: DraftRows, device) -> DraftResult:
        n = rows.slots.shape[0]
        kmax = int(rows.k.max())
        drafts = np.full((n, kmax), -1, dtype=I64)
        conf = np.full((n, kmax), np.nan)
        count = np.zeros(n, dtype=I64)
        q: list | None = [None] * n if rows.sampled.any() else None
        nt = rows.n_tok[rows.slots]
        have = np.minimum(self.lengths[rows.slots], nt - 1)
        # Pass 1: catch-up span plus the last token, for every row.
        spans = [rows.tokens[s, h:t] for s, h, t in zip(rows.slots, have, nt, strict=True)]
        segs = [Segment(int(s), int(h), int(t - h)) for s, h, t in zip(rows.slots, have, nt, strict=True)]
        lens = nt - have
        ids = torch.from_numpy(np.concatenate(spans)).to(device)
        at = torch.from_numpy(np.cumsum(lens) - 1).to(device)
        logits = self.model(ids, segs, self.cache, logits_at=at)
        passes, ctx_tokens, batched = 1, int(nt.sum()), int(lens.sum())
        active = np.arange(n)
        prod = np.ones(n)
        for s in range(kmax):
            active = _take(logits, active, rows, drafts, conf, count, prod, q, s)
            if active.size == 0:
                break
            pos = nt[active] + s  # d_{s+1} sits right after the previous token
            segs = [Segment(int(sl), int(p), 1) for sl, p in zip(rows.slots[active], pos, strict=True)]
            ids = torch.from_numpy(drafts[active, s]).to(device)
            logits = self.model(ids, segs, self.cache)
            passes += 1
            ctx_tokens += int(pos.sum() + active.size)
            batched += int(active.size)
        # The cache now holds the context and every draft token but the last one.
        self.lengths[rows.slots] = nt + count - 1
        return DraftResult(drafts, count, conf, q, passes, ctx_tokens, batched)


class SelfSpecDrafter:
    kind = "self_spec"
    has_state = False
    has_confidence = True

    def __init__(self, name: str, target: LlamaForCausalLM, cache: KVCache, sink: int, window: int) -> None:
        self.name = name
        self.model = target
        self.cache = cache  # the target's own cache
        self.window = (sink, window)

    def propose(self, rows: DraftRows, device) -> DraftResult:
        n = rows.slots.shape[0]
        kmax = int(rows.k.max())
        drafts = np.full((n, kmax), -1, dtype=I64)
        conf = np.full((n, kmax), np.nan)
        count = np.zeros(n, dtype=I64)
        q: list | None = [None] * n if rows.sampled.any() else None
        nt = rows.n_tok[rows.slots]
        budget = sum(self.window)
        active = np.arange(n)
        prod = np.ones(n)
        feed = rows.tokens[rows.slots, nt - 1]  # the last token, then each new draft token
        passes = ctx_tokens = 0
        for s in range(kmax):
            pos = nt[active] - 1 + s
            segs = [Segment(int(sl), int(p), 1) for sl, p in zip(rows.slots[active], pos, strict=True)]
            logits = self.model(torch.from_numpy(np.ascontiguousarray(feed)).to(device), segs, self.cache,
                                window=self.window)
            passes += 1
            ctx_tokens += int(np.minimum(pos + 1, budget).sum())
            active = _take(logits, active, rows, drafts, conf, count, prod, q, s)
            if active.size == 0:
                break
            feed = drafts[active, s]
        return DraftResult(drafts, count, conf, q, passes, ctx_tokens, int(count.sum()))


def _take(logits: torch.Tensor, active: np.ndarray, rows: DraftRows, drafts: np.ndarray, conf: np.ndarray,
          count: np.ndarray, prod: np.ndarray, q: list | None, s: int) -> np.ndarray:
    """Record draft token s for the active rows (logits in active order); return the rows that go on."""
    tok, c = _choose(logits, active, rows, q, s)
    drafts[active, s] = tok
    conf[active, s] = c
    count[active] += 1
    prod[active] *= c
    keep = count[active] < rows.k[active]
    if rows.conf_cut is not None:
        keep &= prod[active] >= rows.conf_cut[active]
    return active[keep]


def _choose(logits: torch.Tensor, active: np.ndarray, rows: DraftRows, q: list | None, s: int):
    """Next draft token (draft position ``s``) and its confidence for each active row: the most likely
    token and its probability, or for sampled rows a draw from the filtered distribution (kept in
    ``q``) with the request's noise at that token position, the noise the target draws with."""
    probs = torch.softmax(logits.float(), dim=-1)
    tok = probs.argmax(dim=-1)
    c = probs.gather(1, tok[:, None])[:, 0]
    tok_np, c_np = tok.cpu().numpy().astype(I64), c.cpu().numpy().astype(np.float64)
    samp = np.flatnonzero(rows.sampled[active])
    if samp.size:
        r = active[samp]
        fp = filtered_probs(logits[torch.from_numpy(samp).to(logits.device)].cpu(),
                            torch.from_numpy(rows.temperature[r]).float(),
                            torch.from_numpy(rows.top_k[r]), torch.from_numpy(rows.top_p[r]).float())
        fp = fp.double().numpy()
        for j, row in enumerate(r):
            t = rows.noise[row].sample(fp[j], int(rows.n_tok[rows.slots[row]]) + s)
            tok_np[samp[j]] = t
            c_np[samp[j]] = fp[j, t]
            prev = q[row]
            q[row] = fp[j][None, :] if prev is None else np.concatenate([prev, fp[j][None, :]])
    return tok_np, c_np


class NgramDrafter:
    kind = "ngram"
    has_state = False
    has_confidence = False

    def __init__(self, name: str = "ngram", max_n: int = 3, min_n: int = 1) -> None:
        self.name = name
        self.max_n = max_n
        self.min_n = min_n

    def propose(self, rows: DraftRows, device=None) -> DraftResult:
        n = rows.slots.shape[0]
        kmax = int(rows.k.max())
        drafts = np.full((n, kmax), -1, dtype=I64)
        count = np.zeros(n, dtype=I64)
        for i, s in enumerate(rows.slots):
            prop = ngram_propose(rows.tokens[s, : rows.n_tok[s]], int(rows.k[i]), self.max_n, self.min_n)
            drafts[i, : prop.shape[0]] = prop
            count[i] = prop.shape[0]
        return DraftResult(drafts, count, None, None)
