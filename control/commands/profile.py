"""``specctl profile``: sweep an executor's models, fit the cost model, write the profile + plot."""

from __future__ import annotations

import argparse
import os

from control.commands import args as A
from control.errors import ConfigError, MissingDependencyError


def register(sub) -> None:
    p = sub.add_parser(
        "profile", help="time the models' passes and fit the cost model (writes profiles/<sku>/<pair>.yaml)",
        description="Sweep batch size x context length x k: the target's verify passes, and each draft model's "
                    "draft steps of k passes through the engine's drafting code (its host work per pass "
                    "included); warm-up, repeats, medians. Fit T = a*N_ctx + b*N_batched + c per pass and "
                    "model (plus d*N_req for the target where its passes grow per request), and write the "
                    "profile (specctl.profile/v1, source: measured) with a PNG of measured vs predicted.")
    p.add_argument("--executor", default="reference", choices=["reference", "trtllm"],
                   help="what to profile (default reference: the PyTorch engine)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--engine-dir", "--engines", dest="engine_dir",
                     help="engine directory (e.g. engines/cpu from `specctl build --sku cpu`)")
    src.add_argument("--shape", help="a catalog model shape for the target (e.g. llama-3.1-8b); needs --random-weights")
    p.add_argument("--draft-shape", action="append",
                   help="draft shape (repeatable; default for llama-3.1-8b: llama-3.2-1b and llama-160m)")
    p.add_argument("--random-weights", action="store_true", help="with --shape: random weights (timing only)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--sku", help="SKU the profile is for (default: cpu, or detected from the GPU's name)")
    p.add_argument("--out", type=A.output_file, help="profile YAML to write (default profiles/<sku>/<pair>.yaml); the PNG and the "
                                 "raw points (CSV) go next to it")
    p.add_argument("--batch", help="batch sizes, e.g. 1,2,4,8 (default: the device's grid)")
    p.add_argument("--ctx", help="context lengths, e.g. 32,128,512")
    p.add_argument("--k", help="draft lengths, e.g. 0,1,3,7: verification passes of k + 1 tokens, draft steps of k > 0")
    p.add_argument("--repeats", type=A.positive_int, help="timed repeats per point (median is kept)")
    p.add_argument("--warmup", type=int, help="untimed passes per point before the repeats")
    p.add_argument("--kv-budget-gb", type=A.positive_float, help="KV cache budget per model in GiB (GPU default 24)")
    p.add_argument("--threads", type=A.positive_int, help="cpu: torch threads (default: all cores)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.set_defaults(run=run)


def _grid(args, device: str):
    from control.profiler.grid import CPU_GRID, GPU_GRID, parse_int_list

    base = GPU_GRID if device.startswith("cuda") else CPU_GRID
    if args.warmup is not None and args.warmup < 0:
        raise ConfigError(f"--warmup {args.warmup} must be an integer >= 0")
    return base.with_overrides(
        batches=parse_int_list(args.batch, "--batch", 1) if args.batch else None,
        ctxs=parse_int_list(args.ctx, "--ctx", 1) if args.ctx else None,
        ks=parse_int_list(args.k, "--k", 0) if args.k else None,
        repeats=args.repeats, warmup=args.warmup, kv_budget_gb=args.kv_budget_gb,
    )


def run(args: argparse.Namespace) -> int:
    if args.executor == "trtllm":
        raise MissingDependencyError("--executor trtllm is not profiled by this version; profile the reference "
                                     "executor (--executor reference) on the GPU host instead")
    if args.shape and not args.random_weights:
        raise ConfigError(f"--shape {args.shape} has no weights here; add --random-weights (timing only) or "
                          "profile a built engine directory with --engine-dir")
    if args.random_weights and not args.shape:
        raise ConfigError("--random-weights goes with --shape NAME (a catalog shape); --engine-dir uses its own weights")
    if args.draft_shape and not args.shape:
        raise ConfigError("--draft-shape goes with --shape; an engine directory names its own drafts")
    if args.shape:
        from control.buildsys.catalog import get_model

        for n in [args.shape, *(args.draft_shape or [])]:
            get_model(n)
    grid = _grid(args, args.device)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from pathlib import Path

    from control.buildsys.cpu.progress import reporter_for
    from control.profiler.plot import plot_fit, write_points_csv
    from control.profiler.run import profile_engine_dir, profile_shapes

    reporter = reporter_for()
    try:
        if args.engine_dir:
            res = profile_engine_dir(args.engine_dir, device=args.device, grid=grid, reporter=reporter, sku=args.sku)
        else:
            res = profile_shapes(args.shape, tuple(args.draft_shape) if args.draft_shape else None,
                                 device=args.device, grid=grid, reporter=reporter, sku=args.sku)
    finally:
        reporter.close()
    prof = res.profile
    out = Path(args.out or f"profiles/{prof.sku}/{prof.pair}.yaml")
    prof.save(out)
    write_points_csv(res.points, out.with_suffix(".points.csv"))
    if not args.no_plot:
        plot_fit(res.points, prof, out.with_suffix(".png"))
    _summary(res, out, args.no_plot)
    return 0


def _summary(res, out, no_plot: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    p = res.profile
    t = Table(title=f"{p.sku}/{p.pair}: T_fwd = a*N_ctx + b*N_batched + c (+ d*N_req)  ({len(res.points)} points)")
    for col in ("model", "params", "a ms/ctx tok", "b ms/tok", "c ms", "d ms/req", "R^2", "MAPE %"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for k, m in p.models.items():
        t.add_row(k, f"{res.params.get(k, 0):,}", f"{m.a_ms_per_ctx_token:.3e}", f"{m.b_ms_per_batched_token:.4f}",
                  f"{m.c_ms:.3f}", f"{m.d_ms_per_request:.3f}", f"{m.r2:.4f}", f"{m.mape:.1f}")
    c.print(t)
    ng = p.drafter("ngram")
    c.print(f"ngram lookup: {ng.cost_ms:.4f} ms per proposal")
    c.print(f"wrote {out}" + ("" if no_plot else f", {out.with_suffix('.png')}") + f", {out.with_suffix('.points.csv')}")
