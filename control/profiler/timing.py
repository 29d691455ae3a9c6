"""Timing forward passes of one model over the KV cache, as the executor runs them.

A pass packs ``batch`` requests, each adding ``tokens`` tokens at context ``ctx`` (1 token for a
draft pass or plain decoding, k + 1 for verification). For each batch size one KV cache is sized
to the largest context of the grid (within the KV budget) and reused. Repeats are interleaved
across the points of a batch size (round robin), so a burst of load from other processes spreads
over many points instead of spoiling one; each point reports the median of its repeats.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from control.buildsys.cpu.progress import Reporter
from control.executors.reference.model import KVCache, LlamaForCausalLM, Segment
from control.profiler.grid import Grid


@dataclass(frozen=True)
class Point:
    """One timed pass shape and its median time."""

    model: str
    batch: int
    ctx: int
    tokens: int  # per request
    ms: float  # median over repeats
    ms_min: float
    ms_max: float

    @property
    def n_ctx(self) -> int:
        return self.batch * self.ctx

    @property
    def n_batched(self) -> int:
        return self.batch * self.tokens


def kv_bytes_per_token(model: LlamaForCausalLM) -> int:
    c = model.config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * model.lm_head.weight.element_size()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def sweep_model(name: str, model: LlamaForCausalLM, grid: Grid, token_counts: tuple[int, ...], reporter: Reporter,
                seed: int = 0) -> list[Point]:
    """Time ``model`` at every (batch, ctx, tokens) of the grid that fits its positions and KV budget."""
    device = model.lm_head.weight.device
    dtype = model.lm_head.weight.dtype
    g = torch.Generator().manual_seed(seed)
    max_tok = max(token_counts)
    max_pos = model.config.max_position_embeddings
    per_tok = kv_bytes_per_token(model)
    budget = None if grid.kv_budget_gb is None else int(grid.kv_budget_gb * 2**30 / per_tok)
    plan: list[tuple[int, list[tuple[int, int]]]] = []
    for B in grid.batches:
        ctxs = [s for s in grid.ctxs if s + max_tok <= max_pos and (budget is None or B * (s + max_tok) <= budget)]
        if ctxs:
            plan.append((B, [(s, t) for s in ctxs for t in token_counts]))
    total = sum(len(pts) for _, pts in plan) * (grid.warmup + grid.repeats)
    reporter.phase(f"time {name}", total)
    points: list[Point] = []
    for B, shapes in plan:
        cache = KVCache(model.config, slots=B, max_len=max(s for s, _ in shapes) + max_tok, device=device, dtype=dtype)
        inputs = []
        for s, t in shapes:
            ids = torch.randint(0, model.config.vocab_size, (B * t,), generator=g).to(device)
            inputs.append((ids, [Segment(i, s, t) for i in range(B)]))
        times: list[list[float]] = [[] for _ in shapes]
        for rep in range(grid.warmup + grid.repeats):
            for j, (ids, segs) in enumerate(inputs):
                _sync(device)
                t0 = time.perf_counter()
                model(ids, segs, cache)
                _sync(device)
                dt = (time.perf_counter() - t0) * 1e3
                if rep >= grid.warmup:
                    times[j].append(dt)
                reporter.advance(1)
        for (s, t), ts in zip(shapes, times, strict=True):
            a = np.asarray(ts)
            points.append(Point(name, B, s, t, float(np.median(a)), float(a.min()), float(a.max())))
        del cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return points


def time_ngram(ctxs: tuple[int, ...], vocab: int, repeats: int = 50, seed: int = 0) -> float:
    """Median ms of one prompt-lookup proposal (k = 8) over contexts of the grid's lengths."""
    from control.buildsys.cpu.ngram import ngram_propose

    rng = np.random.default_rng(seed)
    ts = []
    for s in ctxs:
        # Source-like text repeats itself: draw from a small alphabet so lookups find matches.
        ctx = rng.integers(0, min(vocab, 64), size=s).astype(np.int64)
        for _ in range(repeats):
            t0 = time.perf_counter()
            ngram_propose(ctx, 8)
            ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts))
