"""Which profile a build compiles its plan from: measured if one exists, roofline otherwise.

Order: an explicit ``--profile`` file; ``profiles/<sku>/<pair>.yaml`` when its ``source`` is
``measured``; a committed roofline profile at the same place; the roofline model computed now
(``control.buildsys.roofline.roofline_profile``, the single call site below). A build never
silently runs without a cost model: when none can be had it says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from control.buildsys.recipe import Recipe
from control.buildsys.trtllm_rules import Method
from control.errors import ConfigError
from control.profile import Profile, load_profile

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PROFILES_DIR = REPO_ROOT / "profiles"

# Profile drafter kind per speculation method (control/goodput/stepcost.py DrafterKind).
DRAFTER_KIND = {
    Method.draft_target: "draft_model",
    Method.eagle3: "eagle",
    Method.eagle: "eagle",
    Method.mtp: "eagle",
    Method.ngram: "ngram",
}


@dataclass(frozen=True, slots=True)
class ResolvedProfile:
    profile: Profile
    origin: str  # "file:<path>" or "roofline"
    drafter: str  # the profile's drafter that models the recipe's method

    def describe(self) -> str:
        return f"{self.profile.source} profile {self.profile.sku}/{self.profile.pair} ({self.origin}), drafter '{self.drafter}'"


def profile_path(profiles_dir: Path, recipe: Recipe) -> Path:
    return Path(profiles_dir) / recipe.sku / f"{recipe.pair}.yaml"


# Precisions the roofline prices with fp8 weights, KV and tensor cores. The roofline has no nvfp4
# model: fp8 bytes over-count nvfp4 weights (1 byte vs 4.5 bits), a conservative cost and memory fit.
ROOFLINE_FP8 = frozenset({"fp8", "nvfp4"})

# Per-step cost of n-gram prompt lookup in the roofline profiles of ngram recipes (host-side lookup,
# overlapped with little else; an estimate written down once, as the roofline's framework constants).
NGRAM_MS = 0.1


def roofline(recipe: Recipe) -> Profile:
    """The roofline profile of the recipe's SKU and pair: the one place the roofline model is called."""
    try:
        from control.buildsys.roofline import roofline_profile
    except ImportError:
        raise ConfigError(
            f"no measured profile for {recipe.sku}/{recipe.pair} and the roofline model is not installed in this "
            f"checkout; pass --profile FILE (a specctl.profile/v1 document) or run `specctl profile` on the GPU host"
        ) from None
    fp8 = recipe.precision in ROOFLINE_FP8
    if recipe.method.value == "ngram":  # prompt lookup: no draft model, a small host-side cost per step
        return roofline_profile(recipe.sku, recipe.target, [], tp=recipe.tp, fp8=fp8, ngram_ms=NGRAM_MS)
    if not recipe.speculation.draft:
        raise ConfigError(f"recipe {recipe.sku}/{recipe.pair}: method {recipe.method.value} names no draft model, so "
                          "the roofline cannot price it; pass --profile FILE (a specctl.profile/v1 document)")
    return roofline_profile(recipe.sku, recipe.target, [recipe.speculation.draft], tp=recipe.tp, fp8=fp8)


def pick_drafter(profile: Profile, recipe: Recipe) -> str:
    kind = DRAFTER_KIND[recipe.method]
    for d in profile.drafters:
        if d.kind.value == kind:
            return d.name
    have = ", ".join(f"{d.name} ({d.kind.value})" for d in profile.drafters)
    raise ConfigError(f"profile {profile.sku}/{profile.pair} has no {kind} drafter for method {recipe.method.value}; "
                      f"it has: {have}")


def resolve_profile(recipe: Recipe, profiles_dir: str | Path | None = None,
                    explicit: str | Path | None = None) -> ResolvedProfile:
    """Measured if one exists under ``profiles/<sku>/``, roofline otherwise (see module docstring)."""
    if explicit is not None:
        prof = load_profile(explicit)
        return ResolvedProfile(prof, f"file:{explicit}", pick_drafter(prof, recipe))
    path = profile_path(Path(profiles_dir) if profiles_dir else DEFAULT_PROFILES_DIR, recipe)
    if path.is_file():
        prof = load_profile(path)
        if prof.sku != recipe.sku:
            raise ConfigError(f"profile '{path}' is for sku {prof.sku}, not {recipe.sku}; regenerate it")
        return ResolvedProfile(prof, f"file:{path}", pick_drafter(prof, recipe))
    prof = roofline(recipe)
    return ResolvedProfile(prof, "roofline", pick_drafter(prof, recipe))
