"""Batched greedy generation over the reference model's packed KV-cache forward.

Used to write the drafts' distillation data (the target's own greedy continuations, with its
top-k next-token distribution at every position) and to measure held-out acceptance.
"""

from __future__ import annotations

import torch

from control.buildsys.cpu.progress import Reporter, SilentReporter
from control.executors.reference.model import KVCache, LlamaForCausalLM, Segment


@torch.inference_mode()
def greedy_generate(model: LlamaForCausalLM, prompts: torch.Tensor, new_tokens: int, topk: int = 0,
                    reporter: Reporter | None = None):
    """Continue each prompt row of ``prompts`` (B, P) by ``new_tokens`` greedy tokens.

    Returns ``tokens`` (B, P + new_tokens) and, when ``topk`` > 0, the model's top-k token ids and
    probabilities for the next token at positions 0 .. P + new_tokens - 2: shapes (B, L - 1, K).
    """
    reporter = reporter or SilentReporter()
    B, P = prompts.shape
    L = P + new_tokens
    cache = KVCache(model.config, slots=B, max_len=L)
    out = torch.empty((B, L), dtype=torch.long)
    out[:, :P] = prompts
    ids = torch.empty((B, L - 1, max(topk, 1)), dtype=torch.long) if topk else None
    probs = torch.empty((B, L - 1, max(topk, 1)), dtype=torch.float32) if topk else None
    logits = model(prompts.reshape(-1), [Segment(i, 0, P) for i in range(B)], cache).view(B, P, -1)
    if topk:
        p, i = torch.topk(torch.softmax(logits[:, :-1].float(), -1), topk, dim=-1)
        ids[:, : P - 1], probs[:, : P - 1] = i, p
    last = logits[:, -1]
    for t in range(P, L):
        if topk:
            p, i = torch.topk(torch.softmax(last.float(), -1), topk, dim=-1)
            ids[:, t - 1], probs[:, t - 1] = i, p
        nxt = last.argmax(-1)
        out[:, t] = nxt
        if t + 1 < L:
            last = model(nxt, [Segment(i, t, 1) for i in range(B)], cache)
        reporter.advance(B)
    return (out, ids, probs) if topk else out
