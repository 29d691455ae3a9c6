"""The target's packed forward is batch invariant: a token's logits are bitwise identical whether it
is decoded alone, verified in a block, or packed with other requests (model.py explains why this
makes greedy speculation lossless by construction)."""

from __future__ import annotations

import random

import pytest
import torch

from control.executors.reference.model import KVCache, LlamaConfig, LlamaForCausalLM, Segment


def _model(kv_heads: int, hidden: int = 64, heads: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(kv_heads)
    cfg = LlamaConfig(vocab_size=200, hidden_size=hidden, intermediate_size=352, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.1)
    return m


@pytest.fixture
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("kv_heads", [4, 1])
@torch.inference_mode()
def test_packed_forward_is_batch_invariant(threads, kv_heads):
    m = _model(kv_heads)
    rng = random.Random(threads * 10 + kv_heads)
    S, L = 3, 140  # crosses two KEY_BLOCK boundaries
    seqs = [torch.randint(0, 200, (L,), generator=torch.Generator().manual_seed(i)) for i in range(S)]
    P = [rng.randint(3, 70) for _ in range(S)]
    ref = []
    for s in range(S):  # each request alone: prefill, then one token at a time
        c = KVCache(m.config, 1, L)
        outs = [m(seqs[s][: P[s]], [Segment(0, 0, P[s])], c)]
        outs += [m(seqs[s][p: p + 1], [Segment(0, p, 1)], c) for p in range(P[s], L)]
        ref.append(torch.cat(outs))
    c = KVCache(m.config, S, L)
    lg = m(torch.cat([seqs[s][: P[s]] for s in range(S)]), [Segment(s, 0, P[s]) for s in range(S)], c)
    off = 0
    for s in range(S):
        assert torch.equal(lg[off: off + P[s]], ref[s][: P[s]]), f"packed prefill of request {s} differs"
        off += P[s]
    pos = list(P)
    checked = 0
    while any(p < L for p in pos):  # random blocks (1..9 tokens, like k + 1 verification) in random mixes
        segs, toks = [], []
        for s in rng.sample(range(S), S):
            if pos[s] < L and rng.random() < 0.7:
                t = min(rng.randint(1, 9), L - pos[s])
                segs.append(Segment(s, pos[s], t))
                toks.append(seqs[s][pos[s]: pos[s] + t])
        if not segs:
            continue
        lg = m(torch.cat(toks), segs, c)
        off = 0
        for sg in segs:
            assert torch.equal(lg[off: off + sg.length], ref[sg.slot][sg.start: sg.start + sg.length]), \
                f"block {sg} differs from one-at-a-time decoding ({threads} threads)"
            off += sg.length
            pos[sg.slot] += sg.length
            checked += 1
    assert checked > 20


@torch.inference_mode()
def test_non_invariant_path_agrees_numerically():
    """The fast path (drafts) computes the same function up to float rounding."""
    m = _model(2)
    ids = torch.randint(0, 200, (40,), generator=torch.Generator().manual_seed(0))
    c1, c2 = KVCache(m.config, 1, 64), KVCache(m.config, 1, 64)
    a = m(ids, [Segment(0, 0, 40)], c1)
    m.batch_invariant = False
    b = m(ids, [Segment(0, 0, 40)], c2)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    dense = m.forward_train(ids[None])[0]
    torch.testing.assert_close(a, dense, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [2], indirect=True)
@torch.inference_mode()
def test_wide_layers_in_a_large_batch_stay_invariant(threads):
    """The full CPU pair's widths (a 1408-wide reduction) with 80+ rows in one pass: MKL splits such a
    reduction across two threads when a GEMM has 64 rows or more, which changed the bits before every
    matmul was limited to GEMM_MAX_ROWS rows."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1408, num_hidden_layers=1,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).eval()
    S, P, T = 16, 6, 5  # 16 requests verifying 5-token blocks: 80 rows in one pass
    seqs = torch.randint(0, 256, (S, P + T), generator=torch.Generator().manual_seed(1))
    c = KVCache(cfg, S, P + T)
    m(seqs[:, :P].reshape(-1), [Segment(s, 0, P) for s in range(S)], c)
    packed = m(seqs[:, P:].reshape(-1), [Segment(s, P, T) for s in range(S)], c).view(S, T, -1)
    for s in range(S):
        alone = KVCache(cfg, 1, P + T)
        m(seqs[s, :P], [Segment(0, 0, P)], alone)
        one = torch.cat([m(seqs[s, p: p + 1], [Segment(0, p, 1)], alone) for p in range(P, P + T)])
        assert torch.equal(packed[s], one), f"request {s}: 80-row pass differs from one token at a time"
