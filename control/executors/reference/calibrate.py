"""A profile for an engine directory when no profiler run exists: find one, or measure one quickly.

``find_profile`` looks in ``profiles/<sku>/*.yaml`` for a profile of the same engine (same pair
name, or same SKU covering every drafter). ``quick_profile`` times a handful of packed forwards of
the target and draft steps of each draft model through the engine's drafting code (1-3 s for the
full CPU pair shapes), fits T = a*N_ctx + b*N_batched + c per pass (+ d per request for the target)
and returns a ``source: measured`` profile. Each shape keeps the fastest of its repeats, since load from other processes only ever adds time; while a model's
fit (the target's or a draft model's) stays unclear (R^2 below ``CLEAR_R2``) it times the grid again and keeps each shape's fastest
over all rounds, up to ``MAX_ROUNDS``. It is deliberately small: ``specctl profile`` (the profiler)
sweeps properly and should replace it wherever it is available.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from control.errors import ConfigError
from control.executors.reference.draft_timing import DraftStepTimer
from control.executors.reference.loader import LoadedEngine
from control.executors.reference.model import KVCache, LlamaForCausalLM, Segment
from control.executors.step.ngram import ngram_propose
from control.goodput.cost import LinearCost, fit_linear_cost, fit_target_cost
from control.profile import PROFILE_SCHEMA, CostCoeffs, Profile, load_profile, parse_profile

# (batch, context, new tokens per request): decode, verify-sized and wider passes.
GRID = ((1, 32, 1), (1, 256, 1), (1, 128, 5), (4, 64, 1), (4, 256, 3), (8, 128, 1), (8, 32, 5), (16, 128, 1),
        (16, 64, 3))
# (batch, context, draft length) of the draft models' timed draft steps
DRAFT_GRID = ((1, 32, 1), (1, 256, 4), (4, 64, 2), (4, 256, 4), (8, 128, 1), (8, 32, 4), (16, 128, 2), (16, 64, 4))
CLEAR_R2 = 0.9  # a fit below this is timed again (the target's and each draft model's)
MAX_ROUNDS = 4


def profiles_root() -> Path:
    return Path(__file__).resolve().parents[3] / "profiles"


def find_profile(loaded: LoadedEngine, root: Path | None = None) -> Profile | None:
    """A stored profile for this engine, or None. Prefers one whose pair is the engine's name."""
    d = (root or profiles_root()) / loaded.manifest.sku
    if not d.is_dir():
        return None
    names = set(loaded.drafters)
    fallback = None
    for f in sorted(d.glob("*.yaml")):
        try:
            p = load_profile(f)
        except ConfigError:
            continue
        if not names <= set(p.drafter_names):
            continue
        if p.pair == loaded.name:
            return p
        fallback = fallback or p
    return fallback


@torch.inference_mode()
def _time_model(model: LlamaForCausalLM, repeats: int) -> tuple[list, list, list]:
    device = model.lm_head.weight.device
    max_b = max(b for b, _, _ in GRID)
    max_len = max(c + t for _, c, t in GRID)
    cache = KVCache(model.config, max_b, max_len, device, model.lm_head.weight.dtype)
    gen = torch.Generator().manual_seed(0)
    n_ctx, n_tok, n_req, t_ms = [], [], [], []
    for b, c, t in GRID:
        ids = torch.randint(0, model.config.vocab_size, (b * t,), generator=gen).to(device)
        segs = [Segment(i, c, t) for i in range(b)]
        model(ids, segs, cache)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(ids, segs, cache)
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        n_ctx.append(b * (c + t))
        n_tok.append(b * t)
        n_req.append(b)
        t_ms.append(best * 1e3)
    return n_ctx, n_tok, n_req, t_ms


def _time_draft_steps(name: str, model: LlamaForCausalLM, repeats: int) -> tuple[list, list, list, list]:
    """(context tokens, batched tokens, passes, fastest ms) of draft steps at ``DRAFT_GRID``, timed
    through the engine's drafting code (``draft_timing``: its host work per pass included)."""
    n_ctx, n_tok, passes, t_ms = [], [], [], []
    max_len = max(c + k for _, c, k in DRAFT_GRID)
    timers: dict[int, DraftStepTimer] = {}
    for b, c, k in DRAFT_GRID:
        timer = timers.setdefault(b, DraftStepTimer(name, model, b, max_len))
        rows = timer.rows(c, k)
        timer.run(rows)  # warm-up
        steps = [timer.run(rows) for _ in range(repeats)]
        n_ctx.append(steps[0].ctx_tokens)
        n_tok.append(steps[0].batched_tokens)
        passes.append(steps[0].passes)
        t_ms.append(min(s.ms for s in steps))
    return n_ctx, n_tok, passes, t_ms


def _fit_until_clear(time_shapes: Callable[[], tuple[list, ...]],
                     fit: Callable[[tuple[list, ...]], LinearCost]) -> tuple[LinearCost, tuple[list, ...], int]:
    """(fit, timings, rounds): ``fit`` of ``time_shapes()``'s timings (their last list is the ms per
    shape), the shapes timed again (fastest per shape over all rounds) while the fit is not clear
    (r2 < ``CLEAR_R2``), up to ``MAX_ROUNDS``: on a busy host one round's noise can leave a fit with
    no per-token cost at all. The target and each draft model are fitted so."""
    timed = time_shapes()
    cost = fit(timed)
    rounds = 1
    while cost.r2 < CLEAR_R2 and rounds < MAX_ROUNDS:
        timed = (*timed[:-1], np.minimum(timed[-1], time_shapes()[-1]).tolist())
        cost = fit(timed)
        rounds += 1
    return cost, timed, rounds


def quick_profile(loaded: LoadedEngine, repeats: int = 2, max_batch: int = 32) -> Profile:
    """Measure and fit a small profile for ``loaded`` (target, each draft model, n-gram lookup)."""
    # the target's passes vary tokens per request, so its per-request cost can be fitted (cost.py)
    fit, (n_ctx, n_tok, _, t_ms), rounds = _fit_until_clear(lambda: _time_model(loaded.target, repeats),
                                                            lambda t: fit_target_cost(t[0], t[1], t[3], t[2]))
    models = {"target": CostCoeffs.from_cost(fit).model_dump()}
    grid = {"target": {"n_ctx": n_ctx, "n_batched": n_tok, "t_ms": [round(x, 4) for x in t_ms], "rounds": rounds}}
    for name, model in loaded.drafters.items():
        if not isinstance(model, LlamaForCausalLM):
            continue
        d_fit, (n_ctx, n_tok, passes, t_ms), d_rounds = _fit_until_clear(
            lambda m=model, nm=name: _time_draft_steps(nm, m, repeats),
            lambda t: fit_linear_cost(t[0], t[1], t[3], passes=t[2]))
        models[name] = CostCoeffs.from_cost(d_fit).model_dump()
        grid[name] = {"n_ctx": n_ctx, "n_batched": n_tok, "passes": passes, "t_ms": [round(x, 4) for x in t_ms],
                      "rounds": d_rounds}
    ctx = np.random.default_rng(0).integers(0, loaded.target.config.vocab_size, 512)
    t0 = time.perf_counter()
    for _ in range(20):
        ngram_propose(ctx, 8)
    ngram_ms = (time.perf_counter() - t0) / 20 * 1e3
    drafters, acceptance = [], {}
    for spec in loaded.manifest.drafters:
        if spec.name not in loaded.drafters:
            continue
        if spec.kind == "ngram":
            drafters.append({"name": spec.name, "kind": "ngram", "cost_ms": round(ngram_ms, 4), "confidences": False})
        elif spec.kind == "self_spec":
            drafters.append({"name": spec.name, "kind": "self_spec", "model": "target", "sink": spec.sink,
                             "window": spec.window})
        else:
            drafters.append({"name": spec.name, "kind": "draft_model", "model": spec.name})
        if spec.acceptance is not None:
            acceptance[spec.name] = min(spec.acceptance, 0.99)
    doc = {
        "schema": PROFILE_SCHEMA,
        "sku": loaded.manifest.sku,
        "pair": loaded.name,
        "source": "measured",
        "environment": {
            "method": "quick in-process calibration (reference executor)",
            "device": str(loaded.target.lm_head.weight.device), "machine": platform.machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
        "models": models,
        "drafters": drafters,
        "acceptance": acceptance,
        "limits": {"max_batch": max_batch, "max_ctx": loaded.target.config.max_position_embeddings},
        "grid": {"points": [list(p) for p in GRID], "timings": grid},
    }
    return parse_profile(doc, where=f"quick profile of '{loaded.engine_dir}'")
