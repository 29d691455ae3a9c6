"""Every shipped recipe builds (``--dry-run``) on every backend it supports, with the profile a user
would get: the committed measured profile where one exists, the roofline model otherwise.

The golden tests (test_build_golden.py) feed a synthetic profile, so they never reach the roofline;
this walk does, which is where a recipe's precision has to reach the cost model (fp8 70B recipes
were refused by their own build while the roofline priced them in bf16).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from control.buildsys.profiles import resolve_profile
from control.buildsys.recipe import load_recipe
from control.buildsys.trtllm_rules import BACKEND_METHODS
from control.cli import main

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "build" / "recipes").glob("*.yaml"))


def _supported(path: Path) -> list[str]:
    recipe = load_recipe(path)
    if recipe.is_cpu:
        return ["reference"]
    return [b for b, methods in BACKEND_METHODS.items() if recipe.method in methods]


def _cases():
    for path in RECIPES:
        for backend in _supported(path):
            yield pytest.param(path, backend, id=f"{path.stem}-{backend}")


def test_every_recipe_has_a_backend():
    assert len(RECIPES) >= 28
    assert all(_supported(p) for p in RECIPES)


@pytest.mark.parametrize(("path", "backend"), list(_cases()))
def test_recipe_dry_run_builds_with_its_own_profile(tmp_path, capsys, path, backend):
    out = tmp_path / "out"
    rc = main(["build", "--recipe", str(path), "--backend", backend, "--out", str(out), "--dry-run"])
    printed = capsys.readouterr()
    assert rc == 0, f"{path.name} on {backend}: {printed.err.strip()}"
    assert (out / "build.sh").is_file()
    if backend != "reference":
        assert re.search(r"TensorRT-LLM \d+\.\d+", printed.out.splitlines()[0]), printed.out.splitlines()[0]
        assert "plan compiled from the" in printed.out


@pytest.mark.parametrize("name", ["h100-llama3.1-70b-draft", "l4-llama3.1-70b-draft", "l40s-llama3.1-8b-ngram"])
def test_roofline_prices_the_recipes_precision(name):
    """A roofline profile for an fp8 recipe is an fp8 profile (weights, KV and tensor cores)."""
    recipe = load_recipe(ROOT / "build" / "recipes" / f"{name}.yaml")
    assert recipe.precision == "fp8"
    resolved = resolve_profile(recipe, profiles_dir=ROOT / "build")  # no profiles there: the roofline
    assert resolved.origin == "roofline"
    assert resolved.profile.environment["precision"] == "fp8"
