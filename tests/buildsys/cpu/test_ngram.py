import numpy as np

from control.buildsys.cpu.ngram import ngram_match_rate, ngram_propose


def test_proposes_what_followed_the_latest_match():
    ctx = np.array([5, 6, 7, 8, 9, 1, 6, 7, 3, 4, 2, 6, 7])
    # last trigram (2, 6, 7) never occurred before; bigram (6, 7) last occurred at 6..7 -> then 3, 4
    assert ngram_propose(ctx, 2).tolist() == [3, 4]
    assert ngram_propose(ctx, 5).tolist() == [3, 4, 2, 6, 7]


def test_longest_ngram_wins_and_no_match_is_empty():
    ctx = np.array([1, 2, 3, 9, 2, 3, 8, 1, 2, 3])
    assert ngram_propose(ctx, 1).tolist() == [9]  # trigram (1,2,3) beats the later bigram (2,3)->8
    assert ngram_propose(np.array([1, 2, 3, 4]), 3).size == 0


def test_match_rate_counts_misses():
    seq = np.array([1, 2, 3, 1, 2, 3, 1, 2, 9])
    # positions 3..8: 1? no history of 3->x before pos 3 -> miss; then 2,3,1,2 hit; 9 missed
    assert ngram_match_rate(seq, 3) == 4 / 6
