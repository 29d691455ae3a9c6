"""What a draft model's pass costs the engine, against what a bare forward costs: both fits side by
side on this machine, and two profiles built from them for the replay.

The profiler times draft models through the engine's drafting code (``DraftModelDrafter.propose``:
the softmax over the vocabulary, the token choice, its copy to the host, the next pass's rows), where
it used to time bare forwards. This script measures both on the CPU pair's shapes (random weights:
timing does not depend on them, so it needs no built pair), refits the target's bare forwards, and
writes two copies of ``--template`` (its drafters, acceptance and limits kept) with this machine's
coefficients: ``<out>-bare.yaml`` prices the drafts as the old profiler did, ``<out>.yaml`` as the
engine runs them. Replaying one as the plan and the other as the clock shows what the old pricing
cost the policy (``benchmarks/replay_bar.py --plan-profile``).

    python benchmarks/draft_step_price.py --out /tmp/cpu-here      # about 2 minutes on one thread
    python benchmarks/replay_bar.py --record control/bench/data/replay-stdlib-full.npz \\
        --profile /tmp/cpu-here.yaml --plan-profile /tmp/cpu-here-bare.yaml --seeds 12
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("full", "quick")


def shape_models(recipe_name: str):
    """The recipe's target and drafts with random weights (``ProfiledModel``s)."""
    from control.buildsys.cpu.recipe import FULL, QUICK
    from control.buildsys.cpu.train import init_model, make_config
    from control.profiler.models import ProfiledModel

    recipe = FULL if recipe_name == "full" else QUICK
    out = []
    for spec, role in [(recipe.target, "target"), *[(d, "draft") for d in recipe.drafts]]:
        m = init_model(make_config(spec, recipe.vocab, recipe.max_position, 0, 1), 0).eval().requires_grad_(False)
        out.append(ProfiledModel(spec.name, role, m, spec.name))
    return recipe, out


def fits(models, grid):
    """{model: (engine-step CostCoeffs, bare-forward CostCoeffs or None for the target)}."""
    from control.buildsys.cpu.progress import SilentReporter
    from control.goodput.cost import fit_linear_cost
    from control.profile import CostCoeffs
    from control.profiler.run import sweep_and_fit
    from control.profiler.timing import sweep_model

    engine, _ = sweep_and_fit(models, grid, SilentReporter())
    out = {}
    for m in models:
        bare = None
        if m.role == "draft":
            pts = sweep_model(m.key, m.model, grid, (1,), SilentReporter())
            bare = CostCoeffs.from_cost(fit_linear_cost([p.n_ctx for p in pts], [p.n_batched for p in pts],
                                                        [p.ms for p in pts]))
        out[m.key] = (engine[m.key], bare)
    return out


def side_by_side(models, batches=(1, 4, 16), ctx: int = 128, k: int = 4, repeats: int = 21) -> list[dict]:
    """Per draft model and batch: the engine's draft step per pass and one bare forward, timed
    alternately (median of ``repeats`` each), so load from other processes falls on both alike."""
    import time

    import numpy as np
    import torch

    from control.executors.reference.draft_timing import DraftStepTimer
    from control.executors.reference.model import KVCache, Segment

    rows = []
    for m in (m for m in models if m.role == "draft"):
        for b in batches:
            timer = DraftStepTimer(m.key, m.model, b, ctx + k)
            step_rows = timer.rows(ctx, k)
            cache = KVCache(m.model.config, b, ctx + k)
            ids = torch.zeros(b, dtype=torch.long)
            segs = [Segment(i, ctx, 1) for i in range(b)]
            step, bare = [], []
            with torch.inference_mode():
                for rep in range(repeats + 2):
                    s = timer.run(step_rows).ms / k
                    t0 = time.perf_counter()
                    m.model(ids, segs, cache)
                    f = (time.perf_counter() - t0) * 1e3
                    if rep >= 2:  # warm-up
                        step.append(s)
                        bare.append(f)
            rows.append({"model": m.key, "batch": b, "engine_ms": float(np.median(step)), "bare_ms": float(np.median(bare))})
    return rows


def write_profiles(template, out: Path, coeffs: dict, ngram_ms: float, env: dict) -> list[Path]:
    """Two copies of the ``template`` profile with this machine's coefficients (module doc)."""
    from control.profile import parse_profile

    doc = template.model_dump(mode="json", by_alias=True)
    written = []
    for suffix, pick in (("", 0), ("-bare", 1)):
        d = {**doc, "environment": {**env, "drafts": "bare forwards" if pick else "engine draft steps",
                                    "method": "benchmarks/draft_step_price.py: random weights of the pair's shapes; "
                                              f"drafters, acceptance and limits from {template.pair}'s profile"}}
        d["models"] = {k: (c[0] if k == "target" else c[pick]).model_dump() for k, c in coeffs.items()}
        d["drafters"] = [{**x, "cost_ms": round(ngram_ms, 5)} if x["kind"] == "ngram" else x for x in doc["drafters"]]
        path = out.parent / f"{out.name}{suffix}.yaml"
        parse_profile(d, where=str(path)).save(path)
        written.append(path)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", choices=RECIPES, default="full", help="the CPU pair's shapes (default full)")
    ap.add_argument("--template", type=Path, help="profile whose drafters, acceptance and limits the output keeps "
                                                  "(default profiles/cpu/stdlib-<recipe>.yaml)")
    ap.add_argument("--out", type=Path, required=True, help="output stem: writes OUT.yaml and OUT-bare.yaml")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1, what serve runs per instance)")
    args = ap.parse_args(argv)
    import torch

    from control.profiler.grid import CPU_GRID
    from control.profiler.run import environment
    from control.profiler.timing import time_ngram

    if args.threads < 1:
        ap.error(f"--threads {args.threads}: must be >= 1")
    from control.errors import ConfigError
    from control.profile import load_profile

    path = args.template or ROOT / "profiles" / "cpu" / f"stdlib-{args.recipe}.yaml"
    if not path.is_file():
        ap.error(f"--template {path}: no such profile; give a measured profile of the same pair")
    try:  # before two minutes of timing, not after
        template = load_profile(path)
    except ConfigError as e:
        ap.error(f"--template: {e}")
    torch.set_num_threads(args.threads)
    recipe, models = shape_models(args.recipe)
    print("side by side, context 128, k = 4 (ms per pass, medians of alternate runs):")
    print("model        batch  engine  bare   engine - bare")
    for r in side_by_side(models):
        print(f"{r['model']:12s} {r['batch']:5d}  {r['engine_ms']:6.3f}  {r['bare_ms']:5.3f}  {r['engine_ms'] - r['bare_ms']:+.3f}")
    coeffs = fits(models, CPU_GRID)
    print("model        engine a / b / c            bare a / b / c")
    for k, (eng, bare) in coeffs.items():
        b = "-" if bare is None else f"{bare.a_ms_per_ctx_token:.2e} / {bare.b_ms_per_batched_token:.3f} / {bare.c_ms:.3f}"
        print(f"{k:12s} {eng.a_ms_per_ctx_token:.2e} / {eng.b_ms_per_batched_token:.3f} / {eng.c_ms:.3f}   {b}")
    env = environment(torch.device("cpu"), torch.float32)
    for p in write_profiles(template, args.out, coeffs, time_ngram(CPU_GRID.ctxs, recipe.vocab), env):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
