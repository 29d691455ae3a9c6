"""``specctl build``: build what a deployment needs.

Two paths share the command: ``--recipe`` (GPU SKUs through TensorRT-LLM, and recipe validation
for the cpu SKU) lives in ``control.buildsys.recipe_cli``; ``--sku cpu`` (the reference pair) in the
CPU-pair build. This module only routes.
"""

from __future__ import annotations

import argparse

from control.errors import ConfigError


def register(sub) -> None:
    from control.buildsys.recipe_cli import register_recipe_args

    p = sub.add_parser("build", help="build engines/configs for a GPU SKU from a recipe (or the cpu pair)",
                       description="Build what a deployment needs from a recipe (build/recipes/*.yaml).")
    register_recipe_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "recipe", None):
        from control.buildsys.recipe_cli import run_recipe

        return run_recipe(args)
    raise ConfigError("specctl build needs --recipe FILE (see build/recipes/)")
