"""The reference executor's parts of the step kernel (``control/executors/step``): its drafters,
its verifier (one packed target pass) and its acceptors, for one decode step.

Shapes: n decoding requests in the step, K' the step's longest draft, V the vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from control.executors.base import IterationStats
from control.executors.reference.drafters import DraftRows
from control.executors.reference.model import Segment
from control.executors.step.accept import accept_coupled, accept_greedy
from control.executors.step.clamp import Clamped
from control.executors.step.kernel import Drafts, Verdict
from control.policy.types import Decision, Policy, StepView

I64 = np.int64


class ReferenceStep:
    """``StepParts`` of one decode step over ``dec`` (n,) slots of ``engine``."""

    def __init__(self, engine, dec: np.ndarray, policy: Policy, stats: IterationStats) -> None:
        # engine: the ReferenceEngine (not imported: it imports this module); its slot arrays are read in place
        self.e = engine
        self.dec = dec
        self.policy = policy
        self.stats = stats
        self.n_drafters = len(engine.drafters)
        self.default_drafter = engine.default_drafter
        self.reqs = [engine.slot_req[int(s)] for s in dec]

    def refused(self, view: StepView, error: Exception) -> None:
        self.e.calls.failed(self.stats, "decide", error)

    def draft(self, view: StepView, plan: Clamped) -> Drafts:
        """Each drafter proposes for the requests it serves this step (k > 0); with overlap the
        worker first gets the next step's job, so it decides while these passes run."""
        e = self.e
        if e.calls.worker is not None:
            tp = e.clock()
            e.calls.launch(self.policy, e._next_view(), self.stats)
            self.stats.policy_ms += (e.clock() - tp) * 1e3
        k, d, cut = plan.k, plan.drafter, plan.conf_cut
        n = int(self.dec.size)
        out = Drafts(np.zeros(n, dtype=I64), np.full((n, int(k.max(initial=0))), -1, dtype=I64))
        t_d = e.clock()
        for j in np.unique(d[k > 0]):
            sel = np.flatnonzero((k > 0) & (d == j))
            slots = self.dec[sel]
            rows = DraftRows(slots, k[sel], None if cut is None else cut[sel], e.tok, e.n_tok, e.sampled[slots],
                             e.temperature[slots], e.top_k[slots], e.top_p[slots],
                             [e.slot_req[int(s)].noise for s in slots])
            res = e.drafters[int(j)].propose(rows, e.device)
            w = res.drafts.shape[1]
            out.tokens[sel, :w] = res.drafts
            out.count[sel] = res.count
            if res.confidence is not None:
                if out.confidence is None:
                    out.confidence = np.full((n, max(e.max_k, 1)), np.nan)
                out.confidence[sel, :w] = res.confidence
            out.passes += res.passes
            out.ctx_tokens += res.ctx_tokens
            out.batched_tokens += res.batched_tokens
            e.last_drafter[slots] = j
        out.ms = (e.clock() - t_d) * 1e3
        return out

    def prune(self, view: StepView, decision: Decision, drafts: Drafts) -> np.ndarray | None:
        prune = getattr(self.policy, "prune", None)
        if prune is None:
            return None
        tp = self.e.clock()
        v = self.e.calls.call(self.stats, "prune", prune, view, decision, drafts.count, drafts.confidence)
        self.stats.policy_ms += (self.e.clock() - tp) * 1e3
        return v

    def verify(self, view: StepView, drafts: Drafts, verified: np.ndarray) -> Verdict:
        """Each request's last token and its verified drafts, packed into one target pass; greedy
        requests accept the longest matching prefix, sampled ones by coupled sampling."""
        e, dec, reqs = self.e, self.dec, self.reqs
        t_v = e.clock()
        tokens = drafts.tokens
        n, kmax = tokens.shape
        nt = e.n_tok[dec]  # (n,)
        width = kmax + 1
        tokmat = np.empty((n, width), dtype=I64)  # (n, K' + 1): last token, then the drafts
        tokmat[:, 0] = e.tok[dec, nt - 1]
        tokmat[:, 1:] = tokens
        rows_per = verified + 1  # (n,)
        valid = np.arange(width)[None, :] < rows_per[:, None]  # (n, K' + 1)
        ids = torch.from_numpy(tokmat[valid]).to(e.device)
        segs = [Segment(int(s), int(t) - 1, int(r)) for s, t, r in zip(dec, nt, rows_per, strict=True)]
        logits = e.target(ids, segs, e.pool.target)  # (sum rows_per, V)
        verify_ms = (e.clock() - t_v) * 1e3
        first_row = np.cumsum(rows_per) - rows_per  # (n,)
        if any(r.params.bad_words for r in reqs):
            e.sampler.mask_bad_words(logits, [(r, i) for i, r in enumerate(reqs) if r.params.bad_words], tokens,
                                     first_row, rows_per)
        am = np.full((n, width), -1, dtype=I64)  # (n, K' + 1): the target's greedy token at each row
        am[valid] = logits.argmax(dim=-1).cpu().numpy()
        accepted, bonus = accept_greedy(tokens, verified, am)
        for i in np.flatnonzero(e.sampled[dec]):
            rows = torch.arange(int(first_row[i]), int(first_row[i] + rows_per[i]))
            p = e.sampler.probs(logits[rows.to(e.device)], np.full(rows.shape[0], dec[i]))
            v = int(verified[i])
            accepted[i], bonus[i] = accept_coupled(p, tokens[i, :v], reqs[i].noise, int(nt[i]))
        return Verdict(accepted, bonus, verify_ms)

    def roll_back(self, accepted: np.ndarray) -> None:
        """Forget the rejected positions in the draft caches (the target's follows the commit)."""
        e, dec = self.e, self.dec
        nt = e.n_tok[dec]
        for j in range(len(e.drafters)):
            if e.has_state[j]:
                col = e.pool.draft_len[:, j]
                col[dec] = np.minimum(col[dec], nt + accepted)
