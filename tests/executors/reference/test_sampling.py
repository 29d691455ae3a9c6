"""Rejection sampling preserves the target's distribution (chi-square tests on small vocabularies),
for model drafts and for deterministic (n-gram) proposals, at the unit level and through the engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from control.executors.base import SamplingParams
from control.executors.reference.engine import EngineConfig, ReferenceEngine
from control.executors.reference.model import LlamaConfig, LlamaForCausalLM
from control.executors.reference.sampling import filtered_probs
from control.executors.step.accept import accept_greedy, accept_rejection
from control.policy.types import Decision

P0 = np.array([0.05, 0.40, 0.20, 0.15, 0.10, 0.10])
Q0 = np.array([0.30, 0.10, 0.30, 0.05, 0.05, 0.20])  # a poor draft: mass where the target has little
P1 = np.array([0.25, 0.05, 0.10, 0.30, 0.20, 0.10])
Q1 = np.array([0.10, 0.30, 0.10, 0.10, 0.30, 0.10])


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    return chisquare(counts, probs / probs.sum() * counts.sum()).pvalue


@pytest.mark.parametrize("point_mass", [False, True])
def test_first_token_follows_the_target(point_mass):
    rng = np.random.default_rng(1)
    p = np.stack([P0, P1, P1])
    n = 20000
    first = np.zeros(6)
    second = np.zeros(6)
    accepted = 0
    for _ in range(n):
        if point_mass:  # an n-gram proposal: always the same tokens
            drafts, q = np.array([2, 4]), None
        else:
            drafts = np.array([rng.choice(6, p=Q0), rng.choice(6, p=Q1)])
            q = np.stack([Q0, Q1])
        a, tok = accept_rejection(p, drafts, q, rng)
        out = list(drafts[:a]) + [tok]
        first[out[0]] += 1
        if a >= 1:  # given the first draft was kept, the next token also follows the target
            second[out[1]] += 1
            accepted += 1
    assert _chi2(first, P0) > 1e-3
    assert _chi2(second, P1) > 1e-3
    expect = P0[2] if point_mass else np.minimum(P0, Q0).sum()  # P(first draft accepted)
    assert abs(accepted / n - expect) < 0.015


def test_rejection_sampling_detects_a_wrong_rule():
    """The test above can fail: accepting every draft makes the output the draft's distribution."""
    rng = np.random.default_rng(2)
    counts = np.zeros(6)
    for _ in range(5000):
        counts[rng.choice(6, p=Q0)] += 1
    assert _chi2(counts, P0) < 1e-6


def test_greedy_verification():
    drafts = np.array([[5, 6, 7], [5, 6, 7], [1, 2, 3], [9, -1, -1]])
    verified = np.array([3, 2, 3, 1])
    target = np.array([[5, 6, 7, 8], [5, 0, 0, 0], [1, 2, 3, 4], [9, 4, 0, 0]])
    acc, bonus = accept_greedy(drafts, verified, target)
    assert acc.tolist() == [3, 1, 3, 1]
    assert bonus.tolist() == [8, 0, 4, 4]


def test_filtered_probs_top_k_top_p_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 4))
    t = torch.tensor([1.0, 1.0, 1.0, 0.5])
    k = torch.tensor([0, 2, 0, 0])
    p = torch.tensor([1.0, 1.0, 0.8, 1.0])
    out = filtered_probs(logits, t, k, p)
    torch.testing.assert_close(out[0], torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    torch.testing.assert_close(out[1], torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)
    torch.testing.assert_close(out[2], torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)  # smallest set with mass >= 0.8
    sq = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    torch.testing.assert_close(out[3], sq / sq.sum())


class FixedK:
    name = "fixed"

    def __init__(self, k: int) -> None:
        self.k = k

    def decide(self, view):
        return Decision(np.full(view.n, self.k), np.zeros(view.n, dtype=np.int64))

    def observe(self, outcome):
        pass


def _tiny_lm(seed: int, vocab: int = 6) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.6)
    return m


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_engine_sampling_matches_the_target_distribution(drafter):
    """Four tokens per request, the 2nd to 4th from one speculative step (draft k = 2, verified against
    the target's position-keyed draws): the joint law of (token 2, token 3) must be the target's, computed exactly."""
    target, draft = _tiny_lm(0), _tiny_lm(1)
    prompt = [1, 2, 3, 1, 2]  # n-gram lookup proposes 3, 1 after the suffix "1 2"
    V = 6
    with torch.inference_mode():
        p1 = torch.softmax(target.forward_train(torch.tensor([prompt]))[0, -1], -1).double()
        seqs = torch.tensor([prompt + [a] for a in range(V)])
        p2 = torch.softmax(target.forward_train(seqs)[:, -1], -1).double()  # (a, b)
        seqs3 = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
        p3 = torch.softmax(target.forward_train(seqs3)[:, -1], -1).double().view(V, V, V)  # (a, b, c)
    joint = torch.einsum("a,ab,abc->bc", p1, p2, p3).numpy()
    drafters = {"draft": draft} if drafter == "draft" else {"ngram": None}
    eng = ReferenceEngine(target, drafters, FixedK(2), EngineConfig(max_batch=128, max_k=2, max_len=64))
    n = 2000
    params = [SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True, random_seed=i) for i in range(n)]
    res = eng.generate([prompt] * n, params)
    counts = np.zeros((V, V))
    for r in res:
        counts[r.token_ids[1], r.token_ids[2]] += 1
    drafted = sum(r.drafted for r in res)
    assert drafted > (1.5 if drafter == "draft" else 0.3) * n  # drafts were verified, not skipped
    assert 0 < sum(r.accepted for r in res) < drafted
    exp = joint.ravel() / joint.sum() * n  # softmax sums to 1 only up to rounding; chisquare wants equal totals
    keep = exp >= 5
    obs = np.append(counts.ravel()[keep], counts.ravel()[~keep].sum())
    exp = np.append(exp[keep], exp[~keep].sum())
    assert chisquare(obs, exp).pvalue > 1e-3
