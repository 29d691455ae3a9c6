"""``specctl build``: build what a deployment needs.

Two paths share the command: ``--recipe`` (GPU SKUs through TensorRT-LLM, and recipe validation
for the cpu SKU) lives in ``control.buildsys.recipe_cli``; ``--sku cpu`` (the reference pair:
tokenizer, target and drafts trained from Python sources on this machine) in
``control.buildsys.cpu``. This module only routes.
"""

from __future__ import annotations

import argparse
import os

from control.errors import ConfigError


def register(sub) -> None:
    from control.buildsys.recipe_cli import register_recipe_args

    p = sub.add_parser("build", help="build engines/configs for a GPU SKU from a recipe, or train the cpu pair",
                       description="Build what a deployment needs from a recipe (build/recipes/*.yaml), or with "
                                   "--sku cpu train the reference target and drafts from the Python standard "
                                   "library's sources (or --corpus DIR).")
    register_recipe_args(p)
    g = p.add_argument_group("the cpu pair (--sku cpu)")
    g.add_argument("--sku", help="cpu: train the reference pair into --out (default engines/cpu)")
    g.add_argument("--quick", action="store_true", help="the small pair CI uses (about a minute)")
    g.add_argument("--corpus", help="directory of *.py files to train on (default: this Python's stdlib)")
    g.add_argument("--seed", type=_seed, default=0, help="same seed, same tokenizer and weights (default 0)")
    g.add_argument("--threads", type=_threads, help="torch threads (default: all cores)")
    p.set_defaults(run=run)


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed {text!r} is not an integer >= 0") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"seed {v} must be an integer >= 0")
    return v


def _threads(text: str) -> int:
    from control.commands.args import positive_int

    return positive_int(text)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "recipe", None):
        from control.buildsys.recipe_cli import run_recipe

        return run_recipe(args)
    if args.sku and args.sku.lower() == "cpu":
        return _build_cpu(args)
    if args.sku:
        from control.buildsys.catalog import get_sku

        get_sku(args.sku)  # an unknown SKU: one line listing the known ones
        raise ConfigError(f"--sku {args.sku} builds TensorRT-LLM engines from a recipe: add --recipe FILE "
                          "(see build/recipes/); only --sku cpu builds without one")
    raise ConfigError("specctl build needs --recipe FILE (see build/recipes/) or --sku cpu")


def _build_cpu(args: argparse.Namespace) -> int:
    from pathlib import Path

    from control.buildsys.cpu.pair import check_out_dir
    from control.buildsys.cpu.recipe import get_recipe

    recipe = get_recipe("quick" if args.quick else "full")
    out = Path(args.out or "engines/cpu")
    check_out_dir(out, args.force)
    if args.corpus and not Path(args.corpus).is_dir():
        raise ConfigError(f"--corpus '{args.corpus}' is not a directory; give a directory of *.py files")
    # Idle OpenMP threads sleep instead of spinning: on a shared machine spinning threads slow every
    # process down several-fold. Must be set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    from control.buildsys.cpu.pair import build_cpu_pair
    from control.buildsys.cpu.progress import reporter_for

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    reporter = reporter_for()
    try:
        manifest = build_cpu_pair(out, recipe, seed=args.seed, corpus_dir=args.corpus, reporter=reporter,
                                  force=args.force)
    finally:
        reporter.close()
    _summary(manifest, out)
    return 0


def _summary(m: dict, out) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    t = Table(title=f"{m['name']} -> {out}  (seed {m['seed']}, {m['timings_s']['total']:.0f} s)")
    for col in ("model", "parameters", "held-out acceptance mean", "std", "p10", "p90"):
        t.add_column(col, justify="right" if col != "model" else "left")
    t.add_row(m["target"], f"{m['params'][m['target']]:,}", "-", "-", "-", "-")
    for d in m["drafters"]:
        a = m["acceptance"][d["name"]]
        params = f"{d['params']:,}" if d.get("params") else "-"
        t.add_row(d["name"], params, f"{a['mean']:.3f}", f"{a['std']:.3f}", f"{a['p10']:.3f}", f"{a['p90']:.3f}")
    c.print(t)
