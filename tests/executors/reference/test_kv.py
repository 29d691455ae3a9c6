"""KV rollback and catch-up: the caches hold exactly the accepted tokens (TurboSpec 5.1), a draft
that fell behind (bonus token, speculation switched off, drafter switch) re-prefills what it missed
before drafting, and speculation resumes with full acceptance afterwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from control.executors.reference.loader import load_engine_dir
from control.executors.reference.model import KVCache, LlamaForCausalLM, Segment
from control.policy.types import Decision
from tests.executors.reference.conftest import (
    ChaosPolicy,
    Recorder,
    greedy,
    make_engine,
    plain_reference,
    run_schedule,
)


class Scripted:
    """k, drafter and draft prefill as a function of the step number."""

    name = "scripted"

    def __init__(self, fn, prefill_drafter: int = -1) -> None:
        self.fn = fn
        self.prefill_drafter = prefill_drafter

    def decide(self, view):
        k, d, prefill = self.fn(view.step)
        return Decision(np.full(view.n, k), np.full(view.n, d), prefill_draft=prefill, prefill_drafter=self.prefill_drafter)

    def observe(self, outcome):
        pass


def paired(rec: Recorder):
    """(view, outcome) of every decode step, matched by step number."""
    views = {v.step: v for v in rec.views if v.n}
    return [(views[o.step], o) for o in rec.outcomes]


@pytest.fixture(scope="module")
def invariant(tiny_engine_dir):
    """A private copy of the tiny engine whose drafts are batch invariant too, so cache rows can be
    compared bitwise with a fresh prefill; plus a draft that is the target itself."""
    le = load_engine_dir(tiny_engine_dir)
    for m in le.drafters.values():
        if isinstance(m, LlamaForCausalLM):
            m.batch_invariant = True
    return le


@torch.inference_mode()
def _assert_cache_rows(model, cache, slot: int, tokens: np.ndarray, length: int) -> None:
    if length == 0:
        return
    fresh = KVCache(model.config, 1, cache.max_len)
    model(torch.from_numpy(tokens[:length]), [Segment(0, 0, length)], fresh)
    for layer in range(model.config.num_hidden_layers):
        assert torch.equal(cache.k[layer][slot, :, :length], fresh.k[layer][0, :, :length]), (slot, layer, length)
        assert torch.equal(cache.v[layer][slot, :, :length], fresh.v[layer][0, :, :length]), (slot, layer, length)


def check_caches(engine) -> None:
    """Every running request's target and draft caches equal a fresh prefill of its tokens."""
    running = np.flatnonzero(engine.pool.in_use)
    engine.pool.check(running, engine.n_tok)
    for s in running:
        toks = engine.tok[s]
        _assert_cache_rows(engine.target, engine.pool.target, int(s), toks, int(engine.pool.target_len[s]))
        for j, d in enumerate(engine.drafters):
            if d.has_state:
                _assert_cache_rows(d.model, d.cache, int(s), toks, int(engine.pool.draft_len[s, j]))


def test_caches_hold_exactly_the_accepted_tokens(invariant, prompts):
    eng = make_engine(invariant, ChaosPolicy(3), max_batch=3)
    steps = []

    def check(e):
        steps.append(1)
        if len(steps) % 3 == 0:
            check_caches(e)

    out = run_schedule(eng, [(i, i, p, greedy(14)) for i, p in enumerate(prompts[:5])], check=check)
    assert len(out) == 5 and len(steps) > 6


def test_bonus_token_catch_up_after_full_acceptance(invariant, prompts):
    """With a draft equal to the target every draft token is accepted; the draft then misses its
    last draft token and the bonus token (lag 1) and its next first pass processes both."""
    rec = Recorder(Scripted(lambda step: (3, 0, True)))
    eng = make_engine(invariant, rec, drafters={"copy": invariant.target}, max_batch=1)
    res = eng.generate([prompts[0]], greedy(20))[0]
    assert res.token_ids == plain_reference(invariant, [prompts[0]], [greedy(20)])[0]
    assert rec.views[0].n == 0  # the prefill iteration: nothing decodes yet
    decode = paired(rec)
    first_v, first_o = decode[0]
    assert first_v.draft_lag[0, 0] == 0  # prefilled together with the target
    assert first_o.draft_batched_tokens == 1 + 2  # last token, then one token per further pass
    for v, o in decode[1:]:
        assert v.draft_lag[0, 0] == 1  # d_k and the bonus token are missing
        k = int(o.drafted[0])
        assert o.draft_batched_tokens == 2 + (k - 1)
        assert o.accepted[0] == o.verified[0] == k


@pytest.mark.parametrize("prefill", [False, True])
def test_speculation_resumes_correctly_after_being_off(invariant, prompts, prefill):
    """Off for steps 0-5 (draft prefill skipped or not), on for 6-9, off for 10-13, on again: each
    time speculation resumes, the draft first re-prefills the span it missed, and because it then
    holds exactly the target's tokens, a copy-of-target draft is accepted in full (a stale draft
    cache, TensorRT-LLM's re-enable bug, would collapse acceptance)."""

    def script(step):
        on = 6 <= step < 10 or step >= 14
        return (3 if on else 0), 0, prefill

    rec = Recorder(Scripted(script))
    eng = make_engine(invariant, rec, drafters={"copy": invariant.target}, max_batch=1)
    res = eng.generate([prompts[2]], greedy(40, ignore_eos=True))[0]
    assert res.token_ids == plain_reference(invariant, [prompts[2]], [greedy(40, ignore_eos=True)])[0]
    resumed = [(v, o) for v, o in paired(rec) if v.step in (6, 14)]
    assert len(resumed) == 2
    for v, o in resumed:
        lag = int(v.draft_lag[0, 0])
        expected_lag = int(v.ctx_lens[0]) if (v.step == 6 and not prefill) else None
        if expected_lag is not None:
            assert lag == expected_lag  # never prefilled: the whole context is missing
        assert lag > 1
        assert o.draft_batched_tokens == lag + 1 + (int(o.drafted[0]) - 1)  # catch-up span + last token
        assert o.accepted[0] == o.verified[0] > 0


@pytest.mark.parametrize("named", [-1, 0, 1, 99])
def test_prefill_builds_the_state_of_the_drafter_the_policy_names(invariant, prompts, named):
    """New requests prefill the draft state of ``Decision.prefill_drafter`` (the executor's default
    when it is -1 or not a drafter index): that drafter starts in sync, the other one a whole
    context behind, and drafting on either stays lossless with exact caches."""
    names = list(invariant.drafters)
    small, tiny = names.index("draft-small"), names.index("draft-tiny")
    rec = Recorder(Scripted(lambda step: (0 if step < 2 else 3, tiny, True), prefill_drafter=named))
    eng = make_engine(invariant, rec, max_batch=2, default_drafter="draft-small")
    ps = [prompts[0], prompts[2]]
    out = eng.generate(ps, greedy(16, ignore_eos=True))
    assert [r.token_ids for r in out] == plain_reference(invariant, ps, [greedy(16, ignore_eos=True)] * 2)
    v = next(v for v in rec.views if v.n == 2)
    in_sync = tiny if named == tiny else small
    behind = small if in_sync == tiny else tiny
    assert (v.draft_lag[:, in_sync] <= 1).all()
    assert (v.draft_lag[:, behind] == v.ctx_lens).all()


def test_rollback_after_rejection(invariant, prompts):
    """A draft that disagrees (draft-tiny) gets rejected; target and draft lengths drop back to
    the accepted prefix and the caches match a fresh prefill of the kept tokens."""
    rec = Recorder(Scripted(lambda step: (5, 1, True)))
    eng = make_engine(invariant, rec, max_batch=2)
    eng.add_request(prompts[1], greedy(12))
    eng.add_request(prompts[3], greedy(12))
    rejected = 0
    while eng.has_work():
        eng.step()
        if rec.outcomes and (rec.outcomes[-1].accepted < rec.outcomes[-1].verified).any():
            rejected += 1
            if eng.running:
                check_caches(eng)
    assert rejected > 3
