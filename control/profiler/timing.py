"""Timing one model's passes over the KV cache, as the executor runs them.

- ``sweep_model``: forward passes. A pass packs ``batch`` requests, each adding ``tokens`` tokens at
  context ``ctx`` (1 for plain decoding, k + 1 for verification).
- ``sweep_draft_steps``: a draft model's whole draft steps of k passes through the engine's drafting
  code (``executors.reference.draft_timing``), host work around each pass included, and one-pass
  steps that catch up tokens the draft missed (what a caught-up token costs apart from that work).

For each batch size one KV cache is sized to the largest context of the grid (within the KV budget)
and reused. Repeats are interleaved across the points of a batch size (round robin), so a burst of
load from other processes spreads over many points instead of spoiling one; each point reports the
median of its repeats.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from control.buildsys.cpu.progress import Reporter
from control.executors.reference.draft_timing import DraftStep, DraftStepTimer
from control.executors.reference.model import KVCache, LlamaForCausalLM, Segment
from control.profiler.grid import Grid


@dataclass(frozen=True)
class Point:
    """One timed shape (a pass, or a draft step of ``passes`` passes) and its median time."""

    model: str
    batch: int
    ctx: int
    tokens: int  # per request and pass
    ms: float  # median over repeats
    ms_min: float
    ms_max: float
    n_ctx: int  # context tokens read, summed over the passes
    n_batched: int  # tokens computed, summed over the passes
    passes: int = 1


def kv_bytes_per_token(model: LlamaForCausalLM) -> int:
    c = model.config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * model.lm_head.weight.element_size()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _shape_plan(model: LlamaForCausalLM, grid: Grid, extents: tuple[int, ...]) -> list[tuple[int, list[tuple[int, int]]]]:
    """Per batch size of the grid, the (ctx, extent) shapes whose ctx + the largest extent (tokens a
    request adds) fit the model's positions and, for the whole batch, its KV budget."""
    top = max(extents)
    max_pos = model.config.max_position_embeddings
    budget = None if grid.kv_budget_gb is None else int(grid.kv_budget_gb * 2**30 / kv_bytes_per_token(model))
    plan = []
    for B in grid.batches:
        ctxs = [s for s in grid.ctxs if s + top <= max_pos and (budget is None or B * (s + top) <= budget)]
        if ctxs:
            plan.append((B, [(s, e) for s in ctxs for e in extents]))
    return plan


@torch.inference_mode()
def sweep_model(name: str, model: LlamaForCausalLM, grid: Grid, token_counts: tuple[int, ...], reporter: Reporter,
                seed: int = 0) -> list[Point]:
    """Time ``model`` at every (batch, ctx, tokens) of the grid that fits its positions and KV budget."""
    device = model.lm_head.weight.device
    dtype = model.lm_head.weight.dtype
    g = torch.Generator().manual_seed(seed)
    max_tok = max(token_counts)
    plan = _shape_plan(model, grid, token_counts)
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
            points.append(Point(name, B, s, t, float(np.median(a)), float(a.min()), float(a.max()), B * s, B * t))
        del cache
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return points


def draft_lengths(grid: Grid) -> tuple[int, ...]:
    """The k a draft model's steps are timed at: the grid's draft lengths above 0 (1 without any)."""
    return tuple(k for k in grid.ks if k > 0) or (1,)


def catch_up_tokens(ctx: int) -> int:
    """Tokens a timed catch-up step's draft is behind at context ``ctx``: half of it (0 below 2)."""
    return ctx // 2 if ctx >= 2 else 0


def sweep_draft_steps(name: str, model: LlamaForCausalLM, grid: Grid, reporter: Reporter, seed: int = 0) -> list[Point]:
    """Time draft steps of ``model`` at every (batch, ctx, k) of the grid that fits its positions and
    KV budget, k from ``draft_lengths``, and at every (batch, ctx) a one-token step whose draft is
    ``catch_up_tokens(ctx)`` behind (its first pass catches them up: the tokens' own price, apart
    from the per-request work of a pass); each point's features sum over the step's passes, and its
    ``tokens`` are the first pass's per request."""
    ks = draft_lengths(grid)
    max_k = max(ks)
    plan = _shape_plan(model, grid, ks)
    plan = [(B, [(s, k, 0) for s, k in shapes] + [(s, 1, catch_up_tokens(s)) for s in sorted({s for s, _ in shapes})
                                                  if catch_up_tokens(s)]) for B, shapes in plan]
    reporter.phase(f"time {name} draft steps", sum(len(p) for _, p in plan) * (grid.warmup + grid.repeats))
    points: list[Point] = []
    for B, shapes in plan:
        timer = DraftStepTimer(name, model, B, max(s for s, _, _ in shapes) + max_k, seed=seed)
        rows = [(timer.rows(s, k), lag) for s, k, lag in shapes]
        steps: list[list[DraftStep]] = [[] for _ in shapes]
        for rep in range(grid.warmup + grid.repeats):
            for j, (r, lag) in enumerate(rows):
                step = timer.run(r, lag)
                if rep >= grid.warmup:
                    steps[j].append(step)
                reporter.advance(1)
        for (s, _k, lag), st in zip(shapes, steps, strict=True):
            a = np.array([x.ms for x in st])
            f = st[0]
            points.append(Point(name, B, s, 1 + lag, float(np.median(a)), float(a.min()), float(a.max()), f.ctx_tokens,
                                f.batched_tokens, f.passes))
        del timer
        if model.lm_head.weight.device.type == "cuda":
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
