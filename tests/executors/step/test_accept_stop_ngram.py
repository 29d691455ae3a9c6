"""Acceptance, stop rules and the one n-gram proposer of the step kernel."""

from __future__ import annotations

import numpy as np

from control.executors.base import FinishReason
from control.executors.reference.sampling import PositionNoise
from control.executors.step.accept import accept_coupled, accept_greedy, accepted_run
from control.executors.step.ngram import lookup_avail, lookup_match, ngram_available, ngram_propose
from control.executors.step.stop import StopRules, apply_stop, emitted

I64 = np.int64


def test_accepted_run_counts_the_leading_accepts_only():
    acc = np.array([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=bool)
    assert accepted_run(acc).tolist() == [2, 0, 4]
    assert accepted_run(np.zeros((2, 0), dtype=bool)).tolist() == [0, 0]


def test_greedy_acceptance_stops_at_the_first_mismatch_or_the_verified_count():
    drafts = np.array([[5, 6, 7], [5, 6, 7], [5, 9, 7]], dtype=I64)
    target = np.array([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]], dtype=I64)
    acc, bonus = accept_greedy(drafts, np.array([3, 1, 3], dtype=I64), target)
    assert acc.tolist() == [3, 1, 1]
    assert bonus.tolist() == [8, 6, 6]  # the target's token after the accepted prefix


def test_coupled_acceptance_keeps_the_drafts_equal_to_the_targets_draws():
    p = np.full((4, 10), 0.1)  # (v + 1, V)
    noise = PositionNoise((7, 1))
    draw = [noise.sample(p[j], 20 + j) for j in range(4)]  # the target's own draws at positions 20..23
    wrong = (draw[2] + 1) % 10
    assert accept_coupled(p, np.array([draw[0], draw[1], wrong]), noise, 20) == (2, draw[2])
    assert accept_coupled(p, np.array(draw[:3]), noise, 20) == (3, draw[3])
    assert accept_coupled(p[:1], np.zeros(0, dtype=I64), noise, 20) == (0, draw[0])


def test_stop_rules_length_end_token_and_stop_words():
    new = np.array([4, 5, 2, 6], dtype=I64)
    toks, why = apply_stop(new, StopRules(room=2))
    assert toks.tolist() == [4, 5] and why is FinishReason.length
    toks, why = apply_stop(new, StopRules(room=9, end_id=2))
    assert toks.tolist() == [4, 5] and why is FinishReason.stop  # the reference drops the end token
    toks, why = apply_stop(new, StopRules(room=9, end_id=2, emit_end=True))
    assert toks.tolist() == [4, 5, 2] and why is FinishReason.stop  # the BLS keeps it
    toks, why = apply_stop(new, StopRules(room=9, stop_words=((8, 4, 5),)), generated=np.array([7, 8], dtype=I64))
    assert toks.tolist() == [4, 5] and why is FinishReason.stop  # a stop word begun in an earlier step
    toks, why = apply_stop(new, StopRules(room=9, end_id=0))
    assert toks.tolist() == [4, 5, 2, 6] and why is None


def test_emitted_is_accepted_plus_one_within_remaining():
    assert emitted(np.array([0, 3, 3]), np.array([5, 2, 9])).tolist() == [1, 2, 4]


def test_ngram_longest_suffix_latest_occurrence():
    ctx = np.array([1, 2, 3, 9, 7, 2, 3, 8, 1, 2, 3], dtype=I64)
    assert ngram_propose(ctx, 1).tolist() == [9]  # the trigram (1, 2, 3) beats the later bigram (2, 3) -> 8
    assert ngram_propose(ctx, 1, max_n=2).tolist() == [8]  # the latest (2, 3)
    assert ngram_propose(ctx, 0).size == 0
    assert ngram_propose(np.array([1, 2, 3, 4], dtype=I64), 3).size == 0
    assert ngram_propose(np.array([5], dtype=I64), 3).size == 0


def test_ngram_proposal_is_a_copy():
    ctx = np.array([1, 2, 1, 2], dtype=I64)
    prop = ngram_propose(ctx, 2)
    prop[:] = -1
    assert ctx.tolist() == [1, 2, 1, 2]


def test_ngram_available_counts_what_the_lookup_proposes():
    """The view's ``ngram_avail`` comes from ``ngram_available``: it must equal the proposal's length
    for every context, k and suffix range (small vocabularies, so matches of every length occur)."""
    rng = np.random.default_rng(5)
    seen = set()
    for _ in range(300):
        ctx = rng.integers(0, int(rng.integers(2, 6)), size=int(rng.integers(1, 24))).astype(I64)
        for max_n in (1, 2, 3):
            for k in range(0, 7):
                got = ngram_available(ctx, k, max_n=max_n)
                assert got == ngram_propose(ctx, k, max_n=max_n).size, (ctx.tolist(), k, max_n)
                seen.add(got)
    assert seen == set(range(0, 7))  # no match, short tails and full proposals all happened


def test_lookup_avail_reads_each_slot_of_a_token_buffer():
    tok = np.zeros((3, 10), dtype=I64)  # (S, L)
    tok[0, :6] = [1, 2, 3, 4, 1, 2]  # (1, 2) occurred at 0: proposes 3, 4, 1, 2
    tok[2, :4] = [7, 8, 9, 6]  # no repeat: nothing
    n_tok = np.array([6, 0, 4], dtype=I64)
    out = lookup_avail(tok, n_tok, np.array([2, 0], dtype=I64), 3)
    assert out.dtype == I64 and out.tolist() == [0, 3]
    assert lookup_avail(tok, n_tok, np.array([0], dtype=I64), 8).tolist() == [4]


def test_lookup_match_scores_the_lookup_before_the_step_against_the_tokens_it_committed():
    """Each row's context before the step, [1, 2, 3, 4, 1, 2], proposes 3, 4, 1, 2; the step's
    committed tokens follow it in the buffer. The score is the proposal's leading run over the
    committed tokens only (cut at ``avail``); -1 where nothing was committed or proposed."""
    before = [1, 2, 3, 4, 1, 2]
    after = [[3, 4, 9], [3, 4], [7], [3, 4, 1, 2, 5], [3, 4, 9], [3]]
    tok = np.zeros((len(after), 16), dtype=I64)  # (S, L)
    for s, new in enumerate(after):
        tok[s, : 6 + len(new)] = before + new
    n_tok = np.array([6 + len(a) for a in after], dtype=I64)
    slots = np.arange(len(after), dtype=I64)
    committed = np.array([3, 2, 1, 5, 3, 0], dtype=I64)  # the last: a request that stopped (its caller passes 0)
    avail = np.array([4, 4, 4, 4, 1, 4], dtype=I64)
    out = lookup_match(tok, n_tok, slots, committed, avail)
    assert out.dtype == I64
    # 2 then a miss; 2 of 2 committed (no miss seen); a miss at once; the whole proposal; cut at 1; not scored
    assert out.tolist() == [2, 2, 0, 4, 1, -1]
    assert lookup_match(tok, n_tok, slots[:1], committed[:1], np.zeros(1, dtype=I64)).tolist() == [-1]
    tok[0, :6] = [5, 6, 7, 8, 9, 1]  # no repeat before the step: proposed nothing, so matched nothing
    assert lookup_match(tok, n_tok, slots[:1], committed[:1], avail[:1]).tolist() == [0]


def test_match_start_finds_the_latest_occurrence_of_the_longest_suffix_as_a_plain_scan_does():
    """``match_start`` narrows the last token's earlier occurrences suffix by suffix; a plain scan of
    every suffix length from the longest, latest occurrence first, must agree on random contexts over
    small vocabularies (many repeats), every max_n / min_n."""
    from control.executors.step.ngram import NO_MATCH, match_start

    def scan(ctx, max_n, min_n):
        L = len(ctx)
        for n in range(min(max_n, L - 1), min_n - 1, -1):
            for start in range(L - 1 - n, -1, -1):  # windows ctx[start : start + n] inside ctx[: L - 1]
                if ctx[start: start + n] == ctx[L - n:]:
                    return start + n
        return NO_MATCH

    rng = np.random.default_rng(3)
    for _ in range(3000):
        ctx = rng.integers(0, int(rng.integers(1, 6)), int(rng.integers(0, 30)))
        max_n = int(rng.integers(1, 6))
        min_n = int(rng.integers(1, max_n + 1))
        assert match_start(ctx, max_n, min_n) == scan(ctx.tolist(), max_n, min_n), (ctx.tolist(), max_n, min_n)
